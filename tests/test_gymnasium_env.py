"""Gymnasium and EnvPool environments on the host inside the compiled loop (`envs.external`): the
adapter equals stepping Gymnasium (and EnvPool, until an episode ends) by hand, keeps termination
and truncation apart, resets EnvPool in the same step, cuts the episodes in flight when a
checkpoint is restored in a new process, refuses what it cannot run, and PPO learns CartPole
through both."""

import re
import warnings

import gymnasium
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from gymnasium.vector import AutoresetMode, SyncVectorEnv

import envs
from algos import ppo, sac
from envs import external
from jaxrl.config import ConfigError


def rollout(env, actions, key):
    """Reset `env`, then step it with `actions` [T, num_envs] in one compiled scan."""

    def run(key):
        obs, state = env.reset(key)

        def step(state, action):
            result = env.step(key, state, action)
            out = (result.obs, result.reward, result.terminated, result.truncated)
            return result.state, out + (result.info["final_obs"],)

        return obs, jax.lax.scan(step, state, actions)[1]

    return jax.jit(run)(key)


def test_adapter_equals_stepping_gymnasium_by_hand():
    num_envs, steps = 3, 60
    env = external.GymnasiumVectorEnv("gymnasium:CartPole-v1", num_envs, max_episode_steps=20)
    actions = np.random.default_rng(0).integers(0, 2, (steps, num_envs))
    key = jax.random.key(7)
    first_obs, (obs, reward, terminated, truncated, final_obs) = rollout(env, actions, key)

    seed = int(np.asarray(jax.random.key_data(key))[-1]) % 2**31
    by_hand = SyncVectorEnv(
        [lambda: gymnasium.make("CartPole-v1", max_episode_steps=20)] * num_envs,
        autoreset_mode=AutoresetMode.SAME_STEP,
    )
    expected_obs, _ = by_hand.reset(seed=[seed + i for i in range(num_envs)])
    np.testing.assert_array_equal(np.asarray(first_obs), expected_obs)
    for t in range(steps):
        o, r, term, trunc, info = by_hand.step(actions[t])
        np.testing.assert_array_equal(np.asarray(obs[t]), o)
        np.testing.assert_array_equal(np.asarray(reward[t]), r)
        np.testing.assert_array_equal(np.asarray(terminated[t]), term)
        np.testing.assert_array_equal(np.asarray(truncated[t]), trunc & ~term)
        for i in range(num_envs):
            last = info["final_obs"][i] if info.get("_final_obs", np.zeros(3, bool))[i] else o[i]
            np.testing.assert_array_equal(np.asarray(final_obs[t, i]), last)
    # The 20-step limit truncated some episodes and the pole terminated others.
    assert np.asarray(truncated).any() and np.asarray(terminated).any()


def test_a_restored_group_cuts_the_episodes_in_flight():
    """A group id from another process (a checkpoint) is unknown here: the step starts fresh
    episodes, reports every one as truncated with reward 0, and bootstraps from the last obs."""
    env = external.GymnasiumVectorEnv("gymnasium:CartPole-v1", 2)
    last_obs = jnp.full((2, 4), 0.5, jnp.float32)
    stale = external.HostEnvState(jnp.int32(-5), last_obs)
    result = jax.jit(env.step)(jax.random.key(0), stale, jnp.zeros(2, jnp.int32))
    assert np.asarray(result.truncated).all() and not np.asarray(result.terminated).any()
    np.testing.assert_array_equal(np.asarray(result.reward), 0.0)
    np.testing.assert_array_equal(np.asarray(result.info["final_obs"]), np.asarray(last_obs))
    assert int(result.state.group) != -5
    # The next step continues the fresh group.
    after = jax.jit(env.step)(jax.random.key(1), result.state, jnp.ones(2, jnp.int32))
    assert int(after.state.group) == int(result.state.group)
    np.testing.assert_array_equal(np.asarray(after.reward), 1.0)


