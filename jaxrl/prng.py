"""Random keys for the inner loops of compiled programs: Philox rather than threefry.

JAX's default PRNG, threefry-2x32, lowers on CPU to a rolled five-iteration `while` loop (to keep
compile times down), so every split or draw inside a `lax.scan` body runs a nested loop of about
sixty small kernels. A CartPole rollout step does four such draws (split per environment, split for
the auto-reset, the reset's noise, the action sample), and they were half of its time. Philox-4x32
(Salmon et al., 2011, the generator behind cuRAND and PyTorch's CUDA RNG) lowers to straight-line
integer code that XLA fuses into the surrounding kernels, at no extra compile time.

`loop_keys` is applied where keys enter a hot loop (rollouts, replay sampling, evaluation episodes);
keys that callers pass in and state keys stay whatever the caller uses. Both generators are
counter-based and deterministic, so runs stay reproducible and vmapped seeds still equal separate
runs; only the particular random numbers differ from a threefry run's.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxrl.types import PRNGKey

LOOP_PRNG = "philox4x32"


def loop_keys(key: PRNGKey, shape: int | tuple[int, ...] = ()) -> jax.Array:
    """Philox keys for a compiled loop, derived from `key` (a legacy uint32 key or a typed key of
    any implementation): `shape` independent keys, or one key when `shape` is ()."""
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    if not jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
        key = jax.random.wrap_key_data(key)  # a legacy key of JAX's default implementation
    if str(jax.random.key_impl(key)) == LOOP_PRNG:
        return jax.random.split(key, shape) if shape else key
    # Two words per new key, drawn in one call to the caller's generator (one threefry hash).
    words = jax.random.bits(key, shape + (2,), jnp.uint32)
    return jax.random.wrap_key_data(words, impl=LOOP_PRNG)
