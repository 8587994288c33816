"""Rollouts that never wait (issue 39): AReaL's decoupled PPO objective against a NumPy
reference written from the paper's formula, and partial rollouts carried across updates."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from algos import grpo
from algos.partial import Partial
from algos.rollouts import Sync
from jaxrl.lm.log_probs import completion_log_probs, log_prob_mismatch

# --- the decoupled objective -----------------------------------------------------------------


def np_decoupled_loss(logp, prox, behav, adv, mask, weights, variant, lo, hi, n_max, cap=None):
    """AReaL (Fu et al., 2025, eq. 5): per token
    -(pi_prox / pi_behav) * min(r A, clip(r, 1 - lo, 1 + hi) A), r = pi_theta / pi_prox,
    aggregated like GRPO's loss; tokens whose weight exceeds `cap` are left out."""
    rows = []
    for b in range(logp.shape[0]):
        tokens = []
        for t in range(logp.shape[1]):
            weight = np.exp(prox[b, t] - behav[b, t])
            if not mask[b, t] or (cap is not None and weight > cap):
                continue
            r = np.exp(logp[b, t] - prox[b, t])
            tokens.append(-weight * min(r * adv[b], np.clip(r, 1 - lo, 1 + hi) * adv[b]))
        rows.append(tokens)
    kept = [b for b in range(len(rows)) if weights[b] > 0]
    if variant == "grpo":
        return np.mean([np.mean(rows[b]) if rows[b] else 0.0 for b in kept])
    if variant == "dapo":
        return np.sum([np.sum(rows[b]) for b in kept]) / np.sum([len(rows[b]) for b in kept])
    return np.sum([np.sum(rows[b]) for b in kept]) / (len(kept) * n_max)


def _loss_inputs(seed=1, b=8, n=5):
    rng = np.random.default_rng(seed)
    logp = rng.normal(-1.5, 0.5, (b, n)).astype(np.float32)
    prox = (logp + rng.normal(0, 0.3, (b, n))).astype(np.float32)
    behav = (prox + rng.normal(0, 0.4, (b, n))).astype(np.float32)  # an older sampler
    adv = rng.normal(size=b).astype(np.float32)
    lengths = np.array([5, 3, 1, 4, 5, 2, 5, 3])
    mask = np.arange(n)[None] < lengths[:, None]
    weights = np.array([1, 1, 0, 0, 1, 1, 1, 1], np.float32)
    return logp, prox, behav, adv, mask, weights


def _loss(logp, prox, behav, adv, mask, weights, variant, cap=None, behaviour_clip=False):
    return grpo.policy_loss(
        jnp.asarray(logp), jnp.asarray(prox), jnp.asarray(adv), jnp.asarray(mask),
        jnp.asarray(weights), clip_low=0.2, clip_high=0.3,
        aggregation=grpo.VARIANTS[variant].aggregation, max_new_tokens=logp.shape[1],
        behaviour_log_probs=None if behav is None else jnp.asarray(behav),
        behaviour_weight_cap=cap, behaviour_clip=behaviour_clip,
    )  # fmt: skip


@pytest.mark.parametrize("variant", ["grpo", "dapo", "dr_grpo"])
@pytest.mark.parametrize("cap", [None, 2.0])
def test_decoupled_loss_matches_numpy(variant, cap):
    logp, prox, behav, adv, mask, weights = _loss_inputs()
    loss, _ = _loss(logp, prox, behav, adv, mask, weights, variant, cap)
    want = np_decoupled_loss(logp, prox, behav, adv, mask, weights, variant, 0.2, 0.3, 5, cap)
    np.testing.assert_allclose(float(loss), want, rtol=1e-5)
    # The weights matter: the same tokens without them give another loss.
    plain, _ = _loss(logp, prox, None, adv, mask, weights, variant)
    assert abs(float(plain) - want) > 1e-3


