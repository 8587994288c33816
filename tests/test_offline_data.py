"""Offline RL data (jaxrl.data's collect, episodes, rlds_builder, locate, rlds_reader and
transitions; experiments/collect.py): collect in JAX -> RLDS TFDS dataset -> flat transitions,
exactly; terminal vs time-limit semantics; errors for missing, corrupted and malformed data; host
batches and the in-JAX sampler; the script."""

import dataclasses
import importlib.util
import json
import os
import shutil
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import envs
from jaxrl.data import (
    CorruptDatasetError,
    DatasetNotFoundError,
    EpisodeDataError,
    Transitions,
    build_episode_dataset,
    collect,
    episodes_to_transitions,
    load_dataset_info,
    load_episodes,
    load_transitions,
    normalized_score,
    rlds_reader,
    sample_batch,
    sample_indices,
    to_device,
    transition_batches,
)
from jaxrl.data.episodes import RLDS_STEP_FIELDS

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def transition_rows(t):
    """Transitions as one float64 row each, for order-free exact comparison."""
    n = len(t.reward)
    columns = [
        np.asarray(t.obs, np.float64).reshape(n, -1),
        np.asarray(t.action, np.float64).reshape(n, -1),
        np.asarray(t.reward, np.float64)[:, None],
        np.asarray(t.next_obs, np.float64).reshape(n, -1),
        np.asarray(t.terminated, np.float64)[:, None],
    ]
    rows = np.concatenate(columns, axis=1)
    return rows[np.lexsort(rows.T[::-1])]


def rollout_transitions(record, steps_run):
    """Every valid step of a raw collection Record as a transition."""
    host = jax.tree.map(lambda x: np.asarray(x)[:steps_run], record)
    valid = host.valid.T.reshape(-1)  # env-major

    def flat(x):
        return np.swapaxes(x, 0, 1).reshape((-1,) + x.shape[2:])[valid]

    return Transitions(
        obs=flat(host.obs),
        action=flat(host.action),
        reward=flat(host.reward),
        next_obs=flat(host.next_obs),
        terminated=flat(host.terminated),
    )


def collect_raw(env, num_steps, num_envs, seed=0):
    policy = collect.random_policy(env.action_space)
    rollout = collect.make_rollout(
        env, lambda params, obs, key: policy(obs, key), num_envs, num_steps=num_steps
    )
    record, steps_run = rollout(None, jax.random.PRNGKey(seed))
    return record, int(steps_run)


@pytest.fixture(scope="module")
def pendulum(tmp_path_factory):
    """Pendulum (time limits only), cut to 10-step episodes: 4 envs x 24 steps."""
    env = envs.make("Pendulum-v1", max_steps_in_episode=10)
    record, steps_run = collect_raw(env, num_steps=95, num_envs=4)
    episodes = collect.split_episodes(record, steps_run, policy_name="random")
    data_dir = tmp_path_factory.mktemp("pendulum")
    path = build_episode_dataset(
        episodes,
        data_dir,
        "pendulum_v1/random",
        env_name="Pendulum-v1",
        policy="random",
        mixture="random",
        reference_min_return=-1200.0,
        reference_max_return=-150.0,
        metadata={"note": "test"},
    )
    return dict(record=record, steps_run=steps_run, episodes=episodes, path=path, dir=data_dir)


@pytest.fixture(scope="module")
def cartpole(tmp_path_factory):
    """CartPole (real terminations) with a 25-step limit, so both kinds of episode end occur."""
    env = envs.make("CartPole-v1", max_steps_in_episode=25)
    record, steps_run = collect_raw(env, num_steps=300, num_envs=3, seed=1)
    episodes = collect.split_episodes(record, steps_run)
    data_dir = tmp_path_factory.mktemp("cartpole")
    path = build_episode_dataset(episodes, data_dir, "cartpole", num_actions=2)
    return dict(record=record, steps_run=steps_run, episodes=episodes, path=path, dir=data_dir)


def assert_episodes_equal(expected, loaded):
    assert len(expected) == len(loaded)
    for a, b in zip(expected, loaded, strict=True):
        for key in ("observation", "action", "reward"):
            assert a[key].dtype == b[key].dtype and a[key].shape == b[key].shape, key
            np.testing.assert_array_equal(a[key], b[key])
        assert (a["terminal"], a["complete"]) == (b["terminal"], b["complete"])


