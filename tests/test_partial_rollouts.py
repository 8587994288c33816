"""Rollouts that never wait (issue 39): AReaL's decoupled PPO objective against a NumPy
reference written from the paper's formula, and partial rollouts carried across updates."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from algos import grpo

# --- the decoupled objective -----------------------------------------------------------------


def np_decoupled_loss(logp, prox, behav, adv, mask, weights, variant, lo, hi, n_max, cap=None):
    """AReaL (Fu et al., 2025, eq. 5): per token
    -(pi_prox / pi_behav) * min(r A, clip(r, 1 - lo, 1 + hi) A), r = pi_theta / pi_prox,
    aggregated like GRPO's loss; tokens whose weight exceeds `cap` are left out."""
    rows = []
    for b in range(logp.shape[0]):
        tokens = []
        for t in range(logp.shape[1]):
            weight = np.exp(prox[b, t] - behav[b, t])
            if not mask[b, t] or (cap is not None and weight > cap):
                continue
            r = np.exp(logp[b, t] - prox[b, t])
            tokens.append(-weight * min(r * adv[b], np.clip(r, 1 - lo, 1 + hi) * adv[b]))
        rows.append(tokens)
    kept = [b for b in range(len(rows)) if weights[b] > 0]
    if variant == "grpo":
        return np.mean([np.mean(rows[b]) if rows[b] else 0.0 for b in kept])
    if variant == "dapo":
        return np.sum([np.sum(rows[b]) for b in kept]) / np.sum([len(rows[b]) for b in kept])
    return np.sum([np.sum(rows[b]) for b in kept]) / (len(kept) * n_max)


def _loss_inputs(seed=1, b=8, n=5):
    rng = np.random.default_rng(seed)
    logp = rng.normal(-1.5, 0.5, (b, n)).astype(np.float32)
    prox = (logp + rng.normal(0, 0.3, (b, n))).astype(np.float32)
    behav = (prox + rng.normal(0, 0.4, (b, n))).astype(np.float32)  # an older sampler
    adv = rng.normal(size=b).astype(np.float32)
    lengths = np.array([5, 3, 1, 4, 5, 2, 5, 3])
    mask = np.arange(n)[None] < lengths[:, None]
    weights = np.array([1, 1, 0, 0, 1, 1, 1, 1], np.float32)
    return logp, prox, behav, adv, mask, weights


def _loss(logp, prox, behav, adv, mask, weights, variant, cap=None):
    return grpo.policy_loss(
        jnp.asarray(logp), jnp.asarray(prox), jnp.asarray(adv), jnp.asarray(mask),
        jnp.asarray(weights), clip_low=0.2, clip_high=0.3,
        aggregation=grpo.VARIANTS[variant].aggregation, max_new_tokens=logp.shape[1],
        behaviour_log_probs=None if behav is None else jnp.asarray(behav),
        behaviour_weight_cap=cap,
    )  # fmt: skip


@pytest.mark.parametrize("variant", ["grpo", "dapo", "dr_grpo"])
@pytest.mark.parametrize("cap", [None, 2.0])
def test_decoupled_loss_matches_numpy(variant, cap):
    logp, prox, behav, adv, mask, weights = _loss_inputs()
    loss, _ = _loss(logp, prox, behav, adv, mask, weights, variant, cap)
    want = np_decoupled_loss(logp, prox, behav, adv, mask, weights, variant, 0.2, 0.3, 5, cap)
    np.testing.assert_allclose(float(loss), want, rtol=1e-5)
    # The weights matter: the same tokens without them give another loss.
    plain, _ = _loss(logp, prox, None, adv, mask, weights, variant)
    assert abs(float(plain) - want) > 1e-3


@pytest.mark.parametrize("variant", ["grpo", "dapo", "rloo"])
def test_decoupled_loss_with_behaviour_equal_to_proximal_is_the_grpo_loss(variant):
    logp, prox, _, adv, mask, weights = _loss_inputs(seed=2)
    loss, _ = _loss(logp, prox, prox, adv, mask, weights, variant)
    plain, _ = _loss(logp, prox, None, adv, mask, weights, variant)
    assert float(loss) == float(plain)
    # The gradient with respect to the trained log-probs too.
    grad = lambda behav: jax.grad(  # noqa: E731
        lambda lp: _loss(lp, prox, behav, adv, mask, weights, variant)[0]
    )(jnp.asarray(logp))
    np.testing.assert_array_equal(np.asarray(grad(prox)), np.asarray(grad(None)))


def test_log_prob_mismatch_is_over_the_marked_tokens():
    sampler = jnp.array([[-1.0, -2.0, -3.0], [-0.5, -0.5, -9.0]])
    trainer = jnp.array([[-1.1, -2.0, -3.5], [-0.5, -0.7, 0.0]])
    mask = jnp.array([[True, True, True], [True, True, False]])
    got = grpo.log_prob_mismatch(sampler, trainer, mask)
    np.testing.assert_allclose(float(got["logprob_mismatch_mean"]), (0.1 + 0.5 + 0.2) / 5, 1e-6)
    np.testing.assert_allclose(float(got["logprob_mismatch_max"]), 0.5, 1e-6)
