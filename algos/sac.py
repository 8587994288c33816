"""Soft Actor-Critic (Haarnoja et al., 2018; automatic temperature as in Haarnoja et al., 2019).

    config = sac.Config(env_name="Pendulum-v1")
    train = jax.jit(sac.make_train(config))
    state, metrics = jax.vmap(train)(jax.random.split(key, 4))          # 4 seeds, one program

Environment steps, the replay buffer and the gradient updates all live in one XLA program. Read top
to bottom, this file is the algorithm:
  1. Config, and the hyper-parameters that may vary inside one program (`HParams`, pytree leaves);
  2. the pure losses (critic, actor, temperature), each checked against NumPy in tests;
  3. networks, optimisers and the initial state, with a buffer pre-filled by random actions;
  4. one gradient step (critic, then actor and temperature against the updated critic, then the
     Polyak-averaged target critics) and one iteration (a step of every environment, then
     `utd_ratio * num_envs` gradient steps);
  5. evaluation, `make_train` (the whole run) and `make_train_chunk` (a slice over a batch of
     runs, for host loops that checkpoint and log between chunks).

The actor acts in (-1, 1)^d; actions are scaled affinely to the environment's box on the way out,
and the buffer stores the (-1, 1) actions the networks see.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import distrax
import jax
import jax.numpy as jnp
import optax
from flax import struct

import envs
from jaxrl import evaluation, replay
from jaxrl.config import ConfigError, require, require_in_range, require_positive
from jaxrl.nets import ACTIVATIONS, QEnsemble, SquashedGaussianActor
from jaxrl.types import Metrics, Params, PRNGKey

# --------------------------------------------------------------------------------------------
# 1. Configuration


@dataclasses.dataclass(frozen=True)
class Config:
    """SAC settings. Defaults learn Pendulum-v1 within 20k environment steps."""

    env_name: str = "Pendulum-v1"  # a registered environment with a box action space
    total_timesteps: int = 20_000  # environment steps per seed, the random warm-up included
    num_envs: int = 1  # parallel environments, each stepped once per iteration
    learning_starts: int = 1_000  # uniformly random actions fill the buffer before any update
    buffer_size: int = 1_000_000  # replay capacity in transitions (capped at total_timesteps)
    batch_size: int = 256  # transitions per gradient step
    utd_ratio: float = 1.0  # gradient steps per environment transition (update-to-data ratio)
    gamma: float = 0.99  # discount
    tau: float = 0.005  # Polyak factor of the target critics
    actor_lr: float = 3e-4
    critic_lr: float = 1e-3
    alpha_lr: float = 1e-3  # learning rate of log(alpha), the entropy temperature
    init_alpha: float = 1.0  # initial entropy temperature
    autotune_alpha: bool = True  # False: alpha stays at init_alpha
    target_entropy: float | None = None  # None: -action_dim (Haarnoja et al., 2019)
    num_critics: int = 2  # Q-networks in the ensemble; targets take their minimum
    hidden_sizes: tuple[int, ...] = (256, 256)  # of the actor and of every critic
    activation: str = "relu"  # a key of jaxrl.nets.ACTIVATIONS
    eval_episodes: int = 16  # episodes of the deterministic policy per evaluation

    def __post_init__(self) -> None:
        object.__setattr__(self, "hidden_sizes", tuple(self.hidden_sizes))
        require_positive(
            self,
            "total_timesteps",
            "num_envs",
            "learning_starts",
            "buffer_size",
            "batch_size",
            "utd_ratio",
            "actor_lr",
            "critic_lr",
            "alpha_lr",
            "init_alpha",
            "num_critics",
            "eval_episodes",
        )
        require_in_range(self, "gamma", 0.0, 1.0)
        require_in_range(self, "tau", 0.0, 1.0)
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
        for name in ("total_timesteps", "learning_starts", "buffer_size"):
            value = getattr(self, name)
            require(
                value % self.num_envs == 0,
                name,
                f"({value}) must be a multiple of num_envs ({self.num_envs}): every iteration "
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
        steps = self.utd_ratio * self.num_envs
        require(
            abs(steps - round(steps)) < 1e-9,
            "utd_ratio",
            f"utd_ratio * num_envs ({self.utd_ratio} * {self.num_envs}) must be a whole number "
            f"of gradient steps per iteration",
            f"choose utd_ratio as a multiple of 1/{self.num_envs}",
        )
        if self.env_name not in envs.registered():
            try:
                envs.make(self.env_name)
            except ValueError as error:
                raise ConfigError(f"env_name: {error}") from None
        if envs.is_discrete(envs.make(self.env_name).action_space):
            raise ConfigError(
                f"env_name: {self.env_name!r} has discrete actions; SAC here is for continuous "
                f"(box) action spaces: use algos.ppo for discrete ones"
            )

    @property
    def num_iterations(self) -> int:
        """Learning iterations per seed: one step of every environment plus gradient steps."""
        return (self.total_timesteps - self.learning_starts) // self.num_envs

    @property
    def gradient_steps_per_iteration(self) -> int:
        """Gradient steps after each step of the environments: utd_ratio * num_envs."""
        return round(self.utd_ratio * self.num_envs)

    @property
    def buffer_capacity(self) -> int:
        """Rows actually allocated: no more than the run can ever write."""
        return min(self.buffer_size, self.total_timesteps)

    def hparams(self) -> HParams:
        """This config's continuous hyper-parameters as float32 scalars (no sweep axis)."""
        return HParams(
            actor_lr=jnp.float32(self.actor_lr),
            critic_lr=jnp.float32(self.critic_lr),
            alpha_lr=jnp.float32(self.alpha_lr),
            gamma=jnp.float32(self.gamma),
            tau=jnp.float32(self.tau),
        )


