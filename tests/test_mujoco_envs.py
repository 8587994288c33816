"""MJX HalfCheetah-v5 / Hopper-v5 against Gymnasium's C-MuJoCo environments, and their plumbing.

How the comparison is built, and why. Gymnasium runs 300 steps with uniform random actions from a
fixed NumPy seed (Hopper resets after each termination). Our environment replays the same actions
from Gymnasium's states, re-synchronised (`reset_to(qpos, qvel)`) every WINDOW steps and at every
episode start, and runs freely in between; every one of the 300 steps is compared (observation,
reward, terminated, truncated), and so is the observation of every synchronised state.

Re-synchronising is not a way round a bug: these systems are chaotic. C MuJoCo against itself,
with 1e-12 added to one initial velocity, is 1e-5 apart after 50 HalfCheetah steps and O(1) apart
after 75; a float64 MJX run diverges from C at the same rate. No implementation that is not
bit-identical can follow a random-action trajectory for hundreds of steps. Within a window of
25 steps float64 MJX stays within 5e-9 of C in observations (measured, both tasks); rewards
within 5e-8, because Gymnasium computes the control cost of a float32 action in float32.

Precision: the exact comparison runs with `jax_enable_x64` in a subprocess (x64 is process-wide),
both tasks at once so that they overlap the in-process tests. The default float32 path is checked
through `make_vec` (jit + vmap + wrappers) one step from Gymnasium's states, at a tolerance that
float32 can meet for HalfCheetah: near a contact event its one-step map amplifies rounding
~1e3-fold (C MuJoCo fed float32-rounded states moves by ~7e-5), and float32 MJX differs by up to
~5e-4 in a joint velocity there. (Float32 Hopper meets 1e-4 even in 25-step windows: ~1e-5.)
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import io
import json
import os
import subprocess
import sys

import numpy as np
import pytest

with contextlib.redirect_stdout(io.StringIO()):  # MJX prints "Failed to import warp"
    pytest.importorskip("mujoco.mjx")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import envs  # noqa: E402
from envs import mujoco as mj_envs  # noqa: E402

NAMES = ["HalfCheetah-v5", "Hopper-v5"]
SHAPES = {"HalfCheetah-v5": (17, 6), "Hopper-v5": (11, 3)}
STEPS = 300
WINDOW = 25
SEED = 0
TOLERANCE = 1e-4  # absolute, on every observation entry and reward (float64 comparison)
FLOAT32_TOLERANCE = 2e-3  # one float32 step from Gymnasium's states; measured max ~5e-4

# The reference: Gymnasium's own MuJoCo environments import imageio (their rendering extra).
HAS_REFERENCE = importlib.util.find_spec("imageio") is not None
needs_reference = pytest.mark.skipif(
    not HAS_REFERENCE,
    reason="Gymnasium's MuJoCo envs need imageio: pip install 'gymnasium[mujoco]'",
)


def gymnasium_rollout(name: str, steps: int, seed: int) -> dict[str, np.ndarray]:
    """Run Gymnasium's C-MuJoCo environment with random actions, recording the state before each
    step, the step's outputs, and which steps begin an episode."""
    import gymnasium as gym

    with mj_envs.mujoco_warnings_as_python_warnings():  # no MUJOCO_LOG.TXT in the cwd
        env = gym.make(name)  # with Gymnasium's TimeLimit(1000) wrapper
    inner = env.unwrapped
    rng = np.random.default_rng(seed)
    obs, _ = env.reset(seed=seed)
    keys = ("qpos", "qvel", "obs_before", "action", "obs", "reward", "terminated", "truncated")
    record: dict[str, list] = {key: [] for key in (*keys, "episode_start")}
    episode_start = True
    for _ in range(steps):
        record["qpos"].append(inner.data.qpos.copy())
        record["qvel"].append(inner.data.qvel.copy())
        record["obs_before"].append(obs)
        record["episode_start"].append(episode_start)
        action = rng.uniform(env.action_space.low, env.action_space.high).astype(np.float32)
        obs, reward, terminated, truncated, _ = env.step(action)
        for key, value in zip(keys[3:], (action, obs, reward, terminated, truncated), strict=True):
            record[key].append(value)
        episode_start = terminated or truncated
        if episode_start:
            obs, _ = env.reset()
    env.close()
    return {key: np.asarray(value) for key, value in record.items()}


