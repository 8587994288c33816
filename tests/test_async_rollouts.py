"""Asynchronous GRPO on a split mesh (issue 39, `algos.asynchronous`): generation and training as
two programs on disjoint devices, the weights resharded between them after every update, with
the staleness bound enforced. 8 simulated CPU devices (tests/conftest.py)."""

import dataclasses

import jax
import numpy as np
import pytest

from algos import grpo
from algos.asynchronous import Async
from algos.rollouts import Sync
from jaxrl import hparams, sharding
from jaxrl.config import ConfigError, InputError
from jaxrl.lm.model import init_params, param_shardings
from jaxrl.lm.sampler import Sampling
from jaxrl.trainers import rollout_modes
from tests.test_partial_rollouts import TEXT_TASK, TINY, _updates

SYNC = grpo.Config(
    batch_size=4, group_size=4, sampling=Sampling(max_new_tokens=6), learning_rate=3e-3
)


def _async_updates(config, count, train_devices=None, params=None, seed=3, rollout=None):
    """`count` asynchronous updates with `rollout` (an `Async`; None: its defaults), the
    training mesh on `train_devices`, if given; the states and the metrics after each."""
    params = init_params(TINY, jax.random.key(0)) if params is None else params
    mesh = None
    if train_devices is not None:
        mesh = sharding.make_mesh(*config.mesh_shape, devices=train_devices)
        params = jax.device_put(params, param_shardings(TINY, mesh))
    rollout = Async() if rollout is None else rollout
    algorithm = grpo.make(config, TINY, TEXT_TASK, params, mesh, rollout)
    hp = hparams.hparams(config)
    if mesh is not None:
        hp = jax.device_put(hp, sharding.replicated(mesh))
    state = algorithm.init(jax.random.PRNGKey(seed), hp)
    states, metrics = [], []
    for _ in range(count):
        state, m = algorithm.update(state, None, hp)
        states.append(state)
        metrics.append(jax.device_get(m))
    return states, metrics


def _assert_same_params(a, b):
    a, b = jax.device_get(a), jax.device_get(b)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_array_equal(x, y)


# CI runs the bucketed case (the plain one is the 8-device test's); the plain one with --runslow.
@pytest.mark.parametrize(
    "buckets",
    [{}, dict(length_buckets=4, decode_row_buckets=4)],
)
def test_async_with_bound_zero_equals_synchronous_grpo_on_one_device(buckets):
    """Staleness 0 and an fp32 generation copy on one device (both meshes are that device, the
    programs take turns): the same rewards, losses and parameters as synchronous GRPO; also
    with length buckets in training and row buckets in decoding, in both."""
    rows = buckets.get("decode_row_buckets", 0)
    sync = dataclasses.replace(SYNC, length_buckets=buckets.get("length_buckets", 0))
    rollout = Async(generation_dtype="float32", decode_row_buckets=rows)
    sync_states, sync_metrics = _updates(sync, 2, rollout=Sync(decode_row_buckets=rows))
    async_states, async_metrics = _async_updates(sync, 2, rollout=rollout)
    for want, got, m_want, m_got in zip(
        sync_states, async_states, sync_metrics, async_metrics, strict=True
    ):
        _assert_same_params(want.params, got.params)
        for name in ("reward", "loss", "logprob_mismatch_max", "completion_length"):
            assert m_got[name] == m_want[name], name
        assert m_got["staleness_max"] == 0
    start, end = jax.tree.leaves(init_params(TINY, jax.random.key(0))), jax.tree.leaves(got.params)
    moved = max(np.abs(a - b).max() for a, b in zip(start, end, strict=True))
    assert moved > 1e-4  # the updates did change the parameters


