"""GAE against a NumPy reference written from the definition, with terminations and truncations."""

import numpy as np
import pytest

from algos.ppo import gae


def gae_reference(rewards, values, next_values, terminated, truncated, gamma, lam):
    """A_t = sum_l (gamma * lam)^l * delta_{t+l}, summed only up to the end of t's episode.

    delta_t = r_t + gamma * V(s'_t) * [not terminated_t] - V(s_t), where s'_t is the observation
    step t led to: on truncation the true final observation (bootstrapped), on termination none.
    """
    T = len(rewards)
    done = terminated | truncated
    deltas = rewards + gamma * next_values * (1.0 - terminated) - values
    advantages = np.zeros_like(rewards)
    for t in range(T):
        total, weight = 0.0, 1.0
        for k in range(t, T):
            total += weight * deltas[k]
            if done[k]:
                break
            weight *= gamma * lam
        advantages[t] = total
    return advantages, advantages + values


def test_hand_computed_terminal_and_truncation():
    # Three steps: step 0 continues, step 1 is truncated (bootstrap V(final)=10), step 2 terminates.
    rewards = np.array([1.0, 1.0, 1.0], np.float32)
    values = np.array([0.5, 0.5, 0.5], np.float32)
    next_values = np.array([0.5, 10.0, 7.0], np.float32)
    terminated = np.array([False, False, True])
    truncated = np.array([False, True, False])
    gamma, lam = 0.9, 0.8
    adv, ret = gae(rewards, values, next_values, terminated, terminated | truncated, gamma, lam)
    delta2 = 1.0 - 0.5  # terminal: no bootstrap from 7.0
    delta1 = 1.0 + 0.9 * 10.0 - 0.5  # truncated: bootstrap from the final observation's value
    delta0 = 1.0 + 0.9 * 0.5 - 0.5
    expected = np.array([delta0 + 0.9 * 0.8 * delta1, delta1, delta2])
    np.testing.assert_allclose(adv, expected, rtol=1e-6)
    np.testing.assert_allclose(ret, expected + values, rtol=1e-6)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_random_rollouts_match_reference(seed):
    rng = np.random.default_rng(seed)
    T, N = 64, 5
    rewards = rng.normal(size=(T, N)).astype(np.float32)
    values = rng.normal(size=(T, N)).astype(np.float32)
    next_values = rng.normal(size=(T, N)).astype(np.float32)
    terminated = rng.random((T, N)) < 0.08
    truncated = (rng.random((T, N)) < 0.08) & ~terminated
    gamma, lam = 0.99, 0.95
    adv, ret = gae(rewards, values, next_values, terminated, terminated | truncated, gamma, lam)
    for n in range(N):
        ref_adv, ref_ret = gae_reference(
            rewards[:, n], values[:, n], next_values[:, n], terminated[:, n], truncated[:, n],
            gamma, lam,
        )  # fmt: skip
        np.testing.assert_allclose(adv[:, n], ref_adv, rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(ret[:, n], ref_ret, rtol=1e-4, atol=1e-4)


def test_truncation_differs_from_termination():
    """The same step marked truncated rather than terminated must keep its bootstrap value."""
    rewards = np.zeros(1, np.float32)
    values = np.zeros(1, np.float32)
    next_values = np.ones(1, np.float32)
    adv_trunc, _ = gae(
        rewards, values, next_values, np.array([False]), np.array([True]), 0.99, 0.95
    )
    adv_term, _ = gae(rewards, values, next_values, np.array([True]), np.array([True]), 0.99, 0.95)
    np.testing.assert_allclose(adv_trunc, [0.99])
    np.testing.assert_allclose(adv_term, [0.0])
