"""jaxrl.prng.loop_keys: Philox keys for compiled loops, from legacy and typed keys alike."""

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl.prng import LOOP_PRNG, loop_keys


def test_loop_keys_are_philox_deterministic_and_distinct():
    legacy = jax.random.PRNGKey(3)
    keys = loop_keys(legacy, (4, 2))
    assert keys.shape == (4, 2)
    assert str(jax.random.key_impl(keys)) == LOOP_PRNG
    np.testing.assert_array_equal(
        jax.random.key_data(keys), jax.random.key_data(loop_keys(legacy, (4, 2)))
    )
    words = np.asarray(jax.random.key_data(keys)).reshape(8, 2)
    assert len({tuple(w) for w in words}) == 8
    # A different parent key gives different loop keys.
    other = np.asarray(jax.random.key_data(loop_keys(jax.random.PRNGKey(4), (4, 2))))
    assert not np.array_equal(other.reshape(8, 2), words)


def test_loop_keys_accept_typed_keys_and_leave_philox_keys_philox():
    typed = jax.random.key(0)
    assert str(jax.random.key_impl(loop_keys(typed))) == LOOP_PRNG
    philox = jax.random.key(0, impl=LOOP_PRNG)
    assert loop_keys(philox) is philox
    assert loop_keys(philox, 3).shape == (3,)


def test_loop_keys_draw_uniform_numbers_and_vmap_like_separate_calls():
    keys = jax.random.split(jax.random.PRNGKey(0), 4)
    batched = jax.vmap(lambda k: jax.random.uniform(loop_keys(k), (20_000,)))(keys)
    separate = jnp.stack([jax.random.uniform(loop_keys(k), (20_000,)) for k in keys])
    np.testing.assert_array_equal(batched, separate)
    # Mean 1/2 and variance 1/12 within a few standard errors (80k draws).
    assert abs(float(batched.mean()) - 0.5) < 0.005
    assert abs(float(batched.var()) - 1 / 12) < 0.002
