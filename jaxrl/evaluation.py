"""Evaluation inside the compiled program: returns of fresh episodes, a JAX function that every
control algorithm's `evaluate` compiles into its training program.

The statistics and plots that compare runs afterwards (IQM, bootstrap intervals, pass@k, learning
curves) are `jaxrl.statistics`.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from jaxrl.prng import loop_keys
from jaxrl.types import PRNGKey


def evaluate_episodes(
    env,
    policy: Callable[[jax.Array, PRNGKey], jax.Array],
    key: PRNGKey,
    num_episodes: int,
    max_steps: int | None = None,
) -> jax.Array:
    """Undiscounted returns of `num_episodes` fresh episodes of a single, non-resetting `env`
    (or of a batched host environment of `num_episodes` copies, `envs.make_eval`).

    Episodes run side by side (vmapped); each stops accumulating reward at its first termination or
    truncation. The loop ends when all have ended, or after `max_steps` (default: the env's limit).
    `policy(obs_batch, key) -> actions` acts on a batch of observations.
    """
    max_steps = env.max_episode_steps if max_steps is None else max_steps
    reset_key, loop_key = jax.random.split(key)
    if getattr(env, "batched", False):
        # A host vector environment of num_episodes copies: one call steps them all. It resets
        # itself when an episode ends; `done` below keeps only each copy's first episode.
        if env.num_envs != num_episodes:
            raise ValueError(f"{env!r} holds {env.num_envs} copies, not {num_episodes}")
        obs, state = env.reset(reset_key)
        step_many = lambda keys, state, action: env.step(keys[0], state, action)  # noqa: E731
    else:
        obs, state = jax.vmap(env.reset)(jax.random.split(reset_key, num_episodes))
        step_many = jax.vmap(env.step)

    def cond(carry):
        t, _, _, _, done, _ = carry
        return jnp.logical_and(t < max_steps, jnp.logical_not(done.all()))

    def body(carry):
        t, obs, state, returns, done, key = carry
        key, act_key, step_key = jax.random.split(key, 3)
        action = policy(obs, act_key)
        result = step_many(jax.random.split(step_key, num_episodes), state, action)
        # A multi-agent environment's return is the team's: the sum over its agents' rewards.
        # An Atari game played with lives as episodes and clipped rewards scores its own reward
        # until the game is over (envs.external's `game_reward` and `game_over`).
        reward = result.info.get("game_reward", result.reward)
        reward = reward.reshape(num_episodes, -1).sum(axis=-1)
        returns = returns + jnp.where(done, 0.0, reward)
        done = done | result.info.get("game_over", result.terminated | result.truncated)
        return t + 1, result.obs, result.state, returns, done, key

    # Philox keys inside the loop: a threefry split there is a nested loop (jaxrl.prng).
    loop_key = loop_keys(loop_key)
    init = (0, obs, state, jnp.zeros(num_episodes), jnp.zeros(num_episodes, bool), loop_key)
    return jax.lax.while_loop(cond, body, init)[3]


def __getattr__(name: str) -> Any:
    # The statistics and plots lived here until they moved to jaxrl.statistics: the old path
    # keeps working for a while, with a warning naming the new one.
    from jaxrl import statistics

    if name.startswith("_") or not hasattr(statistics, name):
        raise AttributeError(f"module 'jaxrl.evaluation' has no attribute {name!r}")
    message = f"jaxrl.evaluation.{name} moved to jaxrl.statistics.{name}; import it from there"
    warnings.warn(message, DeprecationWarning, stacklevel=2)
    return getattr(statistics, name)
