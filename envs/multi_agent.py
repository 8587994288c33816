"""Multi-agent JAX environments from JaxMARL behind this library's environment interface.

JaxMARL environments speak in dictionaries keyed by agent name and reset themselves. Here a
multi-agent environment is the single-agent interface with an agents axis in front:

    reset(key) -> (obs [num_agents, *obs_shape], state)
    step(key, state, actions [num_agents]) -> StepResult(obs, state, reward [num_agents],
                                                         terminated [], truncated [], info)

with `world_state(obs)`, what a centralised critic sees (MAPPO), and no auto-reset, so that the
usual wrappers (`AutoReset`, `EpisodeStatistics` per agent, `Vectorize`) do what they do for one
agent. Agents are homogeneous (one observation and one action space), which is what parameter
sharing across agents (IPPO and MAPPO as JaxMARL runs them) needs.

Name an environment `jaxmarl:<id>`, e.g. `jaxmarl:MPE_simple_spread_v3`.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from gymnax.environments import spaces

from envs.core import StepResult
from envs.wrappers import AutoReset, EpisodeStatistics, Vectorize

PREFIX = "jaxmarl:"

# The families whose episodes end only at their time limit: every end is a truncation (bootstrap),
# not a termination. JaxMARL reports a `done` either way; which it is depends on the family.
TIME_LIMIT_ONLY = ("MPE_simple_spread_v3", "MPE_simple_reference_v3", "MPE_simple_v3")


def _import_jaxmarl() -> Any:
    """`import jaxmarl`, whose import prints two lines about optional submodules: kept out of our
    output at the file-descriptor level (its import also resets Python's `sys.stdout`)."""
    if "jaxmarl" in sys.modules:
        return sys.modules["jaxmarl"]
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), 1)
        import jaxmarl
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)
    return jaxmarl


def registered() -> list[str]:
    """The JaxMARL environments this adapter runs, with their `jaxmarl:` prefix."""
    return [PREFIX + name for name in TIME_LIMIT_ONLY]


def _to_gymnax(space: Any) -> spaces.Space:
    if hasattr(space, "n"):
        return spaces.Discrete(int(space.n))
    return spaces.Box(
        np.asarray(space.low), np.asarray(space.high), tuple(space.shape), jnp.float32
    )


class MultiAgentEnv:
    """A JaxMARL environment with stacked agents, stepping without auto-reset."""

    def __init__(self, name: str, **env_kwargs: Any):
        env_id = name.removeprefix(PREFIX)
        if env_id not in TIME_LIMIT_ONLY:
            raise ValueError(
                f"{name!r} is not a multi-agent environment jaxrl runs; choose one of "
                f"{registered()}"
            )
        self.name = name
        self._env = _import_jaxmarl().make(env_id, **env_kwargs)
        self.agents = list(self._env.agents)
        self.num_agents = len(self.agents)
        first = self.agents[0]
        self.observation_space = _to_gymnax(self._env.observation_space(first))
        self.action_space = _to_gymnax(self._env.action_space(first))
        for agent in self.agents[1:]:
            if (
                self._env.observation_space(agent).shape != self.observation_space.shape
                or _to_gymnax(self._env.action_space(agent)).shape != self.action_space.shape
            ):
                raise ValueError(f"{name!r} has agents with different observation or action spaces")
        self.max_episode_steps = int(self._env.max_steps) + 1  # JaxMARL's MPE ends after step T+1

    @property
    def world_state_shape(self) -> tuple[int, ...]:
        """Shape of what a centralised critic sees: every agent's observation, concatenated."""
        return (self.num_agents * int(np.prod(self.observation_space.shape)),)

    def _stack(self, per_agent: dict[str, jax.Array]) -> jax.Array:
        return jnp.stack([per_agent[agent] for agent in self.agents])

    def world_state(self, obs: jax.Array) -> jax.Array:
        """All agents' observations concatenated, the same for every agent (JaxMARL's MPE world
        state), shape [num_agents, num_agents * obs_size]."""
        flat = obs.reshape(-1)
        return jnp.broadcast_to(flat, (self.num_agents, flat.shape[0]))

    def reset(self, key: jax.Array) -> tuple[jax.Array, Any]:
        obs, state = self._env.reset(key)
        return self._stack(obs).astype(jnp.float32), state

    def step(self, key: jax.Array, state: Any, action: jax.Array) -> StepResult:
        actions = {agent: action[i] for i, agent in enumerate(self.agents)}
        obs, state, reward, dones, _ = self._env.step_env(key, state, actions)
        done = jnp.asarray(dones["__all__"], jnp.bool_)
        obs = self._stack(obs).astype(jnp.float32)
        return StepResult(
            obs=obs,
            state=state,
            reward=self._stack(reward).astype(jnp.float32),
            terminated=jnp.zeros((), jnp.bool_),  # these families only end at the time limit
            truncated=done,
            info={},
        )

    def __repr__(self) -> str:
        return f"MultiAgentEnv({self.name!r})"


def make(name: str, **env_kwargs: Any) -> MultiAgentEnv:
    """One multi-agent environment (no auto-reset)."""
    return MultiAgentEnv(name, **env_kwargs)


def make_vec(name: str, num_envs: int, **env_kwargs: Any) -> Vectorize:
    """The training stack: auto-reset, per-agent episode statistics, `num_envs` copies."""
    env = make(name, **env_kwargs)
    return Vectorize(EpisodeStatistics(AutoReset(env), batch_shape=(env.num_agents,)), num_envs)
