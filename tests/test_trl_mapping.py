"""The "Coming from TRL" page's mappings, each checked by evaluating TRL's formula (written here
in NumPy from its definition in TRL 1.16's GRPO trainer) and ours under the mapping on the same
inputs. Where the page says we differ on purpose, a test shows the difference is the one said."""

import jax
import jax.numpy as jnp
import numpy as np

from algos import grpo


def inputs(seed=0, rows=6, length=5):
    """Token log-probs under the current and the old policy (ratios from about 0.2 to 8, so
    that every bound acts), sequence advantages of both signs, completions of 1 to 5 tokens."""
    rng = np.random.default_rng(seed)
    log_probs = rng.normal(-2.0, 0.6, (rows, length))
    old = log_probs - rng.normal(0.3, 1.0, (rows, length))
    advantages = rng.normal(size=rows)
    mask = np.arange(length)[None] < np.array([5, 1, 3, 5, 2, 4])[:, None]
    return log_probs, old, advantages, mask


def trl_cispo_token_gradients(log_probs, old, advantages, mask, epsilon_high):
    """TRL's CISPO (loss_type="cispo"): each token's loss is -min(r, epsilon_high) x A x log pi,
    the weight held constant (no lower bound: epsilon_high is the cap on the ratio itself),
    summed over the batch's tokens and divided by their count. Its gradient per token."""
    ratio = np.exp(log_probs - old)
    weight = np.minimum(ratio, epsilon_high)
    return -weight * advantages[:, None] * mask / mask.sum()


def test_cispo_epsilon_high_is_our_upper_clip_plus_one_with_no_lower_bound():
    """TRL's epsilon_high=5.0 (the ratio's cap) is clip_high=4.0 with clip_low=1.0 (no lower
    bound) here, whose upper clip is 1 + clip_high. Renaming it (clip_high=5.0) caps at 6."""
    log_probs, old, advantages, mask = inputs()
    weights = np.ones(len(advantages))

    def ours(clip_low, clip_high):
        def loss(lp):
            value, _ = grpo.policy_loss(
                lp, jnp.asarray(old), jnp.asarray(advantages), jnp.asarray(mask),
                jnp.asarray(weights), clip_low=clip_low, clip_high=clip_high,
                aggregation="token_mean", max_new_tokens=mask.shape[1], surrogate="weight",
            )  # fmt: skip
            return value

        return np.asarray(jax.grad(loss)(jnp.asarray(log_probs, jnp.float32)))

    want = trl_cispo_token_gradients(log_probs, old, advantages, mask, epsilon_high=5.0)
    assert (np.exp(log_probs - old)[mask] > 5.0).any()  # the cap acts on these inputs
    np.testing.assert_allclose(ours(1.0, 4.0), want, rtol=1e-5, atol=1e-7)
    assert not np.allclose(ours(1.0, 5.0), want, rtol=1e-3)