@pytest.mark.parametrize("variant", ["grpo", "dapo", "rloo"])
def test_decoupled_loss_with_behaviour_equal_to_proximal_is_the_grpo_loss(variant):
    logp, prox, _, adv, mask, weights = _loss_inputs(seed=2)
    loss, _ = _loss(logp, prox, prox, adv, mask, weights, variant)
    plain, _ = _loss(logp, prox, None, adv, mask, weights, variant)
    assert float(loss) == float(plain)
    # The gradient with respect to the trained log-probs too.
    grad = lambda behav: jax.grad(  # noqa: E731
        lambda lp: _loss(lp, prox, behav, adv, mask, weights, variant)[0]
    )(jnp.asarray(logp))
    np.testing.assert_array_equal(np.asarray(grad(prox)), np.asarray(grad(None)))


@pytest.mark.parametrize("variant", ["grpo", "dapo", "dr_grpo"])
def test_behaviour_clip_on_one_step_is_ppo_clipped_around_the_behaviour_policy(variant):
    """Async mode's loss: one optimizer step per batch, so the proximal policy is the current
    one (r = 1) and AReaL's clip never acts. With behaviour_clip the gradient is PPO's with the
    behaviour policy as the old one (a token already moved past the clip since it was sampled
    gets none); the loss value stays the decoupled objective's."""
    logp, _, behav, adv, mask, weights = _loss_inputs(seed=3)
    prox = logp.copy()  # the update's starting parameters are the current ones

    def loss(lp, old, behaviour, clip=False):
        return _loss(lp, old, behaviour, adv, mask, weights, variant, behaviour_clip=clip)

    def grad(*args):
        return np.asarray(jax.grad(lambda lp: loss(lp, *args)[0])(jnp.asarray(logp)))

    clipped, metrics = loss(logp, prox, behav, True)
    coupled, coupled_metrics = loss(logp, behav, None)  # PPO with the sampler as the old policy
    np.testing.assert_allclose(grad(prox, behav, True), grad(behav, None), rtol=1e-5, atol=1e-7)
    assert float(clipped) == float(loss(logp, prox, behav)[0])  # the decoupled loss's value
    assert metrics["clip_fraction"] == 0  # AReaL's clip, around the current policy
    np.testing.assert_allclose(
        float(metrics["behaviour_clip_fraction"]), float(coupled_metrics["clip_fraction"])
    )
    # Some tokens are beyond the behaviour trust region: without the clip they push on.
    assert float(metrics["behaviour_clip_fraction"]) > 0.1
    assert np.abs(grad(prox, behav) - grad(prox, behav, True)).max() > 1e-3


def test_log_prob_mismatch_is_over_the_marked_tokens():
    sampler = jnp.array([[-1.0, -2.0, -3.0], [-0.5, -0.5, -9.0]])
    trainer = jnp.array([[-1.1, -2.0, -3.5], [-0.5, -0.7, 0.0]])
    mask = jnp.array([[True, True, True], [True, True, False]])
    got = log_prob_mismatch(sampler, trainer, mask)
    np.testing.assert_allclose(float(got["logprob_mismatch_mean"]), (0.1 + 0.5 + 0.2) / 5, 1e-6)
    np.testing.assert_allclose(float(got["logprob_mismatch_max"]), 0.5, 1e-6)


# --- partial rollouts --------------------------------------------------------------------------

import dataclasses  # noqa: E402

from envs.text import make_task  # noqa: E402
from envs.text.task import RewardTerm  # noqa: E402
from jaxrl import hparams, sharding  # noqa: E402
from jaxrl.config import ConfigError  # noqa: E402
from jaxrl.lm.model import ModelConfig, Transformer, init_params, param_shardings  # noqa: E402
from jaxrl.lm.sampler import Sampling  # noqa: E402
from jaxrl.lm.tokenizer import ByteTokenizer  # noqa: E402
from jaxrl.trainers import rollout_modes  # noqa: E402

