"""Collecting offline RL episodes: a policy acts in `num_envs` copies of a JAX environment inside
one compiled loop; the host then cuts the time-major record into episodes in the in-memory format
of `jaxrl.data.episodes` (ready for `build_episode_dataset`).

    env = envs.make("Pendulum-v1")
    episodes = collect_episodes(env, random_policy(env.action_space), key, num_steps=10_000,
                                num_envs=10)

The environment is a single, non-resetting one (`reset(key)`, `step(key, state, action)` returning
obs/state/reward/terminated/truncated, as `envs.make` builds): vectorising and resetting are done
here, so that the true last observation of every episode is recorded (what AutoReset keeps in
info["final_obs"]) and a time-limit truncation is told apart from a termination. (jaxrl imports
nothing from `envs`: any object with that interface works.)

Continuous actions are clipped into the action space before stepping, and the clipped action is
what is stored: the dataset records what the environment executed (a Gaussian policy's raw sample
can lie outside the bounds). Discrete actions are stored as int32 indices.

Two ways to say how much to collect:
- `num_steps`: every environment runs ceil(num_steps / num_envs) steps (so at least num_steps
  transitions). Episodes still running at the end are KEPT as cut episodes (complete=False,
  terminal=False: a learner bootstraps from their last observation, exactly as for a time
  limit), so every collected transition is in the dataset, as in D4RL, whose files end with such
  an episode. Pass keep_partial=False to drop them.
- `num_episodes`: each environment runs until it has finished ceil(num_episodes / num_envs)
  episodes (a `lax.while_loop` that stops when all have, so short episodes cost no padding
  steps); then exactly num_episodes complete episodes are kept, round-robin over environments.
  A fixed per-environment quota keeps the sample unbiased: choosing "the first N episodes to end"
  would favour short ones.
Episodes are ordered by (index within their environment, environment).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from jaxrl.types import Transition

__all__ = [
    "Record",
    "collect_episodes",
    "episode_returns",
    "make_rollout",
    "random_policy",
    "split_episodes",
]

Policy = Callable[[jax.Array, jax.Array], jax.Array]  # act(obs_batch, key) -> actions


@struct.dataclass
class Record(Transition):
    """Time-major record [T, num_envs, ...] of a collection run: each step is a
    `jaxrl.types.Transition` (the executed, clipped action, float32 or int32; `next_obs` the true
    last observation when the episode ended; `terminated`: next_obs is absorbing) with two more
    fields."""

    truncated: Any  # bool: a time limit ended the episode at next_obs
    valid: Any  # bool: the step counts (False once an env has finished its episode quota)


def _is_discrete(space: Any) -> bool:
    return hasattr(space, "n") and not hasattr(space, "low")


def random_policy(action_space: Any) -> Policy:
    """Uniform random actions: the D4RL "random" behaviour policy. Works with gymnax Discrete
    (`n`) and Box (`low`, `high`, `shape`) spaces."""
    if _is_discrete(action_space):
        n = int(action_space.n)

        def act_discrete(obs: jax.Array, key: jax.Array) -> jax.Array:
            return jax.random.randint(key, obs.shape[:1], 0, n, dtype=jnp.int32)

        return act_discrete
    shape = tuple(action_space.shape)
    low = jnp.broadcast_to(jnp.asarray(action_space.low, jnp.float32), shape)
    high = jnp.broadcast_to(jnp.asarray(action_space.high, jnp.float32), shape)

    def act_box(obs: jax.Array, key: jax.Array) -> jax.Array:
        return jax.random.uniform(key, obs.shape[:1] + shape, jnp.float32, low, high)

    return act_box


def _check_counts(num_envs: int, num_steps: int | None, num_episodes: int | None) -> None:
    if num_envs < 1:
        raise ValueError(f"num_envs must be >= 1, got {num_envs}")
    if (num_steps is None) == (num_episodes is None):
        raise ValueError("pass exactly one of num_steps and num_episodes")
    amount = num_steps if num_steps is not None else num_episodes
    if amount < 1:
        which = "num_steps" if num_steps is not None else "num_episodes"
        raise ValueError(f"{which} must be >= 1, got {amount}")


def make_rollout(
    env: Any,
    policy: Callable[[Any, jax.Array, jax.Array], jax.Array],
    num_envs: int,
    *,
    num_steps: int | None = None,
    num_episodes: int | None = None,
    max_episode_steps: int | None = None,
) -> Callable[[Any, jax.Array], tuple[Record, jax.Array]]:
    """A jitted `rollout(policy_params, key) -> (Record, steps_run)`.

    `policy(policy_params, obs_batch, key) -> actions` takes its parameters as an argument, so one
    compiled rollout serves many checkpoints of a policy (medium-replay). The Record's time axis
    has a static length; only its first `steps_run` rows hold data (fewer than the length when an
    episode quota is met early). `num_steps` / `num_episodes` are as in `collect_episodes`.
    """
    _check_counts(num_envs, num_steps, num_episodes)
    space = env.action_space
    discrete = _is_discrete(space)
    if num_steps is not None:
        length = math.ceil(num_steps / num_envs)
        quota = length + 1  # never reached: no early stop
    else:
        max_episode_steps = max_episode_steps or getattr(env, "max_episode_steps", None)
        if not max_episode_steps:
            raise ValueError(
                "num_episodes needs the environment's episode step limit: pass max_episode_steps"
            )
        quota = math.ceil(num_episodes / num_envs)
        length = quota * int(max_episode_steps)  # enough for `quota` episodes of any length
    if not discrete:
        action_shape = tuple(space.shape)
        low = jnp.broadcast_to(jnp.asarray(space.low, jnp.float32), action_shape)
        high = jnp.broadcast_to(jnp.asarray(space.high, jnp.float32), action_shape)

    reset_many = jax.vmap(env.reset)
    step_many = jax.vmap(env.step)

    def executed_action(raw: jax.Array) -> jax.Array:
        if discrete:
            expected: tuple[int, ...] = (num_envs,)
        else:
            expected = (num_envs, *action_shape)
        if raw.shape != expected:
            raise ValueError(
                f"the policy returned actions of shape {raw.shape} for {num_envs} observations; "
                f"expected {expected}"
            )
        if discrete:
            return raw.astype(jnp.int32)
        return jnp.clip(raw.astype(jnp.float32), low, high)

    def rollout(params: Any, key: jax.Array) -> tuple[Record, jax.Array]:
        key, reset_key = jax.random.split(key)
        obs, state = reset_many(jax.random.split(reset_key, num_envs))
        obs_shape = obs.shape[1:]

        def zeros(shape, dtype):
            return jnp.zeros((length, num_envs, *shape), dtype)

        buffers = Record(
            obs=zeros(obs_shape, jnp.float32),
            action=zeros(() if discrete else action_shape, jnp.int32 if discrete else jnp.float32),
            reward=zeros((), jnp.float32),
            terminated=zeros((), jnp.bool_),
            truncated=zeros((), jnp.bool_),
            next_obs=zeros(obs_shape, jnp.float32),
            valid=zeros((), jnp.bool_),
        )
        finished = jnp.zeros(num_envs, jnp.int32)

        def cond(carry):
            t, _, _, finished, _, _ = carry
            return jnp.logical_and(t < length, jnp.any(finished < quota))

        def body(carry):
            t, obs, state, finished, buffers, key = carry
            key, act_key, step_key, reset_key = jax.random.split(key, 4)
            action = executed_action(policy(params, obs, act_key))
            result = step_many(jax.random.split(step_key, num_envs), state, action)
            done = jnp.logical_or(result.terminated, result.truncated)
            valid = finished < quota
            record = Record(
                obs=obs.astype(jnp.float32),
                action=action,
                reward=result.reward.astype(jnp.float32),
                terminated=result.terminated.astype(jnp.bool_),
                truncated=result.truncated.astype(jnp.bool_),
                next_obs=result.obs.astype(jnp.float32),
                valid=valid,
            )
            buffers = jax.tree.map(lambda buf, x: buf.at[t].set(x), buffers, record)
            # Auto-reset: environments whose episode ended start a new one.
            reset_obs, reset_state = reset_many(jax.random.split(reset_key, num_envs))

            def pick(reset_leaf, step_leaf):
                mask = done.reshape(done.shape + (1,) * (step_leaf.ndim - 1))
                return jnp.where(mask, reset_leaf, step_leaf)

            next_obs = pick(reset_obs, result.obs)
            next_state = jax.tree.map(pick, reset_state, result.state)
            finished = finished + jnp.logical_and(done, valid).astype(jnp.int32)
            return t + 1, next_obs, next_state, finished, buffers, key

        steps_run, _, _, _, buffers, _ = jax.lax.while_loop(
            cond, body, (jnp.zeros((), jnp.int32), obs, state, finished, buffers, key)
        )
        return buffers, steps_run

    return jax.jit(rollout)


def split_episodes(
    record: Record,
    steps_run: int | None = None,
    *,
    keep_partial: bool = True,
    policy_name: str | None = None,
) -> list[dict[str, Any]]:
    """Cuts a time-major `Record` into episodes (format: `jaxrl.data.episodes`), on the host.

    An episode ends at a step with terminated or truncated; its observations are those acted on
    plus the last step's next_obs (the true final observation, not the next episode's first), and
    `terminal` is the last step's `terminated`: a truncation leaves it False. Steps after an
    environment's last episode end form a cut episode (complete=False), kept if `keep_partial`.
    Ordered by (index within the environment, environment).
    """
    count = None if steps_run is None else int(steps_run)
    host = jax.tree.map(lambda x: np.asarray(x)[:count], record)
    done = host.terminated | host.truncated
    keyed = []
    for env_index in range(host.obs.shape[1]):
        count = int(host.valid[:, env_index].sum())  # valid steps are a prefix
        ends = np.flatnonzero(done[:count, env_index])
        starts = np.r_[0, ends + 1]
        pieces = [(int(s), int(e), True) for s, e in zip(starts[:-1], ends, strict=True)]
        if keep_partial and starts[-1] < count:
            pieces.append((int(starts[-1]), count - 1, False))
        for episode_index, (start, end, complete) in enumerate(pieces):
            rows = slice(start, end + 1)
            episode = {
                "observation": np.concatenate(
                    [host.obs[rows, env_index], host.next_obs[end : end + 1, env_index]]
                ),
                "action": host.action[rows, env_index],
                "reward": host.reward[rows, env_index],
                "terminal": bool(host.terminated[end, env_index]) and complete,
                "complete": complete,
            }
            if policy_name is not None:
                episode["policy"] = policy_name
            keyed.append(((episode_index, env_index), episode))
    keyed.sort(key=lambda item: item[0])
    return [episode for _, episode in keyed]


def collect_episodes(
    env: Any,
    policy: Policy | Callable[[Any, jax.Array, jax.Array], jax.Array],
    key: jax.Array,
    *,
    num_steps: int | None = None,
    num_episodes: int | None = None,
    num_envs: int = 1,
    keep_partial: bool = True,
    policy_params: Any = None,
    policy_name: str | None = None,
    max_episode_steps: int | None = None,
) -> list[dict[str, Any]]:
    """Runs `policy` in `num_envs` copies of `env` (one compiled loop) and returns its episodes.

    `policy(obs_batch, key) -> actions`, or, with `policy_params`, `policy(policy_params,
    obs_batch, key)` (the parameters then enter the compiled loop as an argument rather than as
    constants). Give exactly one of `num_steps` and `num_episodes` (module docstring: rounding,
    and what happens to episodes still running at the end). `policy_name` is recorded on every
    episode (mixtures hold several policies).
    """
    params_policy = policy
    if policy_params is None:
        params_policy = lambda params, obs, k: policy(obs, k)  # noqa: E731
    rollout = make_rollout(
        env,
        params_policy,
        num_envs,
        num_steps=num_steps,
        num_episodes=num_episodes,
        max_episode_steps=max_episode_steps,
    )
    record, steps_run = rollout(policy_params, key)
    episodes = split_episodes(
        record,
        int(steps_run),
        keep_partial=keep_partial and num_episodes is None,
        policy_name=policy_name,
    )
    if num_episodes is not None:
        episodes = [e for e in episodes if e["complete"]][:num_episodes]
    return episodes


def episode_returns(episodes: list[dict[str, Any]], complete_only: bool = True) -> np.ndarray:
    """Undiscounted returns (float64) of the episodes (only those that ended in the environment,
    unless `complete_only` is False): the behaviour policy's score."""
    return np.asarray(
        [
            float(np.sum(e["reward"], dtype=np.float64))
            for e in episodes
            if e.get("complete", True) or not complete_only
        ],
        np.float64,
    )
