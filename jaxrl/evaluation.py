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


def plot_learning_curves(
    metrics_path: str,
    out_path: str,
    x: str = "env_steps",
    y: str = "episode_return",
    title: str | None = None,
) -> str | None:
    """Plot `y` against `x` from a metrics.jsonl: one thin line per run and the mean across runs.
    Returns the written path, or None if there is nothing to plot."""
    import json

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    with open(metrics_path) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    rows = [r for r in rows if y in r]
    if not rows:
        return None
    xs = np.array([r[x] for r in rows], dtype=float)
    fig, ax = plt.subplots(figsize=(6, 4), dpi=120)
    per_run = f"{y}_per_run"
    if per_run in rows[0]:
        runs = np.array([r[per_run] for r in rows], dtype=float)
        for i in range(runs.shape[1]):
            ax.plot(xs, runs[:, i], lw=0.8, alpha=0.4, color="tab:blue")
    ax.plot(xs, [r[y] for r in rows], lw=2.0, color="tab:blue", label="mean over runs")
    ax.set_xlabel(x.replace("_", " "))
    ax.set_ylabel(y.replace("_", " "))
    ax.set_title(title or y)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(out_path)
    plt.close(fig)
    return out_path