@struct.dataclass
class HParams:
    """Continuous hyper-parameters as arrays: `jax.vmap` over them makes a sweep one program."""

    actor_lr: jax.Array
    critic_lr: jax.Array
    alpha_lr: jax.Array
    gamma: jax.Array
    tau: jax.Array


@struct.dataclass
class TrainState:
    """The whole state of one SAC run: networks, temperature, optimisers, replay buffer,
    environments (`env_state`, `obs` with leading axis num_envs) and PRNG key."""

    actor_params: Params
    critic_params: Params
    target_critic_params: Params
    log_alpha: jax.Array
    actor_opt_state: optax.OptState
    critic_opt_state: optax.OptState
    alpha_opt_state: optax.OptState
    buffer: replay.ReplayBuffer
    env_state: Any
    obs: jax.Array
    key: PRNGKey
    iteration: jax.Array  # learning iterations done (the warm-up is not counted)


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


def actor_loss(log_prob: jax.Array, q: jax.Array, alpha: jax.Array) -> jax.Array:
    """E[alpha * log pi(a|s) - min_i Q_i(s, a)] with a ~ pi(.|s) reparameterised."""
    return (alpha * log_prob - q.min(axis=0)).mean()


def temperature_loss(log_alpha: jax.Array, log_prob: jax.Array, target_entropy: float) -> jax.Array:
    """-log(alpha) * E[log pi + target_entropy]: alpha rises while the policy's entropy is below
    the target and falls above it. Optimised in log space so alpha stays positive."""
    return -(log_alpha * jax.lax.stop_gradient(log_prob + target_entropy)).mean()


# --------------------------------------------------------------------------------------------
# 3. Building blocks


def make_env(config: Config) -> envs.Wrapper:
    """The training environments: `envs.make_vec` with `num_envs` copies, no normalisation."""
    return envs.make_vec(config.env_name, config.num_envs)


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


def make_actor(config: Any) -> SquashedGaussianActor:
    """The policy network. `config` needs env_name, hidden_sizes and activation: CQL's and
    behaviour cloning's configs build the same actor."""
    space = envs.make(config.env_name).action_space
    return SquashedGaussianActor(envs.action_dim(space), config.hidden_sizes, config.activation)