# ---------------------------------------------------------------------------------------------
# Round trips


def test_pendulum_round_trip_truncation_is_not_terminal(pendulum):
    episodes, path = pendulum["episodes"], pendulum["path"]
    assert path == os.path.join(str(pendulum["dir"]), "pendulum_v1", "random", "1.0.0")
    # 24 steps per env: two 10-step episodes ended by the time limit, then a cut 4-step one.
    assert [len(e["reward"]) for e in episodes] == [10] * 8 + [4] * 4
    assert [e["complete"] for e in episodes] == [True] * 8 + [False] * 4
    assert not any(e["terminal"] for e in episodes)

    loaded = load_episodes(path)
    assert_episodes_equal(episodes, loaded)
    assert [e["policy"] for e in loaded] == ["random"] * 12
    assert [e["episode_id"] for e in loaded] == list(range(12))

    t = load_transitions("pendulum_v1/random", data_dir=pendulum["dir"])  # by name
    assert t.obs.shape == (96, 3) and t.action.shape == (96, 1) and t.obs.dtype == np.float32
    raw = rollout_transitions(pendulum["record"], pendulum["steps_run"])
    np.testing.assert_array_equal(transition_rows(t), transition_rows(raw))
    expected = episodes_to_transitions(episodes)  # same order as stored
    for field in dataclasses.fields(Transitions):
        np.testing.assert_array_equal(getattr(t, field.name), getattr(expected, field.name))
    assert not t.terminated.any()  # time limits are not terminations
    assert t.last.sum() == t.first.sum() == 12
    np.testing.assert_allclose(
        t.episode_returns(), [e["reward"].sum(dtype=np.float64) for e in episodes], rtol=1e-6
    )
    # A truncated episode ends on its true last observation, not the next episode's first.
    host = jax.tree.map(np.asarray, pendulum["record"])
    t_end, env_index = 9, 0
    assert host.truncated[t_end, env_index]
    assert not np.array_equal(host.next_obs[t_end, env_index], host.obs[t_end + 1, env_index])
    np.testing.assert_array_equal(episodes[0]["observation"][-1], host.next_obs[t_end, env_index])

    info = load_dataset_info(path)
    meta = info["metadata"]
    assert meta["env_name"] == "Pendulum-v1" and meta["observation_shape"] == [3]
    assert meta["action_shape"] == [1] and meta["discrete_actions"] is False
    assert (meta["num_episodes"], meta["num_complete_episodes"], meta["num_transitions"]) == (
        12,
        8,
        96,
    )
    assert meta["reference_min_return"] == -1200.0 and meta["note"] == "test"
    assert meta["mean_episode_return"] == pytest.approx(
        np.mean([e["reward"].sum(dtype=np.float64) for e in episodes[:8]])
    )
    assert info["splits"] == {"train": 12} and "Pendulum-v1" in info["description"]


def test_cartpole_terminations_and_stored_rlds_steps(cartpole):
    episodes, path = cartpole["episodes"], cartpole["path"]
    terminal = [e for e in episodes if e["terminal"]]
    timed_out = [e for e in episodes if e["complete"] and not e["terminal"]]
    assert terminal and timed_out  # both kinds of ending happen
    assert all(len(e["reward"]) == 25 for e in timed_out)  # exactly at the limit

    t = load_transitions(path)
    assert t.action.dtype == np.int32 and t.action.shape == (300,)  # discrete: int32 indices
    raw = rollout_transitions(cartpole["record"], cartpole["steps_run"])
    # Equal up to float32 rounding: jax 0.11 compiles the next observation the collector stores
    # and the one the rollout records into different kernels (1 ulp apart in 9 of 3,300 values).
    np.testing.assert_allclose(transition_rows(t), transition_rows(raw), rtol=1e-6, atol=0)
    assert t.terminated.sum() == len(terminal) == raw.terminated.sum()
    assert (t.terminated <= t.last).all()  # a termination only ever ends an episode
    assert_episodes_equal(episodes, load_episodes(path))

    # The stored RLDS form: L + 1 steps, the last one padding with is_last, is_terminal only
    # there and only for absorbing ends, discount 0 into a terminal state.
    import tensorflow_datasets as tfds

    source = tfds.builder_from_directory(path).as_data_source(split="train")
    for index, episode in enumerate(episodes):
        record = source[index]
        steps = rlds_reader._stack_steps(record["steps"])
        slow = rlds_reader._stack_rows([record["steps"][i] for i in range(len(record["steps"]))])
        for key in RLDS_STEP_FIELDS:  # the fast path equals step-by-step decoding
            np.testing.assert_array_equal(steps[key], slow[key])
        length = len(episode["reward"])
        assert len(steps["observation"]) == length + 1
        assert steps["is_first"].tolist() == [True] + [False] * length
        assert steps["is_last"].tolist() == [False] * length + [True]
        assert steps["is_terminal"].tolist() == [False] * length + [episode["terminal"]]
        assert steps["action"][-1] == 0 and steps["reward"][-1] == 0.0
        expected_discount = np.ones(length + 1, np.float32)
        expected_discount[-1] = 0.0
        if episode["terminal"]:
            expected_discount[-2] = 0.0
        np.testing.assert_array_equal(steps["discount"], expected_discount)
        assert bool(record["complete"]) == episode["complete"]


