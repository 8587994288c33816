"""Soft Actor-Critic (Haarnoja et al., 2018; automatic temperature as in Haarnoja et al., 2019).

    config = sac.Config(env_name="Pendulum-v1")
    train = jax.jit(sac.make_train(config))
    state, metrics = jax.vmap(train)(jax.random.split(key, 4))          # 4 seeds, one program

Environment steps, the replay buffer and the gradient updates all live in one XLA program. Read top
to bottom, this file is the algorithm:
  1. configuration: `LearnerConfig` (the soft actor-critic learner, which CQL's Config extends
     too) and `Config` (online data collection on top of it);
  2. the pure losses (critic, actor, temperature), each checked against NumPy in tests;
  3. the actor: a tanh-squashed Gaussian acting in (-1, 1)^d, scaled affinely to the
     environment's box on the way out, and its evaluation (CQL and behaviour cloning use it too);
  4. the learner: networks, optimisers and one gradient step (critic, then actor and temperature
     against the updated critic, then the Polyak-averaged target critics); CQL adds its penalty to
     the critic loss through `critic_penalty`;
  5. the algorithm (`make`): a buffer pre-filled by random actions, then per update a step of
     every environment and `utd_ratio * num_envs` gradient steps; and `make_train`.

The buffer stores the (-1, 1) actions the networks see.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import struct

import envs
from jaxrl import evaluation, loop, replay
from jaxrl.config import (
    ConfigError,
    require,
    require_finite,
    require_in_range,
    require_positive,
    require_step_count,
)
from jaxrl.hl_gauss import HLGauss, make_hl_gauss, validate_hl_gauss
from jaxrl.hparams import HParams, hparams, static, swept
from jaxrl.loop import Algorithm, zeros_step
from jaxrl.nets import ACTIVATIONS, QEnsemble, SquashedGaussianActor
from jaxrl.prng import loop_keys
from jaxrl.types import Metrics, Params, PRNGKey, Transition

if TYPE_CHECKING:  # only the hints name distrax; jaxrl.nets imports it at first use (start-up time)
    import distrax

# --------------------------------------------------------------------------------------------
# 1. Configuration


@dataclasses.dataclass(frozen=True)
class LearnerConfig:
    """The soft actor-critic learner: networks, temperature, optimisers and target critics.

    SAC's `Config` and CQL's extend it, so both declare these fields once and build the same
    `Learner`. Fields marked `swept` may differ between the runs of one program
    (`jaxrl.hparams.sweep`).
    """

    env_name: str = "Pendulum-v1"  # a registered environment with a box action space
    batch_size: int = 256  # transitions per gradient step
    gamma: float = swept(0.99)  # discount
    tau: float = swept(0.005)  # Polyak factor of the target critics
    actor_lr: float = swept(3e-4)
    critic_lr: float = swept(1e-3)
    alpha_lr: float = swept(1e-3)  # learning rate of log(alpha), the entropy temperature
    init_alpha: float = swept(1.0)  # initial entropy temperature
    autotune_alpha: bool = True  # False: alpha stays at init_alpha
    target_entropy: float | None = None  # None: -action_dim (Haarnoja et al., 2019)
    num_critics: int = 2  # Q-networks in the ensemble; targets take their minimum
    hidden_sizes: tuple[int, ...] = (256, 256)  # of the actor and of every critic
    activation: str = "relu"  # a key of jaxrl.nets.ACTIVATIONS
    # Value learning by classification (jaxrl.hl_gauss): > 0 bins make every critic classify the
    # soft TD target over hl_gauss_range with an HL-Gauss target sigma bin widths wide.
    hl_gauss_bins: int = 0
    hl_gauss_range: tuple[float, ...] = ()  # (low, high) of Q, e.g. (-1700, 100) on Pendulum
    hl_gauss_sigma: float = 0.75  # in bin widths (Farebrother et al., 2024)

    def __post_init__(self) -> None:
        # ml_collections hands us lists; the config must stay hashable.
        object.__setattr__(self, "hidden_sizes", tuple(self.hidden_sizes))
        object.__setattr__(self, "hl_gauss_range", tuple(self.hl_gauss_range))
        validate_hl_gauss(
            self.hl_gauss_bins, self.hl_gauss_range, self.hl_gauss_sigma, example="(-1700, 100)"
        )
        require_positive(
            self, "batch_size", "actor_lr", "critic_lr", "alpha_lr", "init_alpha", "num_critics"
        )
        require_in_range(self, "gamma", 0.0, 1.0)
        require_in_range(self, "tau", 0.0, 1.0)
        if self.target_entropy is not None:
            require_finite(self, "target_entropy")
        require(
            self.activation in ACTIVATIONS,
            "activation",
            f"unknown activation {self.activation!r}",
            f"choose one of {sorted(ACTIVATIONS)}",
        )
        require(
            all(h > 0 for h in self.hidden_sizes),
            "hidden_sizes",
            f"every layer width must be positive, got {self.hidden_sizes}",
            "e.g. hidden_sizes=(256, 256)",
        )
        envs.require_registered(self.env_name)
        envs.require_jax_env(self.env_name, "the soft actor-critic learner (SAC, CQL)")
        if envs.is_discrete(envs.make(self.env_name).action_space):
            raise ConfigError(
                f"env_name: {self.env_name!r} has discrete actions; the soft actor-critic "
                f"learner (SAC, CQL) is for continuous (box) action spaces: use algos.ppo for "
                f"discrete ones"
            )


@dataclasses.dataclass(frozen=True)
class Config(LearnerConfig):
    """SAC settings: the learner's, plus how data are collected online. Defaults learn Pendulum-v1
    within 20k environment steps."""

    total_timesteps: int = 20_000  # environment steps per seed, the random warm-up included
    num_envs: int = 1  # parallel environments, each stepped once per update
    learning_starts: int = 1_000  # uniformly random actions fill the buffer before any update
    buffer_size: int = 1_000_000  # replay capacity in transitions (capped at total_timesteps)
    utd_ratio: float = 1.0  # gradient steps per environment transition (update-to-data ratio)
    eval_episodes: int = 16  # episodes of the deterministic policy per evaluation

    def __post_init__(self) -> None:
        super().__post_init__()
        require_positive(
            self,
            "total_timesteps",
            "num_envs",
            "learning_starts",
            "buffer_size",
            "utd_ratio",
            "eval_episodes",
        )
        for name in ("total_timesteps", "learning_starts", "buffer_size"):
            value = getattr(self, name)
            require(
                value % self.num_envs == 0,
                name,
                f"({value}) must be a multiple of num_envs ({self.num_envs}): every update "
                f"steps all environments once",
                f"set {name} to {value - value % self.num_envs or self.num_envs}",
            )
        require(
            self.total_timesteps > self.learning_starts,
            "total_timesteps",
            f"({self.total_timesteps}) must exceed learning_starts ({self.learning_starts}), "
            f"or nothing is learned",
            "raise total_timesteps or lower learning_starts",
        )
        require_step_count(self, "total_timesteps")
        require(
            self.batch_size <= self.buffer_capacity,
            "batch_size",
            f"({self.batch_size}) exceeds the replay buffer's {self.buffer_capacity} rows "
            f"(min(buffer_size, total_timesteps))",
            f"set batch_size <= {self.buffer_capacity} or raise buffer_size",
        )
        steps = self.utd_ratio * self.num_envs
        require(
            abs(steps - round(steps)) < 1e-9,
            "utd_ratio",
            f"utd_ratio * num_envs ({self.utd_ratio} * {self.num_envs}) must be a whole number "
            f"of gradient steps per update",
            f"choose utd_ratio as a multiple of 1/{self.num_envs}",
        )

    @property
    def num_steps(self) -> int:
        """Updates per seed after the warm-up: one step of every environment plus gradient steps."""
        return (self.total_timesteps - self.learning_starts) // self.num_envs

    @property
    def gradient_steps_per_update(self) -> int:
        """Gradient steps after each step of the environments: utd_ratio * num_envs."""
        return round(self.utd_ratio * self.num_envs)

    @property
    def buffer_capacity(self) -> int:
        """Rows actually allocated: no more than the run can ever write."""
        return min(self.buffer_size, self.total_timesteps)


# --------------------------------------------------------------------------------------------
# 2. Pure losses


def soft_td_target(
    reward: jax.Array,
    terminated: jax.Array,
    next_q: jax.Array,
    next_log_prob: jax.Array,
    alpha: jax.Array,
    gamma: float | jax.Array,
) -> jax.Array:
    """r + gamma * (1 - terminated) * (min_i Q_target_i(s', a') - alpha * log pi(a'|s')).

    `next_q` holds every target critic's value, shape [num_critics, batch]: the minimum over
    critics counters the over-estimation a max-like backup breeds (Fujimoto et al., 2018). A
    termination zeroes the bootstrap; a time-limit truncation does not reach here as terminal.
    """
    soft_value = next_q.min(axis=0) - alpha * next_log_prob
    return reward + gamma * (1.0 - terminated.astype(jnp.float32)) * soft_value


def critic_loss(q: jax.Array, target: jax.Array) -> jax.Array:
    """Sum over critics of each one's mean squared error to the (fixed) soft TD target."""
    return jnp.square(q - jax.lax.stop_gradient(target)).mean(axis=-1).sum()