def test_seeds_vmap_into_separate_groups():
    """Two vmapped seeds each get their own host environments: the same as two separate runs."""
    config = ppo.Config(
        env_name="gymnasium:CartPole-v1", total_timesteps=2048, num_envs=4, eval_episodes=2
    )
    train = jax.jit(ppo.make_train(config, final_evaluation=False))
    keys = jax.random.split(jax.random.key(3), 2)
    together, _ = jax.jit(jax.vmap(ppo.make_train(config, final_evaluation=False)))(keys)
    for i in range(2):
        alone, _ = train(keys[i])
        pairs = zip(jax.tree.leaves(alone.params), jax.tree.leaves(together.params), strict=True)
        for a, b in pairs:
            np.testing.assert_allclose(np.asarray(a), np.asarray(b)[i], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "make, kwargs, problem",
    [
        (ppo.Config, dict(env_name="gymnasium:NoSuchEnv-v0"), "Gymnasium cannot make"),
        (ppo.Config, dict(env_name="gymnasium:Blackjack-v1"), "Tuple space"),
        (sac.Config, dict(env_name="gymnasium:Pendulum-v1"), "use PPO"),
        (ppo.Config, dict(env_name="envpool:NoSuchTask-v0"), "EnvPool has no task"),
        (sac.Config, dict(env_name="envpool:Pendulum-v1"), "use PPO"),
    ],
)
def test_what_it_cannot_run_is_a_config_error(make, kwargs, problem):
    with pytest.raises(ConfigError) as error:
        make(**kwargs)
    message = str(error.value)
    assert message.startswith("env_name: ") and problem in message, message
    assert "\n" not in message


def test_ppo_learns_gymnasium_cartpole():
    """CartPole from Gymnasium (not gymnax), stepped on the host from inside the compiled
    program, learns with PPO's default settings to the 475 threshold."""
    config = ppo.Config(env_name="gymnasium:CartPole-v1", eval_episodes=16)
    assert isinstance(envs.make_vec(config.env_name, 4).env.env, external.GymnasiumVectorEnv)
    _, metrics = jax.jit(ppo.make_train(config))(jax.random.key(0))
    assert float(metrics["eval_return"]) >= 475, metrics["eval_return"]


# EnvPool's C++ pool through the same host adapter (`envpool:<task>`).


def test_envpool_resets_in_the_same_step_and_keeps_its_time_limit():
    """EnvPool on its own would reset an ended environment one step later, ignoring that step's
    action. Through the adapter: until an episode ends the observations are the pool's own; the
    step an episode ends returns the fresh first observation with the true last one in
    `final_obs`; and every truncated episode lasts exactly the 20-step limit from its reset (a
    hidden extra reset step would make it 21)."""
    import envpool

    num_envs, steps = 3, 80
    env = external.EnvPoolVectorEnv("envpool:CartPole-v1", num_envs, max_episode_steps=20)
    assert env.max_episode_steps == 20 and env.action_space.n == 2
    actions = np.random.default_rng(0).integers(0, 2, (steps, num_envs))
    key = jax.random.key(5)
    first_obs, (obs, reward, terminated, truncated, final_obs) = rollout(env, actions, key)
    obs, final_obs = np.asarray(obs), np.asarray(final_obs)
    terminated, truncated = np.asarray(terminated), np.asarray(truncated)
    ended = terminated | truncated

    seed = int(np.asarray(jax.random.key_data(key))[-1]) % 2**31
    with warnings.catch_warnings():  # EnvPool's float64 Box bounds
        warnings.simplefilter("ignore", UserWarning)
        pool = envpool.make_gymnasium(
            "CartPole-v1", num_envs=num_envs, seed=seed, max_episode_steps=20
        )
        expected, _ = pool.reset()
    np.testing.assert_array_equal(np.asarray(first_obs), expected)
    first_end = int(np.argmax(ended.any(axis=1)))
    for t in range(first_end + 1):
        o, r, term, trunc, _ = pool.step(actions[t])
        np.testing.assert_array_equal(final_obs[t], o)
        np.testing.assert_array_equal(np.asarray(reward[t]), r)
        np.testing.assert_array_equal(terminated[t], term)

    fresh = np.abs(obs[ended]) <= 0.05  # CartPole starts uniformly in [-0.05, 0.05]
    assert fresh.all()
    assert not np.array_equal(obs[ended], final_obs[ended])
    pole_fell = np.abs(final_obs[terminated][:, 2]) > 0.2094
    cart_left = np.abs(final_obs[terminated][:, 0]) > 2.4
    assert (pole_fell | cart_left).all()
    np.testing.assert_array_equal(np.asarray(reward), 1.0)
    lengths = {"terminated": [], "truncated": []}
    for i in range(num_envs):
        start = 0
        for t in np.flatnonzero(ended[:, i]):
            lengths["terminated" if terminated[t, i] else "truncated"].append(t + 1 - start)
            start = t + 1
    assert lengths["truncated"] and set(lengths["truncated"]) == {20}, lengths
    assert lengths["terminated"] and max(lengths["terminated"]) < 20, lengths