TINY = ModelConfig(
    vocab_size=260, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4,
    num_kv_heads=2, max_position_embeddings=64,
)  # fmt: skip
# A dense reward (the fraction of even token ids), so that every update's gradient is signal
# and the parameters move (the untrained model scores 0 on the answer everywhere).
EVEN = RewardTerm("even", 1.0, lambda prompts, c: jnp.mean((c.tokens % 2 == 0) & c.mask, axis=1))
TEXT_TASK = (
    make_task("reverse_digits", num_digits=3)
    .text_task(ByteTokenizer())
    ._replace(reward_terms=(EVEN,))
)


def _updates(config, count, params=None, seed=3, mesh=None, rollout=None):
    """`count` updates one by one (on `mesh`, if given) with `rollout` (None: sync); the states
    after each."""
    params = init_params(TINY, jax.random.key(0)) if params is None else params
    if mesh is not None:
        params = jax.device_put(params, param_shardings(TINY, mesh))
    algorithm = grpo.make(config, TINY, TEXT_TASK, params, mesh, rollout)
    hp = hparams.hparams(config)
    state = algorithm.init(jax.random.PRNGKey(seed), hp)
    update = jax.jit(algorithm.update)
    states, metrics = [], []
    for _ in range(count):
        state, m = update(state, None, hp)
        states.append(state)
        metrics.append(jax.device_get(m))
    return states, metrics


def test_partial_with_bound_zero_equals_synchronous_grpo():
    """Staleness 0 (so the budget covers max_new_tokens): the same samples in every update and
    the same parameters after it, bit for bit, as synchronous GRPO."""
    sync = grpo.Config(
        batch_size=4, group_size=4, sampling=Sampling(max_new_tokens=6), learning_rate=3e-3
    )
    sync_states, sync_metrics = _updates(sync, 3)
    partial_states, partial_metrics = _updates(sync, 3, rollout=Partial(rollout_budget=6))
    rollout = jax.jit(grpo.make_rollout(sync, TINY, TEXT_TASK), static_argnums=())
    hp = hparams.hparams(sync)
    params = init_params(TINY, jax.random.key(0))
    for i, (want, got) in enumerate(zip(sync_states, partial_states, strict=True)):
        key = jax.random.split(jax.random.fold_in(want.key, i))[0]
        batch, _ = rollout(params, key, hp)
        np.testing.assert_array_equal(got.slots.tokens, batch["tokens"][:, -6:])
        np.testing.assert_array_equal(got.slots.mask, batch["completion_mask"])
        for a, b in zip(jax.tree.leaves(want.params), jax.tree.leaves(got.params), strict=True):
            np.testing.assert_array_equal(a, b)
        before, after = jax.tree.leaves(params), jax.tree.leaves(want.params)
        moved = max(np.abs(a - b).max() for a, b in zip(before, after, strict=True))
        assert moved > 1e-4  # the update did change the parameters
        params = want.params
        assert partial_metrics[i]["trained_groups"] == 4
        assert partial_metrics[i]["staleness_max"] == 0
        np.testing.assert_allclose(partial_metrics[i]["reward"], sync_metrics[i]["reward"], 1e-6)
        np.testing.assert_allclose(partial_metrics[i]["loss"], sync_metrics[i]["loss"], 1e-6)
        # The sampler's and the trainer's log-probs of the same tokens under the same
        # parameters: float rounding in fp32, the same figure in both modes.
        for name in ("logprob_mismatch_mean", "logprob_mismatch_max"):
            assert partial_metrics[i][name] == sync_metrics[i][name]
        assert partial_metrics[i]["logprob_mismatch_max"] < 1e-5


def test_partial_with_bound_zero_equals_synchronous_grpo_on_8_devices():
    """The same on a (2, 2, 2) mesh of 8 simulated devices: partial mode's program against
    synchronous GRPO's, both sharded the same way."""
    mesh_shape = (2, 2, 2)
    sync = grpo.Config(
        batch_size=4, group_size=4, sampling=Sampling(max_new_tokens=6), learning_rate=3e-3,
        mesh_shape=mesh_shape,
    )  # fmt: skip
    mesh = sharding.make_mesh(*mesh_shape)
    sync_states, _ = _updates(sync, 2, mesh=mesh)
    partial_states, _ = _updates(sync, 2, mesh=mesh, rollout=Partial())
    for want, got in zip(sync_states, partial_states, strict=True):
        wanted, gotten = jax.device_get(want.params), jax.device_get(got.params)
        for a, b in zip(jax.tree.leaves(wanted), jax.tree.leaves(gotten), strict=True):
            np.testing.assert_array_equal(a, b)


