"""Wrappers that turn a single, non-resetting environment into what a training loop needs.

The order used by `envs.make_vec` is, from the inside out:

    GymnaxEnv -> ClipAction -> AutoReset -> EpisodeStatistics -> Vectorize
              -> NormalizeObservation -> NormalizeReward

Statistics sit below normalisation so that reported returns are the environment's own; the
normalisers sit above vectorisation so that their running moments pool every parallel environment.
Each wrapper's state is a pytree holding the wrapped state: the whole stack vmaps and checkpoints.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from flax import struct

from envs.core import EnvState, Observation, StepResult, Wrapper, is_discrete


class ClipAction(Wrapper):
    """Clip continuous actions into the action space's box (a Gaussian policy is unbounded)."""

    def step(self, key: jax.Array, state: EnvState, action: jax.Array) -> StepResult:
        space = self.env.action_space
        if not is_discrete(space):
            action = jnp.clip(action, space.low, space.high)
        return self.env.step(key, state, action)


class AutoReset(Wrapper):
    """Start a new episode when one ends, keeping the true last observation in `info["final_obs"]`.

    The observation returned after a terminal or truncated step is the FIRST observation of the
    next episode (that is what the policy acts on next). Value bootstrapping on truncation must use
    the LAST observation of the ended episode instead, which is why it is kept.
    """

    def step(self, key: jax.Array, state: EnvState, action: jax.Array) -> StepResult:
        step_key, reset_key = jax.random.split(key)
        result = self.env.step(step_key, state, action)
        done = jnp.logical_or(result.terminated, result.truncated)
        reset_obs, reset_state = self.env.reset(reset_key)

        def pick(reset_leaf, step_leaf):
            return jnp.where(done, reset_leaf, step_leaf)

        return result._replace(
            obs=jax.tree.map(pick, reset_obs, result.obs),
            state=jax.tree.map(pick, reset_state, result.state),
            info={**result.info, "final_obs": result.obs},
        )


@struct.dataclass
class EpisodeStatisticsState:
    """`EpisodeStatistics`' state: the wrapped state plus the episode counters (per environment)."""

    inner: EnvState
    episode_return: jax.Array  # undiscounted return of the episode in progress
    episode_length: jax.Array  # steps taken in the episode in progress
    # Return and length of the most recently completed episode (0 until one completes).
    last_return: jax.Array
    last_length: jax.Array


class EpisodeStatistics(Wrapper):
    """Accumulate undiscounted episode return and length; report them when an episode ends.

    Over a single environment the counters are scalars; over an already batched one (a host
    vector environment) they have its `batch_shape`, one per environment.
    """

    def __init__(self, env: Any, batch_shape: tuple[int, ...] = ()):
        super().__init__(env)
        self.batch_shape = batch_shape

    def reset(self, key: jax.Array) -> tuple[Observation, EpisodeStatisticsState]:
        obs, inner = self.env.reset(key)
        zero_f = jnp.zeros(self.batch_shape, jnp.float32)
        zero_i = jnp.zeros(self.batch_shape, jnp.int32)
        return obs, EpisodeStatisticsState(inner, zero_f, zero_i, zero_f, zero_i)

    def step(self, key: jax.Array, state: EpisodeStatisticsState, action: jax.Array) -> StepResult:
        result = self.env.step(key, state.inner, action)
        # An environment whose learning episodes are not its games (an Atari life, clipped
        # rewards: envs.external) says what to count; otherwise an episode is a game.
        done = result.info.get("game_over", jnp.logical_or(result.terminated, result.truncated))
        episode_return = state.episode_return + result.info.get("game_reward", result.reward)
        episode_length = state.episode_length + 1
        new_state = EpisodeStatisticsState(
            inner=result.state,
            episode_return=jnp.where(done, 0.0, episode_return),
            episode_length=jnp.where(done, 0, episode_length),
            last_return=jnp.where(done, episode_return, state.last_return),
            last_length=jnp.where(done, episode_length, state.last_length),
        )
        info = {
            **result.info,
            "episode_done": done,
            "episode_return": episode_return,
            "episode_length": episode_length,
        }
        return result._replace(state=new_state, info=info)


class Vectorize(Wrapper):
    """Run `num_envs` independent copies with one call; every output gains a leading axis."""

    def __init__(self, env: Any, num_envs: int):
        super().__init__(env)
        self.num_envs = num_envs

    def reset(self, key: jax.Array) -> tuple[Observation, EnvState]:
        return jax.vmap(self.env.reset)(jax.random.split(key, self.num_envs))

    def step(self, key: jax.Array, state: EnvState, action: jax.Array) -> StepResult:
        keys = jax.random.split(key, self.num_envs)
        return jax.vmap(self.env.step)(keys, state, action)


# ---------------------------------------------------------------------------------------------
# Running moments, shared by the normalisers and by evaluation (which normalises with frozen stats).