def compare_with_gymnasium(
    name: str, steps: int = STEPS, window: int = WINDOW, seed: int = SEED
) -> dict[str, list]:
    """Per-step absolute errors of our environment against Gymnasium (see the module docstring),
    in whatever precision this process runs."""
    ref = gymnasium_rollout(name, steps, seed)
    env = envs.make(name)
    episode_starts = np.flatnonzero(ref["episode_start"])
    starts = np.array(sorted(set(range(0, steps, window)) | set(episode_starts.tolist())))
    offsets = np.arange(window)
    action_index = np.minimum(starts[:, None] + offsets[None, :], steps - 1)

    def rollout(qpos, qvel, actions):
        obs0, state = env.reset_to(qpos, qvel)

        def body(state, action):
            result = env.step(jax.random.PRNGKey(0), state, action)
            outputs = (result.obs, result.reward, result.terminated, result.truncated)
            return result.state, outputs

        _, outputs = jax.lax.scan(body, state, actions)
        return obs0, outputs

    # lax.map, not vmap: one unbatched MJX step compiles in ~2/3 of the time (a 2-core CI budget).
    windows = (ref["qpos"][starts], ref["qvel"][starts], ref["action"][action_index])
    obs0, (obs, reward, terminated, truncated) = jax.jit(
        lambda windows: jax.lax.map(lambda window: rollout(*window), windows)
    )(windows)
    # Step t is covered by the latest window starting at or before it.
    which = np.searchsorted(starts, np.arange(steps), side="right") - 1
    offset = np.arange(steps) - starts[which]
    obs, reward = np.asarray(obs)[which, offset], np.asarray(reward)[which, offset]
    terminated, truncated = (
        np.asarray(terminated)[which, offset],
        np.asarray(truncated)[which, offset],
    )
    return {
        "dtype": str(np.asarray(obs).dtype),
        "offset": offset.tolist(),
        "obs_err": np.abs(obs - ref["obs"]).max(axis=1).tolist(),
        "reward_err": np.abs(reward - ref["reward"]).tolist(),
        "terminated_ours": terminated.tolist(),
        "terminated_ref": ref["terminated"].tolist(),
        "truncated_ours": truncated.tolist(),
        "synced_obs_err": np.abs(np.asarray(obs0) - ref["obs_before"][starts]).max().item(),
        "episodes": int(len(episode_starts)),
    }


@pytest.fixture(scope="module", autouse=True)
def float64_runs(request):
    """Start the float64 comparison of each task in its own subprocess as soon as this module's
    tests begin, so that their compilation overlaps the in-process tests (CI has 2 cores)."""
    selected = any(item.name.startswith("test_matches_gymnasium") for item in request.session.items)
    if not (selected and HAS_REFERENCE):
        yield {}
        return
    repo_root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, JAX_ENABLE_X64="1", JAX_PLATFORMS="cpu")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [repo_root, env.get("PYTHONPATH")]))
    env.pop("XLA_FLAGS", None)  # the 8 simulated devices of conftest are not needed there
    procs = {
        name: subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), name],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name in NAMES
    }
    yield procs
    for proc in procs.values():
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def float64_result(procs: dict, name: str) -> dict:
    out, err = procs[name].communicate(timeout=900)
    assert procs[name].returncode == 0, f"{name} float64 comparison failed:\n{err[-4000:]}"
    return json.loads(out.strip().splitlines()[-1])


def test_registry_and_spaces_and_traced_shapes():
    """Names, spaces, and the shapes/dtypes of the make_vec stack, traced (not compiled)."""
    names = envs.registered()
    key = jax.random.PRNGKey(0)
    for name in NAMES:
        assert name in names
        env = envs.make(name)
        obs_dim, act_dim = SHAPES[name]
        assert env.name == name and env.max_episode_steps == 1000
        assert env.observation_space.shape == (obs_dim,)
        assert env.action_space.shape == (act_dim,)
        np.testing.assert_array_equal(env.action_space.low, -np.ones(act_dim))
        np.testing.assert_array_equal(env.action_space.high, np.ones(act_dim))
        venv = envs.make_vec(name, num_envs=3)
        obs, state = jax.eval_shape(venv.reset, key)
        assert obs.shape == (3, obs_dim) and obs.dtype == jnp.float32
        if name == "Hopper-v5":  # HalfCheetah's stack is compiled and run below
            result = jax.eval_shape(venv.step, key, state, jnp.zeros((3, act_dim)))
            assert result.obs.shape == result.info["final_obs"].shape == (3, obs_dim)
            assert result.reward.shape == result.terminated.shape == (3,)
            assert result.reward.dtype == jnp.float32 and result.terminated.dtype == jnp.bool_
    with pytest.raises(ValueError, match="ctrl_cost_weight"):
        envs.make("Hopper-v5", ctrl_cost=0.1)
    assert envs.make("Hopper-v5", ctrl_cost_weight=0.5).ctrl_cost_weight == 0.5