def test_async_with_bound_zero_equals_synchronous_grpo_on_8_devices():
    """4 generating + 4 training devices, bound 0, fp32: the same parameters as synchronous GRPO
    on the 4 training devices alone with the same (2, 2, 1) mesh, though every batch was
    sampled on the other 4 devices from weights resharded to an all-data layout."""
    devices = jax.devices()
    sync = dataclasses.replace(SYNC, mesh_shape=(2, 2, 1))
    rollout = Async(generation_mesh_shape=(4, 1, 1), generation_dtype="float32")
    sync_mesh = sharding.make_mesh(2, 2, 1, devices=devices[:4])
    sync_states, _ = _updates(sync, 2, mesh=sync_mesh)
    async_states, metrics = _async_updates(sync, 2, train_devices=devices[:4], rollout=rollout)
    for want, got in zip(sync_states, async_states, strict=True):
        _assert_same_params(want.params, got.params)
    state = async_states[-1]
    train = {d for leaf in jax.tree.leaves(state) for d in leaf.devices()}
    assert train == set(devices[:4])  # the state (and so the checkpoint) is the training mesh's
    # fp32 weights replicated on each of the 4 generation devices.
    size = sum(x.size for x in jax.tree.leaves(state.params))
    assert metrics[-1]["reshard_bytes"] == 4 * 4 * size
    assert metrics[-1]["reshard_bytes_per_device"] == 4 * size


def test_staleness_one_on_8_devices_samples_from_the_last_version():
    """4 + 4 devices, bound 1, bf16 generation copy: batch i is sampled by the weights of version
    i - 1 (for i >= 1; version 0 for batch 0) with update i's keys, never older than the bound;
    the copy on the generation devices is bf16 and half the fp32 bytes."""
    devices = jax.devices()
    config = dataclasses.replace(
        SYNC, mesh_shape=(2, 2, 1), sampling=Sampling(max_new_tokens=6, temperature=1.5)
    )
    rollout = Async(generation_mesh_shape=(4, 1, 1), max_staleness=1)
    states, metrics = _async_updates(config, 4, train_devices=devices[:4], rollout=rollout)
    assert [m["staleness_max"] for m in metrics] == [0, 1, 1, 1]
    assert [m["offpolicy_token_fraction"] for m in metrics] == [0, 1, 1, 1]
    size = sum(x.size for x in jax.tree.leaves(states[0].params))
    assert metrics[0]["reshard_bytes_per_device"] == 2 * size  # bf16
    assert all(m["reshard_seconds"] > 0 for m in metrics)
    # The batch waiting in the state after update i (batch i + 1) is what synchronous GRPO's
    # rollout samples from version i's weights in bf16 with update i + 1's key.
    rollout = jax.jit(grpo.make_rollout(config, TINY, TEXT_TASK))
    hp = hparams.hparams(config)
    before = [init_params(TINY, jax.random.key(0))] + [s.params for s in states[:-1]]
    for i, state in enumerate(states):
        (ahead,) = state.ahead
        assert int(ahead.version) == i
        weights = jax.tree.map(lambda p: p.astype("bfloat16"), jax.device_get(before[i]))
        key = jax.random.split(jax.random.fold_in(jax.random.PRNGKey(3), i + 1))[0]
        batch, _ = rollout(weights, key, hp)
        np.testing.assert_array_equal(jax.device_get(ahead.batch["tokens"]), batch["tokens"])
    for m in metrics:
        assert np.isfinite(m["loss"])
        # The sampler/trainer mismatch of every batch, taken on the generation devices under the
        # bf16 copy that sampled it (no training step holds those weights).
        assert 0 < m["logprob_mismatch_mean"] <= m["logprob_mismatch_max"] < 0.1


def test_staleness_one_logs_the_fp32_log_prob_mismatch_every_update():
    """Bound 1, fp32 generation copy, one device: every update logs the mismatch of its batch
    (sampler against the trainer's forward under the weights that sampled it), fp32-small."""
    rollout = Async(max_staleness=1, generation_dtype="float32")
    _, metrics = _async_updates(SYNC, 3, rollout=rollout)
    assert [m["staleness_max"] for m in metrics] == [0, 1, 1]
    for m in metrics:
        assert 0 <= m["logprob_mismatch_mean"] <= m["logprob_mismatch_max"] < 1e-5
    assert max(m["logprob_mismatch_max"] for m in metrics[1:]) > 0  # measured, not left at 0


