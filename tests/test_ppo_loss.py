"""The PPO objective and the policy heads' log-probabilities against NumPy references."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from algos import ppo
from jaxrl.nets import ActorCritic


def ppo_loss_reference(logp, old_logp, adv, value, old_value, ret, entropy, eps, vf, ent,
                       clip_value, normalize):  # fmt: skip
    logp, old_logp, adv = (np.asarray(x, np.float64) for x in (logp, old_logp, adv))
    value, old_value, ret = (np.asarray(x, np.float64) for x in (value, old_value, ret))
    if normalize:
        adv = (adv - adv.mean()) / (adv.std() + 1e-8)
    ratio = np.exp(logp - old_logp)
    surrogate = np.minimum(ratio * adv, np.clip(ratio, 1 - eps, 1 + eps) * adv)
    policy_loss = -surrogate.mean()
    if clip_value:
        v_clip = old_value + np.clip(value - old_value, -eps, eps)
        value_loss = 0.5 * np.maximum((value - ret) ** 2, (v_clip - ret) ** 2).mean()
    else:
        value_loss = 0.5 * ((value - ret) ** 2).mean()
    return policy_loss + vf * value_loss - ent * np.mean(entropy), policy_loss, value_loss


@pytest.mark.parametrize("clip_value", [True, False])
@pytest.mark.parametrize("normalize", [True, False])
def test_loss_matches_reference(clip_value, normalize):
    rng = np.random.default_rng(0)
    n = 256
    old_logp = rng.normal(-1.0, 0.3, n).astype(np.float32)
    logp = (old_logp + rng.normal(0, 0.3, n)).astype(np.float32)  # ratios well outside the clip
    adv = rng.normal(0.5, 2.0, n).astype(np.float32)
    old_value = rng.normal(size=n).astype(np.float32)
    value = (old_value + rng.normal(0, 0.5, n)).astype(np.float32)
    ret = rng.normal(size=n).astype(np.float32)
    entropy = rng.random(n).astype(np.float32)
    loss, metrics = ppo.ppo_loss_terms(
        logp, old_logp, adv, value, old_value, ret, entropy,
        clip_eps=0.2, vf_coef=0.5, ent_coef=0.01,
        clip_value=clip_value, normalize_advantages=normalize,
    )  # fmt: skip
    ref_loss, ref_pg, ref_v = ppo_loss_reference(
        logp, old_logp, adv, value, old_value, ret, entropy, 0.2, 0.5, 0.01, clip_value, normalize
    )
    np.testing.assert_allclose(loss, ref_loss, rtol=1e-5)
    np.testing.assert_allclose(metrics["policy_loss"], ref_pg, rtol=1e-5)
    np.testing.assert_allclose(metrics["value_loss"], ref_v, rtol=1e-5)
    ratio = np.exp(logp - old_logp)
    np.testing.assert_allclose(metrics["clip_fraction"], np.mean(np.abs(ratio - 1) > 0.2))


def test_categorical_log_prob_and_entropy_are_exact():
    net = ActorCritic(action_dim=3, discrete=True)
    obs = jax.random.normal(jax.random.PRNGKey(0), (5, 4))
    params = net.init(jax.random.PRNGKey(1), obs)
    dist, _ = net.apply(params, obs)
    logits = np.asarray(dist.logits, np.float64)
    log_softmax = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    actions = np.array([0, 1, 2, 1, 0])
    np.testing.assert_allclose(
        dist.log_prob(actions), log_softmax[np.arange(5), actions], rtol=1e-5
    )
    probs = np.exp(log_softmax)
    np.testing.assert_allclose(dist.entropy(), -(probs * log_softmax).sum(-1), rtol=1e-5)


def test_gaussian_log_prob_is_exact():
    net = ActorCritic(action_dim=2, discrete=False)
    obs = jax.random.normal(jax.random.PRNGKey(0), (5, 3))
    params = net.init(jax.random.PRNGKey(1), obs)
    params = jax.tree_util.tree_map_with_path(
        lambda p, x: x + 0.3 if "log_std" in jax.tree_util.keystr(p) else x, params
    )
    dist, _ = net.apply(params, obs)
    actions = np.asarray(jax.random.normal(jax.random.PRNGKey(2), (5, 2)))
    mean, std = np.asarray(dist.mean(), np.float64), np.asarray(dist.stddev(), np.float64)
    ref = (-0.5 * ((actions - mean) / std) ** 2 - np.log(std) - 0.5 * np.log(2 * np.pi)).sum(-1)
    np.testing.assert_allclose(dist.log_prob(actions), ref, rtol=1e-5)
    np.testing.assert_allclose(std, np.exp(0.3) * np.ones((5, 2)), rtol=1e-6)


def test_tanh_normal_log_prob_includes_jacobian():
    from jaxrl.nets import tanh_normal

    mean, log_std = jnp.array([0.1, -0.4]), jnp.array([-0.5, 0.2])
    dist = tanh_normal(mean, log_std)
    u = np.array([0.3, -1.2])
    a = np.tanh(u)
    std = np.exp(np.asarray(log_std, np.float64))
    base = -0.5 * ((u - np.asarray(mean)) / std) ** 2 - np.log(std) - 0.5 * np.log(2 * np.pi)
    ref = (base - np.log(1 - a**2)).sum()
    np.testing.assert_allclose(dist.log_prob(jnp.asarray(a, jnp.float32)), ref, rtol=1e-4)
