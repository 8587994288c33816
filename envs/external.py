"""Environments of other libraries (Gymnasium, EnvPool), which run on the host (in Python or C++,
outside the compiled program) and are stepped from inside the compiled loop.

`GymnasiumVectorEnv` runs `num_envs` copies of any Gymnasium environment on the host and steps
them all with one `io_callback` per step, so PPO's rollout, advantages and update stay one XLA
program while the simulator is ordinary Python (or C++ behind Python). Name such an environment
`gymnasium:<id>`, e.g. `gymnasium:CartPole-v1`, or `gymnasium:my_package.envs:MyEnv-v0` for one your
own module registers (Gymnasium imports the module first).

`EnvPoolVectorEnv` does the same for EnvPool's C++ environments (`envpool:<task>`, e.g.
`envpool:Pong-v5` or `envpool:CartPole-v1`; `envpool.list_all_envs()` names them), stepping its
batched pool in one call. EnvPool also has an XLA interface (custom calls, no callback), but it
resets an environment only in the step *after* its episode ends, ignoring that step's action, so
every learner would need masked reset transitions, and its handle is a process-local pointer that a
checkpoint cannot carry. Through the callback the ended environments take that resetting step at
once, which keeps the same-step auto-reset every learner here is written for; the callback's cost
is small beside an Atari step (README, Host environments).

Atari's training options (EnvPool's `episodic_life`, `reward_clip`) make a lost life end the
learner's episode and clip rewards to their sign; `info["game_over"]` and `info["game_reward"]`
say when the game itself ended and what it scored, which episode statistics and evaluation count.

What the compiled program holds of it is a handle (`HostEnvState.group`: which set of host
environments) and the last observations. The simulators' own state lives on the host, outside
checkpoints: a run restored from a checkpoint in a new process finds its group gone, so the first
step after a resume starts fresh episodes and reports the episodes in flight as truncated (a
time-limit-like cut, bootstrapped from their last observation). JAX environments resume exactly;
host environments resume with that one cut.

The environments auto-reset on the host in the same step an episode ends, keeping the true last
observation in `info["final_obs"]`, as `envs.AutoReset` does for JAX environments; the rest of the
training stack (episode statistics, normalisation) is the usual wrappers over the batch.
"""

from __future__ import annotations

import difflib
import itertools
import random
import threading
import warnings
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct
from gymnax.environments import spaces
from jax.experimental import io_callback

from envs.core import StepResult
from jaxrl import extras, host

PREFIX = "gymnasium:"
ENVPOOL_PREFIX = "envpool:"


def is_host_env(name: str) -> bool:
    """Whether `name` names a host environment (`gymnasium:<id>` or `envpool:<task>`) rather than a
    JAX one."""
    return name.startswith((PREFIX, ENVPOOL_PREFIX))


def make_host_env(name: str, num_envs: int, **make_kwargs: Any) -> GymnasiumVectorEnv:
    """`num_envs` host environments of `name` (Gymnasium's or EnvPool's, by the prefix)."""
    if name.startswith(ENVPOOL_PREFIX):
        return EnvPoolVectorEnv(name, num_envs, **make_kwargs)
    return GymnasiumVectorEnv(name, num_envs, **make_kwargs)


@struct.dataclass
class HostEnvState:
    """What the program carries of a set of host environments: its group id and last observations
    (the bootstrap observation of the episodes a resume cuts)."""

    group: jax.Array  # int32 id of the host-side set of environments
    obs: jax.Array  # [num_envs, *obs_shape]


# The host side: groups of Gymnasium vector environments by id. Ids start at a random offset per
# process, so a group id restored from a checkpoint written by another process is never mistaken
# for one of this process's groups.
_groups: dict[int, Any] = {}
_group_ids = itertools.count(random.randrange(1, 2**30))
_groups_lock = threading.Lock()


