"""Proximal Policy Optimization (Schulman et al., 2017) as one pure, compiled function.

    config = ppo.Config(env_name="CartPole-v1")
    train = jax.jit(ppo.make_train(config))
    state, metrics = jax.vmap(train)(jax.random.split(key, 8))          # 8 seeds, one program

Read top to bottom, this file is the algorithm:
  1. Config, whose `swept` fields may vary inside one program (`jaxrl.hparams.sweep`);
  2. the pure pieces: GAE and the clipped-surrogate loss, each checked against NumPy in tests;
  3. the environment, network and optimiser;
  4. `make(config)`: `init`, and `update` (roll out `rollout_length` steps in `num_envs`
     environments, estimate advantages, then `num_epochs` passes of `num_minibatches` gradient
     steps), and `evaluate`, on the contract of `jaxrl.loop`;
  5. the policy, its evaluation, and `make_train` (the whole run as one program).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import optax
from flax import struct
from jax.flatten_util import ravel_pytree

import envs
from jaxrl import evaluation, loop
from jaxrl.config import (
    divisors,
    require,
    require_in_range,
    require_non_negative,
    require_positive,
    require_step_count,
)
from jaxrl.hl_gauss import HLGauss, make_hl_gauss, validate_hl_gauss
from jaxrl.hparams import HParams, hparams, static, swept
from jaxrl.loop import Algorithm, zeros_step
from jaxrl.nets import ACTIVATIONS, TORSOS, ActorCritic
from jaxrl.prng import loop_keys
from jaxrl.types import Metrics, Params, PRNGKey, Rollout

# --------------------------------------------------------------------------------------------
# 1. Configuration


@dataclasses.dataclass(frozen=True)
class TrainingConfig:
    """The settings every PPO learner shares, single-agent (`Config`) or multi-agent
    (`algos.mappo.Config`): run length, rollout size, the clipped objective, its optimiser and the
    MLPs. Fields marked `swept` may differ between the runs of one program
    (`jaxrl.hparams.sweep`)."""

    env_name: str = ""  # each algorithm sets its default and says which names it runs
    total_timesteps: int = 500_000  # environment steps per seed
    num_envs: int = 4  # parallel environments
    rollout_length: int = 128  # environment steps per environment per update
    num_epochs: int = 4  # passes over each rollout
    num_minibatches: int = 4  # gradient steps per epoch; must divide the samples of a rollout
    learning_rate: float = swept(2.5e-4)
    anneal_lr: bool = True  # linear decay to zero over all gradient steps
    gamma: float = swept(0.99)  # discount (of GAE and of the reward normaliser)
    gae_lambda: float = swept(0.95)  # GAE's bias/variance trade-off
    clip_eps: float = swept(0.2)  # policy-ratio clip range (and value clip range when clip_value)
    clip_value: bool = True  # clip the value update to clip_eps around the old value (PPO2)
    ent_coef: float = swept(0.01)  # weight of the entropy bonus
    vf_coef: float = swept(0.5)  # weight of the value loss
    max_grad_norm: float = swept(0.5)  # global gradient-norm clip
    normalize_advantages: bool = True  # per minibatch
    hidden_sizes: tuple[int, ...] = (64, 64)  # of both the actor and the critic MLP
    activation: str = "tanh"  # a key of jaxrl.nets.ACTIVATIONS
    adam_eps: float = 1e-5
    eval_episodes: int = 32  # episodes of the deterministic policy in the final evaluation

    # How a rollout's samples are counted, as errors name them (MAPPO's count every agent's).
    samples_per_update: ClassVar[str] = "num_envs * rollout_length"

    def __post_init__(self) -> None:
        # ml_collections hands us lists; the config must stay hashable.
        object.__setattr__(self, "hidden_sizes", tuple(self.hidden_sizes))
        require_positive(
            self,
            "total_timesteps",
            "num_envs",
            "rollout_length",
            "num_epochs",
            "num_minibatches",
            "learning_rate",
            "clip_eps",
            "max_grad_norm",
            "adam_eps",
            "eval_episodes",
        )
        require_in_range(self, "gamma", 0.0, 1.0)
        require_in_range(self, "gae_lambda", 0.0, 1.0)
        require_non_negative(self, "ent_coef", "vf_coef")
        require(
            all(h > 0 for h in self.hidden_sizes),
            "hidden_sizes",
            f"every layer width must be positive, got {self.hidden_sizes}",
            "e.g. hidden_sizes=(64, 64)",
        )
        require(
            self.activation in ACTIVATIONS,
            "activation",
            f"unknown activation {self.activation!r}",
            f"choose one of {sorted(ACTIVATIONS)}",
        )
        require_step_count(self, "total_timesteps")
        require(
            self.total_timesteps >= self.env_steps_per_update,
            "total_timesteps",
            f"({self.total_timesteps}) is less than one rollout, num_envs * rollout_length "
            f"({self.env_steps_per_update})",
            f"set total_timesteps >= {self.env_steps_per_update}",
        )
        samples = self.batch_size
        require(
            samples % self.num_minibatches == 0,
            "num_minibatches",
            f"{self.samples_per_update} ({samples}) must be divisible by num_minibatches "
            f"({self.num_minibatches})",
            f"choose num_minibatches among {divisors(samples)[:12]}",
        )

    @property
    def env_steps_per_update(self) -> int:
        """Environment steps per update: num_envs * rollout_length."""
        return self.num_envs * self.rollout_length

    @property
    def batch_size(self) -> int:
        """Samples per update: num_envs * rollout_length."""
        return self.env_steps_per_update

    @property
    def minibatch_size(self) -> int:
        """Samples per gradient step: batch_size // num_minibatches."""
        return self.batch_size // self.num_minibatches

    @property
    def num_steps(self) -> int:
        """Updates (rollout + epochs) in a run: total_timesteps // (num_envs * rollout_length)."""
        return self.total_timesteps // self.env_steps_per_update


