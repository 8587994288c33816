"""One definition of the step's batch: an optimizer step's loss is one mean over every sample of
the step, so the memory settings (grad_accum_steps, length_buckets), the shared-prompt pass
and sharding the batch over devices change how the gradient is computed, never what it is.

Each test takes one optimizer step from the same state on the same samples in a plain setting
(one micro-batch, no buckets, one device) and in the others, and compares the gradients (read
back from Adam's first moment, which after one step is (1 - b1) x the gradient) to 1e-6 of the
gradient's norm, and the step's metrics. The samples are chosen so that a mean per micro-batch
would differ: completions of 1 to 8 tokens, groups left out (weight 0) and groups without signal
(advantage 0), ratios outside both clip bounds. Before the step's denominators, DAPO's gradient
with grad_accum_steps=2 was off by up to 100% of its scale here."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from algos import grpo, multiturn, online_dpo, optimizer_steps, ppo_lm
from envs.text.task import RewardTerm
from jaxrl import hparams, sharding
from jaxrl.config import from_flat
from jaxrl.lm import training
from jaxrl.lm.model import Transformer, init_params, param_shardings
from jaxrl.lm.sampler import Sampling
from tests.test_grpo import TEXT_TASK, TINY

B1 = 0.9  # optax.adamw's first-moment decay
PROMPT, COMPLETION, GROUPS, GROUP_SIZE = 4, 8, 4, 4


def first_step_gradient(state) -> np.ndarray:
    """The gradient of the one optimizer step `state` has taken, flat."""
    mu = optax.tree.get(state.opt_state, "mu")
    return np.concatenate([np.ravel(np.asarray(m)) / (1 - B1) for m in jax.tree.leaves(mu)])


def assert_same_step(got, want, names=None):
    """Two (gradient, metrics) of one optimizer step: the gradients within 1e-6 of the norm,
    the metrics (the loss included) to fp32 rounding."""
    (got_gradient, got_metrics), (want_gradient, want_metrics) = got, want
    scale = np.linalg.norm(want_gradient)
    assert scale > 1e-6  # a step that moves nothing would make this vacuous
    error = np.linalg.norm(got_gradient - want_gradient) / scale
    assert error <= 1e-6, f"gradient off by {error:.2e} of its norm"
    for name in names or want_metrics:
        np.testing.assert_allclose(
            got_metrics[name], want_metrics[name], rtol=1e-5, atol=1e-7, err_msg=name
        )


# --- the GRPO family: every variant's loss through the optimizer steps every mode runs ------


def samples() -> dict:
    """16 completions, 4 groups of 4 sharing their 4-token prompt: lengths 1 to 8, group 1
    without signal (advantages 0), group 2 left out (weight 0), sampler-recorded log-probs of
    an older policy (partial mode's decoupled loss and mismatch metrics) and old log-probs far
    enough from the model's that ratios leave both clip bounds."""
    rng = np.random.default_rng(3)
    rows = GROUPS * GROUP_SIZE
    lengths = np.array([8, 1, 3, 5, 2, 6, 4, 7, 1, 1, 8, 2, 5, 3, 8, 6])
    completion_mask = np.arange(COMPLETION)[None, :] < lengths[:, None]
    prompts = np.repeat(rng.integers(3, 200, (GROUPS, PROMPT)), GROUP_SIZE, axis=0)
    tokens = np.concatenate([prompts, rng.integers(3, 200, (rows, COMPLETION))], 1)
    advantages = rng.normal(size=rows)
    advantages[GROUP_SIZE : 2 * GROUP_SIZE] = 0.0
    weights = np.ones(rows)
    weights[2 * GROUP_SIZE : 3 * GROUP_SIZE] = 0.0
    old = rng.normal(-np.log(TINY.vocab_size), 0.4, (rows, COMPLETION)) * completion_mask
    return {
        "tokens": jnp.asarray(tokens, jnp.int32),
        "attention_mask": jnp.asarray(
            np.concatenate([np.ones((rows, PROMPT), bool), completion_mask], 1)
        ),
        "completion_mask": jnp.asarray(completion_mask),
        "advantages": jnp.asarray(advantages, jnp.float32),
        "weights": jnp.asarray(weights, jnp.float32),
        "old_log_probs": jnp.asarray(old, jnp.float32),
        "behaviour_log_probs": jnp.asarray(old - rng.normal(0, 0.2, old.shape) * completion_mask),
        "sampler_log_probs": jnp.asarray(old + rng.normal(0, 0.1, old.shape) * completion_mask),
        "fresh_mask": jnp.asarray(completion_mask & (np.arange(rows) % 2 == 0)[:, None]),
    }


PLAIN = dict(
    batch_size=GROUPS, group_size=GROUP_SIZE, max_new_tokens=COMPLETION, learning_rate=1e-3,
    max_grad_norm=1e6, kl_beta=0.05, entropy_coef=0.01, uniform_kl_coef=0.01,
)  # fmt: skip


def grpo_step(settings: dict) -> tuple[np.ndarray, dict]:
    """One optimizer step of GRPO's loss (`grpo.learner`'s, as every rollout mode runs it) on
    `samples()`, with a reference model for the KL term: its gradient and metrics."""
    config = from_flat(grpo.Config, PLAIN | settings)
    params = init_params(TINY, jax.random.key(7))
    reference = jax.tree.map(lambda x: x * 1.05, params)
    batch = samples()
    mesh = None
    if config.mesh_shape != (1, 1, 1):
        mesh = sharding.make_mesh(*config.mesh_shape)
        params = jax.device_put(params, param_shardings(TINY, mesh))
        reference = jax.device_put(reference, param_shardings(TINY, mesh))
    learner = grpo.learner(config, TINY, TEXT_TASK, params, mesh)
    optimize = learner.make_optimize(False)
    hp = hparams.hparams(config)
    state = training.make_init(params, config, mesh)(jax.random.key(1), hp)

    @jax.jit
    def step(state):
        return optimize(state, batch, hp, jax.random.key(2), state.params, reference)

    state, metrics = step(state)
    return first_step_gradient(state), jax.tree.map(lambda m: np.asarray(m).mean(), metrics)


_plain_steps: dict = {}


def plain_grpo_step(variant: str) -> tuple[np.ndarray, dict]:
    """The plain step of `variant`, computed once per distinct loss (rloo and remax share
    dr_grpo's: the variants differ in their advantages, which these samples fix)."""
    spec = grpo.VARIANTS[variant]
    if spec not in _plain_steps:
        _plain_steps[spec] = grpo_step(dict(variant=variant))
    return _plain_steps[spec]


# Each variant with accumulation alone and with everything at once; DAPO's token mean (CISPO's is
# the same mean of another per-token loss) also in each setting alone and on 8 devices.
SETTINGS = {
    "accumulated": dict(grad_accum_steps=2),
    "accumulated_buckets_shared": dict(grad_accum_steps=2, length_buckets=2, shared_prompt=True),
}
TOKEN_MEAN_SETTINGS = {
    "accumulated_4": dict(grad_accum_steps=4),
    "length_buckets": dict(length_buckets=4),
    "shared_prompt": dict(shared_prompt=True),
    # 8 simulated devices: each micro-batch of 8 completions over the mesh's 4 batch shards
    "8_devices_accumulated": dict(mesh_shape=(2, 2, 2), grad_accum_steps=2),
}
CASES = [(v, s) for v in grpo.VARIANTS for s in SETTINGS] + [
    ("dapo", s) for s in TOKEN_MEAN_SETTINGS
]


@pytest.mark.parametrize("variant,setting", CASES)
def test_every_variant_takes_the_plain_step_in_every_setting(variant, setting):
    """Micro-batches and length buckets with different numbers of tokens and of kept
    sequences, the shared-prompt pass and 8 devices give the plain step's gradient and
    metrics."""
    settings = dict(variant=variant, **(SETTINGS | TOKEN_MEAN_SETTINGS)[setting])
    assert_same_step(grpo_step(settings), plain_grpo_step(variant))


def test_a_mean_per_micro_batch_would_move_dapos_step():
    """What the tests above rule out, on the same samples: DAPO's token mean taken per
    micro-batch and averaged over two (TRL's `bnpo`; this library's before the step's
    denominators) moves the gradient by a large part of its norm."""
    config = from_flat(grpo.Config, PLAIN | dict(variant="dapo", kl_beta=0.0))
    loss_fn = grpo.make_loss(Transformer(TINY), config)
    hp = hparams.hparams(config)
    params = init_params(TINY, jax.random.key(7))
    halves = jax.tree.map(lambda x: x.reshape(2, -1, *x.shape[1:]), samples())

    def gradient(denominators):
        grads, _ = training.accumulated_gradient(
            lambda p, b: loss_fn(p, b, hp), params, halves, denominators=denominators
        )
        return np.concatenate([np.ravel(g) for g in jax.tree.leaves(grads)])

    step = gradient(optimizer_steps.normalisers)
    per_micro_batch = gradient(None)
    assert np.linalg.norm(per_micro_batch - step) > 0.1 * np.linalg.norm(step)


# --- PPO-LM, online DPO and multi-turn GRPO: one update, its one optimizer step ----------------


# A dense reward, the fraction of even token ids: ranks most pairs (online DPO), ties some.
EVEN_TASK = TEXT_TASK._replace(
    reward_terms=(
        RewardTerm("even", 1.0, lambda prompts, c: jnp.mean((c.tokens % 2 == 0) & c.mask, 1)),
    )
)


def eos_prone(params: dict, eos_id: int, strength: float = 4.5) -> dict:
    """A random tiny model that says EOS at about a quarter of its tokens, so that completions
    differ in length (a random model's almost never end before the budget). The
    bias rides on one residual dimension made constant through the embedding, which the head
    reads (as test_multiturn's digits model)."""
    params = jax.tree.map(np.array, params)
    params["embedding"][:, 0] = 10.0
    params["lm_head"][0] = 0.0
    params["lm_head"][0, eos_id] = strength / np.sqrt(TINY.hidden_size)
    return jax.tree.map(jnp.asarray, params)


def one_update(algorithm, config, inputs) -> tuple[np.ndarray, dict]:
    hp = hparams.hparams(config)
    state = algorithm.init(jax.random.key(2), hp)
    state, metrics = jax.jit(algorithm.update)(state, inputs, hp)
    return first_step_gradient(state), jax.device_get(metrics)


def ppo_lm_update(grad_accum_steps: int) -> tuple[np.ndarray, dict]:
    config = ppo_lm.Config(
        batch_size=8, sampling=Sampling(max_new_tokens=6), num_epochs=1, num_minibatches=1,
        grad_accum_steps=grad_accum_steps, max_grad_norm=1e6, learning_rate=1e-3,
    )  # fmt: skip
    lm = eos_prone(init_params(TINY, jax.random.key(0)), TEXT_TASK.eos_id)
    params = ppo_lm.init_params(lm, TINY, jax.random.key(1), critic="value_head")
    algorithm = ppo_lm.make(config, TINY, EVEN_TASK, params)
    return one_update(algorithm, config, ppo_lm.Inputs(lm, None))


def test_ppo_lm_accumulated_takes_the_plain_step():
    """PPO-LM's policy and value losses, token means over the step's completions of different
    lengths: the same step with 1, 2 and 4 micro-batches."""
    want = ppo_lm_update(1)
    lengths = want[1]["completion_length"]
    assert 1 < lengths < 6  # some completions ended early: micro-batches differ in tokens
    names = ["loss", "policy_loss", "value_loss", "entropy", "approx_kl", "grad_norm"]
    for accum in (2, 4):
        assert_same_step(ppo_lm_update(accum), want, names)


def online_dpo_update(grad_accum_steps: int) -> tuple[np.ndarray, dict]:
    config = online_dpo.Config(
        batch_size=8, num_samples=2, sampling=Sampling(max_new_tokens=4), learning_rate=1e-3,
        grad_accum_steps=grad_accum_steps, max_grad_norm=1e6,
    )  # fmt: skip
    lm = eos_prone(init_params(TINY, jax.random.key(0)), TEXT_TASK.eos_id)
    algorithm = online_dpo.make(config, TINY, EVEN_TASK, lm)
    return one_update(algorithm, config, online_dpo.Inputs(lm, None))


def test_online_dpo_accumulated_takes_the_plain_step(monkeypatch):
    """Online DPO ranks by the task's reward, so some pairs tie and leave the loss: micro-batches
    keep different numbers of pairs, and the step is still one mean over its kept pairs."""
    want = online_dpo_update(1)
    assert 0 < want[1]["tied_fraction"] < 1, want[1]["tied_fraction"]
    names = ["loss", "reward_accuracy", "reward_margin", "grad_norm"]
    for accum in (2, 4):
        assert_same_step(online_dpo_update(accum), want, names)
    # Not vacuous: with a mean per micro-batch (no step denominators) 4 micro-batches differ.
    monkeypatch.setattr(online_dpo, "step_pairs", None)
    with pytest.raises(AssertionError, match="gradient off by"):
        assert_same_step(online_dpo_update(4), want, names)


def multiturn_update(settings: dict) -> tuple[np.ndarray, dict]:
    from envs.text import multiturn as games
    from tests.test_multiturn import BYTES, digits_model
    from tests.test_multiturn import TINY as BYTE_MODEL

    config = multiturn.Config(
        batch_size=2, group_size=4, sampling=Sampling(max_new_tokens=4), learning_rate=1e-3,
        credit="turn", gamma=0.9, max_grad_norm=1e6, entropy_coef=0.01, variant="dapo",
        **settings,
    )  # fmt: skip
    env = games.make_guess_my_number(BYTES, maximum=8, max_turns=4)
    algorithm = multiturn.make(config, BYTE_MODEL, env, digits_model(), BYTES.eos_id, BYTES.pad_id)
    return one_update(algorithm, config, None)


def test_multiturn_accumulated_takes_the_plain_step():
    """Multi-turn GRPO's token mean over its episodes' policy tokens (episodes of different
    numbers of turns), with 2 micro-batches and with the shared opening."""
    want = multiturn_update({})
    names = ["loss", "entropy", "clip_fraction", "grad_norm"]
    assert_same_step(multiturn_update(dict(grad_accum_steps=2)), want, names)
    shared = dict(grad_accum_steps=2, shared_prompt=True)
    assert_same_step(multiturn_update(shared), want, names)


def test_the_entropy_floor_is_each_parts_own_when_accumulated():
    """The floor's gate needs the mean entropy, which a step of several parts knows only part by
    part: each compares its own mean with the floor. A floor above every part's entropy acts
    as the plain step's (the bonus everywhere); one below every part's as no bonus."""
    for floor in (100.0, 1e-6):
        settings = dict(variant="dapo", entropy_floor=floor, entropy_coef=0.05)
        assert_same_step(
            grpo_step(dict(settings, grad_accum_steps=2)), grpo_step(settings), ["loss"]
        )
    floored = grpo_step(dict(variant="dapo", entropy_floor=1e-6, entropy_coef=0.05))
    off = grpo_step(dict(variant="dapo", entropy_coef=0.0))
    np.testing.assert_allclose(floored[0], off[0], rtol=0, atol=1e-6 * np.linalg.norm(off[0]))
