"""SAC: losses against NumPy, the replay buffer, config errors, chunks and sweeps on the learner
contract, and learning Pendulum."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from algos import sac
from jaxrl import hparams, loop, replay
from jaxrl.config import ConfigError


def test_soft_td_target_matches_numpy_and_never_bootstraps_a_termination():
    rng = np.random.default_rng(0)
    reward = rng.normal(size=8).astype(np.float32)
    terminated = np.array([0, 1, 0, 0, 1, 0, 0, 0], bool)
    next_q = rng.normal(size=(2, 8)).astype(np.float32)
    next_log_prob = rng.normal(size=8).astype(np.float32)
    alpha, gamma = 0.2, 0.9
    expected = reward + gamma * (1 - terminated) * (next_q.min(0) - alpha * next_log_prob)
    got = sac.soft_td_target(
        jnp.asarray(reward), jnp.asarray(terminated), next_q, next_log_prob, alpha, gamma
    )
    np.testing.assert_allclose(got, expected, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(got)[terminated], reward[terminated], rtol=1e-6)


def test_losses_match_numpy():
    rng = np.random.default_rng(1)
    q = rng.normal(size=(2, 16)).astype(np.float32)
    target = rng.normal(size=16).astype(np.float32)
    log_prob = rng.normal(size=16).astype(np.float32)
    alpha, log_alpha, entropy_target = 0.3, np.log(0.3), -1.0
    np.testing.assert_allclose(
        sac.critic_loss(q, target), ((q - target) ** 2).mean(1).sum(), rtol=1e-6
    )
    np.testing.assert_allclose(
        sac.actor_loss(log_prob, q, alpha), (alpha * log_prob - q.min(0)).mean(), rtol=1e-6
    )
    np.testing.assert_allclose(
        sac.temperature_loss(log_alpha, log_prob, entropy_target),
        -(log_alpha * (log_prob + entropy_target)).mean(),
        rtol=1e-6,
    )
    # The temperature rises (loss gradient negative) when entropy -log_prob is below target.
    low_entropy_log_prob = jnp.full(16, 2.0)  # entropy -2 < target -1
    grad = jax.grad(sac.temperature_loss)(jnp.float32(0.0), low_entropy_log_prob, -1.0)
    assert grad < 0


def test_replay_buffer_wraps_around_and_samples_only_written_rows():
    buffer = replay.init_buffer({"x": jnp.zeros(2), "i": jnp.int32(0)}, capacity=6)
    for start in range(0, 8, 2):
        rows = {"x": jnp.full((2, 2), float(start)), "i": jnp.arange(start, start + 2)}
        buffer = replay.add_batch(buffer, rows)
    assert int(buffer.size) == 6 and int(buffer.position) == 2
    np.testing.assert_array_equal(buffer.data["i"], [6, 7, 2, 3, 4, 5])
    partial = replay.add_batch(replay.init_buffer({"i": jnp.int32(0)}, 6), {"i": jnp.array([7, 9])})
    drawn = replay.sample(partial, jax.random.PRNGKey(0), 100)["i"]
    assert set(np.asarray(drawn).tolist()) == {7, 9}


def test_action_scaling_round_trips():
    low, high = jnp.array([-2.0, 0.0]), jnp.array([2.0, 1.0])
    a = jnp.array([[-1.0, -1.0], [0.0, 0.5], [1.0, 1.0]])
    env_a = sac.to_env_action(a, low, high)
    np.testing.assert_allclose(env_a, [[-2.0, 0.0], [0.0, 0.75], [2.0, 1.0]])
    np.testing.assert_allclose(sac.from_env_action(env_a, low, high), a, atol=1e-6)


@pytest.mark.parametrize(
    "kwargs, field",
    [
        (dict(env_name="CartPole-v1"), "env_name"),
        (dict(env_name="Pendulm-v1"), "env_name"),
        (dict(num_envs=3, total_timesteps=1000), "total_timesteps"),
        (dict(num_envs=2, utd_ratio=0.25), "utd_ratio"),
        (dict(total_timesteps=1000, learning_starts=1000), "total_timesteps"),
        (dict(tau=1.5), "tau"),
        (dict(batch_size=0), "batch_size"),
    ],
)
def test_config_errors_name_the_field(kwargs, field):
    with pytest.raises(ConfigError, match=field):
        sac.Config(**kwargs)


def init_runs(algorithm, keys, hps):
    return jax.jit(jax.vmap(algorithm.init))(keys, hps)


def test_chunks_reproduce_the_whole_run():
    """Two chunks of a seed batch end where one uninterrupted scan does (resume is exact)."""
    config = sac.Config(total_timesteps=1_200, learning_starts=1_000, hidden_sizes=(32, 32))
    algorithm = sac.make(config)
    keys = jax.random.split(jax.random.PRNGKey(3), 2)
    hps = hparams.repeat(hparams.hparams(config), 2)
    states = init_runs(algorithm, keys, hps)
    whole, _ = jax.jit(loop.make_chunk(algorithm.update, 200, log_every=50))(states, None, hps)
    half = jax.jit(loop.make_chunk(algorithm.update, 100, log_every=50))
    split, _ = half(states, None, hps)
    split, _ = half(split, None, hps)
    assert int(whole.step[0]) == int(split.step[0]) == 200 == config.num_steps
    np.testing.assert_allclose(
        jax.tree.leaves(whole.learner.actor_params)[0],
        jax.tree.leaves(split.learner.actor_params)[0],
        atol=1e-6,
    )


def test_sweep_is_separate_runs_in_one_program():
    """`hparams.sweep` over critic_lr (and gamma, away from the config's), vmapped through
    `loop.make_chunk`, ends where separate runs with those settings in their configs end: every
    swept value reaches the program through its hparams (none is read from the config inside)."""
    config = sac.Config(
        total_timesteps=1_050, learning_starts=1_000, hidden_sizes=(16, 16), batch_size=32
    )
    hps = hparams.sweep(config, critic_lr=[1e-3, 3e-3], gamma=[0.9])
    assert hparams.num_runs(hps) == 2
    key = jax.random.PRNGKey(5)
    algorithm = sac.make(config)
    states = init_runs(algorithm, jnp.stack([key, key]), hps)
    swept, metrics = jax.jit(loop.make_chunk(algorithm.update, 50, log_every=25))(states, None, hps)
    for index, critic_lr in enumerate([1e-3, 3e-3]):
        point = dataclasses.replace(config, critic_lr=critic_lr, gamma=0.9)
        separate = sac.make(point)
        hp = hparams.hparams(point)
        state = jax.jit(separate.init)(key, hp)
        chunk = loop.make_chunk(separate.update, 50, log_every=25, runs_axis=False)
        state, _ = jax.jit(chunk)(state, None, hp)
        for a, b in zip(
            jax.tree.leaves(state.learner), jax.tree.leaves(swept.learner), strict=True
        ):
            np.testing.assert_allclose(a, b[index], rtol=2e-4, atol=2e-5)
    # Different settings, different runs: the sweep is not one run twice.
    critic_losses = np.asarray(metrics["critic_loss"][-1])
    assert critic_losses[0] != critic_losses[1]


def test_sac_learns_pendulum():
    """Three vmapped seeds, 12k environment steps: the median deterministic return beats -250
    (random policy: about -1200). The full criterion, -200 within 20k steps, is measured by
    `experiments/sac.py` (README)."""
    config = sac.Config(total_timesteps=12_000, hidden_sizes=(64, 64), eval_episodes=8)
    train = jax.jit(jax.vmap(sac.make_train(config)))
    _, metrics = train(jax.random.split(jax.random.PRNGKey(0), 3))
    returns = np.asarray(metrics["eval_return"])
    assert np.median(returns) >= -250, returns