@dataclasses.dataclass(frozen=True)
class Config(TrainingConfig):
    """PPO settings: the shared `TrainingConfig`, plus the environment's options, observation and
    reward normalisation, the torso and an HL-Gauss critic. Defaults are the PureJaxRL / CleanRL
    CartPole settings."""

    env_name: str = "CartPole-v1"  # any name in envs.registered()
    # The environment's own options, "name=value,...": gymnax EnvParams fields, or a host
    # environment's make() options, e.g. "episodic_life=True,reward_clip=True" for EnvPool Atari.
    env_options: str = ""
    normalize_observations: bool = False  # running mean/std of observations (a wrapper)
    normalize_rewards: bool = False  # scale rewards by the running std of discounted returns
    # "mlp": separate actor and critic MLPs; "nature_cnn": one Nature CNN torso both share, for
    # stacked Atari frames (hidden_sizes and activation then unused).
    torso: str = "mlp"
    # Value learning by classification (jaxrl.hl_gauss): > 0 bins make the critic classify the
    # return over hl_gauss_range with an HL-Gauss target sigma bin widths wide; 0 regresses.
    hl_gauss_bins: int = 0
    hl_gauss_range: tuple[float, ...] = ()  # (low, high) of the returns, e.g. (0, 100)
    hl_gauss_sigma: float = 0.75  # in bin widths (Farebrother et al., 2024)

    def __post_init__(self) -> None:
        object.__setattr__(self, "hl_gauss_range", tuple(self.hl_gauss_range))
        validate_hl_gauss(
            self.hl_gauss_bins, self.hl_gauss_range, self.hl_gauss_sigma, example="(0, 100)"
        )
        require(
            not (self.hl_gauss_bins and self.clip_value),
            "clip_value",
            "clips a regressed value; a classification critic (hl_gauss_bins > 0) has none",
            "set clip_value=False with hl_gauss_bins",
        )
        super().__post_init__()
        envs.require_registered(self.env_name)
        envs.require_options(self.env_name, self.env_options)
        require(
            self.torso in TORSOS,
            "torso",
            f"unknown torso {self.torso!r}",
            f"choose one of {list(TORSOS)}",
        )
        if self.torso == "nature_cnn":
            obs_shape = envs.observation_shape(self.env_name, self.env_options, "env_options")
            require(
                len(obs_shape) == 3 and min(obs_shape[1:]) >= 36,
                "torso",
                f"nature_cnn takes stacked frames [frames, height, width] of at least 36x36 "
                f"pixels; {self.env_name} observes {tuple(obs_shape)}",
                "use torso='mlp', or an Atari task such as envpool:Breakout-v5",
            )
            require(
                self.activation == "tanh" and tuple(self.hidden_sizes) == (64, 64),
                "hidden_sizes",
                "hidden_sizes and activation shape the MLP torso, which nature_cnn replaces",
                "leave them at their defaults with torso='nature_cnn'",
            )

    @property
    def env_params(self) -> dict[str, Any]:
        """`env_options` as keyword arguments for `envs.make_vec` and `envs.make_eval`."""
        return envs.parse_env_options(self.env_options)

    @property
    def hl_gauss(self) -> HLGauss | None:
        """The critic's bins when it classifies (`hl_gauss_bins` > 0), else None."""
        return make_hl_gauss(self.hl_gauss_bins, self.hl_gauss_range, self.hl_gauss_sigma)


