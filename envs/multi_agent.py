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

Name an environment `jaxmarl:<id>`: the MPE tasks by JaxMARL's id (`jaxmarl:MPE_simple_spread_v3`),
Overcooked by its layout (`jaxmarl:overcooked_cramped_room`). Overcooked's dense shaping reward
(3 for an onion into the pot or a plate picked up, 5 for a soup picked up) is kept apart from its
task reward (20 to each cook per soup served): `info["shaped_reward"]`, [num_agents], for the
learner to add with a weight it anneals (`algos.mappo.Config.reward_shaping_horizon`), while
returns count the task reward only, as JaxMARL reports them.
"""

from __future__ import annotations

import os
import sys
import warnings
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import numpy as np

from envs.core import StepResult
from envs.wrappers import AutoReset, EpisodeStatistics, Vectorize
from jaxrl import extras

if TYPE_CHECKING:  # gymnax is imported where a space is made: start-up time
    from gymnax.environments import spaces

PREFIX = "jaxmarl:"

# The families whose episodes end only at their time limit: every end is a truncation (bootstrap),
# not a termination. JaxMARL reports a `done` either way; which it is depends on the family.
# Both families here are of this kind.
MPE = ("MPE_simple_spread_v3", "MPE_simple_reference_v3", "MPE_simple_v3")
OVERCOOKED_LAYOUTS = (
    "cramped_room",
    "asymm_advantages",
    "coord_ring",
    "forced_coord",
    "counter_circuit",
)
OVERCOOKED = "overcooked_"


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
        jaxmarl = extras.import_module("jaxmarl", "marl", "multi-agent environments (jaxmarl:)")
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)
    return jaxmarl


def registered() -> list[str]:
    """The JaxMARL environments this adapter runs, with their `jaxmarl:` prefix."""
    return [PREFIX + name for name in MPE] + [
        PREFIX + OVERCOOKED + layout for layout in OVERCOOKED_LAYOUTS
    ]


def has_shaped_reward(name: str) -> bool:
    """Whether the environment reports a shaping reward apart from its task reward."""
    return name.removeprefix(PREFIX).startswith(OVERCOOKED)


def _to_gymnax(space: Any) -> spaces.Discrete:
    from gymnax.environments import spaces  # here, not at the top: start-up time

    if not hasattr(space, "n"):
        raise ValueError(f"only discrete actions are supported, got {space}")
    return spaces.Discrete(int(space.n))


class MultiAgentEnv:
    """A JaxMARL environment with stacked agents, stepping without auto-reset."""

    def __init__(self, name: str, **env_kwargs: Any):
        if name not in registered():
            raise ValueError(
                f"{name!r} is not a multi-agent environment jaxrl runs; choose one of "
                f"{registered()}"
            )
        self.name = name
        self.shaped = has_shaped_reward(name)
        jaxmarl = _import_jaxmarl()
        env_id = name.removeprefix(PREFIX)
        overcooked = env_id.startswith(OVERCOOKED)
        if overcooked:
            from jaxmarl.environments.overcooked import overcooked_layouts

            layout = overcooked_layouts[env_id.removeprefix(OVERCOOKED)]
            # JaxMARL points to Overcooked V2 on every construction; the original is the one its
            # IPPO baselines (and ours) run, so the note is kept out of users' output.
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", "OvercookedV2", DeprecationWarning)
                self._env = jaxmarl.make("overcooked", layout=layout, **env_kwargs)
        else:
            self._env = jaxmarl.make(env_id, **env_kwargs)
        self.agents = list(self._env.agents)
        self.num_agents = len(self.agents)
        first = self.agents[0]
        # Overcooked's declared observation space has height and width swapped; the shape of a
        # real observation is the one to trust (traced, not computed).
        obs, _ = jax.eval_shape(self._env.reset, jax.random.key(0))
        space = self._env.observation_space(first)
        from gymnax.environments import spaces  # here, not at the top: start-up time

        self.observation_space = spaces.Box(
            np.broadcast_to(np.asarray(space.low, np.float32), obs[first].shape),
            np.broadcast_to(np.asarray(space.high, np.float32), obs[first].shape),
            tuple(obs[first].shape),
            jnp.float32,
        )
        self.action_space = _to_gymnax(self._env.action_space(first))
        for agent in self.agents[1:]:
            if (
                obs[agent].shape != obs[first].shape
                or _to_gymnax(self._env.action_space(agent)).shape != self.action_space.shape
            ):
                raise ValueError(f"{name!r} has agents with different observation or action spaces")
        # JaxMARL's MPE ends after step T+1, Overcooked after step T.
        self.max_episode_steps = int(self._env.max_steps) + (0 if overcooked else 1)

    @property
    def world_state_shape(self) -> tuple[int, ...]:
        """Shape of what a centralised critic sees: every agent's observation, concatenated."""
        return (self.num_agents * int(np.prod(self.observation_space.shape)),)

    def _stack(self, per_agent: dict[str, jax.Array]) -> jax.Array:
        return jnp.stack([per_agent[agent] for agent in self.agents])

    def world_state(self, obs: jax.Array) -> jax.Array:
        """All agents' observations concatenated, the same for every agent (JaxMARL's MPE world
        state; Overcooked's observations each see the whole kitchen, from that cook's side),
        shape [num_agents, num_agents * obs_size]."""
        flat = obs.reshape(-1)
        return jnp.broadcast_to(flat, (self.num_agents, flat.shape[0]))

    def reset(self, key: jax.Array) -> tuple[jax.Array, Any]:
        obs, state = self._env.reset(key)
        return self._stack(obs).astype(jnp.float32), state

    def step(self, key: jax.Array, state: Any, action: jax.Array) -> StepResult:
        actions = {agent: action[i] for i, agent in enumerate(self.agents)}
        obs, state, reward, dones, info = self._env.step_env(key, state, actions)
        done = jnp.asarray(dones["__all__"], jnp.bool_)
        obs = self._stack(obs).astype(jnp.float32)
        extra = {}
        if self.shaped:
            extra["shaped_reward"] = self._stack(info["shaped_reward"]).astype(jnp.float32)
        return StepResult(
            obs=obs,
            state=state,
            reward=self._stack(reward).astype(jnp.float32),
            terminated=jnp.zeros((), jnp.bool_),  # these families only end at the time limit
            truncated=done,
            info=extra,
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