def classification_critic_loss(
    logits: jax.Array, target: jax.Array, hl_gauss: HLGauss
) -> jax.Array:
    """Sum over critics of each one's mean HL-Gauss cross-entropy to the (fixed) soft TD target;
    `logits` has shape [num_critics, batch, num_bins]."""
    return hl_gauss.loss(logits, jax.lax.stop_gradient(target)).mean(axis=-1).sum()


def actor_loss(log_prob: jax.Array, q: jax.Array, alpha: jax.Array) -> jax.Array:
    """E[alpha * log pi(a|s) - min_i Q_i(s, a)] with a ~ pi(.|s) reparameterised."""
    return (alpha * log_prob - q.min(axis=0)).mean()


def temperature_loss(log_alpha: jax.Array, log_prob: jax.Array, target_entropy: float) -> jax.Array:
    """-log(alpha) * E[log pi + target_entropy]: alpha rises while the policy's entropy is below
    the target and falls above it. Optimised in log space so alpha stays positive."""
    return -(log_alpha * jax.lax.stop_gradient(log_prob + target_entropy)).mean()


# --------------------------------------------------------------------------------------------
# 3. The actor


def action_bounds(env_name: str) -> tuple[jax.Array, jax.Array]:
    """(low, high) of the environment's action box as float32 arrays of the action shape."""
    space = envs.make(env_name).action_space
    low = jnp.broadcast_to(jnp.asarray(space.low, jnp.float32), space.shape)
    high = jnp.broadcast_to(jnp.asarray(space.high, jnp.float32), space.shape)
    return low, high