@struct.dataclass
class TrainState:
    """The whole state of one PPO run: network, optimiser, environments, PRNG key and step.

    `opt_state` is over the parameters flattened into one vector (`ravel_pytree`); `env_state` and
    `obs` are the vectorised environments' (leading axis num_envs).
    """

    params: Params
    opt_state: optax.OptState
    env_state: Any
    obs: jax.Array
    key: PRNGKey
    step: jax.Array  # updates done


# --------------------------------------------------------------------------------------------
# 2. Pure pieces


def gae(
    rewards: jax.Array,
    values: jax.Array,
    next_values: jax.Array,
    terminated: jax.Array,
    done: jax.Array,
    gamma: float | jax.Array,
    gae_lambda: float | jax.Array,
) -> tuple[jax.Array, jax.Array]:
    """Generalised advantage estimation over a rollout (time on axis 0).

    `next_values[t]` is the value of the observation step t led to (the true final observation when
    the episode ended). A termination zeroes the bootstrap; a truncation keeps it. Either ends the
    episode, so the recursion does not carry advantages across the boundary.
    Returns (advantages, value targets).
    """
    not_terminated = 1.0 - terminated.astype(jnp.float32)
    not_done = 1.0 - done.astype(jnp.float32)
    deltas = rewards + gamma * next_values * not_terminated - values

    def backwards(next_advantage, step):
        delta, continues = step
        advantage = delta + gamma * gae_lambda * continues * next_advantage
        return advantage, advantage

    _, advantages = jax.lax.scan(
        backwards, jnp.zeros_like(deltas[0]), (deltas, not_done), reverse=True
    )
    return advantages, advantages + values


def ppo_loss_terms(
    log_prob: jax.Array,
    old_log_prob: jax.Array,
    advantages: jax.Array,
    value: jax.Array,
    old_value: jax.Array,
    returns: jax.Array,
    entropy: jax.Array,
    clip_eps: float | jax.Array,
    vf_coef: float | jax.Array,
    ent_coef: float | jax.Array,
    clip_value: bool = True,
    normalize_advantages: bool = True,
    value_logits: jax.Array | None = None,
    hl_gauss: HLGauss | None = None,
) -> tuple[jax.Array, Metrics]:
    """The PPO objective on a minibatch of per-sample quantities (no network inside).

    Every array argument has shape [batch]. Returns (loss, metrics): the scalar clipped-surrogate
    policy loss + vf_coef * value loss - ent_coef * entropy, and scalar `loss`, `policy_loss`,
    `value_loss`, `entropy`, `approx_kl` and `clip_fraction` metrics. With `hl_gauss` the value
    loss is the HL-Gauss cross-entropy of `value_logits` ([batch, num_bins]) to the returns.
    """
    if normalize_advantages:
        advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
    log_ratio = log_prob - old_log_prob
    ratio = jnp.exp(log_ratio)
    clipped_ratio = jnp.clip(ratio, 1.0 - clip_eps, 1.0 + clip_eps)
    policy_loss = -jnp.minimum(ratio * advantages, clipped_ratio * advantages).mean()

    if hl_gauss is not None:
        value_loss = hl_gauss.loss(value_logits, returns).mean()
    else:
        value_error = jnp.square(value - returns)
        if clip_value:
            clipped_value = old_value + jnp.clip(value - old_value, -clip_eps, clip_eps)
            value_error = jnp.maximum(value_error, jnp.square(clipped_value - returns))
        value_loss = 0.5 * value_error.mean()

    entropy = entropy.mean()
    loss = policy_loss + vf_coef * value_loss - ent_coef * entropy
    metrics = {
        "loss": loss,
        "policy_loss": policy_loss,
        "value_loss": value_loss,
        "entropy": entropy,
        # Schulman's low-variance estimator of KL(old || new).
        "approx_kl": ((ratio - 1.0) - log_ratio).mean(),
        "clip_fraction": (jnp.abs(ratio - 1.0) > clip_eps).astype(jnp.float32).mean(),
    }
    return loss, metrics


