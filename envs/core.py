"""The environment interface every algorithm sees, and the gymnax adapter behind it.

An environment here is an object with two pure methods:

    reset(key) -> (obs, state)
    step(key, state, action) -> StepResult(obs, state, reward, terminated, truncated, info)

`step` does NOT reset. Resetting, episode statistics, vectorisation and normalisation are wrappers
(`envs.wrappers`), so that each concern can be read, tested and swapped on its own. Environment
parameters (gymnax `EnvParams`) are bound at construction: they are constants of the program.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, NamedTuple

import jax
import jax.numpy as jnp

if TYPE_CHECKING:  # gymnax is imported where a space is checked: start-up time
    from gymnax.environments import spaces

Observation = Any
EnvState = Any


class StepResult(NamedTuple):
    """One transition, following gymnax 1.0 / Gymnasium: `terminated` and `truncated` are separate.

    `terminated` means the MDP reached an absorbing state (never bootstrap); `truncated` means a
    time limit cut the episode (bootstrap from the final observation).
    """

    obs: Observation
    state: EnvState
    reward: jax.Array
    terminated: jax.Array
    truncated: jax.Array
    info: dict[str, Any]


class GymnaxEnv:
    """A single gymnax environment with its parameters bound, stepping without auto-reset."""

    def __init__(self, name: str, gymnax_env: Any, params: Any):
        self.name = name
        self._env = gymnax_env
        self.params = params

    def reset(self, key: jax.Array) -> tuple[Observation, EnvState]:
        return self._env.reset_env(key, self.params)

    def step(self, key: jax.Array, state: EnvState, action: jax.Array) -> StepResult:
        obs, next_state, reward, terminated, info = self._env.step_env(
            key, state, action, self.params
        )
        truncated = self._env.is_truncated(next_state, self.params)
        # A time limit that coincides with a true terminal is a termination: no bootstrap.
        truncated = jnp.logical_and(truncated, jnp.logical_not(terminated))
        return StepResult(
            obs=obs,
            state=next_state,
            reward=jnp.asarray(reward, jnp.float32),
            terminated=jnp.asarray(terminated, jnp.bool_),
            truncated=jnp.asarray(truncated, jnp.bool_),
            info={},
        )

    @property
    def observation_space(self) -> spaces.Space:
        return self._env.observation_space(self.params)

    @property
    def action_space(self) -> spaces.Space:
        return self._env.action_space(self.params)

    @property
    def max_episode_steps(self) -> int:
        """The time limit after which an episode is truncated."""
        return int(self.params.max_steps_in_episode)

    def __repr__(self) -> str:
        return f"GymnaxEnv({self.name!r})"


class Wrapper:
    """Base class: forwards everything it does not override to the wrapped environment."""

    def __init__(self, env: Any):
        self.env = env

    def reset(self, key: jax.Array) -> tuple[Observation, EnvState]:
        return self.env.reset(key)

    def step(self, key: jax.Array, state: EnvState, action: jax.Array) -> StepResult:
        return self.env.step(key, state, action)

    def __getattr__(self, name: str) -> Any:
        # Reached only for attributes not found normally; guard `env` itself against recursion.
        if name == "env":
            raise AttributeError(name)
        return getattr(self.env, name)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.env!r})"


def is_discrete(space: spaces.Space) -> bool:
    """Whether `space` is a gymnax `Discrete` space (otherwise it is a box)."""
    # Here, not at the top: gymnax imports seaborn and matplotlib, seconds of start-up time.
    from gymnax.environments import spaces

    return isinstance(space, spaces.Discrete)


def action_dim(space: spaces.Space) -> int:
    """Number of logits for a discrete space, number of action dimensions for a box."""
    if is_discrete(space):
        return int(space.n)
    return int(math.prod(space.shape))
