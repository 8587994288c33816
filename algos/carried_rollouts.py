"""What partial rollouts of single completions (`algos.partial`) and of conversations
(`algos.multiturn_partial`) share: the algorithm's state with the carried slots in it, the cache
moved left between updates, the choice of the ended groups that train, an update that trains
only when some group ended, and the staleness of the trained tokens.

A token's policy version is the update (`state.step`) that sampled it; its staleness when it
trains is the training update's version minus its own.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from jaxrl.hparams import HParams
from jaxrl.lm import training
from jaxrl.lm.model import ModelConfig
from jaxrl.lm.sampler import map_cache

Array = jax.Array


class State(NamedTuple):
    """The `TrainState` fields plus the carried rollouts (`slots`: the mode's own), so that
    checkpoints hold them."""

    params: Any
    opt_state: Any
    key: Array
    step: Array
    slots: Any


def move_cache_left(model: ModelConfig, cache: Any, shift: Array) -> Any:
    """The cache's columns moved left by `shift` along each leaf's sequence axis (read off
    `init_cache`); what falls off the left comes back on the right, where the next writes go."""
    roll = lambda _, axis, leaf: leaf if axis is None else jnp.roll(leaf, -shift, axis=axis)  # noqa: E731
    return map_cache(model, roll, cache)


def choose_groups(complete: Array, started: Array, groups: int) -> tuple[Array, Array, Array]:
    """Of the slot groups, those that train now: the `groups` ended ones (`complete`) that
    started first (`started`, per group), fewer when fewer ended. Returns the chosen groups'
    indices [groups], whether each trains (else it takes part at weight 0), and the slot groups
    freed by training."""
    order = jnp.where(complete, started, jnp.iinfo(jnp.int32).max)
    chosen = jnp.argsort(order, stable=True)[:groups]
    trains = complete[chosen]
    freed = jnp.zeros(complete.shape, bool).at[chosen].set(trains)
    return chosen, trains, freed


def staleness_metrics(staleness: Array, trained: Array, max_staleness: int) -> dict[str, Array]:
    """Per update: the trained tokens' staleness (the training version minus the version that
    sampled each) as mean, max, off-policy fraction and a histogram `staleness_<age>`."""
    count = jnp.maximum(trained.sum(), 1).astype(jnp.float32)
    metrics = {
        "staleness_mean": jnp.sum(staleness * trained) / count,
        "staleness_max": jnp.max(jnp.where(trained, staleness, 0)).astype(jnp.float32),
        "offpolicy_token_fraction": jnp.sum((staleness > 0) & trained) / count,
    }
    for age in range(max_staleness + 1):
        metrics[f"staleness_{age}"] = jnp.sum((staleness == age) & trained) / count
    return metrics


def train_if_any(
    optimize: Any,
    state: Any,
    batch: dict[str, Array],
    hp: HParams,
    shuffle_key: Array,
    reference_params: Any,
    any_ended: Array,
) -> tuple[training.TrainState, dict[str, Array]]:
    """The optimizer steps on `batch` when some group ended (`any_ended`); otherwise none, since
    Adam would move the parameters on zero gradients, and zeros for the step metrics. `state`
    holds params, opt_state, key and step; the returned state only those."""
    start = training.TrainState(state.params, state.opt_state, state.key, state.step)

    def train(train_state: training.TrainState):
        train_state, step_metrics = optimize(
            train_state, batch, hp, shuffle_key, train_state.params, reference_params
        )
        return train_state, jax.tree.map(jnp.mean, step_metrics)

    def skip(train_state: training.TrainState):
        shapes = jax.eval_shape(train, train_state)[1]
        return train_state, jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)

    return jax.lax.cond(any_ended, train, skip, start)