# --------------------------------------------------------------------------------------------
# 3. Building blocks: environment, network, optimiser


def make_env(config: Config) -> envs.Wrapper:
    """The training environments: `envs.make_vec` with `num_envs` copies and the config's
    observation / reward normalisation (the normaliser's discount is set per run by `init`)."""
    return envs.make_vec(
        config.env_name,
        config.num_envs,
        normalize_observation=config.normalize_observations,
        normalize_reward=config.normalize_rewards,
        **config.env_params,
    )


def make_network(config: Config) -> ActorCritic:
    """The actor-critic for the config's environment: `apply(params, obs) -> (dist, value)`."""
    probe = envs.make(config.env_name, **config.env_params)
    return ActorCritic(
        action_dim=envs.action_dim(probe.action_space),
        discrete=envs.is_discrete(probe.action_space),
        hidden_sizes=config.hidden_sizes,
        activation=config.activation,
        obs_ndim=len(probe.observation_space.shape),
        value_bins=config.hl_gauss_bins,
        torso=config.torso,
    )


def make_optimizer(hp: HParams, learning_rate: jax.Array, adam_eps: float):
    """Clip by global norm, Adam, then step by -learning_rate. Built from (possibly traced)
    hyper-parameters, so each vmapped member of a sweep has its own clip norm and step size."""
    return optax.chain(
        optax.clip_by_global_norm(hp.max_grad_norm),
        optax.scale_by_adam(eps=adam_eps),
        optax.scale(-learning_rate),
    )


def minibatch_epochs(
    loss_fn: Callable[[Params, dict[str, jax.Array], HParams], tuple[jax.Array, Metrics]],
    samples: dict[str, jax.Array],
    params: Params,
    opt_state: optax.OptState,
    updates_done: jax.Array,
    key: PRNGKey,
    hp: HParams,
    config: TrainingConfig,
) -> tuple[Params, optax.OptState, Metrics]:
    """PPO's optimisation of one batch: `config.num_epochs` passes over `samples` (leading axis:
    the samples) in `config.num_minibatches` shuffled minibatches, a gradient step of
    `loss_fn(params, minibatch, hp) -> (loss, metrics)` on each. With `config.anneal_lr` the
    learning rate decays linearly to zero over the run's gradient steps (`updates_done`: updates
    before this one). Returns the parameters, the optimiser state and the metrics averaged over
    the steps."""
    num_epochs, num_minibatches = config.num_epochs, config.num_minibatches
    gradient_steps_per_update = num_epochs * num_minibatches
    total_gradient_steps = config.num_steps * gradient_steps_per_update
    first_step = updates_done * gradient_steps_per_update
    # The optimiser works on all parameters as one flat vector: Adam and the global-norm clip
    # become a handful of large operations rather than a few per parameter array, which is
    # what small networks spend their time on (about 10% of a CartPole run on a CPU).
    flat_params, unravel = ravel_pytree(params)
    batch_size = jax.tree.leaves(samples)[0].shape[0]
    minibatch_size = batch_size // num_minibatches

    def gradient_step(carry, minibatch):
        flat_params, opt_state, step = carry
        flat_loss = lambda p: loss_fn(unravel(p), minibatch, hp)  # noqa: E731
        grads, metrics = jax.grad(flat_loss, has_aux=True)(flat_params)
        fraction_left = 1.0 - step / total_gradient_steps
        learning_rate = hp.learning_rate * (fraction_left if config.anneal_lr else 1.0)
        optimizer = make_optimizer(hp, learning_rate, config.adam_eps)
        updates, opt_state = optimizer.update(grads, opt_state, flat_params)
        return (flat_params + updates, opt_state, step + 1), metrics

    def epoch(carry, epoch_key):
        permutation = jax.random.permutation(epoch_key, batch_size)
        minibatches = jax.tree.map(
            lambda x: x[permutation].reshape((num_minibatches, minibatch_size) + x.shape[1:]),
            samples,
        )
        return jax.lax.scan(gradient_step, carry, minibatches)

    (flat_params, opt_state, _), metrics = jax.lax.scan(
        epoch,
        (flat_params, opt_state, jnp.asarray(first_step).astype(jnp.float32)),
        loop_keys(key, num_epochs),
    )
    return unravel(flat_params), opt_state, jax.tree.map(jnp.mean, metrics)


