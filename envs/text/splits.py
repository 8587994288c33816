"""Train and held-out problems told apart by a fixed hash that the host (NumPy) and a compiled
program (JAX) compute alike, so a prompt sampler inside the program avoids the problems the
evaluation uses without a table of them.

A problem here is a row of small non-negative ints (a digit task's digits, a word's letter
codes); about `EVAL_PERCENT`% of all rows are held out:

    held = is_held_out(rows, np)                        # host: [n] bool
    rows = sample_split(key, draw, want_eval=False)     # JAX: draw(key) rows, held-out ones redrawn
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp

Array = jax.Array
EVAL_PERCENT = 10


def _problem_hash(rows, xp):
    """FNV-1a over a row's ints then an avalanche step, in uint32 arithmetic (wraps in NumPy and
    JAX alike). rows: [..., k] ints."""
    h = xp.full(rows.shape[:-1], 2166136261, dtype=xp.uint32)
    for i in range(rows.shape[-1]):
        h = (h ^ rows[..., i].astype(xp.uint32)) * xp.uint32(16777619)
    h = h ^ (h >> xp.uint32(15))
    h = h * xp.uint32(0x2C1B3C6D)
    return h ^ (h >> xp.uint32(12))


def is_held_out(rows, xp=jnp):
    """True for evaluation problems. rows: [..., k] ints; xp is numpy or jax.numpy."""
    return _problem_hash(rows, xp) % xp.uint32(100) < xp.uint32(EVAL_PERCENT)


def sample_split(key: Array, draw: Callable[[Array], Array], want_eval: bool) -> Array:
    """Rows `draw(key) -> [count, k]` of one split (pure JAX): a row of the other split is
    redrawn until it is not (10% of rows for the train split, so a few rounds)."""

    def wrong_split(rows):
        return is_held_out(rows) != want_eval

    def redraw(carry):
        key, rows = carry
        key, sub = jax.random.split(key)
        return key, jnp.where(wrong_split(rows)[:, None], draw(sub), rows)

    key, sub = jax.random.split(key)
    _, rows = jax.lax.while_loop(
        lambda carry: jnp.any(wrong_split(carry[1])), redraw, (key, draw(sub))
    )
    return rows