def to_env_action(action: jax.Array, low: jax.Array, high: jax.Array) -> jax.Array:
    """Map (-1, 1) to the box [low, high]."""
    return low + 0.5 * (action + 1.0) * (high - low)


def from_env_action(action: jax.Array, low: jax.Array, high: jax.Array) -> jax.Array:
    """Map the box [low, high] to [-1, 1] (offline datasets store environment-scale actions)."""
    return 2.0 * (action - low) / (high - low) - 1.0


def deterministic_action(dist: distrax.Distribution) -> jax.Array:
    """tanh of the Gaussian's mean: the squashed distribution's usual evaluation action."""
    return jnp.tanh(dist.distribution.mean())


@dataclasses.dataclass(frozen=True, eq=False)
class Actor:
    """The policy SAC, CQL and behaviour cloning share: a tanh-squashed Gaussian over (-1, 1)^d
    actions (`network`), scaled to the environment's box [low, high] when acting."""

    env_name: str
    network: SquashedGaussianActor
    low: np.ndarray
    high: np.ndarray

    @property
    def action_dim(self) -> int:
        """Dimensions of an action."""
        return self.network.action_dim

    def init(self, key: PRNGKey) -> Params:
        """Fresh parameters."""
        obs = jnp.zeros((1, *envs.make(self.env_name).observation_space.shape), jnp.float32)
        return self.network.init(key, obs)

    def dist(self, params: Params, obs: jax.Array) -> distrax.Distribution:
        """pi(.|obs) over (-1, 1) actions."""
        return self.network.apply(params, obs)

    def act(
        self, params: Params, obs: jax.Array, key: PRNGKey, deterministic: bool = True
    ) -> jax.Array:
        """Environment-scale actions: tanh(mean) when `deterministic`, else a sample (how offline
        datasets are collected: they need the behaviour policy's noise)."""
        dist = self.dist(params, obs)
        action = deterministic_action(dist) if deterministic else dist.sample(seed=key)
        return to_env_action(action, self.low, self.high)

    def evaluate(self, params: Params, key: PRNGKey, num_episodes: int) -> jax.Array:
        """Undiscounted returns [num_episodes] of the deterministic policy from fresh episodes."""
        env = envs.ClipAction(envs.make(self.env_name))
        return evaluation.evaluate_episodes(
            env, lambda obs, k: self.act(params, obs, k), key, num_episodes
        )