# --------------------------------------------------------------------------------------------
# 4. The algorithm: init, update (rollout, advantages, epochs of minibatch steps), evaluate


def make(config: Config) -> Algorithm:
    """PPO as pure functions of one run: `init(key, hparams)`, `update(state, None, hparams)`
    (one rollout, GAE and the epochs of minibatch steps) and `evaluate(state, key)`.

    `update`'s metrics are scalars: the loss terms averaged over the update's gradient steps, plus
    `episode_return` and `episode_length` of the most recently finished episodes (mean over envs).
    `evaluate` returns `eval_return[eval_episodes]` of the deterministic policy.
    """
    config = static(config)
    env, network = make_env(config), make_network(config)
    hl_gauss = config.hl_gauss

    def value_of(critic_output: jax.Array) -> jax.Array:
        """The critic's value: its output, or the expectation of its bins when it classifies."""
        return critic_output if hl_gauss is None else hl_gauss.value(critic_output)

    def init(key: PRNGKey, hp: HParams) -> TrainState:
        key, params_key, env_key = jax.random.split(key, 3)
        obs, env_state = env.reset(env_key)
        env_state = envs.with_reward_discount(env_state, hp.gamma)
        params = network.init(params_key, obs)
        flat_params, _ = ravel_pytree(params)  # the optimiser state is over the flat vector
        opt_state = make_optimizer(hp, hp.learning_rate, config.adam_eps).init(flat_params)
        return TrainState(params, opt_state, env_state, obs, key, zeros_step())

    def rollout_step(carry, keys):
        params, env_state, obs = carry
        action_key, step_key = keys
        dist, _ = network.apply(params, obs)  # acting needs only the actor; XLA drops the critic
        action, log_prob = dist.sample_and_log_prob(seed=action_key)
        result = env.step(step_key, env_state, action)
        transition = Rollout(
            obs=obs,
            action=action,
            reward=result.reward,
            terminated=result.terminated,
            done=jnp.logical_or(result.terminated, result.truncated),
            log_prob=log_prob,
            next_obs=result.info["final_obs"],
        )
        return (params, result.state, result.obs), transition

    def loss_fn(params, batch, hp):
        dist, critic_output = network.apply(params, batch["obs"])
        return ppo_loss_terms(
            log_prob=dist.log_prob(batch["action"]),
            old_log_prob=batch["log_prob"],
            advantages=batch["advantages"],
            value=value_of(critic_output),
            old_value=batch["value"],
            returns=batch["returns"],
            entropy=dist.entropy(),
            clip_eps=hp.clip_eps,
            vf_coef=hp.vf_coef,
            ent_coef=hp.ent_coef,
            clip_value=config.clip_value,
            normalize_advantages=config.normalize_advantages,
            value_logits=critic_output,
            hl_gauss=hl_gauss,
        )

    def update(state: TrainState, inputs: None, hp: HParams) -> tuple[TrainState, Metrics]:
        del inputs  # the environments run inside
        key, rollout_key, shuffle_key = jax.random.split(state.key, 3)
        # All of the rollout's random keys in one batched call rather than a split per step, as
        # Philox keys: each threefry draw inside the loop would be a nested loop (jaxrl.prng).
        rollout_keys = loop_keys(rollout_key, (config.rollout_length, 2))
        (_, env_state, obs), traj = jax.lax.scan(
            rollout_step, (state.params, state.env_state, state.obs), rollout_keys
        )
        # The critic runs once over the whole rollout: a few large matrix products instead of
        # small ones at every step. next_values[t] is V of the observation step t led to, which is
        # obs[t + 1] unless an episode ended at t. Ended episodes need the value of their true last
        # observation only when truncated (a termination zeroes the bootstrap), so the second pass,
        # over every next observation, runs only for rollouts in which one was truncated.
        critic = lambda obs: value_of(network.apply(state.params, obs)[1])  # noqa: E731
        values_and_last = critic(jnp.concatenate([traj.obs, obs[None]]))
        values = values_and_last[:-1]
        truncated = jnp.logical_and(traj.done, jnp.logical_not(traj.terminated))
        next_values = jax.lax.cond(
            truncated.any(),
            lambda: critic(traj.next_obs),
            lambda: values_and_last[1:],
        )
        advantages, returns = gae(
            traj.reward, values, next_values, traj.terminated, traj.done, hp.gamma, hp.gae_lambda
        )
        # Flatten [time, env] into one batch of samples for the minibatch epochs.
        samples = {
            "obs": traj.obs,
            "action": traj.action,
            "log_prob": traj.log_prob,
            "value": values,
            "advantages": advantages,
            "returns": returns,
        }
        samples = jax.tree.map(lambda x: x.reshape((config.batch_size,) + x.shape[2:]), samples)

        params, opt_state, metrics = minibatch_epochs(
            loss_fn, samples, state.params, state.opt_state, state.step, shuffle_key, hp, config
        )
        stats = envs.find_state(env_state, envs.EpisodeStatisticsState)
        metrics["episode_return"] = stats.last_return.mean()
        metrics["episode_length"] = stats.last_length.astype(jnp.float32).mean()
        new_state = TrainState(params, opt_state, env_state, obs, key, state.step + 1)
        return new_state, metrics

    evaluate_returns = make_evaluate(config)

    def evaluate(state: TrainState, key: PRNGKey) -> Metrics:
        return {"eval_return": evaluate_returns(state, key)}

    return Algorithm(init, update, evaluate)