def test_missing_extra_is_explained(monkeypatch):
    monkeypatch.setattr(mj_envs, "mjx_available", lambda: False)
    assert not set(NAMES) & set(envs.registered())
    with pytest.raises(ImportError, match=r'pip install "jaxrl\[mujoco\]"'):
        envs.make("HalfCheetah-v5")


@needs_reference
def test_make_vec_jit_vmap_float32_time_limit_and_one_step():
    """The default float32 path through the training stack, compiled once: 16 Gymnasium states
    (spread over 300 steps) on their 1000th step take one jitted, vmapped step. Checks float32
    agreement of the final observation and reward, truncation (not termination) at the time
    limit, and the auto-reset observations' shape and noise."""
    name, num = "HalfCheetah-v5", 16
    obs_dim, act_dim = SHAPES[name]
    every = STEPS // num
    ref = {key: value[::every][:num] for key, value in gymnasium_rollout(name, STEPS, SEED).items()}
    # forward=False: no separate mj_forward program to compile; step() begins with one anyway.
    start = functools.partial(envs.make(name).reset_to, step_count=999, forward=False)
    obs, inner = jax.vmap(start)(ref["qpos"], ref["qvel"])
    np.testing.assert_allclose(obs, ref["obs_before"], rtol=0, atol=1e-6)
    zeros_f, zeros_i = jnp.zeros(num), jnp.zeros(num, jnp.int32)
    state = envs.EpisodeStatisticsState(inner, zeros_f, zeros_i, zeros_f, zeros_i)

    venv = envs.make_vec(name, num_envs=num)
    assert venv.action_space.shape == (act_dim,)
    result = jax.jit(venv.step)(jax.random.PRNGKey(1), state, jnp.asarray(ref["action"]))
    final_obs = result.info["final_obs"]
    assert result.obs.shape == final_obs.shape == (num, obs_dim)
    assert result.obs.dtype == final_obs.dtype == result.reward.dtype == jnp.float32
    assert result.reward.shape == result.terminated.shape == result.truncated.shape == (num,)
    np.testing.assert_allclose(final_obs, ref["obs"], rtol=0, atol=FLOAT32_TOLERANCE)
    np.testing.assert_allclose(result.reward, ref["reward"], rtol=0, atol=FLOAT32_TOLERANCE)
    assert np.all(result.truncated) and not np.any(result.terminated)
    # Auto-reset: qpos0 is zero, positions within the uniform noise, velocities ~ 0.1 * N(0, 1).
    assert np.all(np.abs(result.obs[:, :8]) <= 0.1)
    assert 0.05 < float(jnp.std(result.obs[:, 8:])) < 0.2
    assert np.all(result.state.inner.step_count == 0)


@needs_reference
@pytest.mark.parametrize("name", NAMES)
def test_matches_gymnasium_in_float64(float64_runs, name):
    result = float64_result(float64_runs, name)
    assert result["dtype"] == "float64"
    obs_err, reward_err = np.array(result["obs_err"]), np.array(result["reward_err"])
    assert len(obs_err) == STEPS
    assert result["synced_obs_err"] < TOLERANCE
    bad = np.flatnonzero((obs_err > TOLERANCE) | (reward_err > TOLERANCE))
    assert bad.size == 0, (
        f"steps {bad.tolist()[:10]} differ: obs {obs_err[bad][:10]}, reward {reward_err[bad][:10]}"
    )
    assert result["terminated_ours"] == result["terminated_ref"]
    assert not any(result["truncated_ours"])  # 300 < 1000 steps, and never when terminated
    if name == "Hopper-v5":
        assert result["episodes"] > 1  # random actions topple the hopper: terminations compared


if __name__ == "__main__":
    # Subprocess entry of the `float64_runs` fixture: print one task's comparison as JSON.
    print(json.dumps(compare_with_gymnasium(sys.argv[1])))
