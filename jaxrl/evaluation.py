"""Episode evaluation inside the compiled program."""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp

from jaxrl.types import PRNGKey


def evaluate_episodes(
    env,
    policy: Callable[[jax.Array, PRNGKey], jax.Array],
    key: PRNGKey,
    num_episodes: int,
    max_steps: int | None = None,
) -> jax.Array:
    """Undiscounted returns of `num_episodes` fresh episodes of a single, non-resetting `env`.

    Episodes run side by side (vmapped); each stops accumulating reward at its first termination or
    truncation. The loop ends when all have ended, or after `max_steps` (default: the env's limit).
    `policy(obs_batch, key) -> actions` acts on a batch of observations.
    """
    max_steps = env.max_episode_steps if max_steps is None else max_steps
    reset_key, loop_key = jax.random.split(key)
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
        returns = returns + jnp.where(done, 0.0, result.reward)
        done = done | result.terminated | result.truncated
        return t + 1, result.obs, result.state, returns, done, key

    init = (0, obs, state, jnp.zeros(num_episodes), jnp.zeros(num_episodes, bool), loop_key)
    return jax.lax.while_loop(cond, body, init)[3]