# --------------------------------------------------------------------------------------------
# 5. The policy, its evaluation, and whole runs


def make_policy(
    config: Config, deterministic: bool = True
) -> Callable[[TrainState, jax.Array, PRNGKey], jax.Array]:
    """`act(state, obs, key) -> actions`: the policy on observations normalised with the training
    run's (frozen) statistics: the distribution's mode for evaluation (`deterministic`), or a
    sample from it, which is how offline datasets are collected (experiments/collect.py).
    Continuous samples are unbounded: clip them to the action space, as training does."""
    network = make_network(config)

    def act(state: TrainState, obs: jax.Array, key: PRNGKey) -> jax.Array:
        if config.normalize_observations:
            obs_stats = envs.find_state(state.env_state, envs.NormalizeObservationState).obs_stats
            obs = obs_stats.normalize(obs)
        dist, _ = network.apply(state.params, obs)
        return dist.mode() if deterministic else dist.sample(seed=key)

    return act


def make_evaluate(config: Config) -> Callable[[TrainState, PRNGKey], jax.Array]:
    """`evaluate(state, key) -> returns[eval_episodes]`, undiscounted, from fresh episodes."""
    env = envs.make_eval(config.env_name, config.eval_episodes, **config.env_params)
    act = make_policy(config)

    def evaluate(state: TrainState, key: PRNGKey) -> jax.Array:
        return evaluation.evaluate_episodes(
            env, lambda obs, k: act(state, obs, k), key, config.eval_episodes
        )

    return evaluate


def make_train(
    config: Config, final_evaluation: bool = True
) -> Callable[[PRNGKey, HParams | None], tuple[TrainState, Metrics]]:
    """`train(key, hparams=None) -> (state, metrics)`: the whole run as one program, then a final
    evaluation (PureJaxRL's `make_train`, over `jaxrl.loop.make_train`).

    `metrics` holds one value per update for each training scalar, plus `eval_return` (the mean
    undiscounted return of the deterministic policy over `config.eval_episodes` episodes) unless
    `final_evaluation` is False (benchmarks time training alone).
    """
    return loop.make_train(make(config), config.num_steps, final_evaluation, hparams(config))