CARRYING = grpo.Config(
    batch_size=4, group_size=4, sampling=Sampling(max_new_tokens=12, temperature=1.5),
    learning_rate=3e-3,
)  # fmt: skip
CARRIED = Partial(rollout_budget=4, max_staleness=2)


@pytest.fixture(scope="module")
def carrying_run():
    """8 partial updates of CARRYING (samples carried over, up to 2 versions old)."""
    return _updates(CARRYING, 8, rollout=CARRIED)


@pytest.mark.parametrize("rollout_groups", [0, 8])
def test_staleness_never_exceeds_the_bound_and_groups_carry_over(rollout_groups, carrying_run):
    """Over 8 updates: no trained token older than the bound, some carried over. With as many
    slots as the batch (0) no group waits, so none is dropped; over-provisioned (8 groups of
    slots for 4 trained) decoding stops once 4 have ended and at most 4 train."""
    rollout = dataclasses.replace(CARRIED, rollout_groups=rollout_groups)
    states, metrics = (
        carrying_run if rollout_groups == 0 else _updates(CARRYING, 8, rollout=rollout)
    )
    ages = [m["staleness_max"] for m in metrics]
    assert max(ages) <= 2, ages
    assert max(ages) >= 1, ages  # some groups did carry over
    if rollout_groups == 0:
        assert all(m["dropped_groups"] == 0 for m in metrics)
    trained = sum(m["trained_groups"] for m in metrics)
    assert trained >= 4, trained
    for m in metrics:
        assert m["decode_steps"] <= 4
        assert m["trained_groups"] <= 4
        assert 0 <= m["offpolicy_token_fraction"] <= 1
        histogram = sum(m[f"staleness_{age}"] for age in range(3))
        assert m["trained_tokens"] == 0 or abs(histogram - 1) < 1e-6
        # The sampler's and the trainer's log-probs of the same token under the same
        # parameters agree to float rounding (fp32).
        assert m["logprob_mismatch_max"] < 1e-4, m["logprob_mismatch_max"]
    # Every version a carried token records is one of the updates so far.
    last = states[-1].slots
    assert np.all(np.asarray(last.versions)[np.asarray(last.mask)] < len(states))


@pytest.mark.parametrize(
    "settings, field",
    [
        (dict(rollout_mode="later"), "rollout_mode"),
        (dict(rollout_budget=4), "rollout_budget"),
        (dict(max_staleness=1), "max_staleness"),
        (dict(rollout_mode="partial", rollout_budget=-1), "rollout_budget"),
        (dict(rollout_mode="partial", rollout_budget=9, max_new_tokens=8), "rollout_budget"),
        (dict(rollout_mode="partial", max_staleness=1.5), "max_staleness"),
        (dict(rollout_mode="partial", max_staleness=True), "max_staleness"),
        (dict(rollout_groups=32), "rollout_groups"),
        (dict(rollout_mode="partial", batch_size=8, rollout_groups=4), "rollout_groups"),
        (dict(rollout_mode="partial", rollout_budget=2, max_new_tokens=8), "max_staleness"),
        (dict(rollout_mode="partial", dynamic_sampling=True), "rollout_mode"),
        (dict(rollout_mode="partial", variant="remax"), "rollout_mode"),
        (dict(rollout_mode="partial", lora_rank=4), "rollout_mode"),
        (dict(batch_size=4, group_size=4, decode_row_buckets=3), "decode_row_buckets"),
        (dict(decode_row_buckets=-1), "decode_row_buckets"),
        (
            dict(
                rollout_mode="partial",
                batch_size=4,
                group_size=4,
                rollout_groups=5,
                decode_row_buckets=8,
            ),
            "decode_row_buckets",
        ),
    ],
)
def test_rollout_config_errors_name_the_field(settings, field):
    with pytest.raises(ConfigError, match=f"^{field}:"):
        rollout_modes.configure(grpo.Config, settings, grpo.check_rollout)