def test_ppo_learns_envpool_cartpole():
    """PPO's default settings reach the 475 threshold on EnvPool's CartPole, stepped on the host
    from inside the compiled program."""
    config = ppo.Config(env_name="envpool:CartPole-v1", eval_episodes=16)
    assert isinstance(envs.make_vec(config.env_name, 4).env.env, external.EnvPoolVectorEnv)
    _, metrics = jax.jit(ppo.make_train(config))(jax.random.key(0))
    assert float(metrics["eval_return"]) >= 475, metrics["eval_return"]


def test_envpool_atari_lives_are_episodes_and_the_game_is_scored():
    """With EnvPool's `episodic_life` and `reward_clip` (the Atari training options; Space Invaders,
    whose random play loses lives and scores 5-30 points a hit), a lost life
    terminates the learner's episode but the game goes on (lives keep falling instead of a fresh
    game starting), and episode statistics count whole games in unclipped points: each reported
    return is the sum of `game_reward` from one game over to the next."""
    num_envs, steps = 2, 1500  # random play in Space Invaders: about 3 games per env, 3 lives each
    env = envs.make_vec(
        "envpool:SpaceInvaders-v5", num_envs, episodic_life=True, reward_clip=True, noop_max=1
    )
    actions = np.random.default_rng(0).integers(0, 6, (steps, num_envs))

    def run(key):
        obs, state = env.reset(key)

        def step(state, action):
            result = env.step(key, state, action)
            info = result.info
            out = (result.reward, result.terminated, info["game_over"], info["game_reward"])
            return result.state, out + (info["episode_return"],)

        return jax.lax.scan(step, state, actions)[1]

    reward, terminated, game_over, game_reward, episode_return = map(
        np.asarray, jax.jit(run)(jax.random.key(3))
    )
    assert game_over.sum() >= 2 and terminated.sum() >= 3 * game_over.sum()  # 3 lives a game
    assert (terminated | ~game_over).all()  # a game ends only with an episode
    np.testing.assert_array_equal(reward, np.sign(game_reward))  # clipped for the learner
    for i in range(num_envs):
        start = 0
        for t in np.flatnonzero(game_over[:, i]):
            np.testing.assert_allclose(episode_return[t, i], game_reward[start : t + 1, i].sum())
            start = t + 1
    assert (game_reward > 1).any()  # invaders score 5 to 30 points: unclipped


def test_env_options_reach_the_environment_or_are_config_errors():
    config = ppo.Config(env_name="envpool:CartPole-v1", env_options="max_episode_steps=20")
    assert config.env_params == {"max_episode_steps": 20}
    assert ppo.make_env(config).env.env.max_episode_steps == 20
    for options, problem in [
        ("max_episode_steps", "is not name=value"),
        ("lives=3", "has no option(s) ['lives']"),
    ]:
        with pytest.raises(ConfigError, match=r"^env_options: .*" + re.escape(problem)):
            ppo.Config(env_name="envpool:CartPole-v1", env_options=options)