@struct.dataclass
class RunningMeanStd:
    """Running per-feature mean and variance of a stream of batches, and the number of samples."""

    mean: jax.Array
    var: jax.Array
    count: jax.Array

    @classmethod
    def create(cls, shape: tuple[int, ...] = ()) -> RunningMeanStd:
        """Moments for samples of `shape`: mean 0, variance 1, a near-zero prior count."""
        # A tiny prior count keeps the first update well defined without biasing later ones.
        return cls(jnp.zeros(shape), jnp.ones(shape), jnp.asarray(1e-4, jnp.float32))

    def update(self, batch: jax.Array) -> RunningMeanStd:
        """Merge the moments of `batch` (leading axis: samples) by Chan et al.'s parallel rule."""
        batch_mean = batch.mean(axis=0)
        batch_var = batch.var(axis=0)
        batch_count = batch.shape[0]
        delta = batch_mean - self.mean
        total = self.count + batch_count
        mean = self.mean + delta * batch_count / total
        m2 = self.var * self.count + batch_var * batch_count
        m2 = m2 + jnp.square(delta) * self.count * batch_count / total
        return RunningMeanStd(mean, m2 / total, total)

    def normalize(self, x: jax.Array, clip: float = 10.0) -> jax.Array:
        """`x` standardised by these moments and clipped to [-clip, clip]."""
        return jnp.clip((x - self.mean) / jnp.sqrt(self.var + 1e-8), -clip, clip)


@struct.dataclass
class NormalizeObservationState:
    """`NormalizeObservation`'s state: the wrapped state and the observation moments."""

    inner: EnvState
    obs_stats: RunningMeanStd


class NormalizeObservation(Wrapper):
    """Standardise (batched) observations with running moments pooled over all environments."""

    def reset(self, key: jax.Array) -> tuple[Observation, NormalizeObservationState]:
        obs, inner = self.env.reset(key)
        stats = RunningMeanStd.create(obs.shape[1:]).update(obs)
        return stats.normalize(obs), NormalizeObservationState(inner, stats)

    def step(
        self, key: jax.Array, state: NormalizeObservationState, action: jax.Array
    ) -> StepResult:
        result = self.env.step(key, state.inner, action)
        stats = state.obs_stats.update(result.obs)
        info = dict(result.info)
        if "final_obs" in info:
            info["final_obs"] = stats.normalize(info["final_obs"])
        return result._replace(
            obs=stats.normalize(result.obs),
            state=NormalizeObservationState(result.state, stats),
            info=info,
        )


@struct.dataclass
class NormalizeRewardState:
    """`NormalizeReward`'s state: the wrapped state and the discounted-return moments."""

    inner: EnvState
    discounted_return: jax.Array  # [num_envs], reset to 0 when an episode ends
    return_stats: RunningMeanStd
    # The discount of the normalised return: state, not a constant, so that a program whose runs
    # sweep gamma normalises each run's rewards with that run's gamma (`with_reward_discount`).
    gamma: jax.Array


class NormalizeReward(Wrapper):
    """Scale rewards by the running standard deviation of the discounted return (not re-centred)."""

    def __init__(self, env: Any, gamma: float = 0.99):
        super().__init__(env)
        self.gamma = gamma  # the initial state's discount

    def reset(self, key: jax.Array) -> tuple[Observation, NormalizeRewardState]:
        obs, inner = self.env.reset(key)
        zeros = jnp.zeros(obs.shape[:1], jnp.float32)
        gamma = jnp.float32(self.gamma)
        return obs, NormalizeRewardState(inner, zeros, RunningMeanStd.create(), gamma)

    def step(self, key: jax.Array, state: NormalizeRewardState, action: jax.Array) -> StepResult:
        result = self.env.step(key, state.inner, action)
        done = jnp.logical_or(result.terminated, result.truncated)
        discounted_return = state.discounted_return * state.gamma + result.reward
        stats = state.return_stats.update(discounted_return)
        reward = result.reward / jnp.sqrt(stats.var + 1e-8)
        new_state = NormalizeRewardState(
            result.state, jnp.where(done, 0.0, discounted_return), stats, state.gamma
        )
        return result._replace(reward=reward, state=new_state)


def with_reward_discount(state: Any, gamma: jax.Array) -> Any:
    """`state` (a wrapper-state stack) with its `NormalizeReward` discount set to `gamma`; the
    stack unchanged when it has no reward normalisation."""
    if isinstance(state, NormalizeRewardState):
        return state.replace(gamma=jnp.asarray(gamma, jnp.float32))
    if hasattr(state, "inner") and dataclasses.is_dataclass(state):
        return state.replace(inner=with_reward_discount(state.inner, gamma))
    return state


def find_state(state: Any, state_type: type) -> Any:
    """Walk down `.inner` links of a wrapper-state stack to the first state of `state_type`."""
    while not isinstance(state, state_type):
        if not hasattr(state, "inner"):
            return None
        state = state.inner
    return state