def test_carried_rows_continue_where_they_stopped():
    """With the parameters held (a learning rate too small to move fp32 weights), every
    token's recorded log-prob, carried across updates or not, equals the trainer's log-prob of
    it recomputed from the whole prompt and completion: the cache moved left between updates
    and the refilled slots lost nothing of a carried row's history."""
    config = grpo.Config(
        batch_size=4, group_size=4, sampling=Sampling(max_new_tokens=12, temperature=1.5),
        learning_rate=1e-30,
    )  # fmt: skip
    params = init_params(TINY, jax.random.key(0))
    # 12 tokens take 3 updates of 5 steps: after 8 updates the slots hold rows started in
    # update 7 and carried into update 8.
    states, _ = _updates(config, 8, params, rollout=Partial(rollout_budget=5, max_staleness=2))
    slots = states[-1].slots
    for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(states[-1].params), strict=True):
        np.testing.assert_array_equal(a, b)
    batch = {
        "tokens": jnp.concatenate([slots.prompts.tokens, slots.tokens], axis=1),
        "attention_mask": jnp.concatenate([slots.prompts.mask, slots.mask], axis=1),
        "completion_mask": slots.mask,
    }
    temperature = config.sampling.temperature
    trainer = completion_log_probs(Transformer(TINY), params, batch, temperature).log_probs
    mask = np.asarray(slots.mask)
    versions = np.asarray(slots.versions)
    spans = [len(set(versions[row][mask[row]])) for row in range(mask.shape[0])]
    assert max(spans) >= 2, spans  # some row's tokens come from more than one update
    gap = np.abs(np.asarray(trainer) - np.asarray(slots.log_probs))[mask]
    assert gap.max() < 1e-5, gap.max()


