"""Multi-agent PPO: IPPO (de Witt et al., 2020) and MAPPO (Yu et al., 2022) as one pure function.

    config = mappo.Config(critic="independent")                     # IPPO on MPE simple spread
    train = jax.jit(mappo.make_train(config))
    state, metrics = jax.vmap(train)(jax.random.split(key, 4))      # 4 seeds, one program

Every agent acts with the same actor on its own observation (parameter sharing, as JaxMARL's
baselines run them) and learns from its own reward with PPO's clipped surrogate. The two differ
only in the critic:
  - IPPO ("independent"): each agent's value is estimated from its own observation;
  - MAPPO ("centralised"): from the world state, every agent's observation concatenated, which the
    critic sees in training only; acting needs the actor alone.

Read top to bottom: 1. Config; 2. the environment and network (PPO's pure pieces, `ppo.gae` and
`ppo.ppo_loss_terms`, are reused as they are: an agent's sample is a sample); 3. `make(config)`:
`init`, `update` (roll out `rollout_length` steps of `num_envs` environments, advantages per agent,
`num_epochs` passes of `num_minibatches` gradient steps over every agent's samples) and
`evaluate`; 4. `make_train`, the whole run as one program.

Returns are the team's: the sum over agents of their episode returns (the scale JaxMARL logs).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import ClassVar

import jax
import jax.numpy as jnp
from flax import struct
from jax.flatten_util import ravel_pytree

import envs
from algos import ppo
from envs import multi_agent
from jaxrl import evaluation, loop
from jaxrl.config import (
    require,
    require_non_negative,
)
from jaxrl.hparams import HParams, hparams, static
from jaxrl.loop import Algorithm, zeros_step
from jaxrl.nets import ActorCritic
from jaxrl.prng import loop_keys
from jaxrl.types import Metrics, PRNGKey

CRITICS = ("independent", "centralised")

# --------------------------------------------------------------------------------------------
# 1. Configuration


@dataclasses.dataclass(frozen=True)
class Config(ppo.TrainingConfig):
    """Multi-agent PPO settings: PPO's shared `TrainingConfig`, the critic, and reward shaping.
    Defaults are JaxMARL's IPPO settings for MPE (its `ippo_ff_mpe.yaml`) with a centralised
    critic; `critic="independent"` is IPPO. Samples are counted per agent: a rollout gives
    num_envs * rollout_length * num_agents of them."""

    env_name: str = "jaxmarl:MPE_simple_spread_v3"  # envs.multi_agent.registered()
    total_timesteps: int = 2_000_000  # environment steps per seed (each moves every agent)
    num_envs: int = 16
    critic: str = "centralised"  # "independent" (IPPO) or "centralised" (MAPPO)
    # Environments with a shaping reward apart from their task reward (Overcooked): the learner
    # adds it with a weight falling linearly from 1 to 0 over this many environment steps, as
    # JaxMARL's IPPO does (REW_SHAPING_HORIZON); 0 learns from the task reward alone.
    reward_shaping_horizon: int = 0

    samples_per_update: ClassVar[str] = "num_envs * rollout_length * num_agents"

    def __post_init__(self) -> None:
        # The checks that need no environment first, then the environment, then the shared
        # checks: they count samples per agent, and counting agents builds the environment
        # (importing JaxMARL takes seconds; a mistyped critic should not wait for it).
        require(
            self.env_name in multi_agent.registered(),
            "env_name",
            f"{self.env_name!r} is not a multi-agent environment jaxrl runs",
            f"choose one of {multi_agent.registered()}",
        )
        require(
            self.critic in CRITICS,
            "critic",
            f"unknown critic {self.critic!r}",
            f"choose one of {list(CRITICS)} (IPPO, MAPPO)",
        )
        require_non_negative(self, "reward_shaping_horizon")
        require(
            self.reward_shaping_horizon == 0 or multi_agent.has_shaped_reward(self.env_name),
            "reward_shaping_horizon",
            f"{self.env_name!r} has no shaping reward, so the horizon would be ignored",
            "set reward_shaping_horizon=0, or choose a jaxmarl:overcooked_* environment",
        )
        super().__post_init__()

    @property
    def num_agents(self) -> int:
        """Agents of the environment (every one a PPO learner sharing the parameters)."""
        return _num_agents(self.env_name)

    @property
    def batch_size(self) -> int:
        """Samples per update: num_envs * rollout_length * num_agents."""
        return self.env_steps_per_update * self.num_agents


_agent_counts: dict[str, int] = {}


def _num_agents(env_name: str) -> int:
    if env_name not in _agent_counts:
        _agent_counts[env_name] = multi_agent.make(env_name).num_agents
    return _agent_counts[env_name]


@struct.dataclass
class TrainState:
    """One run: shared actor-critic parameters, optimiser, environments, PRNG key and step."""

    params: dict
    opt_state: object
    env_state: object
    obs: jax.Array  # [num_envs, num_agents, *obs_shape]
    key: PRNGKey
    step: jax.Array


# --------------------------------------------------------------------------------------------
# 2. Environment and network


def make_network(config: Config) -> ActorCritic:
    """The shared actor-critic: `apply(params, obs, critic_obs)`; `critic_obs` is the world state
    for MAPPO and None (the agent's own observation) for IPPO."""
    env = multi_agent.make(config.env_name)
    return ActorCritic(
        action_dim=int(env.action_space.n),
        discrete=True,
        hidden_sizes=config.hidden_sizes,
        activation=config.activation,
        obs_ndim=len(env.observation_space.shape),
    )


def make_critic_input(config: Config) -> Callable[[jax.Array], jax.Array | None]:
    """`critic_input(obs)`: what the critic sees for observations [..., num_agents, *obs_shape]:
    the world state, [..., num_agents, world_size], for MAPPO; None (their own) for IPPO."""
    env = multi_agent.make(config.env_name)
    obs_ndim = len(env.observation_space.shape)

    def critic_input(obs: jax.Array) -> jax.Array | None:
        if config.critic == "independent":
            return None
        lead = obs.shape[: obs.ndim - 1 - obs_ndim]
        per_env = obs.reshape((-1,) + obs.shape[len(lead) :])
        return jax.vmap(env.world_state)(per_env).reshape(lead + (env.num_agents, -1))

    return critic_input


# --------------------------------------------------------------------------------------------
# 3. The algorithm


def make(config: Config) -> Algorithm:
    """Multi-agent PPO as pure functions of one run (`init`, `update`, `evaluate`).

    `update`'s metrics are PPO's loss terms averaged over the update's gradient steps, plus
    `episode_return` (the team return of the most recently finished episodes, mean over
    environments) and `episode_length`. `evaluate` gives `eval_return[eval_episodes]`, the team
    return of the deterministic policy.
    """
    config = static(config)
    env = multi_agent.make_vec(config.env_name, config.num_envs)
    network = make_network(config)
    centralised = config.critic == "centralised"

    critic_input = make_critic_input(config)
    shaped = config.reward_shaping_horizon > 0

    def shaping_weight(updates_done: jax.Array) -> jax.Array:
        env_steps = updates_done.astype(jnp.float32) * config.env_steps_per_update
        return jnp.maximum(0.0, 1.0 - env_steps / max(config.reward_shaping_horizon, 1))

    def init(key: PRNGKey, hp: HParams) -> TrainState:
        key, params_key, env_key = jax.random.split(key, 3)
        obs, env_state = env.reset(env_key)
        params = network.init(params_key, obs, critic_input(obs))
        flat_params, _ = ravel_pytree(params)
        opt_state = ppo.make_optimizer(hp, hp.learning_rate, config.adam_eps).init(flat_params)
        return TrainState(params, opt_state, env_state, obs, key, zeros_step())

    def rollout_step(carry, keys):
        params, env_state, obs, reward_shaping = carry
        action_key, step_key = keys
        dist, _ = network.apply(params, obs, critic_input(obs))
        action, log_prob = dist.sample_and_log_prob(seed=action_key)
        result = env.step(step_key, env_state, action)
        reward = result.reward
        if shaped:  # learn from the shaping reward too; returns still count the task reward
            reward = reward + reward_shaping * result.info["shaped_reward"]
        # The episode's end is the environment's; every agent's sample carries it.
        per_agent = lambda flag: jnp.broadcast_to(flag[:, None], action.shape)  # noqa: E731
        transition = {
            "obs": obs,
            "action": action,
            "reward": reward,
            "terminated": per_agent(result.terminated),
            "done": per_agent(jnp.logical_or(result.terminated, result.truncated)),
            "log_prob": log_prob,
            "next_obs": result.info["final_obs"],
        }
        return (params, result.state, result.obs, reward_shaping), transition

    def loss_fn(params, batch, hp):
        dist, value = network.apply(params, batch["obs"], batch.get("critic_obs"))
        return ppo.ppo_loss_terms(
            log_prob=dist.log_prob(batch["action"]),
            old_log_prob=batch["log_prob"],
            advantages=batch["advantages"],
            value=value,
            old_value=batch["value"],
            returns=batch["returns"],
            entropy=dist.entropy(),
            clip_eps=hp.clip_eps,
            vf_coef=hp.vf_coef,
            ent_coef=hp.ent_coef,
            clip_value=config.clip_value,
            normalize_advantages=config.normalize_advantages,
        )

    def update(state: TrainState, inputs: None, hp: HParams) -> tuple[TrainState, Metrics]:
        del inputs
        key, rollout_key, shuffle_key = jax.random.split(state.key, 3)
        rollout_keys = loop_keys(rollout_key, (config.rollout_length, 2))  # Philox: jaxrl.prng
        reward_shaping = shaping_weight(state.step)
        (_, env_state, obs, _), traj = jax.lax.scan(
            rollout_step,
            (state.params, state.env_state, state.obs, reward_shaping),
            rollout_keys,
        )
        # [time, env, agent] throughout; GAE runs over time for every (env, agent) at once.
        critic_obs = critic_input(traj["obs"])
        _, values = network.apply(state.params, traj["obs"], critic_obs)
        _, next_values = network.apply(
            state.params, traj["next_obs"], critic_input(traj["next_obs"])
        )
        advantages, returns = ppo.gae(
            traj["reward"],
            values,
            next_values,
            traj["terminated"],
            traj["done"],
            hp.gamma,
            hp.gae_lambda,
        )
        samples = {
            "obs": traj["obs"],
            "action": traj["action"],
            "log_prob": traj["log_prob"],
            "value": values,
            "advantages": advantages,
            "returns": returns,
        }
        if centralised:
            samples["critic_obs"] = critic_obs
        # Every agent's step is one sample: flatten [time, env, agent].
        samples = jax.tree.map(lambda x: x.reshape((config.batch_size,) + x.shape[3:]), samples)
        params, opt_state, metrics = ppo.minibatch_epochs(
            loss_fn, samples, state.params, state.opt_state, state.step, shuffle_key, hp, config
        )
        stats = envs.find_state(env_state, envs.EpisodeStatisticsState)  # [env, agent]
        metrics["episode_return"] = stats.last_return.sum(axis=-1).mean()  # team, over envs
        metrics["episode_length"] = stats.last_length[..., 0].astype(jnp.float32).mean()
        if shaped:
            metrics["reward_shaping_weight"] = reward_shaping
        new_state = TrainState(params, opt_state, env_state, obs, key, state.step + 1)
        return new_state, metrics

    evaluate_returns = make_evaluate(config)

    def evaluate(state: TrainState, key: PRNGKey) -> Metrics:
        return {"eval_return": evaluate_returns(state, key)}

    return Algorithm(init, update, evaluate)


def make_policy(config: Config) -> Callable[[TrainState, jax.Array, PRNGKey], jax.Array]:
    """`act(state, obs, key) -> actions`: each agent's most likely action under the shared actor."""
    network, critic_input = make_network(config), make_critic_input(config)

    def act(state: TrainState, obs: jax.Array, key: PRNGKey) -> jax.Array:
        del key
        dist, _ = network.apply(state.params, obs, critic_input(obs))  # XLA drops the critic
        return dist.mode()

    return act


def make_evaluate(config: Config) -> Callable[[TrainState, PRNGKey], jax.Array]:
    """`evaluate(state, key) -> team returns[eval_episodes]` of the deterministic policy."""
    env = multi_agent.make(config.env_name)
    act = make_policy(config)

    def evaluate(state: TrainState, key: PRNGKey) -> jax.Array:
        return evaluation.evaluate_episodes(
            env, lambda obs, k: act(state, obs, k), key, config.eval_episodes
        )

    return evaluate


# --------------------------------------------------------------------------------------------
# 4. The whole run


def make_train(
    config: Config, final_evaluation: bool = True
) -> Callable[[PRNGKey, HParams | None], tuple[TrainState, Metrics]]:
    """`train(key, hparams=None) -> (state, metrics)`: the whole run as one program, then a final
    evaluation (unless `final_evaluation` is False)."""
    return loop.make_train(make(config), config.num_steps, final_evaluation, hparams(config))