def test_checkpoint_with_batches_in_flight_resumes_equal_to_an_uninterrupted_run(tmp_path):
    """Bound 2: the two batches generated ahead are part of the state: saved after update 2,
    restored into a fresh state and run on, the run ends where an uninterrupted one does; the
    staleness grows to the bound and stays there."""
    from jaxrl.checkpoint import Checkpointer

    config = SYNC
    params = init_params(TINY, jax.random.key(0))
    algorithm = grpo.make(config, TINY, TEXT_TASK, params, rollout=Async(max_staleness=2))
    hp = hparams.hparams(config)
    state = algorithm.init(jax.random.PRNGKey(5), hp)
    ages = []
    for _ in range(2):
        state, metrics = algorithm.update(state, None, hp)
        ages.append(metrics["staleness_max"])
    assert [int(a.version) for a in state.ahead] == [0, 1]  # batches 2 and 3
    checkpoints = Checkpointer(str(tmp_path / "checkpoints"))
    checkpoints.save(2, state, {})
    uninterrupted, metrics = algorithm.update(state, None, hp)
    resumed, _ = checkpoints.restore(algorithm.init(jax.random.PRNGKey(5), hp))
    checkpoints.close()
    resumed, _ = algorithm.update(resumed, None, hp)
    assert [*ages, metrics["staleness_max"]] == [0, 1, 2]
    for a, b in zip(jax.tree.leaves(uninterrupted), jax.tree.leaves(resumed), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.parametrize(
    "settings, field",
    [
        (dict(rollout_mode="async", max_staleness=-1), "max_staleness"),
        (dict(rollout_mode="async", rollout_budget=4), "rollout_budget"),
        (dict(rollout_mode="async", generation_mesh_shape=(2, 0, 1)), "generation_mesh_shape"),
        (dict(rollout_mode="async", generation_mesh_shape=(3, 1, 1)), "generation_mesh_shape"),
        (dict(rollout_mode="async", generation_dtype="float16"), "generation_dtype"),
        (dict(rollout_mode="async", lora_rank=4), "rollout_mode"),
        (dict(generation_mesh_shape=(2, 1, 1)), "generation_mesh_shape"),
        (dict(generation_dtype="float32"), "generation_dtype"),
    ],
)
def test_async_config_errors_name_the_field(settings, field):
    with pytest.raises(ConfigError, match=f"^{field}:"):
        rollout_modes.configure(grpo.Config, settings, grpo.check_rollout)


def test_devices_that_do_not_split_are_one_line_error():
    config = dataclasses.replace(SYNC, batch_size=8, mesh_shape=(4, 1, 1))
    rollout = Async(generation_mesh_shape=(8, 1, 1))
    with pytest.raises(ConfigError, match=r"^generation_mesh_shape: .* 4 \+ 8 .* 8 are available"):
        rollout.split_devices(config)
    device = jax.devices()[:1]
    assert Async().split_devices(SYNC, device) == (device, device)  # shared, one device
    # On one device the fix named the settings that work there (it said mesh_shape=(0,1,1)).
    with pytest.raises(ConfigError, match=r"; use mesh_shape=\(1,1,1\) and generation_mesh_"):
        Async(generation_mesh_shape=(2, 1, 1)).split_devices(SYNC, device)
    split = dataclasses.replace(config, mesh_shape=(2, 2, 1))
    train, generate = Async(generation_mesh_shape=(4, 1, 1)).split_devices(split)
    assert train == jax.devices()[:4] and generate == jax.devices()[4:]


def short_answer_reward(prompts, completions, answer, **columns):
    """A host reward (called back per batch shard of the mesh the rollout runs on)."""
    return [float(len(c) <= len(a) + 1) for c, a in zip(completions, answer, strict=True)]


def test_grpo_trainer_runs_async_on_a_split_mesh(tmp_path):
    """`experiments/grpo.py --config.rollout_mode=async` through its trainer: 2 training + 2
    generating devices, staleness 1, with a host reward (its callbacks on the generation mesh,
    where the rollout runs); the metrics rows carry the staleness and the reshard's time and
    bytes, and the checkpoint is the state with its batch in flight."""
    from jaxrl.trainers import grpo as trainer
    from tests.script_runs import read_rows
    from tests.test_trainers import LM_QUIET, configured

    settings = {"num_steps": 3, "batch_size": 4, "group_size": 4, "eval_batch_size": 16}
    settings |= {"task.num_eval": 16, "eval_samples": 0, "run.num_chunks": 1, **LM_QUIET}
    settings |= {"rollout_mode": "async", "max_staleness": 1, "mesh_shape": (2, 1, 1)}
    settings |= {"generation_mesh_shape": (2, 1, 1)}
    result = trainer.train(
        configured(trainer, None, settings), str(tmp_path / "run"), rewards=[short_answer_reward]
    )
    rows = [row for row in read_rows(result.run_dir) if "loss" in row]
    assert [row["staleness_max"] for row in rows] == [0, 1, 1]
    assert all("reward_short_answer_reward" in row for row in rows), rows[0].keys()
    assert all(row["reshard_seconds"] > 0 and row["reshard_bytes"] > 0 for row in rows)
    assert result.summary["steps"] == 3
    # Its two programs compile inside the first updates: no compile time is claimed (was 0 s).
    assert result.summary["compile_seconds"] is None
    assert int(result.state.ahead[0].version) == 2
    train = {d for leaf in jax.tree.leaves(result.state) for d in leaf.devices()}
    assert train == set(jax.devices()[:2])


def test_grpo_trainer_refuses_devices_that_do_not_split(tmp_path):
    from jaxrl.trainers import grpo as trainer
    from tests.test_trainers import configured

    settings = {"rollout_mode": "async", "mesh_shape": (4, 1, 1)}
    settings |= {"generation_mesh_shape": (8, 1, 1), "batch_size": 8}
    # From Python the one line is the InputError's text (a script prints it after "error: ").
    with pytest.raises(InputError) as error:
        trainer.train(configured(trainer, None, settings), str(tmp_path / "run"))
    (line,) = str(error.value).splitlines()
    assert line.startswith("config.generation_mesh_shape: ") and "4 + 8" in line
    assert not (tmp_path / "run").exists()


# --- through the script: kill -9 and resume ---------------------------------------------------

# The default tiny model on reverse_digits, staleness 1: every checkpoint (after updates 2 and
# 4) holds the batch generated ahead by the last version. The subprocess inherits the 8
# simulated devices, so the default (1, 1, 1) meshes are two devices: one training, one
# generating.
ASYNC_SMALL = [
    "--config.num_steps=4",
    "--config.batch_size=4",
    "--config.group_size=4",
    "--config.rollout_mode=async",
    "--config.max_staleness=1",
    "--config.run.num_chunks=2",
    "--config.run.log_every=1",
    "--config.task.num_eval=16",
    "--config.eval_samples=0",
]
ASYNC_HEADLINES = ("final_mean_reward", "eval_task_accuracy", "completions", "tokens")


@pytest.fixture(scope="module")
def async_whole(tmp_path_factory):
    """An uninterrupted async-mode run of grpo.py, and its seconds from first row to exit."""
    from tests.test_lm_experiment import timed_run

    workdir = str(tmp_path_factory.mktemp("async") / "whole")
    return workdir, timed_run("grpo.py", workdir, *ASYNC_SMALL)


# Not in CI: the in-process checkpoint test above covers batches in flight; the script's kill -9 is
# the runner's, tested in test_lm_experiment
def test_async_run_killed_after_a_checkpoint_with_a_batch_in_flight_resumes_equal(
    async_whole, tmp_path
):
    """SIGKILL right after the first chunk's checkpoint, which holds batch 2, generated ahead by
    version 1 on the generation device; the same command resumes and ends where the
    uninterrupted run did: every metrics row (staleness and all), the summary, the parameters."""
    from tests.script_runs import run_script
    from tests.test_lm_experiment import QUIET, read_metrics
    from tests.test_partial_rollouts import assert_same_run, kill_after_first_checkpoint

    whole, parts = async_whole[0], str(tmp_path / "parts")
    flags = [*ASYNC_SMALL, *QUIET, f"--workdir={parts}"]
    state = kill_after_first_checkpoint(flags, parts)
    ahead = state["ahead"] if isinstance(state, dict) else state[4]
    (batch,) = ahead if isinstance(ahead, list | tuple) else ahead.values()
    version = batch["version"] if isinstance(batch, dict) else batch[2]
    assert int(np.asarray(version)) == 1  # the batch in flight, sampled by version 1
    assert np.asarray(state["step"] if isinstance(state, dict) else state[3]) == 2
    run_script("grpo.py", *flags)
    rows = [row for row in read_metrics(parts) if "loss" in row]
    assert [row["staleness_max"] for row in rows] == [0, 1, 1, 1]
    assert_same_run(whole, parts, ASYNC_HEADLINES)


def test_async_run_killed_at_a_random_moment_resumes_equal(async_whole, tmp_path):
    """SIGKILL at a random moment after training started (mid-chunk, between the two programs,
    mid-checkpoint, in the final evaluation), then the same command: the uninterrupted run's
    rows, summary and parameters."""
    from tests.script_runs import kill_at_random_moment, run_script
    from tests.test_lm_experiment import QUIET
    from tests.test_partial_rollouts import assert_same_run

    (whole, window), parts = async_whole, str(tmp_path / "parts")
    flags = [*ASYNC_SMALL, *QUIET, f"--workdir={parts}"]
    for seed in range(3):
        kill_at_random_moment("grpo.py", *flags, seed=seed, max_delay=0.9 * window)
        run_script("grpo.py", *flags)
        assert_same_run(whole, parts, ASYNC_HEADLINES)


# --- multi-turn episodes ------------------------------------------------------------------------

MT_SYNC = dict(
    batch_size=2, group_size=4, sampling=Sampling(max_new_tokens=4), learning_rate=1e-3,
    credit="turn", gamma=0.9, num_minibatches=2, warn_no_signal_updates=0,
)  # fmt: skip


def _multiturn_updates(config, count, train_devices=None, rollout=None):
    """`count` multi-turn updates on guess-my-number from the digit-favouring tiny model (the
    training mesh on `train_devices`, if given): the states and metrics after each. The
    synchronous update is jitted; the asynchronous one is a host function."""
    from algos import multiturn
    from envs.text import multiturn as games
    from tests.test_multiturn import BYTES, digits_model
    from tests.test_multiturn import TINY as MT_TINY

    env = games.make_guess_my_number(BYTES, maximum=8, max_turns=4)
    params, mesh = digits_model(), None
    if train_devices is not None:
        mesh = sharding.make_mesh(*config.mesh_shape, devices=train_devices)
        params = jax.device_put(params, param_shardings(MT_TINY, mesh))
    algorithm = multiturn.make(
        config, MT_TINY, env, params, BYTES.eos_id, BYTES.pad_id, mesh, rollout
    )
    hp = hparams.hparams(config)
    if mesh is not None:
        hp = jax.device_put(hp, sharding.replicated(mesh))
    state = algorithm.init(jax.random.key(0), hp)
    update = algorithm.update if isinstance(rollout, Async) else jax.jit(algorithm.update)
    states, metrics = [], []
    for _ in range(count):
        state, m = update(state, None, hp)
        states.append(state)
        metrics.append(jax.device_get(m))
    return states, metrics, params


def test_multiturn_async_with_bound_zero_equals_synchronous_multiturn_grpo():
    """Whole episodes played by the generation program from an fp32 copy, bound 0, one device:
    the same returns, losses, log-prob mismatch and parameters as synchronous multi-turn GRPO,
    bit for bit."""
    from algos import multiturn

    sync = multiturn.Config(**MT_SYNC)
    rollout = Async(generation_dtype="float32")
    sync_states, sync_metrics, start = _multiturn_updates(sync, 2)
    async_states, async_metrics, _ = _multiturn_updates(sync, 2, rollout=rollout)
    for want, got, m_want, m_got in zip(
        sync_states, async_states, sync_metrics, async_metrics, strict=True
    ):
        _assert_same_params(want.params, got.params)
        for name in ("return", "turns", "loss", "policy_tokens", "logprob_mismatch_max"):
            assert m_got[name] == m_want[name], name
        assert m_got["staleness_max"] == 0 and m_got["offpolicy_token_fraction"] == 0
    # The sampler's and the trainer's log-probs of the same tokens and fp32 weights agree.
    assert all(m["logprob_mismatch_max"] < 1e-5 for m in sync_metrics)
    leaves = zip(jax.tree.leaves(start), jax.tree.leaves(got.params), strict=True)
    assert max(np.abs(a - b).max() for a, b in leaves) > 1e-5  # the parameters did move


def test_multiturn_async_staleness_one_on_a_split_mesh():
    """2 training + 2 generating devices, bound 1, bf16 copy: episodes played by the last
    version's weights while the current batch trains (staleness 0, then 1 on), the batch in
    flight recorded in the state on the training devices; the losses stay finite."""
    from algos import multiturn

    devices = jax.devices()
    config = multiturn.Config(**MT_SYNC, mesh_shape=(2, 1, 1))
    rollout = Async(max_staleness=1, generation_mesh_shape=(2, 1, 1))
    states, metrics, _ = _multiturn_updates(config, 3, train_devices=devices[:2], rollout=rollout)
    assert [m["staleness_max"] for m in metrics] == [0, 1, 1]
    assert [m["offpolicy_token_fraction"] for m in metrics] == [0, 1, 1]
    assert [int(s.ahead[0].version) for s in states] == [0, 1, 2]
    train = {d for leaf in jax.tree.leaves(states[-1]) for d in leaf.devices()}
    assert train == set(devices[:2])
    size = sum(x.size for x in jax.tree.leaves(states[0].params))
    assert metrics[0]["reshard_bytes_per_device"] == 2 * size  # bf16
    for m in metrics:
        assert np.isfinite(m["loss"]) and 1 <= m["turns"] <= 4
        # Every batch's sampler/trainer mismatch under its bf16 copy, taken where it was played.
        assert 0 < m["logprob_mismatch_mean"] <= m["logprob_mismatch_max"] < 0.1


@pytest.mark.parametrize(
    "settings, field",
    [
        # Partial mode is built for conversations (tests/test_multiturn_partial.py).
        (dict(rollout_mode="partial", rollout_groups=1), "rollout_groups"),
        (dict(rollout_mode="async", max_staleness=-1), "max_staleness"),
        (dict(rollout_mode="async", generation_dtype="float16"), "generation_dtype"),
        (dict(rollout_mode="async", generation_mesh_shape=(3, 1, 1)), "generation_mesh_shape"),
        (dict(max_staleness=1), "max_staleness"),
    ],
)
def test_multiturn_rollout_config_errors_name_the_field(settings, field):
    from algos import multiturn

    with pytest.raises(ConfigError, match=f"^{field}:"):
        settings = dict(max_new_tokens=4, batch_size=2, group_size=4, **settings)
        rollout_modes.configure(multiturn.Config, settings, multiturn.check_rollout)


def test_multiturn_script_refuses_devices_that_do_not_split(tmp_path):
    """experiments/multiturn.py in async mode with meshes the 8 devices cannot hold: one line,
    exit 2, nothing written."""
    from tests.script_runs import run_script

    workdir = tmp_path / "run"
    result = run_script(
        "multiturn.py", "--config.rollout_mode=async", "--config.mesh_shape=(4,1,1)",
        "--config.generation_mesh_shape=(8,1,1)", "--config.batch_size=8",
        f"--workdir={workdir}", check=False,
    )  # fmt: skip
    assert result.returncode == 2, result.stderr[-3000:]
    (line,) = [line for line in result.stderr.splitlines() if line.strip()]
    assert line.startswith("error: config.generation_mesh_shape: ") and "4 + 8" in line, line
    assert not workdir.exists()