def test_checkpoint_mid_rollout_resumes_equal_to_an_uninterrupted_run(tmp_path):
    """The carried rollouts are part of the state: saved after update 2 (rows half decoded),
    restored into a fresh state and run on, the run ends where an uninterrupted one does."""
    from jaxrl.checkpoint import Checkpointer

    config = grpo.Config(
        batch_size=4, group_size=4, sampling=Sampling(max_new_tokens=12), learning_rate=3e-3
    )
    params = init_params(TINY, jax.random.key(0))
    rollout = Partial(rollout_budget=5, max_staleness=2)
    algorithm = grpo.make(config, TINY, TEXT_TASK, params, rollout=rollout)
    hp = hparams.hparams(config)
    update = jax.jit(algorithm.update)
    state = algorithm.init(jax.random.PRNGKey(5), hp)
    for _ in range(2):
        state, _ = update(state, None, hp)
    assert np.asarray(state.slots.live).any() and not np.asarray(state.slots.done).all()
    checkpoints = Checkpointer(str(tmp_path / "checkpoints"))
    checkpoints.save(2, state, {})
    uninterrupted = state
    for _ in range(3):
        uninterrupted, _ = update(uninterrupted, None, hp)
    resumed, _ = checkpoints.restore(algorithm.init(jax.random.PRNGKey(5), hp))
    for _ in range(3):
        resumed, _ = update(resumed, None, hp)
    for a, b in zip(jax.tree.leaves(uninterrupted), jax.tree.leaves(resumed), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_repeat_digit_answers_have_long_tailed_lengths():
    """The long-tailed task: JAX answers equal the host's for every problem; lengths 1 to 32,
    most of them short."""
    task = make_task("repeat_digit", num_digits=5)
    assert task.lengths() == (1, 1, 2, 3, 5, 7, 10, 15, 22, 32)
    problems = [f"{d}{c}" for d in range(10) for c in range(10)]
    digits = jnp.asarray(task.problem_digits(problems))
    answer, length = task.answer_digits(digits)
    for row, problem in enumerate(problems):
        want = task.answer(problem)
        assert int(length[row]) == len(want)
        assert "".join(map(str, np.asarray(answer[row])[: len(want)])) == want
    lengths = np.asarray(length)
    assert np.median(lengths) <= 7 and lengths.max() == 32
    assert task.prompt("78") == "rep 7x8="


# --- through the script: kill -9 and resume, the summary's counts ------------------------------

import os  # noqa: E402

import orbax.checkpoint as ocp  # noqa: E402

from tests.script_runs import checkpoint_steps, kill_at_random_moment, run_script  # noqa: E402
from tests.test_lm_experiment import (  # noqa: E402
    QUIET,
    assert_same_params,
    read_json,
    read_metrics,
    timed_run,
)

# The default tiny model on reverse_digits: 4-token completions decoded 2 steps per update, so
# every group spans two updates; 6 slot groups for 4 trained, so ended groups wait, some until
# the bound (2) drops them. Checkpoints after updates 3, 6 and 9 hold half-decoded rows.
PARTIAL_SMALL = [
    "--config.num_steps=9",
    "--config.batch_size=4",
    "--config.group_size=4",
    "--config.rollout_mode=partial",
    "--config.rollout_budget=2",
    "--config.rollout_groups=6",
    "--config.max_staleness=2",
    "--config.run.num_chunks=3",
    "--config.run.log_every=1",
    "--config.task.num_eval=16",
    "--config.eval_samples=0",
]
PARTIAL_HEADLINES = (
    "final_mean_reward", "eval_task_accuracy", "completions", "tokens",
    "trained_groups_per_update", "decode_steps_per_update",
)  # fmt: skip


@pytest.fixture(scope="module")
def partial_whole(tmp_path_factory):
    """An uninterrupted partial-mode run of grpo.py, and its seconds from first row to exit."""
    workdir = str(tmp_path_factory.mktemp("partial") / "whole")
    return workdir, timed_run("grpo.py", workdir, *PARTIAL_SMALL)


# Columns that time something (async mode's reshard), which differ between runs as
# wall_seconds does.
TIMED_COLUMNS = ("reshard_seconds",)


def assert_same_run(whole, parts, headlines=PARTIAL_HEADLINES):
    """Two run directories of grpo.py hold the same run: every metrics row (but its timings),
    the summary's `headlines` and the final parameters."""
    untimed = lambda workdir: [  # noqa: E731
        {k: v for k, v in row.items() if k not in TIMED_COLUMNS} for row in read_metrics(workdir)
    ]
    assert untimed(parts) == untimed(whole)
    a, b = read_json(whole), read_json(parts)
    for key in headlines:
        assert a[key] == b[key], key
    assert_same_params(whole, parts)


def kill_after_first_checkpoint(flags, workdir):
    """grpo.py with `flags` SIGKILLed right after its first chunk's checkpoint; that
    checkpoint's state as orbax restores it (a dict of its fields, or their list)."""
    killed = run_script("grpo.py", *flags, "--kill_after_chunk=1", check=False)
    assert killed.returncode == -9, killed.stderr[-3000:]
    (step,) = checkpoint_steps(workdir)
    with ocp.StandardCheckpointer() as checkpointer:
        return checkpointer.restore(os.path.join(workdir, "checkpoints", str(step), "state"))


# Not in CI: test_checkpoint_mid_rollout_resumes_equal_to_an_uninterrupted_run covers carried rows
def test_partial_run_killed_after_a_checkpoint_mid_rollout_resumes_equal(partial_whole, tmp_path):
    """SIGKILL right after the first chunk's checkpoint, which holds half-decoded rows (the
    carried rollouts are in the checkpoint); the same command resumes and ends where the
    uninterrupted run did: every metrics row, the summary and the parameters."""
    whole, parts = partial_whole[0], str(tmp_path / "parts")
    flags = [*PARTIAL_SMALL, *QUIET, f"--workdir={parts}"]
    state = kill_after_first_checkpoint(flags, parts)
    assert checkpoint_steps(parts) == [3]
    slots = state["slots"] if isinstance(state, dict) else state[4]
    live, done = np.asarray(slots["live"]), np.asarray(slots["done"])
    assert (live & ~done).any()  # rows carried mid-completion
    run_script("grpo.py", *flags)
    assert_same_run(whole, parts)


def test_partial_summary_counts_the_trained_completions(partial_whole):
    """completions, tokens and their rates count what partial mode trained on (summed over
    every update's metrics row), not a synchronous run's batch_size x group_size per update."""
    whole = partial_whole[0]
    rows, summary = read_metrics(whole), read_json(whole)
    groups = sum(row["trained_groups"] for row in rows if "loss" in row)
    tokens = sum(row["trained_tokens"] for row in rows if "loss" in row)
    assert summary["completions"] == groups * 4 < 9 * 16
    assert summary["tokens"] == tokens > 0
    assert summary["trained_groups_per_update"] == pytest.approx(groups / 9)
    rate = summary["steps_per_second"]
    assert summary["tokens_per_second"] == pytest.approx(rate * tokens / 9, abs=1)
    trained = rate * groups * 4 / 9 * (summary_prompt_length(whole) + 4)
    assert summary["trained_tokens_per_second"] == pytest.approx(trained, abs=1)
    assert summary["decode_steps_per_update"] == 2


def summary_prompt_length(workdir):
    """The prompt's tokens in the run's task (reverse_digits with the byte tokenizer)."""
    assert read_json(workdir)["task"] == "reverse_digits"
    sample = lambda key: TEXT_TASK.sample_prompts(key, 1, TEXT_TASK.data)  # noqa: E731
    return jax.eval_shape(sample, jax.random.key(0)).tokens.shape[1]


def test_partial_run_killed_at_a_random_moment_resumes_equal(partial_whole, tmp_path):
    """SIGKILL at a random moment after training started (mid-chunk, mid-checkpoint, in the
    final evaluation), then the same command: the uninterrupted run's rows, summary and
    parameters."""
    (whole, window), parts = partial_whole, str(tmp_path / "parts")
    flags = [*PARTIAL_SMALL, *QUIET, f"--workdir={parts}"]
    kill_at_random_moment("grpo.py", *flags, seed=2, max_delay=0.9 * window)
    run_script("grpo.py", *flags)
    assert_same_run(whole, parts)


def test_partial_with_length_buckets_equals_unbucketed():
    """Partial mode (carried rows, the decoupled loss) trained in length buckets: the same
    samples and metrics in every update, the parameters equal to Adam-amplified rounding."""
    config = CARRYING
    plain_states, plain = _updates(config, 3, rollout=CARRIED)
    in_buckets = dataclasses.replace(config, length_buckets=4)
    bucketed_states, bucketed = _updates(in_buckets, 3, rollout=CARRIED)
    for want, got, want_metrics, got_metrics in zip(
        plain_states, bucketed_states, plain, bucketed, strict=True
    ):
        np.testing.assert_array_equal(got.slots.tokens, want.slots.tokens)
        for name in ("reward", "loss", "entropy", "trained_tokens", "logprob_mismatch_mean"):
            np.testing.assert_allclose(got_metrics[name], want_metrics[name], 1e-5, 1e-7)
        leaves = jax.tree.leaves(got.params), jax.tree.leaves(want.params)
        # Adam's step is about lr x g / (|g| + 1e-8), so a gradient element near 1e-8 moves
        # by a few 1e-3 x lr on rounding; three updates.
        assert max(np.abs(a - b).max() for a, b in zip(*leaves, strict=True)) < 3 * 5e-3 * 3e-3
    assert sum(m["trained_groups"] for m in plain) >= 4  # something trained


def test_partial_with_decode_row_buckets_samples_the_same(carrying_run):
    """Partial mode decoding only its rows still sampling (4 row buckets of its 16 slot rows):
    over 8 updates with carried rows, the same tokens, versions and rewards in every update,
    the parameters equal to Adam-amplified rounding (the smaller matmuls round differently)."""
    plain_states, plain = carrying_run
    rollout = dataclasses.replace(CARRIED, decode_row_buckets=4)
    bucketed_states, bucketed = _updates(CARRYING, 8, rollout=rollout)
    for want, got, want_metrics, got_metrics in zip(
        plain_states, bucketed_states, plain, bucketed, strict=True
    ):
        for name in ("tokens", "mask", "versions", "length", "done", "live"):
            np.testing.assert_array_equal(getattr(got.slots, name), getattr(want.slots, name))
        for name in ("reward", "trained_tokens", "decode_steps", "staleness_max"):
            assert got_metrics[name] == want_metrics[name], name
        np.testing.assert_allclose(got.slots.log_probs, want.slots.log_probs, atol=1e-5)
        leaves = jax.tree.leaves(got.params), jax.tree.leaves(want.params)
        assert max(np.abs(a - b).max() for a, b in zip(*leaves, strict=True)) < 8 * 5e-3 * 3e-3
    # Rows ended while others decoded on (the smaller buckets ran): ended rows waited.
    assert any(m["decode_steps"] > 0 and m["trained_groups"] < 4 for m in plain) or any(
        np.any(np.asarray(s.slots.done) & np.asarray(s.slots.live)) for s in plain_states
    )


# Not in CI: 6 minutes; test_partial_with_decode_row_buckets_samples_the_same and the async bucketed
# test cover the buckets
def test_decode_row_buckets_on_8_devices_equal_one_device():
    """Sync and partial GRPO with 4 decode row buckets on a (2, 2, 2) mesh of 8 simulated
    devices (rows gathered across the batch shards): the same samples as on one device, the
    parameters equal to rounding, over 2 updates."""
    mesh_shape = (2, 2, 2)
    config = CARRYING
    for rollout in (Sync(), CARRIED):
        rollout = dataclasses.replace(rollout, decode_row_buckets=4)
        one, _ = _updates(config, 2, rollout=rollout)
        sharded = dataclasses.replace(config, mesh_shape=mesh_shape)
        eight, _ = _updates(sharded, 2, mesh=sharding.make_mesh(*mesh_shape), rollout=rollout)
        for want, got in zip(one, eight, strict=True):
            if isinstance(rollout, Partial):
                np.testing.assert_array_equal(jax.device_get(got.slots.tokens), want.slots.tokens)
            leaves = jax.tree.leaves(jax.device_get(got.params)), jax.tree.leaves(want.params)
            assert max(np.abs(a - b).max() for a, b in zip(*leaves, strict=True)) < 2 * 5e-3 * 3e-3


def test_proximal_log_probs_are_the_loss_pass_held_constant(monkeypatch, carrying_run):
    """With one optimizer step per batch the proximal policy of the decoupled objective is the
    parameters the update starts from, so no forward pass of its own is run: the loss holds its
    own log-probs constant (`grpo.make_loss`). Forcing the explicit no-grad pass over the
    trained batch (as when samples are reused) gives the same parameters and metrics over
    3 partial updates with carried, older samples."""
    assert not CARRYING.reuses_samples
    skipped_states, skipped = (run[:3] for run in carrying_run)
    monkeypatch.setattr(grpo.Config, "reuses_samples", property(lambda self: True))
    explicit_states, explicit = _updates(CARRYING, 3, rollout=CARRIED)
    assert max(m["staleness_max"] for m in skipped) >= 1  # the decoupled objective acted
    for want, got, want_metrics, got_metrics in zip(
        explicit_states, skipped_states, explicit, skipped, strict=True
    ):
        np.testing.assert_array_equal(got.slots.tokens, want.slots.tokens)
        for name in want_metrics:
            np.testing.assert_allclose(got_metrics[name], want_metrics[name], 1e-6, 1e-6, name)
        leaves = jax.tree.leaves(got.params), jax.tree.leaves(want.params)
        assert max(np.abs(a - b).max() for a, b in zip(*leaves, strict=True)) < 1e-6