def make_networks(config: Config) -> tuple[SquashedGaussianActor, QEnsemble]:
    """(actor, critic): `actor.apply(params, obs) -> distribution` over (-1, 1) actions and
    `critic.apply(params, obs, action) -> q` of shape [num_critics, batch]."""
    critic = QEnsemble(config.num_critics, config.hidden_sizes, config.activation)
    return make_actor(config), critic


def target_entropy(config: Config) -> float:
    """The entropy the temperature steers towards: `config.target_entropy`, or -action_dim."""
    if config.target_entropy is not None:
        return float(config.target_entropy)
    return -float(envs.action_dim(envs.make(config.env_name).action_space))


def init(config: Config, key: PRNGKey, hparams: HParams | None = None) -> TrainState:
    """Fresh networks and optimisers, and a buffer holding `learning_starts` random transitions."""
    hp = config.hparams() if hparams is None else hparams
    env = make_env(config)
    actor, critic = make_networks(config)
    key, actor_key, critic_key, env_key = jax.random.split(key, 4)
    obs, env_state = env.reset(env_key)
    action_dim = envs.action_dim(env.action_space)
    dummy_action = jnp.zeros((config.num_envs, action_dim))
    actor_params = actor.init(actor_key, obs)
    critic_params = critic.init(critic_key, obs, dummy_action)
    log_alpha = jnp.log(jnp.float32(config.init_alpha))
    example_row = {
        "obs": obs[0],
        "action": dummy_action[0],
        "reward": jnp.float32(0),
        "next_obs": obs[0],
        "terminated": jnp.bool_(False),
    }
    state = TrainState(
        actor_params=actor_params,
        critic_params=critic_params,
        target_critic_params=critic_params,
        log_alpha=log_alpha,
        actor_opt_state=optax.adam(hp.actor_lr).init(actor_params),
        critic_opt_state=optax.adam(hp.critic_lr).init(critic_params),
        alpha_opt_state=optax.adam(hp.alpha_lr).init(log_alpha),
        buffer=replay.init_buffer(example_row, config.buffer_capacity),
        env_state=env_state,
        obs=obs,
        key=key,
        iteration=jnp.zeros((), jnp.int32),
    )
    return prefill(config, state)


def _environment_step(config: Config, state: TrainState, action: jax.Array, key: PRNGKey):
    """Step every environment with (-1, 1) actions and store the transitions. The stored next
    observation is the true last one when an episode ended (AutoReset's `final_obs`), and only a
    termination is stored as terminal: time-limit truncations bootstrap."""
    env = make_env(config)
    low, high = action_bounds(config.env_name)
    result = env.step(key, state.env_state, to_env_action(action, low, high))
    rows = {
        "obs": state.obs,
        "action": action,
        "reward": result.reward,
        "next_obs": result.info["final_obs"],
        "terminated": result.terminated,
    }
    buffer = replay.add_batch(state.buffer, rows)
    return state.replace(buffer=buffer, env_state=result.state, obs=result.obs)


def prefill(config: Config, state: TrainState) -> TrainState:
    """`learning_starts` transitions of uniformly random actions, before any learning."""
    action_dim = envs.action_dim(envs.make(config.env_name).action_space)

    def random_step(state, _):
        key, action_key, step_key = jax.random.split(state.key, 3)
        action = jax.random.uniform(action_key, (config.num_envs, action_dim), minval=-1, maxval=1)
        return _environment_step(config, state.replace(key=key), action, step_key), None

    state, _ = jax.lax.scan(
        random_step, state, None, length=config.learning_starts // config.num_envs
    )
    return state


# --------------------------------------------------------------------------------------------
# 4. Gradient step and iteration