def _gym_space_to_gymnax(space: Any) -> spaces.Space:
    import gymnasium

    if isinstance(space, gymnasium.spaces.Discrete):
        if int(space.start) != 0:
            raise ValueError(f"a Discrete action space starting at {space.start} (not 0)")
        return spaces.Discrete(int(space.n))
    if isinstance(space, gymnasium.spaces.Box):
        return spaces.Box(
            np.asarray(space.low), np.asarray(space.high), tuple(space.shape), space.dtype
        )
    raise ValueError(f"a {type(space).__name__} space (Discrete and Box are supported)")


class GymnasiumVectorEnv:
    """`num_envs` Gymnasium environments on the host with the batched env interface: `reset(key)`
    and `step(key, state, action)` return arrays with a leading `num_envs` axis (like
    `envs.Vectorize` of an auto-resetting JAX environment). `batched` tells evaluation so."""

    batched = True
    prefix = PREFIX
    # How to name an environment whose spaces cannot be run (after "<name> has <space>; ").
    unsupported_space_hint = (
        "flatten it with a Gymnasium wrapper in a module of your own and name that "
        "(gymnasium:my_module:MyEnv-v0)"
    )

    def __init__(self, name: str, num_envs: int, **make_kwargs: Any):
        self.name = name
        self.env_id = name.removeprefix(self.prefix)
        self.num_envs = int(num_envs)
        self._make_kwargs = make_kwargs
        probe = self._make_probe()
        try:
            self.observation_space = _gym_space_to_gymnax(probe.observation_space)
            self.action_space = _gym_space_to_gymnax(probe.action_space)
        except ValueError as error:
            raise ValueError(f"{name} has {error}; {self.unsupported_space_hint}") from None
        finally:
            probe.close()
        self.max_episode_steps = self._time_limit(probe)
        self._obs_dtype = np.dtype(probe.observation_space.dtype)
        self._action_dtype = np.dtype(probe.action_space.dtype)

    def _make_probe(self) -> Any:
        """One environment, for its spaces and time limit; a ValueError saying what to name
        instead if it cannot be made."""
        import gymnasium

        try:
            return gymnasium.make(self.env_id, **self._make_kwargs)
        except Exception as error:  # gymnasium's NameNotFound, a module that fails to import, ...
            first_line = (str(error).strip().splitlines() or [type(error).__name__])[0]
            raise ValueError(
                f"Gymnasium cannot make {self.env_id!r} ({first_line.rstrip('.')}); name a "
                f"registered Gymnasium id (e.g. gymnasium:CartPole-v1) or module:id of your own"
            ) from None

    def _time_limit(self, probe: Any) -> int:
        return int(probe.spec.max_episode_steps or 0) if probe.spec else 0

    # -- the host side ------------------------------------------------------------------------

    def _new_group(self, seed: int) -> tuple[int, np.ndarray]:
        import gymnasium
        from gymnasium.vector import AutoresetMode, SyncVectorEnv

        vector_env = SyncVectorEnv(
            [lambda: gymnasium.make(self.env_id, **self._make_kwargs)] * self.num_envs,
            autoreset_mode=AutoresetMode.SAME_STEP,
        )
        obs, _ = vector_env.reset(seed=[seed + i for i in range(self.num_envs)])
        with _groups_lock:
            group = next(_group_ids)
            _groups[group] = vector_env
        return group, obs

    def _host_reset(self, key_data: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        group, obs = self._new_group(_seed_of(key_data))
        return np.int32(group), self._obs(obs)

    def _host_step(self, group: np.ndarray, action: np.ndarray, last_obs: np.ndarray, key_data):
        vector_env = _groups.get(int(group))
        if vector_env is None:
            # Restored from a checkpoint of another process: the simulators are gone. Start fresh
            # episodes and report the ones in flight as cut off at their last observation.
            new_group, obs = self._new_group(_seed_of(key_data))
            zeros = np.zeros(self.num_envs, np.float32)
            cut = np.ones(self.num_envs, bool)
            return (np.int32(new_group), self._obs(obs), zeros, ~cut, cut, last_obs, cut, zeros)
        action = np.asarray(action).astype(self._action_dtype)
        obs, reward, terminated, truncated, final_obs, info = self._step_group(vector_env, action)
        terminated = np.asarray(terminated, bool)
        # A time limit that coincides with a true terminal is a termination: no bootstrap.
        truncated = np.asarray(truncated, bool) & ~terminated
        game_over, game_reward = self._game_progress(info, reward, terminated, truncated)
        return (
            np.int32(group),
            self._obs(obs),
            np.asarray(reward, np.float32),
            terminated,
            truncated,
            self._obs(final_obs),
            np.asarray(game_over, bool),
            np.asarray(game_reward, np.float32),
        )

    def _step_group(self, vector_env: Any, action: np.ndarray) -> tuple:
        """One step of a group with same-step auto-reset: (obs, reward, terminated, truncated,
        final_obs, info), `obs` already the first of a new episode where one ended."""
        obs, reward, terminated, truncated, info = vector_env.step(action)
        final_obs = np.array(obs, copy=True)
        if "_final_obs" in info:
            for i in np.flatnonzero(info["_final_obs"]):
                final_obs[i] = info["final_obs"][i]
        return obs, reward, terminated, truncated, final_obs, info

    def _game_progress(
        self, info: dict, reward: np.ndarray, terminated: np.ndarray, truncated: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """(game_over, game_reward) of a step: whether the game a score counts over ended, and the
        reward it scores. A Gymnasium episode is the game, and its reward the score."""
        del info
        return terminated | truncated, reward

    def _obs(self, obs: Any) -> np.ndarray:
        return np.asarray(obs, self._obs_dtype).reshape(self._obs_shape)

    @property
    def _obs_shape(self) -> tuple[int, ...]:
        return (self.num_envs, *self.observation_space.shape)

    # -- the compiled side --------------------------------------------------------------------

    def _obs_struct(self) -> jax.ShapeDtypeStruct:
        return jax.ShapeDtypeStruct(self._obs_shape, self._obs_dtype)

    def reset(self, key: jax.Array) -> tuple[jax.Array, HostEnvState]:
        shapes = (jax.ShapeDtypeStruct((), jnp.int32), self._obs_struct())
        group, obs = io_callback(
            lambda k: host.call(self.name, self._host_reset, k), shapes, _key_data(key)
        )
        return obs, HostEnvState(group, obs)

    def step(self, key: jax.Array, state: HostEnvState, action: jax.Array) -> StepResult:
        batch = (self.num_envs,)
        shapes = (
            jax.ShapeDtypeStruct((), jnp.int32),
            self._obs_struct(),
            jax.ShapeDtypeStruct(batch, jnp.float32),
            jax.ShapeDtypeStruct(batch, jnp.bool_),
            jax.ShapeDtypeStruct(batch, jnp.bool_),
            self._obs_struct(),
            jax.ShapeDtypeStruct(batch, jnp.bool_),
            jax.ShapeDtypeStruct(batch, jnp.float32),
        )
        group, obs, reward, terminated, truncated, final_obs, game_over, game_reward = io_callback(
            lambda *args: host.call(self.name, self._host_step, *args),
            shapes,
            state.group,
            action,
            state.obs,
            _key_data(key),
        )
        return StepResult(
            obs=obs,
            state=HostEnvState(group, obs),
            reward=reward,
            terminated=terminated,
            truncated=truncated,
            # What episode statistics and evaluation count (envs.EpisodeStatistics): the game,
            # where training sees lives as episodes or clipped rewards (EnvPool's Atari options).
            info={"final_obs": final_obs, "game_over": game_over, "game_reward": game_reward},
        )

    def __repr__(self) -> str:
        return f"GymnasiumVectorEnv({self.name!r}, num_envs={self.num_envs})"


# EnvPool options that shape the pool, not the task; the adapter sets what it needs of them.
_ENVPOOL_POOL_OPTIONS = {
    "num_envs",
    "seed",
    "batch_size",
    "num_threads",
    "base_path",
    "gym_reset_return_info",
    "max_num_players",
    "thread_affinity_offset",
}


class EnvPoolVectorEnv(GymnasiumVectorEnv):
    """`num_envs` EnvPool environments (one C++ pool) on the host, with the same interface and
    resume semantics as `GymnasiumVectorEnv`. Keyword arguments are EnvPool's `make` options
    (e.g. `episodic_life=True` for Atari)."""

    prefix = ENVPOOL_PREFIX
    unsupported_space_hint = "EnvPool's Discrete and Box tasks are supported"

    def _make_probe(self) -> Any:
        envpool = extras.import_module("envpool", "envpool", "EnvPool environments (envpool:)")

        if self.env_id not in envpool.list_all_envs():
            close = difflib.get_close_matches(self.env_id, envpool.list_all_envs(), n=3)
            hint = f" (did you mean {', '.join(close)}?)" if close else ""
            raise ValueError(
                f"EnvPool has no task {self.env_id!r}{hint}; name one of envpool.list_all_envs(), "
                f"e.g. envpool:Pong-v5"
            )
        options = set(envpool.make_spec(self.env_id).config._fields)
        unknown = sorted(set(self._make_kwargs) - options)
        if unknown:
            raise ValueError(
                f"EnvPool's {self.env_id} has no option(s) {unknown}; its options are "
                f"{sorted(options - _ENVPOOL_POOL_OPTIONS)}"
            )
        return self._make(num_envs=1, seed=0)

    def _time_limit(self, probe: Any) -> int:
        return int(probe.spec.config.max_episode_steps)

    def _make(self, num_envs: int, seed: int) -> Any:
        envpool = extras.import_module("envpool", "envpool", "EnvPool environments (envpool:)")

        # EnvPool builds its spaces on first use, from float64 bounds that Gymnasium warns it
        # casts to float32: built here, quietly, and cached by the pool.
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", ".*precision lowered", UserWarning)
            pool = envpool.make_gymnasium(
                self.env_id, num_envs=num_envs, seed=seed, **self._make_kwargs
            )
            pool.observation_space  # noqa: B018
            pool.action_space  # noqa: B018
        return pool

    def _new_group(self, seed: int) -> tuple[int, np.ndarray]:
        pool = self._make(num_envs=self.num_envs, seed=seed)
        obs, _ = pool.reset()
        with _groups_lock:
            group = next(_group_ids)
            _groups[group] = pool
        return group, obs

    def _step_group(self, pool: Any, action: np.ndarray) -> tuple:
        # EnvPool resets an ended environment in its next step, whatever the action; taking that
        # step now, for the ended ones only, gives the same-step auto-reset (and the next step is
        # an ordinary one). A step, not `reset(env_id)`: an explicit reset restarts the whole
        # game, where with `episodic_life` a lost life must only start the next life.
        obs, reward, terminated, truncated, info = pool.step(action)
        final_obs = obs
        ended = np.flatnonzero(np.logical_or(terminated, truncated)).astype(np.int32)
        if ended.size:
            obs = np.array(obs, copy=True)
            first_obs, *_, reset_info = pool.step(np.zeros_like(action[ended]), env_id=ended)
            obs[np.asarray(reset_info["env_id"])] = first_obs
        return obs, reward, terminated, truncated, final_obs, info

    def _game_progress(
        self, info: dict, reward: np.ndarray, terminated: np.ndarray, truncated: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        # Atari tasks report lives left and the reward before `reward_clip`: with `episodic_life`
        # a lost life ends an episode for the learner, but the game (and its score) goes on
        # until no life is left.
        game_over = terminated | truncated
        if "lives" in info:
            game_over = truncated | (terminated & (np.asarray(info["lives"]) == 0))
        return game_over, np.asarray(info.get("reward", reward))

    def __repr__(self) -> str:
        return f"EnvPoolVectorEnv({self.name!r}, num_envs={self.num_envs})"


def _key_data(key: jax.Array) -> jax.Array:
    """Raw uint32 words of a (typed or legacy) PRNG key, which a host function can read."""
    if jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
        return jax.random.key_data(key)
    return key


def _seed_of(key_data: np.ndarray) -> int:
    """The Gymnasium seed of a PRNG key's raw words: its last word, as a non-negative int."""
    return int(np.asarray(key_data, np.uint32)[-1]) % 2**31