def make_actor(env_name: str, hidden_sizes: tuple[int, ...], activation: str) -> Actor:
    """The actor for `env_name`'s action box, with the given MLP torso."""
    space = envs.make(env_name).action_space
    network = SquashedGaussianActor(envs.action_dim(space), hidden_sizes, activation)
    low, high = action_bounds(env_name)
    return Actor(env_name, network, np.asarray(low), np.asarray(high))


# --------------------------------------------------------------------------------------------
# 4. The learner: networks, optimisers, one gradient step


@struct.dataclass
class LearnerState:
    """The soft actor-critic learner's parameters and optimiser states (SAC's and CQL's)."""

    actor_params: Params
    critic_params: Params
    target_critic_params: Params
    log_alpha: jax.Array  # log of the entropy temperature
    actor_opt_state: optax.OptState
    critic_opt_state: optax.OptState
    alpha_opt_state: optax.OptState


# `penalty(critic_params, key) -> (loss, metrics)`: a term added to the critic loss (CQL's).
CriticPenalty = Callable[[Params, PRNGKey], tuple[jax.Array, Metrics]]


class Learner(NamedTuple):
    """The soft actor-critic learner as pure functions, with the networks they apply.

    `init(actor_key, critic_key, hparams) -> LearnerState`; `gradient_step(state, batch, key,
    hparams, critic_penalty=None) -> (state, metrics)` on a `Transition` batch of (-1, 1) actions.
    """

    actor: Actor
    critic: QEnsemble
    init: Callable[[PRNGKey, PRNGKey, HParams], LearnerState]
    gradient_step: Callable[..., tuple[LearnerState, Metrics]]


def target_entropy(config: LearnerConfig) -> float:
    """The entropy the temperature steers towards: `config.target_entropy`, or -action_dim."""
    if config.target_entropy is not None:
        return float(config.target_entropy)
    return -float(envs.action_dim(envs.make(config.env_name).action_space))