def test_collect_by_episodes():
    env = envs.make("CartPole-v1", max_steps_in_episode=40)
    episodes = collect.collect_episodes(
        env,
        collect.random_policy(env.action_space),
        jax.random.PRNGKey(3),
        num_episodes=5,
        num_envs=2,
        policy_name="random",
    )
    assert len(episodes) == 5 and all(e["complete"] for e in episodes)
    assert all(e["terminal"] or len(e["reward"]) == 40 for e in episodes)
    assert collect.episode_returns(episodes).shape == (5,)
    with pytest.raises(ValueError, match="exactly one of num_steps and num_episodes"):
        collect.collect_episodes(env, collect.random_policy(env.action_space), None, num_envs=2)


# ---------------------------------------------------------------------------------------------
# Errors


def test_missing_dataset_names_path_and_how_to_create(pendulum, tmp_path):
    missing = tmp_path / "nowhere"
    with pytest.raises(DatasetNotFoundError) as error:
        load_transitions(str(missing))
    assert str(missing) in str(error.value) and "experiments/collect.py" in str(error.value)
    with pytest.raises(DatasetNotFoundError) as error:
        load_transitions("pendulum_v1/expert", data_dir=tmp_path)
    message = str(error.value)
    assert str(tmp_path / "pendulum_v1" / "expert") in message and "collect.py" in message
    with pytest.raises(DatasetNotFoundError, match="data directory holding pendulum_v1/"):
        load_transitions(pendulum["dir"])  # a data_dir, not a dataset
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(DatasetNotFoundError, match="no built RLDS dataset"):
        load_transitions(empty)


def corrupt_copy(path, tmp_path, name):
    copy = tmp_path / name / "1.0.0"
    shutil.copytree(path, copy)
    shard = next(copy / f for f in os.listdir(copy) if ".array_record-" in f)
    return str(copy), str(shard)


