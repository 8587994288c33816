"""The environment registry and wrappers: names, auto-reset, statistics, normalisation."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import envs
from jaxrl import evaluation


def test_unknown_name_lists_close_matches():
    with pytest.raises(ValueError, match="CartPole-v1"):
        envs.make("CartPol-v1")
    with pytest.raises(ValueError, match="Breakout-MinAtar"):
        envs.make("breakout-minatar")


def test_unknown_env_parameter_is_named():
    with pytest.raises(ValueError, match="max_steps_in_episode"):
        envs.make("CartPole-v1", max_step=10)


@pytest.mark.parametrize("name", ["CartPole-v1", "Pendulum-v1", "Breakout-MinAtar", "Catch-bsuite"])
def test_families_step_vectorised_under_jit(name):
    env = envs.make_vec(name, num_envs=3)
    obs, state = env.reset(jax.random.PRNGKey(0))
    space = env.action_space
    actions = jax.vmap(space.sample)(jax.random.split(jax.random.PRNGKey(1), 3))
    result = jax.jit(env.step)(jax.random.PRNGKey(2), state, actions)
    assert result.obs.shape == obs.shape == (3,) + tuple(env.observation_space.shape)
    assert result.reward.shape == result.terminated.shape == result.truncated.shape == (3,)
    assert result.info["final_obs"].shape == obs.shape


def run_fixed_action(env, action, steps, key=0):
    obs, state = env.reset(jax.random.PRNGKey(key))

    def body(state, k):
        result = env.step(k, state, action)
        return result.state, result

    _, results = jax.lax.scan(body, state, jax.random.split(jax.random.PRNGKey(key + 1), steps))
    return obs, results


def test_truncation_is_not_termination_and_keeps_final_observation():
    # A pendulum never terminates; a 5-step limit truncates it. The observation returned with the
    # truncation is the next episode's first; info["final_obs"] is where the episode was cut.
    base = envs.make("Pendulum-v1", max_steps_in_episode=5)
    env = envs.EpisodeStatistics(envs.AutoReset(base))
    _, results = run_fixed_action(env, jnp.array([1.0]), steps=12)
    np.testing.assert_array_equal(results.truncated, [0, 0, 0, 0, 1] * 2 + [0, 0])
    assert not results.terminated.any()
    cut = 4
    assert not np.allclose(results.info["final_obs"][cut], results.obs[cut])
    # Away from episode ends, the final observation IS the next observation.
    np.testing.assert_allclose(results.info["final_obs"][:cut], results.obs[:cut])
    # Episode statistics: return reported at the end equals the sum of that episode's rewards.
    np.testing.assert_allclose(results.info["episode_return"][cut], results.reward[:5].sum(), 1e-5)
    np.testing.assert_array_equal(results.info["episode_length"][cut], 5)
    assert results.state.episode_length[cut] == 0


def test_cartpole_fall_is_termination():
    env = envs.AutoReset(envs.make("CartPole-v1"))
    _, results = run_fixed_action(env, jnp.array(1), steps=60)  # always push right: it falls
    first_end = int(np.argmax(results.terminated | results.truncated))
    assert results.terminated[first_end] and not results.truncated[first_end]
    assert first_end < 60


def test_time_limit_coinciding_with_terminal_counts_as_termination():
    # CartPole limited to 9 steps, always pushing right: the pole falls at step 9 or 10.
    base = envs.make("CartPole-v1")
    _, natural = run_fixed_action(envs.AutoReset(base), jnp.array(1), steps=30)
    fall = int(np.argmax(natural.terminated)) + 1  # episode length at the fall
    limited = envs.AutoReset(envs.make("CartPole-v1", max_steps_in_episode=fall))
    _, results = run_fixed_action(limited, jnp.array(1), steps=fall)
    assert results.terminated[fall - 1] and not results.truncated[fall - 1]


def test_running_mean_std_matches_numpy():
    rng = np.random.default_rng(0)
    batches = [rng.normal(3.0, 2.0, size=(16, 4)).astype(np.float32) for _ in range(5)]
    stats = envs.RunningMeanStd.create((4,))
    for b in batches:
        stats = stats.update(jnp.asarray(b))
    data = np.concatenate(batches)
    np.testing.assert_allclose(stats.mean, data.mean(0), rtol=1e-4)
    np.testing.assert_allclose(stats.var, data.var(0), rtol=1e-3)


def test_normalizers_keep_raw_episode_returns_and_normalize_final_obs():
    env = envs.make_vec(
        "Pendulum-v1", num_envs=8, normalize_observation=True, normalize_reward=True,
        max_steps_in_episode=10,
    )  # fmt: skip
    _, results = run_fixed_action(env, jnp.ones((8, 1)), steps=40)
    # Normalised observations are roughly standardised; final observations use the same scaling.
    obs = np.asarray(results.obs).reshape(-1, 3)
    assert np.all(np.abs(obs.mean(0)) < 1.0) and np.all(obs.std(0) < 3.0)
    np.testing.assert_allclose(results.info["final_obs"][:9], results.obs[:9], atol=0.2)
    # Episode returns are the environment's own (rewards in [-16.3, 0] over 10 steps).
    ended = np.asarray(results.info["episode_done"])
    returns = np.asarray(results.info["episode_return"])[ended]
    assert returns.size and np.all(returns <= 0) and np.all(returns > -170)
    assert np.abs(results.reward).max() < 20


def test_clip_action_bounds_continuous_actions():
    env = envs.ClipAction(envs.make("Pendulum-v1"))
    raw = envs.make("Pendulum-v1")
    _, state = env.reset(jax.random.PRNGKey(0))
    big = env.step(jax.random.PRNGKey(1), state, jnp.array([50.0]))
    at_bound = raw.step(jax.random.PRNGKey(1), state, jnp.array([2.0]))
    np.testing.assert_allclose(big.obs, at_bound.obs)


def test_checkpoint_round_trips_zero_size_arrays(tmp_path):
    """MJX states hold zero-size arrays (no actuator activations); orbax cannot write those, so
    the checkpointer stores a placeholder and restores them from the template."""
    import jax.numpy as jnp

    from jaxrl.checkpoint import Checkpointer

    state = {"act": jnp.zeros((4, 0)), "qpos": jnp.arange(3.0)}
    checkpointer = Checkpointer(str(tmp_path / "ckpt"))
    checkpointer.save(1, state, {"step": 1})
    restored, meta = checkpointer.restore({"act": jnp.zeros((4, 0)), "qpos": jnp.zeros(3)})
    checkpointer.close()
    assert restored["act"].shape == (4, 0) and meta == {"step": 1}
    assert restored["qpos"].tolist() == [0.0, 1.0, 2.0]


# --- the episode evaluator behind every control learning test ----------------------------------


def cartpole_returns(policy, num_episodes, seed=0):
    env = envs.make("CartPole-v1")
    run = jax.jit(lambda key: evaluation.evaluate_episodes(env, policy, key, num_episodes))
    return np.asarray(run(jax.random.PRNGKey(seed)))


def test_evaluator_scores_known_cartpole_policies():
    """Every control learning test trusts `evaluate_episodes`, so it is checked on policies whose
    returns are known: uniformly random actions last about 22 steps (22.1 +- 10.9 over these 500
    episodes; the bounds are three standard errors either side); always pushing left falls
    in 8-11 steps (a count that kept adding reward after termination would reach 500); and
    pushing towards where the pole is falling balances it until the 500-step truncation, and no
    further."""
    random = cartpole_returns(lambda obs, key: jax.random.randint(key, obs.shape[:1], 0, 2), 500)
    assert 20.5 <= random.mean() <= 23.7, random.mean()
    left = cartpole_returns(lambda obs, key: jnp.zeros(obs.shape[:1], jnp.int32), 100)
    assert left.min() >= 8 and left.max() <= 11, (left.min(), left.max())
    balance = lambda obs, key: (obs[:, 2] + 0.5 * obs[:, 3] > 0).astype(jnp.int32)  # noqa: E731
    np.testing.assert_array_equal(cartpole_returns(balance, 20), np.full(20, 500.0))