def make_learner(config: LearnerConfig) -> Learner:
    """The learner of `config` (SAC's or CQL's Config, both `LearnerConfig`s); swept values are
    read from the `hparams` given to `init` and `gradient_step`."""
    config = static(config)
    actor = make_actor(config.env_name, config.hidden_sizes, config.activation)
    hl_gauss = make_hl_gauss(config.hl_gauss_bins, config.hl_gauss_range, config.hl_gauss_sigma)
    critic = QEnsemble(config.num_critics, config.hidden_sizes, config.activation, hl_gauss)
    entropy_target = target_entropy(config)

    def init(actor_key: PRNGKey, critic_key: PRNGKey, hp: HParams) -> LearnerState:
        actor_params = actor.init(actor_key)
        obs = jnp.zeros((1, *envs.make(config.env_name).observation_space.shape), jnp.float32)
        critic_params = critic.init(critic_key, obs, jnp.zeros((1, actor.action_dim)))
        log_alpha = jnp.log(hp.init_alpha)
        return LearnerState(
            actor_params=actor_params,
            critic_params=critic_params,
            target_critic_params=critic_params,
            log_alpha=log_alpha,
            # Adam's state does not depend on the learning rate: the swept rates enter at update.
            actor_opt_state=optax.adam(hp.actor_lr).init(actor_params),
            critic_opt_state=optax.adam(hp.critic_lr).init(critic_params),
            alpha_opt_state=optax.adam(hp.alpha_lr).init(log_alpha),
        )

    def critic_objective(critic_params, batch, target, penalty, key):
        if hl_gauss is None:
            q = critic.apply(critic_params, batch.obs, batch.action)
            loss = critic_loss(q, target)
        else:
            logits = critic.apply(critic_params, batch.obs, batch.action, logits=True)
            q = hl_gauss.value(logits)
            loss = classification_critic_loss(logits, target, hl_gauss)
        metrics = {"critic_loss": loss, "q_mean": q.mean()}
        if penalty is not None:
            penalty_loss, penalty_metrics = penalty(critic_params, key)
            loss = loss + penalty_loss
            metrics.update(penalty_metrics)
        return loss, metrics

    def actor_objective(actor_params, critic_params, obs, alpha, key):
        action, log_prob = actor.dist(actor_params, obs).sample_and_log_prob(seed=key)
        return actor_loss(log_prob, critic.apply(critic_params, obs, action), alpha), log_prob

    def gradient_step(
        state: LearnerState,
        batch: Transition,
        key: PRNGKey,
        hp: HParams,
        critic_penalty: CriticPenalty | None = None,
    ) -> tuple[LearnerState, Metrics]:
        next_key, penalty_key, actor_key = jax.random.split(key, 3)
        alpha = jnp.exp(state.log_alpha)

        # Critic: regress (or classify) every Q_i onto the soft TD target of the target critics.
        next_action, next_log_prob = actor.dist(
            state.actor_params, batch.next_obs
        ).sample_and_log_prob(seed=next_key)
        next_q = critic.apply(state.target_critic_params, batch.next_obs, next_action)
        target = soft_td_target(
            batch.reward, batch.terminated, next_q, next_log_prob, alpha, hp.gamma
        )
        critic_grads, metrics = jax.grad(critic_objective, has_aux=True)(
            state.critic_params, batch, target, critic_penalty, penalty_key
        )
        updates, critic_opt_state = optax.adam(hp.critic_lr).update(
            critic_grads, state.critic_opt_state
        )
        critic_params = optax.apply_updates(state.critic_params, updates)

        # Actor, against the critics just updated.
        (loss_pi, log_prob), actor_grads = jax.value_and_grad(actor_objective, has_aux=True)(
            state.actor_params, critic_params, batch.obs, alpha, actor_key
        )
        updates, actor_opt_state = optax.adam(hp.actor_lr).update(
            actor_grads, state.actor_opt_state
        )
        actor_params = optax.apply_updates(state.actor_params, updates)

        # Temperature, on the same policy samples.
        log_alpha, alpha_opt_state = state.log_alpha, state.alpha_opt_state
        if config.autotune_alpha:
            alpha_grad = jax.grad(temperature_loss)(log_alpha, log_prob, entropy_target)
            update, alpha_opt_state = optax.adam(hp.alpha_lr).update(alpha_grad, alpha_opt_state)
            log_alpha = log_alpha + update

        target_critic_params = optax.incremental_update(
            critic_params, state.target_critic_params, hp.tau
        )
        metrics.update(actor_loss=loss_pi, alpha=alpha, entropy=-log_prob.mean())
        new_state = LearnerState(
            actor_params=actor_params,
            critic_params=critic_params,
            target_critic_params=target_critic_params,
            log_alpha=log_alpha,
            actor_opt_state=actor_opt_state,
            critic_opt_state=critic_opt_state,
            alpha_opt_state=alpha_opt_state,
        )
        return new_state, metrics

    return Learner(actor, critic, init, gradient_step)


# --------------------------------------------------------------------------------------------
# 5. The algorithm: init (with the random warm-up), update (act, store, learn), evaluate


@struct.dataclass
class TrainState:
    """The whole state of one SAC run: the learner, the replay buffer of `Transition` rows, the
    environments (`env_state`, `obs` with leading axis num_envs), PRNG key and step."""

    learner: LearnerState
    buffer: replay.ReplayBuffer
    env_state: Any
    obs: jax.Array
    key: PRNGKey
    step: jax.Array  # updates done (the warm-up is not counted)


def make_env(config: Config) -> envs.Wrapper:
    """The training environments: `envs.make_vec` with `num_envs` copies, no normalisation."""
    return envs.make_vec(config.env_name, config.num_envs)


