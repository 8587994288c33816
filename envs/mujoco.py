"""MuJoCo locomotion in JAX: HalfCheetah-v5 and Hopper-v5 simulated by MJX.

Why MJX: MuJoCo's JAX port steps the physics inside the XLA program, so these environments jit,
vmap and compile into `train(key)` like every gymnax environment, instead of calling the C
simulator through a host callback. MJX is built for accelerators: on a CPU, C MuJoCo (Gymnasium)
is faster per environment step; see `ls_iterations` below for the main CPU cost.

Why Gymnasium's models and formulas: results should be comparable with the published v5 numbers.
The models are the very XML files Gymnasium ships (found through the installed package, never
copied), compiled by the same C `mujoco` that Gymnasium uses; observation, reward, termination,
reset noise and the 1000-step time limit follow `gymnasium/envs/mujoco/{half_cheetah,hopper}_v5.py`.
The physics options (integrator: Euler for HalfCheetah, RK4 for Hopper; timestep; Newton solver,
iterations, tolerance, pyramidal cone, warm start) come from the compiled `MjModel` unchanged:
MJX reads `opt` from it, so nothing had to be matched by hand.

Accuracy, measured by `tests/test_mujoco_envs.py` against Gymnasium along random-action runs:
- float64 (`jax_enable_x64`): one environment step agrees with C MuJoCo to ~3e-13.
- float32 (the default): Hopper ~5e-6 per step, still ~1e-5 after 25 free-running steps.
  HalfCheetah: up to ~5e-4 in a joint velocity for one step taken near a contact event, where the
  one-step map amplifies rounding ~1e3-fold (C MuJoCo itself, fed float32-rounded states, moves
  by ~7e-5 there).
- Long runs of any two implementations separate: these systems are chaotic. Two C runs whose
  initial velocities differ by 1e-12 are 1e-5 apart after 50 random-action HalfCheetah steps and
  O(1) apart after 75; float64 MJX leaves C at that same rate. This is physics, not an error;
  what carries over is the statistics (returns), not one trajectory.

`mujoco` and `mujoco-mjx` are an optional extra (`pip install "jaxrl[mujoco]"`) and are imported
only when an environment is built, so `import envs` works without them.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import inspect
import io
import os
import sys
import warnings
from collections.abc import Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct
from gymnax.environments import spaces

from envs.core import StepResult

INSTALL_HINT = (
    'MuJoCo environments need the optional extra: pip install "jaxrl[mujoco]" -c constraints.txt '
    "(it installs mujoco and mujoco-mjx at the versions pinned in constraints.txt; the two must "
    "be the same release, and mujoco-mjx must work with the installed jax)."
)


def mjx_available() -> bool:
    """Whether `mujoco.mjx` can be found, decided without importing it (importing loads the C
    library and MJX's JAX code: too slow for `envs.registered()`)."""
    spec = importlib.util.find_spec("mujoco")
    if spec is None or not spec.submodule_search_locations:
        return False
    return any(
        os.path.isfile(os.path.join(path, "mjx", "__init__.py"))
        for path in spec.submodule_search_locations
    )


@functools.cache
def _import_mujoco() -> tuple[Any, Any]:
    """Import `mujoco` and `mujoco.mjx` on first use, else raise an ImportError naming the fix.

    MJX prints "Failed to import warp" on import when the optional NVIDIA Warp backend is absent;
    we only use MJX's JAX backend, so those lines are dropped and any other output is passed on.
    """
    captured = io.StringIO()
    try:
        with contextlib.redirect_stdout(captured):
            import mujoco
            from mujoco import mjx
    except ImportError as error:
        raise ImportError(f"{INSTALL_HINT} (import failed: {error})") from error
    finally:
        for line in captured.getvalue().splitlines(keepends=True):
            if not line.startswith(("Failed to import warp", "Failed to import mujoco_warp")):
                sys.stdout.write(line)
    return mujoco, mjx


@contextlib.contextmanager
def mujoco_warnings_as_python_warnings() -> Iterator[None]:
    """Route C MuJoCo's warnings to Python's `warnings` while the block runs.

    By default MuJoCo prints each warning and appends it to MUJOCO_LOG.TXT in the working
    directory. Gymnasium's half_cheetah.xml uses the deprecated `settotalmass`, so every model
    compile (ours and Gymnasium's own) would leave that file behind. That warning is dropped: the
    XML is Gymnasium's, users cannot act on it, and the attribute still takes effect. Others are
    raised as RuntimeWarning.
    """
    mujoco, _ = _import_mujoco()
    previous = mujoco.get_mju_user_warning()

    def handler(message: str) -> None:
        if "'settotalmass' is deprecated" not in message:
            warnings.warn(f"MuJoCo: {message}", RuntimeWarning, stacklevel=2)

    mujoco.set_mju_user_warning(handler)
    try:
        yield
    finally:
        mujoco.set_mju_user_warning(previous)


def gymnasium_asset(xml_file: str) -> str:
    """Path of a model XML shipped inside the installed Gymnasium package.

    Found through the package's location rather than by importing `gymnasium.envs.mujoco`, which
    needs Gymnasium's own MuJoCo extras (imageio, for rendering) that simulation does not use.
    """
    spec = importlib.util.find_spec("gymnasium")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("gymnasium is not installed; its MuJoCo model files are needed.")
    for root in spec.submodule_search_locations:
        path = os.path.join(root, "envs", "mujoco", "assets", xml_file)
        if os.path.isfile(path):
            return path
    raise FileNotFoundError(f"{xml_file} not found under the installed gymnasium package.")


@struct.dataclass
class MujocoState:
    """Environment state: the full MJX simulation data and the steps taken in this episode.

    `data` carries everything the next step depends on (including the solver's warm start), so a
    state can be vmapped, selected with `jnp.where` by `AutoReset`, and checkpointed as a pytree.
    """

    data: Any  # mujoco.mjx.Data
    step_count: jax.Array  # int32


class MujocoEnv:
    """Shared machinery of the MJX locomotion tasks; subclasses define observation and reward.

    The simulated dtype is JAX's default float dtype when the environment is built (float32, or
    float64 under `jax_enable_x64`); observations and rewards come out in that dtype.
    """

    xml_file: str = ""

    def __init__(
        self,
        name: str,
        *,
        frame_skip: int,
        forward_reward_weight: float,
        ctrl_cost_weight: float,
        reset_noise_scale: float,
        max_episode_steps: int = 1000,
        solver_iterations: int | None = None,
        ls_iterations: int | None = None,
    ):
        mujoco, mjx = _import_mujoco()
        self._mjx = mjx
        self.name = name
        self.frame_skip = int(frame_skip)
        self.forward_reward_weight = float(forward_reward_weight)
        self.ctrl_cost_weight = float(ctrl_cost_weight)
        self.reset_noise_scale = float(reset_noise_scale)
        self._max_episode_steps = int(max_episode_steps)

        with mujoco_warnings_as_python_warnings():
            self.mj_model = mujoco.MjModel.from_xml_path(gymnasium_asset(self.xml_file))
        # Speed knobs, off by default (None keeps the XML's values, i.e. Gymnasium's physics).
        # Under vmap, MJX's line search runs all `ls_iterations` (50) of its steps for every
        # env (a batched loop cannot skip the converged ones): with ls_iterations=8, 128 vmapped
        # HalfCheetahs stepped ~2.7x faster on CPU, and one float64 step still matched C MuJoCo
        # to 3e-13 along our test trajectories (a search needing more steps would differ).
        if solver_iterations is not None:
            self.mj_model.opt.iterations = int(solver_iterations)
        if ls_iterations is not None:
            self.mj_model.opt.ls_iterations = int(ls_iterations)
        # impl="jax": the state must be a plain JAX pytree (the Warp backend keeps it elsewhere).
        self.mjx_model = mjx.put_model(self.mj_model, impl="jax")
        # Fresh data as after mj_resetData: ctrl, qacc_warmstart and time are zero.
        self._data0 = mjx.make_data(self.mjx_model, impl="jax")
        self.dtype = self._data0.qpos.dtype
        self.init_qpos = jnp.asarray(self.mj_model.qpos0, self.dtype)
        self.init_qvel = jnp.zeros(self.mj_model.nv, self.dtype)
        # Gymnasium's dt: the time one env step covers (forward velocity divides by it).
        self.dt = float(self.mj_model.opt.timestep) * self.frame_skip
        ctrlrange = np.asarray(self.mj_model.actuator_ctrlrange, np.float32)
        self._action_space = spaces.Box(
            low=jnp.asarray(ctrlrange[:, 0]),
            high=jnp.asarray(ctrlrange[:, 1]),
            shape=(self.mj_model.nu,),
            dtype=jnp.float32,
        )
        obs_dim = self.mj_model.nq - 1 + self.mj_model.nv  # x position left out, as in v5
        self._observation_space = spaces.Box(-jnp.inf, jnp.inf, (obs_dim,), self.dtype)

    # ------------------------------------------------------------------ interface of envs.core

    def reset(self, key: jax.Array) -> tuple[jax.Array, MujocoState]:
        """Sample an initial state around the model's rest pose (`qpos0`, zero velocity)."""
        qpos, qvel = self._reset_noise(key)
        return self.reset_to(qpos, qvel)

    def reset_to(
        self,
        qpos: jax.Array,
        qvel: jax.Array,
        step_count: int | jax.Array = 0,
        *,
        forward: bool = True,
    ) -> tuple[jax.Array, MujocoState]:
        """Start from given joint positions and velocities, like Gymnasium's `set_state` after
        `mj_resetData`: other data is fresh, derived quantities come from `mj_forward`.

        Used to replay or compare against Gymnasium (the tests), or to start from chosen states;
        `step_count` starts the episode clock elsewhere than 0 (e.g. to test the time limit).
        `forward=False` skips `mj_forward`, a large program to compile: the observation and the
        next `step` are unchanged (every physics step begins with `mj_forward`), but derived
        fields of `state.data` (body positions, contacts, ...) stay stale until that step.
        """
        data = self._data0.replace(
            qpos=jnp.asarray(qpos, self.dtype), qvel=jnp.asarray(qvel, self.dtype)
        )
        if forward:
            data = self._mjx.forward(self.mjx_model, data)
        state = MujocoState(data=data, step_count=jnp.asarray(step_count, jnp.int32))
        return self._observation(data), state

    def step(self, key: jax.Array, state: MujocoState, action: jax.Array) -> StepResult:
        """Apply `action` as the actuator controls for `frame_skip` physics steps.

        The physics clamps controls into ctrlrange (the actuators are ctrllimited) while the
        control cost uses the action as given, exactly as Gymnasium does.
        """
        del key  # the dynamics are deterministic
        action = jnp.asarray(action, self.dtype)
        before = state.data
        data = before.replace(ctrl=action)
        # A loop, not `frame_skip` inlined copies: one MJX step is a large program to compile.
        data = jax.lax.fori_loop(
            0, self.frame_skip, lambda _, d: self._mjx.step(self.mjx_model, d), data
        )
        # Gymnasium then calls mj_rnePostConstraint, which fills cacc/cfrc_*: only contact-force
        # observations (Ant, Humanoid) read those, so it is skipped here.
        x_velocity = (data.qpos[0] - before.qpos[0]) / self.dt
        reward, terminated, info = self._reward(data, action, x_velocity)
        step_count = state.step_count + 1
        # Gymnasium's TimeLimit: truncated once max_episode_steps steps were taken, unless the
        # same step terminated (a true terminal is never bootstrapped).
        truncated = jnp.logical_and(
            step_count >= self._max_episode_steps, jnp.logical_not(terminated)
        )
        info = {"x_position": data.qpos[0], "x_velocity": x_velocity, **info}
        return StepResult(
            obs=self._observation(data),
            state=MujocoState(data=data, step_count=step_count),
            reward=reward,
            terminated=terminated,
            truncated=truncated,
            info=info,
        )

    @property
    def observation_space(self) -> spaces.Box:
        return self._observation_space

    @property
    def action_space(self) -> spaces.Box:
        """The actuators' ctrlrange, as Gymnasium's MujocoEnv builds it."""
        return self._action_space

    @property
    def max_episode_steps(self) -> int:
        """The time limit after which an episode is truncated (Gymnasium's TimeLimit)."""
        return self._max_episode_steps

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"

    # ------------------------------------------------------------------ task specifics

    def _reset_noise(self, key: jax.Array) -> tuple[jax.Array, jax.Array]:
        raise NotImplementedError

    def _observation(self, data: Any) -> jax.Array:
        raise NotImplementedError

    def _reward(
        self, data: Any, action: jax.Array, x_velocity: jax.Array
    ) -> tuple[jax.Array, jax.Array, dict[str, jax.Array]]:
        raise NotImplementedError

    def _ctrl_cost(self, action: jax.Array) -> jax.Array:
        return self.ctrl_cost_weight * jnp.sum(jnp.square(action))


class HalfCheetah(MujocoEnv):
    """HalfCheetah-v5: run forward; never terminates, truncated after 1000 steps.

    reward = forward_reward_weight * dx/dt - ctrl_cost_weight * |action|^2, with dt = 5 * 0.01 s.
    Observation (17): qpos[1:] (8) and qvel (9). Reset: qpos0 + U(-0.1, 0.1), qvel ~ 0.1 * N(0, 1).
    """

    xml_file = "half_cheetah.xml"

    def __init__(
        self,
        *,
        frame_skip: int = 5,
        forward_reward_weight: float = 1.0,
        ctrl_cost_weight: float = 0.1,
        reset_noise_scale: float = 0.1,
        max_episode_steps: int = 1000,
        solver_iterations: int | None = None,
        ls_iterations: int | None = None,
    ):
        super().__init__(
            "HalfCheetah-v5",
            frame_skip=frame_skip,
            forward_reward_weight=forward_reward_weight,
            ctrl_cost_weight=ctrl_cost_weight,
            reset_noise_scale=reset_noise_scale,
            max_episode_steps=max_episode_steps,
            solver_iterations=solver_iterations,
            ls_iterations=ls_iterations,
        )

    def _reset_noise(self, key: jax.Array) -> tuple[jax.Array, jax.Array]:
        pos_key, vel_key = jax.random.split(key)
        scale = self.reset_noise_scale
        qpos = self.init_qpos + jax.random.uniform(
            pos_key, self.init_qpos.shape, self.dtype, -scale, scale
        )
        qvel = self.init_qvel + scale * jax.random.normal(vel_key, self.init_qvel.shape, self.dtype)
        return qpos, qvel

    def _observation(self, data: Any) -> jax.Array:
        return jnp.concatenate([data.qpos[1:], data.qvel])

    def _reward(
        self, data: Any, action: jax.Array, x_velocity: jax.Array
    ) -> tuple[jax.Array, jax.Array, dict[str, jax.Array]]:
        forward_reward = self.forward_reward_weight * x_velocity
        ctrl_cost = self._ctrl_cost(action)
        info = {"reward_forward": forward_reward, "reward_ctrl": -ctrl_cost}
        return forward_reward - ctrl_cost, jnp.asarray(False), info


class Hopper(MujocoEnv):
    """Hopper-v5: hop forward without falling; terminates when unhealthy.

    reward = forward_reward_weight * dx/dt + healthy_reward * healthy - ctrl_cost, dt = 4 * 0.002 s.
    Healthy: every entry of (qpos, qvel)[2:] inside healthy_state_range, torso height qpos[1]
    inside healthy_z_range and torso angle qpos[2] inside healthy_angle_range (all open
    intervals, checked after the step). Observation (11): qpos[1:] (5) and qvel clipped to
    [-10, 10] (6). Reset: qpos0 + U(-5e-3, 5e-3), qvel + U(-5e-3, 5e-3).
    """

    xml_file = "hopper.xml"

    def __init__(
        self,
        *,
        frame_skip: int = 4,
        forward_reward_weight: float = 1.0,
        ctrl_cost_weight: float = 1e-3,
        healthy_reward: float = 1.0,
        terminate_when_unhealthy: bool = True,
        healthy_state_range: tuple[float, float] = (-100.0, 100.0),
        healthy_z_range: tuple[float, float] = (0.7, float("inf")),
        healthy_angle_range: tuple[float, float] = (-0.2, 0.2),
        reset_noise_scale: float = 5e-3,
        max_episode_steps: int = 1000,
        solver_iterations: int | None = None,
        ls_iterations: int | None = None,
    ):
        super().__init__(
            "Hopper-v5",
            frame_skip=frame_skip,
            forward_reward_weight=forward_reward_weight,
            ctrl_cost_weight=ctrl_cost_weight,
            reset_noise_scale=reset_noise_scale,
            max_episode_steps=max_episode_steps,
            solver_iterations=solver_iterations,
            ls_iterations=ls_iterations,
        )
        self.healthy_reward = float(healthy_reward)
        self.terminate_when_unhealthy = bool(terminate_when_unhealthy)
        self.healthy_state_range = tuple(map(float, healthy_state_range))
        self.healthy_z_range = tuple(map(float, healthy_z_range))
        self.healthy_angle_range = tuple(map(float, healthy_angle_range))

    def _reset_noise(self, key: jax.Array) -> tuple[jax.Array, jax.Array]:
        pos_key, vel_key = jax.random.split(key)
        scale = self.reset_noise_scale
        qpos = self.init_qpos + jax.random.uniform(
            pos_key, self.init_qpos.shape, self.dtype, -scale, scale
        )
        qvel = self.init_qvel + jax.random.uniform(
            vel_key, self.init_qvel.shape, self.dtype, -scale, scale
        )
        return qpos, qvel

    def _observation(self, data: Any) -> jax.Array:
        return jnp.concatenate([data.qpos[1:], jnp.clip(data.qvel, -10.0, 10.0)])

    def is_healthy(self, data: Any) -> jax.Array:
        """Gymnasium's health check (NaN anywhere makes it unhealthy, as there)."""
        z, angle = data.qpos[1], data.qpos[2]
        state = jnp.concatenate([data.qpos, data.qvel])[2:]

        def inside(x: jax.Array, bounds: tuple[float, float]) -> jax.Array:
            return jnp.logical_and(bounds[0] < x, x < bounds[1])

        return (
            jnp.all(inside(state, self.healthy_state_range))
            & inside(z, self.healthy_z_range)
            & inside(angle, self.healthy_angle_range)
        )

    def _reward(
        self, data: Any, action: jax.Array, x_velocity: jax.Array
    ) -> tuple[jax.Array, jax.Array, dict[str, jax.Array]]:
        healthy = self.is_healthy(data)
        forward_reward = self.forward_reward_weight * x_velocity
        healthy_reward = healthy.astype(self.dtype) * self.healthy_reward
        ctrl_cost = self._ctrl_cost(action)
        terminated = jnp.logical_and(jnp.logical_not(healthy), self.terminate_when_unhealthy)
        info = {
            "reward_forward": forward_reward,
            "reward_ctrl": -ctrl_cost,
            "reward_survive": healthy_reward,
            "z_distance_from_origin": data.qpos[1] - self.init_qpos[1],
        }
        return forward_reward + healthy_reward - ctrl_cost, terminated, info


ENVIRONMENTS: dict[str, type[MujocoEnv]] = {"HalfCheetah-v5": HalfCheetah, "Hopper-v5": Hopper}


def make(name: str, **params: Any) -> MujocoEnv:
    """Build a MuJoCo environment; keyword arguments are the Gymnasium v5 constructor's
    (e.g. `ctrl_cost_weight`, `reset_noise_scale`) plus `max_episode_steps` and the solver speed
    knobs `solver_iterations` / `ls_iterations` (default: the model's own, as in Gymnasium)."""
    cls = ENVIRONMENTS[name]
    accepted = set(inspect.signature(cls.__init__).parameters) - {"self"}
    unknown = sorted(set(params) - accepted)
    if unknown:
        raise ValueError(
            f"Environment {name!r} has no parameter(s) {unknown}; its parameters are "
            f"{sorted(accepted)}."
        )
    return cls(**params)
