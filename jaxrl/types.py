"""Pytrees shared across algorithms."""

from __future__ import annotations

from typing import Any

import jax
from flax import struct

PRNGKey = jax.Array
Params = Any
Metrics = dict[str, jax.Array]


@struct.dataclass
class Transition:
    """Environment steps as every learner and dataset stores them (any leading axes): the replay
    buffer, offline datasets and the on-policy `Rollout` all use these names."""

    obs: jax.Array
    action: jax.Array
    reward: jax.Array
    # The observation this step led to: the true final observation when the episode ended (not
    # the next episode's first), so that truncated episodes bootstrap from where they were cut.
    next_obs: jax.Array
    terminated: jax.Array  # absorbing state reached: the value after it is zero


@struct.dataclass
class Rollout(Transition):
    """A `Transition` as an on-policy learner records it while acting (axes: [time, env])."""

    done: jax.Array  # terminated or truncated: the episode (and GAE's recursion) ends here
    log_prob: jax.Array  # log pi(action | obs) under the acting parameters