def make(config: Config) -> Algorithm:
    """SAC as pure functions of one run: `init(key, hparams)` (fresh learner and a buffer holding
    `learning_starts` random transitions), `update(state, None, hparams)` (every environment steps
    once on a sampled action, then `utd_ratio * num_envs` gradient steps on batches drawn from the
    buffer) and `evaluate(state, key)`.

    `update`'s metrics are scalars: means over its gradient steps, and the last finished episodes'
    `episode_return` / `episode_length`. `evaluate` returns `eval_return[eval_episodes]` of the
    deterministic policy.
    """
    learner = make_learner(config)
    config = static(config)
    env = make_env(config)
    actor = learner.actor

    def env_step(state: TrainState, action: jax.Array, key: PRNGKey) -> TrainState:
        """Step every environment with (-1, 1) actions and store the transitions. The stored next
        observation is the true last one when an episode ended (AutoReset's `final_obs`), and
        only a termination is stored as terminal: time-limit truncations bootstrap."""
        result = env.step(key, state.env_state, to_env_action(action, actor.low, actor.high))
        rows = Transition(
            obs=state.obs,
            action=action,
            reward=result.reward,
            next_obs=result.info["final_obs"],
            terminated=result.terminated,
        )
        buffer = replay.add_batch(state.buffer, rows)
        return state.replace(buffer=buffer, env_state=result.state, obs=result.obs)

    def random_step(state: TrainState, _) -> tuple[TrainState, None]:
        key, action_key, step_key = jax.random.split(state.key, 3)
        shape = (config.num_envs, actor.action_dim)
        action = jax.random.uniform(action_key, shape, minval=-1, maxval=1)
        return env_step(state.replace(key=key), action, step_key), None

    def init(key: PRNGKey, hp: HParams) -> TrainState:
        key, actor_key, critic_key, env_key = jax.random.split(key, 4)
        obs, env_state = env.reset(env_key)
        example_row = Transition(
            obs=obs[0],
            action=jnp.zeros(actor.action_dim),
            reward=jnp.float32(0),
            next_obs=obs[0],
            terminated=jnp.bool_(False),
        )
        state = TrainState(
            learner=learner.init(actor_key, critic_key, hp),
            buffer=replay.init_buffer(example_row, config.buffer_capacity),
            env_state=env_state,
            obs=obs,
            key=key,
            step=zeros_step(),
        )
        # The warm-up: uniformly random actions fill the buffer before any learning.
        warmup = config.learning_starts // config.num_envs
        state, _ = jax.lax.scan(random_step, state, None, length=warmup)
        return state

    def update(state: TrainState, inputs: None, hp: HParams) -> tuple[TrainState, Metrics]:
        del inputs  # the environments run inside
        # Philox keys for everything this step draws (jaxrl.prng); the run's own key stays a
        # legacy uint32 key in the state, as every algorithm keeps it.
        key, action_key, step_key, learn_key = loop_keys(state.key, 4)
        key = jax.random.key_data(key)
        action = actor.dist(state.learner.actor_params, state.obs).sample(seed=action_key)
        state = env_step(state.replace(key=key), action, step_key)

        def learn(learner_state, key):
            sample_key, step_key = jax.random.split(key)
            batch = replay.sample(state.buffer, sample_key, config.batch_size)
            return learner.gradient_step(learner_state, batch, step_key, hp)

        keys = jax.random.split(learn_key, config.gradient_steps_per_update)
        learner_state, metrics = jax.lax.scan(learn, state.learner, keys)
        metrics = jax.tree.map(jnp.mean, metrics)
        stats = envs.find_state(state.env_state, envs.EpisodeStatisticsState)
        metrics["episode_return"] = stats.last_return.mean()
        metrics["episode_length"] = stats.last_length.astype(jnp.float32).mean()
        return state.replace(learner=learner_state, step=state.step + 1), metrics

    def evaluate(state: TrainState, key: PRNGKey) -> Metrics:
        returns = actor.evaluate(state.learner.actor_params, key, config.eval_episodes)
        return {"eval_return": returns}

    return Algorithm(init, update, evaluate)


def make_policy(
    config: Config, deterministic: bool = True
) -> Callable[[TrainState, jax.Array, PRNGKey], jax.Array]:
    """`act(state, obs, key) -> environment-scale actions` of a SAC run's state: tanh(mean) when
    deterministic, a sample from the squashed Gaussian otherwise (how offline datasets are
    collected, experiments/collect.py)."""
    actor = make_actor(config.env_name, config.hidden_sizes, config.activation)

    def act(state: TrainState, obs: jax.Array, key: PRNGKey) -> jax.Array:
        return actor.act(state.learner.actor_params, obs, key, deterministic)

    return act


def make_train(
    config: Config, final_evaluation: bool = True
) -> Callable[[PRNGKey, HParams | None], tuple[TrainState, Metrics]]:
    """`train(key, hparams=None) -> (state, metrics)`: warm-up, every update, then (unless
    `final_evaluation` is False) the deterministic policy's mean return over `eval_episodes` as
    `metrics["eval_return"]` (over `jaxrl.loop.make_train`)."""
    return loop.make_train(make(config), config.num_steps, final_evaluation, hparams(config))