def make_gradient_step(
    config: Any,
    actor: SquashedGaussianActor,
    critic: QEnsemble,
    critic_penalty: Callable[..., tuple[jax.Array, Metrics]] | None = None,
) -> Callable[[TrainState, dict[str, jax.Array], PRNGKey, HParams], tuple[TrainState, Metrics]]:
    """`gradient_step(state, batch, key, hparams) -> (state, metrics)`: one soft actor-critic
    update on a batch dict of obs, action, reward, next_obs and terminated, actions in (-1, 1).

    CQL reuses it: `critic_penalty(critic_params, batch, key, state) -> (penalty, metrics)`, when
    given, is added to the critic loss (CQL's conservative term); `config` then is CQL's config,
    which has the same fields this function reads.
    """
    entropy_target = target_entropy(config)

    def critic_objective(critic_params, state, batch, target, key):
        q = critic.apply(critic_params, batch["obs"], batch["action"])
        loss = critic_loss(q, target)
        metrics = {"critic_loss": loss, "q_mean": q.mean()}
        if critic_penalty is not None:
            penalty, penalty_metrics = critic_penalty(critic_params, batch, key, state)
            loss = loss + penalty
            metrics.update(penalty_metrics)
        return loss, metrics

    def actor_objective(actor_params, critic_params, obs, alpha, key):
        action, log_prob = actor.apply(actor_params, obs).sample_and_log_prob(seed=key)
        q = critic.apply(critic_params, obs, action)
        return actor_loss(log_prob, q, alpha), log_prob

    def gradient_step(state, batch, key, hp):
        next_key, penalty_key, actor_key = jax.random.split(key, 3)
        alpha = jnp.exp(state.log_alpha)

        # Critic: regress every Q_i onto the soft TD target of the target critics.
        next_action, next_log_prob = actor.apply(
            state.actor_params, batch["next_obs"]
        ).sample_and_log_prob(seed=next_key)
        next_q = critic.apply(state.target_critic_params, batch["next_obs"], next_action)
        target = soft_td_target(
            batch["reward"], batch["terminated"], next_q, next_log_prob, alpha, hp.gamma
        )
        critic_grads, metrics = jax.grad(critic_objective, has_aux=True)(
            state.critic_params, state, batch, target, penalty_key
        )
        updates, critic_opt_state = optax.adam(hp.critic_lr).update(
            critic_grads, state.critic_opt_state
        )
        critic_params = optax.apply_updates(state.critic_params, updates)

        # Actor, against the critics just updated.
        (loss_pi, log_prob), actor_grads = jax.value_and_grad(actor_objective, has_aux=True)(
            state.actor_params, critic_params, batch["obs"], alpha, actor_key
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
        new_state = state.replace(
            actor_params=actor_params,
            critic_params=critic_params,
            target_critic_params=target_critic_params,
            log_alpha=log_alpha,
            actor_opt_state=actor_opt_state,
            critic_opt_state=critic_opt_state,
            alpha_opt_state=alpha_opt_state,
        )
        return new_state, metrics

    return gradient_step


def make_update(config: Config) -> Callable[[TrainState, HParams], tuple[TrainState, Metrics]]:
    """`update(state, hparams) -> (state, metrics)`: one learning iteration of one run. Every
    environment steps once on a sampled action, then `utd_ratio * num_envs` gradient steps on
    batches drawn from the buffer; `metrics` are scalars (means over those gradient steps, and the
    last finished episodes' `episode_return` / `episode_length`)."""
    actor, critic = make_networks(config)
    gradient_step = make_gradient_step(config, actor, critic)

    def update(state: TrainState, hp: HParams) -> tuple[TrainState, Metrics]:
        key, action_key, step_key, learn_key = jax.random.split(state.key, 4)
        action = actor.apply(state.actor_params, state.obs).sample(seed=action_key)
        state = _environment_step(config, state.replace(key=key), action, step_key)

        def learn(state, key):
            sample_key, step_key = jax.random.split(key)
            batch = replay.sample(state.buffer, sample_key, config.batch_size)
            return gradient_step(state, batch, step_key, hp)

        keys = jax.random.split(learn_key, config.gradient_steps_per_iteration)
        state, metrics = jax.lax.scan(learn, state, keys)
        metrics = jax.tree.map(jnp.mean, metrics)
        stats = envs.find_state(state.env_state, envs.EpisodeStatisticsState)
        metrics["episode_return"] = stats.last_return.mean()
        metrics["episode_length"] = stats.last_length.astype(jnp.float32).mean()
        return state.replace(iteration=state.iteration + 1), metrics

    return update


# --------------------------------------------------------------------------------------------
# 5. Evaluation and whole runs


def deterministic_action(dist: distrax.Distribution) -> jax.Array:
    """tanh of the Gaussian's mean: the squashed distribution's usual evaluation action."""
    return jnp.tanh(dist.distribution.mean())


def make_policy(
    config: Config, deterministic: bool = True
) -> Callable[[TrainState, jax.Array, PRNGKey], jax.Array]:
    """`act(state, obs, key) -> environment-scale actions`: tanh(mean) when deterministic, a
    sample from the squashed Gaussian otherwise (how offline datasets are collected)."""
    actor = make_actor(config)
    low, high = action_bounds(config.env_name)

    def act(state: TrainState, obs: jax.Array, key: PRNGKey) -> jax.Array:
        dist = actor.apply(state.actor_params, obs)
        action = deterministic_action(dist) if deterministic else dist.sample(seed=key)
        return to_env_action(action, low, high)

    return act


def make_evaluate(config: Config) -> Callable[[TrainState, PRNGKey], jax.Array]:
    """`evaluate(state, key) -> returns[eval_episodes]` of the deterministic policy. CQL and
    behaviour cloning evaluate with it too: it reads only `state.actor_params`."""
    env = envs.ClipAction(envs.make(config.env_name))
    act = make_policy(config, deterministic=True)

    def evaluate(state: TrainState, key: PRNGKey) -> jax.Array:
        return evaluation.evaluate_episodes(
            env, lambda obs, k: act(state, obs, k), key, config.eval_episodes
        )

    return evaluate


def make_train(
    config: Config, final_evaluation: bool = True
) -> Callable[[PRNGKey, HParams | None], tuple[TrainState, Metrics]]:
    """`train(key, hparams=None) -> (state, metrics)`: warm-up, every learning iteration, then the
    deterministic policy's mean return over `eval_episodes` as `metrics["eval_return"]`."""
    update = make_update(config)
    evaluate = make_evaluate(config)

    def train(key: PRNGKey, hparams: HParams | None = None) -> tuple[TrainState, Metrics]:
        hp = config.hparams() if hparams is None else hparams
        init_key, eval_key = jax.random.split(key)
        state = init(config, init_key, hp)
        state, metrics = jax.lax.scan(
            lambda s, _: update(s, hp), state, None, length=config.num_iterations
        )
        if final_evaluation:
            metrics["eval_return"] = evaluate(state, eval_key).mean()
        return state, metrics

    return train


def make_train_chunk(
    config: Config,
    num_iterations: int,
    callback: Callable[[jax.Array, Metrics], None] | None = None,
    callback_every: int = 1,
) -> Callable[[TrainState, HParams], tuple[TrainState, Metrics]]:
    """`chunk(states, hparams) -> (states, metrics)`: `num_iterations` iterations of a batch of
    runs (leading run axis on `states` and `hparams`).

    Every `callback_every` iterations, `callback(iteration, metrics)` receives the block's mean
    metrics of every run: one host call per block rather than per environment step, which would
    cost more than the step itself. `num_iterations` must be a multiple of `callback_every`.
    """
    if num_iterations % callback_every:
        raise ValueError(
            f"num_iterations ({num_iterations}) must be a multiple of callback_every "
            f"({callback_every})"
        )
    batched_update = jax.vmap(make_update(config))

    def block(states, hparams):
        states, metrics = jax.lax.scan(
            lambda s, _: batched_update(s, hparams), states, None, length=callback_every
        )
        metrics = jax.tree.map(lambda m: m.mean(axis=0), metrics)
        if callback is not None:
            jax.debug.callback(callback, states.iteration[0], metrics)
        return states, metrics

    def chunk(states: TrainState, hparams: HParams) -> tuple[TrainState, Metrics]:
        return jax.lax.scan(
            lambda s, _: block(s, hparams), states, None, length=num_iterations // callback_every
        )

    return chunk
