"""PPO as a program: config validation, vmap over seeds and hyper-parameters, learning."""

import dataclasses

import jax
import numpy as np
import pytest

from algos import ppo
from jaxrl import hparams, loop
from jaxrl.config import ConfigError

SMALL = ppo.Config(total_timesteps=4 * 128 * 6, eval_episodes=4)


@pytest.mark.parametrize(
    "change, field",
    [
        (dict(num_minibatches=3), "num_minibatches"),
        (dict(num_envs=-1), "num_envs"),
        (dict(gamma=1.5), "gamma"),
        (dict(total_timesteps=100), "total_timesteps"),
        (dict(activation="sigmoidal"), "activation"),
        (dict(env_name="CartPol-v1"), "env_name"),
    ],
)
def test_invalid_config_names_field_and_fix(change, field):
    with pytest.raises(ConfigError) as error:
        ppo.Config(**change)
    message = str(error.value)
    assert message.startswith(field)
    assert "\n" not in message
    if field == "num_minibatches":
        assert "(512) must be divisible by num_minibatches (3)" in message
    if field == "env_name":
        assert "CartPole-v1" in message  # the close match is suggested


def member(tree, i):
    """Run i of a tree whose leaves have a leading run axis."""
    return jax.tree.map(lambda x: x[i], tree)


def assert_trees_close(a, b, atol=1e-5):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), atol=atol, rtol=1e-5)


def test_vmap_over_seeds_equals_separate_runs():
    train = ppo.make_train(SMALL)
    keys = jax.random.split(jax.random.PRNGKey(42), 4)
    batched_state, batched_metrics = jax.jit(jax.vmap(train))(keys)
    single = jax.jit(train)
    for i in range(4):
        state, metrics = single(keys[i])
        assert_trees_close(member(batched_state.params, i), state.params)
        np.testing.assert_allclose(
            batched_metrics["loss"][i], metrics["loss"], rtol=1e-4, atol=1e-5
        )


def test_vmap_over_hyperparameters_equals_separate_configs():
    """A sweep over learning rate, entropy coefficient and clip range is one program, and each
    member equals a run given that Config's hyper-parameters."""
    hps = hparams.sweep(SMALL, learning_rate=[1e-3, 2.5e-4], ent_coef=[0.0, 0.05], clip_eps=[0.1])
    assert hps.learning_rate.shape == (4,)
    key = jax.random.PRNGKey(7)
    train = ppo.make_train(SMALL)
    swept, _ = jax.jit(jax.vmap(train, in_axes=(None, 0)))(key, hps)
    single = jax.jit(train)  # hyper-parameters are arguments: one compile serves every config
    for i in range(4):
        config = dataclasses.replace(
            SMALL,
            learning_rate=float(hps.learning_rate[i]),
            ent_coef=float(hps.ent_coef[i]),
            clip_eps=float(hps.clip_eps[i]),
        )
        state, _ = single(key, hparams.hparams(config))
        assert_trees_close(member(swept.params, i), state.params)
    # Different hyper-parameters really do give different runs.
    first, last = (jax.tree.leaves(member(swept.params, i)) for i in (0, 3))
    assert any(not np.allclose(a, b) for a, b in zip(first, last, strict=True))


def test_chunks_equal_one_whole_run():
    """The runner's chunks (`loop.make_chunk`, vmapped inside the scan) compute exactly what
    `train` does, and stream one callback per update with the step counter."""
    keys = jax.random.split(jax.random.PRNGKey(3), 2)
    hps = hparams.repeat(hparams.hparams(SMALL), 2)
    algorithm = ppo.make(SMALL)
    init_keys = jax.vmap(lambda k: jax.random.split(k)[0])(keys)
    states = jax.vmap(algorithm.init)(init_keys, hps)
    calls = []
    chunk = loop.make_chunk(algorithm.update, 3, callback=lambda u, m: calls.append(int(u)))
    chunk = jax.jit(chunk)
    states, _ = chunk(states, None, hps)
    states, _ = chunk(states, None, hps)
    jax.effects_barrier()
    whole, _ = jax.jit(jax.vmap(ppo.make_train(SMALL)))(keys)
    assert_trees_close(states.params, whole.params)
    assert sorted(calls) == [1, 2, 3, 4, 5, 6]


