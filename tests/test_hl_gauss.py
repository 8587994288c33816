"""HL-Gauss value learning by classification (Farebrother et al., 2024): the target distribution,
value and loss against a NumPy reference written from the paper, the PPO and SAC critic losses
that use it, its configuration errors, and PPO learning CartPole with a classifying critic."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from algos import ppo, sac
from jaxrl.config import ConfigError
from jaxrl.hl_gauss import HLGauss


def numpy_target_probs(target, low, high, num_bins, sigma_in_bins):
    """Section 3 of the paper: the probability of bin i is the Normal(y, sigma) mass between its
    edges, divided by the mass inside [low, high]; y is first clipped onto the range."""
    width = (high - low) / num_bins
    sigma = sigma_in_bins * width
    y = min(max(target, low), high)

    def cdf(x):
        return 0.5 * (1.0 + math.erf((x - y) / (sigma * math.sqrt(2.0))))

    edges = [low + i * width for i in range(num_bins + 1)]
    mass = np.array([cdf(edges[i + 1]) - cdf(edges[i]) for i in range(num_bins)])
    return mass / (cdf(high) - cdf(low))


def numpy_log_softmax(logits):
    shifted = logits - logits.max(-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))


@pytest.mark.parametrize("num_bins, low, high, sigma", [(51, 0.0, 100.0, 0.75), (11, -5, 3, 2.0)])
def test_target_value_and_loss_match_numpy(num_bins, low, high, sigma):
    hl = HLGauss(num_bins, low, high, sigma)
    rng = np.random.default_rng(0)
    # Inside the range, on its edges and outside it on both sides.
    targets = np.concatenate([rng.uniform(low, high, 20), [low, high, low - 7.0, high + 7.0]])
    logits = rng.normal(size=(targets.size, num_bins)).astype(np.float32)

    expected_probs = np.stack([numpy_target_probs(t, low, high, num_bins, sigma) for t in targets])
    probs = np.asarray(hl.target_probs(jnp.asarray(targets, jnp.float32)))
    np.testing.assert_allclose(probs, expected_probs, atol=2e-6)
    np.testing.assert_allclose(probs.sum(-1), 1.0, atol=1e-5)

    centres = low + (np.arange(num_bins) + 0.5) * (high - low) / num_bins
    softmax = np.exp(numpy_log_softmax(logits))
    value = np.asarray(hl.value(logits))
    np.testing.assert_allclose(value, softmax @ centres, rtol=1e-5, atol=1e-6)

    expected_loss = -(expected_probs * numpy_log_softmax(logits)).sum(-1)
    loss = np.asarray(hl.loss(jnp.asarray(logits), jnp.asarray(targets, jnp.float32)))
    np.testing.assert_allclose(loss, expected_loss, rtol=1e-5)


def test_value_of_the_target_distribution_is_close_to_the_target():
    """Classifying perfectly recovers the target: the expectation of the HL-Gauss distribution is
    within a fraction of a bin of the (in-range, away from the ends) target."""
    hl = HLGauss(51, 0.0, 100.0)
    targets = jnp.linspace(10.0, 90.0, 9)
    recovered = hl.value(jnp.log(hl.target_probs(targets)))
    np.testing.assert_allclose(np.asarray(recovered), np.asarray(targets), atol=0.05 * hl.bin_width)


def test_gradient_does_not_reach_the_target():
    hl = HLGauss(11, -1.0, 1.0)
    grad = jax.grad(lambda t: hl.loss(jnp.zeros(11), t))(jnp.float32(0.3))
    assert float(grad) == 0.0


def test_ppo_value_loss_is_the_cross_entropy():
    hl = HLGauss(21, 0.0, 10.0)
    rng = np.random.default_rng(1)
    n = 16
    logits = rng.normal(size=(n, 21)).astype(np.float32)
    returns = rng.uniform(-1, 12, n).astype(np.float32)
    zeros = np.zeros(n, np.float32)
    _, metrics = ppo.ppo_loss_terms(
        log_prob=zeros,
        old_log_prob=zeros,
        advantages=rng.normal(size=n).astype(np.float32),
        value=np.asarray(hl.value(logits)),
        old_value=zeros,
        returns=returns,
        entropy=zeros,
        clip_eps=0.2,
        vf_coef=0.5,
        ent_coef=0.0,
        clip_value=False,
        value_logits=logits,
        hl_gauss=hl,
    )
    probs = np.stack([numpy_target_probs(r, 0.0, 10.0, 21, 0.75) for r in returns])
    expected = -(probs * numpy_log_softmax(logits)).sum(-1).mean()
    np.testing.assert_allclose(float(metrics["value_loss"]), expected, rtol=1e-5)


def test_sac_critic_loss_sums_the_critics_mean_cross_entropy():
    hl = HLGauss(31, -50.0, 10.0, 1.0)
    rng = np.random.default_rng(2)
    logits = rng.normal(size=(2, 8, 31)).astype(np.float32)
    target = rng.uniform(-60, 15, 8).astype(np.float32)
    probs = np.stack([numpy_target_probs(t, -50.0, 10.0, 31, 1.0) for t in target])
    expected = sum(-(probs * numpy_log_softmax(logits[i])).sum(-1).mean() for i in range(2))
    got = sac.classification_critic_loss(jnp.asarray(logits), jnp.asarray(target), hl)
    np.testing.assert_allclose(float(got), expected, rtol=1e-5)


NO_CLIP = dict(clip_value=False)
BINS = dict(hl_gauss_bins=51)


@pytest.mark.parametrize(
    "make, kwargs, field",
    [
        (ppo.Config, dict(hl_gauss_bins=51, clip_value=False), "hl_gauss_range"),
        (ppo.Config, dict(hl_gauss_range=(0, 100)), "hl_gauss_range"),
        (ppo.Config, dict(hl_gauss_sigma=1.0), "hl_gauss_sigma"),
        (ppo.Config, dict(hl_gauss_bins=51, hl_gauss_range=(0, 100)), "clip_value"),
        (
            ppo.Config,
            dict(hl_gauss_bins=1, hl_gauss_range=(0, 1), clip_value=False),
            "hl_gauss_bins",
        ),
        (
            ppo.Config,
            dict(hl_gauss_bins=9, hl_gauss_range=(5, 5), clip_value=False),
            "hl_gauss_range",
        ),
        (sac.Config, dict(hl_gauss_bins=51, hl_gauss_range=(0, float("nan"))), "hl_gauss_range"),
        (
            sac.Config,
            dict(hl_gauss_bins=51, hl_gauss_range=(0, 1), hl_gauss_sigma=0),
            "hl_gauss_sigma",
        ),
    ],
)
def test_config_errors_name_the_field(make, kwargs, field):
    with pytest.raises(ConfigError) as error:
        make(**kwargs)
    assert str(error.value).startswith(f"{field}: "), str(error.value)


def test_ppo_with_a_classifying_critic_learns_cartpole():
    """CartPole's discounted returns lie in [0, 100] (gamma 0.99): 51 bins over that range and
    the default settings otherwise (no value clipping) reach the 475 threshold."""
    config = ppo.Config(
        hl_gauss_bins=51, hl_gauss_range=(0, 100), clip_value=False, eval_episodes=16
    )
    _, metrics = jax.jit(jax.vmap(ppo.make_train(config)))(jax.random.split(jax.random.key(0), 2))
    eval_return = np.asarray(metrics["eval_return"])
    assert eval_return.min() >= 475, eval_return
