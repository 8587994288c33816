"""A fixed-size circular replay buffer held as a pytree, so it lives inside the compiled program.

Off-policy learners keep it in their training state: adding and sampling are pure functions, the
buffer vmaps over seeds with the rest of the state and checkpoints like any other pytree. SAC's rows
are `jaxrl.types.Transition`s; any pytree of arrays works.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import struct

from jaxrl.types import PRNGKey


@struct.dataclass
class ReplayBuffer:
    """`data` is a pytree (e.g. a `Transition`) whose leaves have a leading axis of `capacity` rows.

    `position` is where the next row goes; `size` is how many rows hold data (at most capacity).
    """

    data: Any
    position: jax.Array
    size: jax.Array

    @property
    def capacity(self) -> int:
        """Rows the buffer can hold (the leading axis of its leaves)."""
        return jax.tree.leaves(self.data)[0].shape[0]


def init_buffer(example: Any, capacity: int) -> ReplayBuffer:
    """An empty buffer for rows shaped like `example` (one row, no batch axis)."""
    data = jax.tree.map(
        lambda x: jnp.zeros((capacity, *jnp.shape(x)), jnp.asarray(x).dtype), example
    )
    return ReplayBuffer(data, jnp.zeros((), jnp.int32), jnp.zeros((), jnp.int32))


def add_batch(buffer: ReplayBuffer, rows: Any) -> ReplayBuffer:
    """Write a batch of rows (leading axis n) at `position`, overwriting the oldest when full.

    The capacity must be a multiple of n (algorithm configs check this), so a batch never wraps
    around the end and one dynamic slice update writes it.
    """
    n = jax.tree.leaves(rows)[0].shape[0]
    data = jax.tree.map(
        lambda store, new: jax.lax.dynamic_update_slice_in_dim(
            store, new.astype(store.dtype), buffer.position, axis=0
        ),
        buffer.data,
        rows,
    )
    capacity = buffer.capacity
    return ReplayBuffer(
        data=data,
        position=(buffer.position + n) % capacity,
        size=jnp.minimum(buffer.size + n, capacity),
    )


def sample(buffer: ReplayBuffer, key: PRNGKey, batch_size: int) -> Any:
    """`batch_size` rows drawn uniformly with replacement from the filled part of the buffer, in
    the rows' own type (a `Transition` batch for a buffer of `Transition`s)."""
    return sample_uniform(buffer.data, key, batch_size, jnp.maximum(buffer.size, 1))


def sample_uniform(
    data: Any, key: PRNGKey, batch_size: int, num_rows: int | jax.Array | None = None
) -> Any:
    """`batch_size` rows drawn uniformly with replacement from the first `num_rows` (default:
    all) rows of a pytree of arrays: a buffer's filled part, or a whole offline dataset on device
    (CQL, behaviour cloning), which needs no sampler state between compiled steps."""
    if num_rows is None:
        num_rows = jax.tree.leaves(data)[0].shape[0]
    rows = jax.random.randint(key, (batch_size,), 0, num_rows, dtype=jnp.int32)
    return jax.tree.map(lambda x: jnp.take(x, rows, axis=0), data)