def test_gamma_sweep_with_reward_normalisation_applies_gamma_everywhere():
    """With normalize_rewards on, the reward normaliser's discount is the run's swept gamma, not
    the config's: each member of a gamma sweep equals a separate run of a config with that gamma
    (this was half applied: GAE took the swept gamma, the normaliser the config's)."""
    config = dataclasses.replace(SMALL, normalize_rewards=True, gamma=0.99)
    key = jax.random.PRNGKey(5)
    train = ppo.make_train(config, final_evaluation=False)
    swept, _ = jax.jit(jax.vmap(train, in_axes=(None, 0)))(
        key, hparams.sweep(config, gamma=[0.9, 0.5])
    )
    for i, gamma in enumerate([0.9, 0.5]):
        separate = dataclasses.replace(config, gamma=gamma)
        state, _ = jax.jit(ppo.make_train(separate, final_evaluation=False))(key)
        assert_trees_close(member(swept.params, i), state.params)
        discount = member(swept.env_state, i)
        assert float(discount.gamma) == pytest.approx(gamma)


def test_swept_fields_are_read_only_from_hparams():
    """The program never reads a swept field from the config: building PPO from a config with
    different swept values but running it with the same hparams changes nothing."""
    config = dataclasses.replace(SMALL, normalize_rewards=True)
    other = dataclasses.replace(
        config, learning_rate=0.1, gamma=0.5, gae_lambda=0.1, clip_eps=0.9, ent_coef=0.3,
        vf_coef=2.0, max_grad_norm=9.0,
    )  # fmt: skip
    assert set(hparams.swept_fields(config)) == {
        "learning_rate", "gamma", "gae_lambda", "clip_eps", "ent_coef", "vf_coef", "max_grad_norm"
    }  # fmt: skip
    key, hp = jax.random.PRNGKey(1), hparams.hparams(config)
    a, _ = jax.jit(ppo.make_train(config, final_evaluation=False))(key, hp)
    b, _ = jax.jit(ppo.make_train(other, final_evaluation=False))(key, hp)
    assert_trees_close(a.params, b.params, atol=0)
    with pytest.raises(AttributeError, match="swept"):
        hparams.static(config).gamma  # noqa: B018


def test_cartpole_learns():
    """The default CartPole settings (500k steps) solve it: mean deterministic return >= 475."""
    config = ppo.Config(env_name="CartPole-v1", total_timesteps=500_000, eval_episodes=16)
    keys = jax.random.split(jax.random.PRNGKey(0), 2)
    _, metrics = jax.jit(jax.vmap(ppo.make_train(config)))(keys)
    eval_return = np.asarray(metrics["eval_return"])
    assert eval_return.mean() >= 475, eval_return


def test_pendulum_continuous_learns():
    """Continuous PPO (Gaussian policy, normalised observations and rewards) on Pendulum-v1."""
    from jaxrl.trainers.presets import ppo as presets

    settings = dict(presets.PRESETS["pendulum"], eval_episodes=16)  # its 2M-step budget
    config = ppo.Config(**settings)
    keys = jax.random.split(jax.random.PRNGKey(0), 2)
    _, metrics = jax.jit(jax.vmap(ppo.make_train(config)))(keys)
    eval_return = np.asarray(metrics["eval_return"])
    assert eval_return.mean() >= -300, eval_return


@pytest.mark.parametrize("normalize_observations", [False, True])
def test_next_observation_is_the_next_rollout_observation_unless_an_episode_ended(
    normalize_observations,
):
    """What lets PPO's update value the rollout in one pass (next_values[t] = values[t + 1]) and
    pass over the true last observations only when an episode was truncated: where no episode
    ended at t, the observation step t led to is the one step t + 1 acts on (also after the
    observation normaliser), and the last one is the observation the rollout carries on with."""
    config = ppo.Config(
        env_name="CartPole-v1",
        env_options="max_steps_in_episode=15",  # truncations inside a 64-step rollout
        normalize_observations=normalize_observations,
    )
    env = ppo.make_env(config)
    obs, state = env.reset(jax.random.key(0))
    actions = jax.random.bernoulli(jax.random.key(1), shape=(64, config.num_envs)).astype(int)

    def step(carry, action):
        state, obs = carry
        result = env.step(jax.random.key(2), state, action)
        done = result.terminated | result.truncated
        return (result.state, result.obs), (obs, result.info["final_obs"], done, result.truncated)

    (_, last_obs), (obs, next_obs, done, truncated) = jax.lax.scan(step, (state, obs), actions)
    assert bool(truncated.any()) and bool((done & ~truncated).any())
    following = np.concatenate([np.asarray(obs[1:]), np.asarray(last_obs)[None]])
    continuing = ~np.asarray(done)
    np.testing.assert_array_equal(np.asarray(next_obs)[continuing], following[continuing])
    assert not np.allclose(np.asarray(next_obs)[~continuing], following[~continuing])
