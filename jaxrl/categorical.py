"""PPO's categorical policy distribution: distrax's, with leaner sampling and log-probs.

A module of its own so that importing `jaxrl.nets` (and with it every algorithm's Config) does
not import distrax, which takes about a second (TensorFlow Probability's JAX substrate): a
network head imports this module when it is first applied, so a script's --help or a mistyped
flag never loads it. `jaxrl.nets.Categorical` is this class.
"""

from __future__ import annotations

import distrax
import jax
import jax.numpy as jnp


class Categorical(distrax.Categorical):
    """distrax's categorical distribution over logits with leaner sampling and log-probs: every
    PPO rollout step samples it and every gradient step takes its log-prob, and distrax spends
    several small operations on checks our callers never need (that freshly computed
    probabilities are finite, that an action is inside the support). Samples are the same
    Gumbel-max draws for the same key; values agree with distrax's to float rounding.
    (`sample_and_log_prob` is distrax's own, which calls these two.)"""

    def _sample_n(self, key: jax.Array, n: int) -> jax.Array:
        shape = (n,) + self._logits.shape[:-1]
        return jax.random.categorical(key, self._logits, axis=-1, shape=shape).astype(self._dtype)

    def log_prob(self, value: jax.Array) -> jax.Array:
        log_probs = jax.nn.log_softmax(self._logits)
        return jnp.sum(jax.nn.one_hot(value, self.num_categories) * log_probs, axis=-1)