def test_corrupted_dataset_names_file_and_says_rebuild(pendulum, tmp_path):
    copy, shard = corrupt_copy(pendulum["path"], tmp_path, "truncated")
    with open(shard, "r+b") as f:
        f.truncate(os.path.getsize(shard) // 2)
    with pytest.raises(CorruptDatasetError) as error:
        load_transitions(copy)
    message = str(error.value)
    assert message.startswith(shard) and "corrupted" in message and "rebuild" in message

    copy, shard = corrupt_copy(pendulum["path"], tmp_path, "garbage")
    with open(shard, "wb") as f:
        f.write(np.random.default_rng(0).bytes(70_000))
    with pytest.raises(CorruptDatasetError, match=f"^{shard}: .*corrupted.*rebuild"):
        load_transitions(copy)

    copy, shard = corrupt_copy(pendulum["path"], tmp_path, "no_shard")
    os.remove(shard)
    with pytest.raises(CorruptDatasetError, match=f"^{shard}: missing.*rebuild"):
        load_transitions(copy)

    copy, _ = corrupt_copy(pendulum["path"], tmp_path, "no_info")
    os.remove(os.path.join(copy, "dataset_info.json"))
    info = os.path.join(copy, "dataset_info.json")
    with pytest.raises(CorruptDatasetError, match=f"^{info}: missing.*corrupted.*rebuild"):
        load_transitions(copy)
    # Found through the name too, where the version directory is picked automatically.
    with pytest.raises(CorruptDatasetError, match="dataset_info.json: missing"):
        load_transitions(os.path.dirname(copy))

    copy, _ = corrupt_copy(pendulum["path"], tmp_path, "bad_info")
    with open(os.path.join(copy, "dataset_info.json"), "w") as f:
        f.write("{not json")
    with pytest.raises(CorruptDatasetError, match="dataset_info.json.*corrupted"):
        load_transitions(copy)


@pytest.mark.skipif(
    importlib.util.find_spec("tensorflow") is not None, reason="TensorFlow is installed"
)
def test_tfrecord_dataset_without_tensorflow_says_install(pendulum, tmp_path):
    copy = str(tmp_path / "tfrecord")
    shutil.copytree(pendulum["path"], copy)
    info_path = os.path.join(copy, "dataset_info.json")
    with open(info_path) as f:
        info = json.load(f)
    info["fileFormat"] = "tfrecord"  # how TFDS catalog datasets (e.g. d4rl_mujoco_*) are stored
    with open(info_path, "w") as f:
        json.dump(info, f)
    with pytest.raises(ImportError, match="pip install tensorflow"):
        load_transitions(copy)


def episode(length=3, obs_dim=2, act_dim=1):
    rng = np.random.default_rng(length)
    return {
        "observation": rng.normal(size=(length + 1, obs_dim)),
        "action": rng.normal(size=(length, act_dim)),
        "reward": rng.normal(size=length),
        "terminal": False,
    }


@pytest.mark.parametrize(
    "field, value, problem",
    [
        ("reward", lambda e: np.r_[e["reward"][:-1], np.nan], "field 'reward' has a non-finite"),
        ("observation", lambda e: e["observation"][:, :1], "field 'observation' has per-step"),
        ("action", lambda e: e["action"][:-1], "field 'action' has shape (2, 1); expected 3"),
        ("reward", lambda e: e["reward"][:, None], "field 'reward' has shape (3, 1)"),
        ("action", lambda e: np.zeros(3, np.int32), "field 'action' is discrete"),
        ("terminal", lambda e: [True, False], "field 'terminal' must be one bool"),
        ("observation", lambda e: e["observation"][:1], "field 'observation' has 1 row"),
    ],
)
def test_malformed_episode_names_index_and_field(tmp_path, field, value, problem):
    episodes = [episode(3), episode(3), episode(3)]
    episodes[2][field] = value(episodes[2])
    with pytest.raises(EpisodeDataError) as error:
        build_episode_dataset(episodes, tmp_path / "data", "bad")
    assert str(error.value).startswith("episode 2: ") and problem in str(error.value)
    assert not (tmp_path / "data").exists()  # checked before anything is written
    missing = [episode(3), {k: v for k, v in episode(3).items() if k != "terminal"}]
    with pytest.raises(EpisodeDataError, match="^episode 1: missing field 'terminal'"):
        build_episode_dataset(missing, tmp_path / "data", "bad")


def test_existing_dataset_needs_overwrite(pendulum):
    with pytest.raises(FileExistsError, match="already exists.*overwrite"):
        build_episode_dataset(pendulum["episodes"], pendulum["dir"], "pendulum_v1/random")


def test_user_files_npz_and_jsonl(tmp_path):
    rng = np.random.default_rng(0)
    n = 9
    flat = dict(
        observations=rng.normal(size=(n, 2)).astype(np.float32),
        actions=rng.normal(size=(n, 1)).astype(np.float32),
        rewards=rng.normal(size=n).astype(np.float32),
        terminals=np.array([0, 0, 1, 0, 0, 0, 0, 0, 0], bool),
        timeouts=np.array([0, 0, 0, 0, 0, 1, 0, 0, 0], bool),
    )
    np.savez(tmp_path / "flat.npz", **flat)
    t = load_transitions(build_episode_dataset(str(tmp_path / "flat.npz"), tmp_path, "a"))
    # Without next_observations the time-limit end and the final cut lose their last transition.
    assert len(t.reward) == 3 + 2 + 2
    assert t.terminated.tolist() == [False, False, True, False, False, False, False]
    np.testing.assert_array_equal(t.next_obs[3:5], flat["observations"][4:6])

    next_obs = rng.normal(size=(n, 2)).astype(np.float32)
    np.savez(tmp_path / "next.npz", **flat, next_observations=next_obs)
    t = load_transitions(build_episode_dataset(str(tmp_path / "next.npz"), tmp_path, "b"))
    assert len(t.reward) == n and t.terminated.sum() == 1 and t.last.sum() == 3
    np.testing.assert_array_equal(t.next_obs[t.last], next_obs[[2, 5, 8]])
    np.testing.assert_array_equal(t.obs, flat["observations"])

    lines = [{k: np.asarray(v).tolist() for k, v in episode(2).items()}, {"observation": [[1]]}]
    (tmp_path / "eps.jsonl").write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    with pytest.raises(EpisodeDataError, match=r"eps.jsonl:2: episode 1: missing field"):
        build_episode_dataset(str(tmp_path / "eps.jsonl"), tmp_path, "c")


# ---------------------------------------------------------------------------------------------
# Batches and the in-JAX sampler


def test_batches_fixed_shape_and_deterministic(cartpole):
    t = load_transitions(cartpole["path"])
    first = list(transition_batches(t, 64, key_or_seed=7, epochs=2))
    again = list(transition_batches(t, 64, key_or_seed=jax.random.PRNGKey(7)))
    other = list(transition_batches(t, 64, key_or_seed=8))
    assert len(first) == 2 * (300 // 64)
    for batch in first:
        assert isinstance(batch, Transitions)
        assert batch.obs.shape == (64, 4) and batch.action.shape == (64,)
        assert batch.reward.shape == batch.terminated.shape == batch.first.shape == (64,)
    second = list(transition_batches(t, 64, key_or_seed=7, epochs=2))
    for a, b in zip(first, second, strict=True):
        for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
            np.testing.assert_array_equal(x, y)
    assert not np.array_equal(first[0].obs, other[0].obs)
    assert len(again) == 4
    # Within one pass, no transition repeats.
    rows = np.concatenate([np.c_[b.obs, b.next_obs] for b in first[:4]])
    assert len(np.unique(rows, axis=0)) == 256


def test_in_jax_sampler_inside_compiled_loop(cartpole):
    t = load_transitions(cartpole["path"])
    data = to_device(t)
    assert isinstance(data.obs, jax.Array)

    @jax.jit
    def chunk(data, key):
        def body(total, k):
            batch = sample_batch(data, k, 32)
            return total + batch.reward.sum(), batch

        return jax.lax.scan(body, jnp.zeros(()), jax.random.split(key, 5))

    total, batches = chunk(data, jax.random.PRNGKey(0))
    assert batches.obs.shape == (5, 32, 4) and batches.action.dtype == jnp.int32
    _, again = chunk(data, jax.random.PRNGKey(0))
    np.testing.assert_array_equal(np.asarray(batches.obs), np.asarray(again.obs))
    # Every sampled row is a whole transition of the dataset (fields indexed together).
    index = np.asarray(sample_indices(jax.random.PRNGKey(1), len(t.reward), 1000))
    assert index.min() >= 0 and index.max() < len(t.reward) and len(np.unique(index)) > 250
    sample = sample_batch(data, jax.random.PRNGKey(1), 1000)
    np.testing.assert_array_equal(np.asarray(sample.next_obs), t.next_obs[index])
    np.testing.assert_array_equal(np.asarray(sample.terminated), t.terminated[index])
    vmapped = jax.vmap(lambda k: sample_batch(data, k, 8))(jax.random.split(jax.random.key(2), 3))
    assert vmapped.obs.shape == (3, 8, 4)
    assert normalized_score(-675.0, -1200.0, -150.0) == pytest.approx(50.0)


# ---------------------------------------------------------------------------------------------
# Behaviour policies from a run directory, and the script


def fake_ppo_run(run_dir):
    """A finished-looking experiments/ppo.py run directory: config.json, summary.json and two
    checkpoints (initial parameters, then shifted), without spending time on training."""
    from algos import ppo
    from jaxrl.checkpoint import Checkpointer
    from jaxrl.trainers import offline_sources

    config = ppo.Config(
        env_name="Pendulum-v1",
        num_envs=2,
        rollout_length=8,
        num_minibatches=1,
        total_timesteps=16,
        normalize_observations=True,
    )
    saved = {**dataclasses.asdict(config), "run": {"num_chunks": 2}, "num_seeds": 2, "seed": 0}
    os.makedirs(run_dir)
    with open(os.path.join(run_dir, "config.json"), "w") as f:
        json.dump(saved, f)
    with open(os.path.join(run_dir, "summary.json"), "w") as f:
        json.dump({"algo": "ppo", "env": "Pendulum-v1", "num_seeds": 2}, f)
    # The loader's (cached) initial states: the same as experiments/ppo.py's, compiled once here.
    states = offline_sources.initial_states("ppo", config, 0, 2)
    checkpointer = Checkpointer(os.path.join(run_dir, "checkpoints"), keep=10)
    checkpointer.save(1, states, {"step": 1})
    shifted = states.replace(params=jax.tree.map(lambda p: p + 1.0, states.params))
    checkpointer.save(2, shifted, {"step": 2})
    checkpointer.close()
    return states, shifted


def test_ppo_run_policy_medium_replay(tmp_path):
    from jaxrl.trainers import offline_sources

    run_dir = str(tmp_path / "ppo-run")
    states, shifted = fake_ppo_run(run_dir)
    policy = offline_sources.load_run_policy(run_dir, seed_index=1)
    assert (policy.algo, policy.env_name, policy.steps) == ("ppo", "Pendulum-v1", [1, 2])
    restored = policy.state(2)
    for a, b in zip(jax.tree.leaves(restored.params), jax.tree.leaves(shifted.params), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b)[1])

    env = offline_sources.make_env("Pendulum-v1", max_episode_steps=5)
    sources = offline_sources.plan_mixture("medium-replay", env, 60, policy, None)
    assert [s.label.rsplit("@", 1)[1] for s in sources] == ["0", "1", "2"]
    assert [s.num_steps for s in sources] == [20, 20, 20]
    episodes = offline_sources.collect_sources(env, sources, jax.random.PRNGKey(0), num_envs=2)
    assert sum(len(e["reward"]) for e in episodes) == 60
    assert [e["policy"] for e in episodes[::4]] == [s.label for s in sources]
    low, high = float(env.action_space.low), float(env.action_space.high)
    actions = np.concatenate([e["action"] for e in episodes])
    assert actions.min() >= low and actions.max() <= high  # executed (clipped) actions
    assert len(np.unique(actions)) > 20  # sampled, not the deterministic mode

    with pytest.raises(offline_sources.PolicyError, match="collects with a trained policy"):
        offline_sources.plan_mixture("medium", env, 60, None, None)
    with pytest.raises(offline_sources.PolicyError, match="uses uniform random actions"):
        offline_sources.plan_mixture("random", env, 60, policy, None)
    with pytest.raises(offline_sources.PolicyError, match="needs --expert_policy"):
        offline_sources.plan_mixture("medium-expert", env, 60, policy, None)
    with pytest.raises(offline_sources.PolicyError, match="no summary.json"):
        offline_sources.load_run_policy(str(tmp_path))
    with pytest.raises(offline_sources.PolicyError, match="--policy_seed=2: .* trained 2 seed"):
        offline_sources.load_run_policy(run_dir, seed_index=2)


def run_collect(*args):
    return subprocess.run(
        [sys.executable, os.path.join(REPO, "experiments", "collect.py"), *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
    )


def test_collect_script_random_policy(tmp_path):
    flags = [
        "--env=CartPole-v1",
        "--num_steps=200",
        "--num_envs=2",
        "--max_episode_steps=50",
        f"--data_dir={tmp_path}",
    ]
    result = run_collect(*flags)
    assert result.returncode == 0, result.stderr[-3000:]
    path = os.path.join(str(tmp_path), "cartpole_v1", "random", "1.0.0")
    lines = result.stdout.splitlines()
    assert lines[0] == f"Dataset: {path}"
    t = load_transitions("cartpole_v1/random", data_dir=tmp_path)
    episodes = load_episodes(path)
    assert lines[1].startswith(f"episodes: {len(episodes)} (") and "transitions: 200" in lines[1]
    complete = [e["reward"].sum(dtype=np.float64) for e in episodes if e["complete"]]
    assert f"mean return of {len(complete)} complete episodes): {np.mean(complete):.2f}" in lines[2]
    assert len(t.reward) == 200 and t.terminated.sum() == sum(e["terminal"] for e in episodes)
    meta = load_dataset_info(path)["metadata"]
    assert (meta["mixture"], meta["policy"], meta["num_actions"]) == ("random", "random", 2)
    assert meta["max_episode_steps"] == 50
