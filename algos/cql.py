"""Conservative Q-Learning (Kumar et al., 2020), CQL(H) on top of SAC, from a fixed dataset.

    data = cql.device_dataset(load_transitions(path), config)          # (-1, 1) actions, on device
    chunk = jax.jit(cql.make_train_chunk(config, num_updates=1_000))
    states, metrics = chunk(states, hparams, data, eval_keys)         # a batch of seeds at once

Offline, the critic's errors on actions the dataset never shows are never corrected by experience,
and the actor climbs exactly those errors. CQL adds to SAC's critic loss a term that pushes Q down
on actions from a broad proposal and up on the dataset's actions, so that the learned Q lower-bounds
the policy's value off the data. Read top to bottom:
  1. Config (SAC's fields plus the conservative ones) and the training state;
  2. the conservative penalty: an importance-sampled log-sum-exp of Q over uniform, current-policy
     and next-policy actions, minus Q of the dataset action, checked against NumPy in tests;
  3. one gradient step (SAC's, with the penalty added to the critic loss, then the Lagrange
     multiplier when the target action-gap variant is on);
  4. `make_train_chunk`: `num_updates` steps on batches drawn from the on-device dataset, then an
     evaluation of the deterministic policy in the JAX environment, all in one program.
D4RL's normalized score, 100 * (R - R_random) / (R_expert - R_random), is `normalized_score`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import struct

import envs
from algos import sac
from jaxrl.config import ConfigError, require, require_in_range, require_positive
from jaxrl.nets import ACTIVATIONS
from jaxrl.types import Metrics, Params, PRNGKey

# --------------------------------------------------------------------------------------------
# 1. Configuration and state


@dataclasses.dataclass(frozen=True)
class Config:
    """CQL settings. Defaults follow Kumar et al.'s continuous-control settings (fixed alpha 5,
    10 sampled actions per proposal, policy learning rate below the critic's)."""

    env_name: str = "Pendulum-v1"  # evaluation environment; also fixes the action bounds
    num_updates: int = 20_000  # gradient steps per seed
    batch_size: int = 256  # transitions drawn uniformly from the dataset per gradient step
    gamma: float = 0.99  # discount
    tau: float = 0.005  # Polyak factor of the target critics
    actor_lr: float = 1e-4
    critic_lr: float = 3e-4
    alpha_lr: float = 1e-4  # learning rate of log(alpha), SAC's entropy temperature
    init_alpha: float = 1.0  # initial entropy temperature
    autotune_alpha: bool = True  # False: alpha stays at init_alpha
    target_entropy: float | None = None  # None: -action_dim
    num_critics: int = 2  # Q-networks in the ensemble; TD targets take their minimum
    hidden_sizes: tuple[int, ...] = (256, 256)  # of the actor and of every critic
    activation: str = "relu"  # a key of jaxrl.nets.ACTIVATIONS
    # The conservative term.
    cql_alpha: float = 5.0  # weight of the penalty (the multiplier's start with `lagrangian`)
    num_action_samples: int = 10  # per proposal (uniform, pi(.|s), pi(.|s')) and state
    cql_temperature: float = 1.0  # log-sum-exp temperature
    lagrangian: bool = False  # tune the weight so the action gap stays at target_action_gap
    target_action_gap: float = 10.0  # the gap the Lagrangian variant holds the critics to
    cql_alpha_lr: float = 3e-4  # learning rate of log(cql_alpha) with `lagrangian`
    eval_episodes: int = 10  # episodes of the deterministic policy per evaluation

    def __post_init__(self) -> None:
        object.__setattr__(self, "hidden_sizes", tuple(self.hidden_sizes))
        require_positive(
            self,
            "num_updates",
            "batch_size",
            "actor_lr",
            "critic_lr",
            "alpha_lr",
            "init_alpha",
            "num_critics",
            "num_action_samples",
            "cql_temperature",
            "cql_alpha_lr",
            "eval_episodes",
        )
        require_in_range(self, "gamma", 0.0, 1.0)
        require_in_range(self, "tau", 0.0, 1.0)
        require(
            self.cql_alpha >= 0,
            "cql_alpha",
            f"must be >= 0, got {self.cql_alpha}",
            "set cql_alpha >= 0 (0 is plain offline SAC)",
        )
        require(
            self.activation in ACTIVATIONS,
            "activation",
            f"unknown activation {self.activation!r}",
            f"choose one of {sorted(ACTIVATIONS)}",
        )
        require(
            not self.lagrangian or self.cql_alpha > 0,
            "cql_alpha",
            "the Lagrangian variant starts its multiplier at cql_alpha, which must be > 0",
            "set cql_alpha > 0, e.g. 1.0",
        )
        if self.env_name not in envs.registered():
            try:
                envs.make(self.env_name)
            except ValueError as error:
                raise ConfigError(f"env_name: {error}") from None
        if envs.is_discrete(envs.make(self.env_name).action_space):
            raise ConfigError(
                f"env_name: {self.env_name!r} has discrete actions; CQL here is for continuous "
                f"(box) action spaces"
            )

    def hparams(self) -> sac.HParams:
        """This config's continuous hyper-parameters, as SAC's `HParams` of float32 scalars."""
        return sac.HParams(
            actor_lr=jnp.float32(self.actor_lr),
            critic_lr=jnp.float32(self.critic_lr),
            alpha_lr=jnp.float32(self.alpha_lr),
            gamma=jnp.float32(self.gamma),
            tau=jnp.float32(self.tau),
        )


@struct.dataclass
class TrainState:
    """SAC's learner state without environment or buffer, plus the penalty's weight."""

    actor_params: Params
    critic_params: Params
    target_critic_params: Params
    log_alpha: jax.Array
    actor_opt_state: optax.OptState
    critic_opt_state: optax.OptState
    alpha_opt_state: optax.OptState
    log_cql_alpha: jax.Array  # learned only with `lagrangian`; else log(cql_alpha) throughout
    cql_alpha_opt_state: optax.OptState
    key: PRNGKey
    update_step: jax.Array


@struct.dataclass
class Dataset:
    """Transitions on device, actions scaled to (-1, 1). `terminal` is True only for absorbing
    states: a time-limit end is an ordinary transition whose next observation bootstraps."""

    obs: jax.Array
    action: jax.Array
    reward: jax.Array
    next_obs: jax.Array
    terminal: jax.Array

    @property
    def size(self) -> int:
        """Number of transitions."""
        return self.obs.shape[0]


def device_dataset(transitions: Any, config: Config) -> Dataset:
    """Environment-scale transitions (anything with obs/action/reward/next_obs/terminal arrays,
    e.g. `jaxrl.data.transitions.Transitions`) as a `Dataset` the compiled loop samples from.

    Raises a ValueError naming the field when shapes do not fit the environment, and when actions
    lie outside its action box (they would map outside (-1, 1), where tanh cannot reach).
    """
    space = envs.make(config.env_name).action_space
    obs_shape = envs.make(config.env_name).observation_space.shape
    action_dim = envs.action_dim(space)
    obs = jnp.asarray(transitions.obs, jnp.float32)
    action = jnp.asarray(transitions.action, jnp.float32).reshape(obs.shape[0], -1)
    if obs.shape[1:] != tuple(obs_shape):
        raise ValueError(
            f"dataset obs: shape {obs.shape[1:]} per row, but {config.env_name} observations "
            f"have shape {tuple(obs_shape)}; pass the dataset collected on this environment"
        )
    if action.shape[1] != action_dim:
        raise ValueError(
            f"dataset action: {action.shape[1]} dimensions per row, but {config.env_name} has "
            f"{action_dim}; pass the dataset collected on this environment"
        )
    low, high = sac.action_bounds(config.env_name)
    outside = jnp.logical_or(action < low - 1e-5, action > high + 1e-5).any(axis=1)
    if bool(outside.any()):
        row = int(jnp.argmax(outside))
        raise ValueError(
            f"dataset action: row {row} ({action[row].tolist()}) lies outside the action box "
            f"[{low.tolist()}, {high.tolist()}] of {config.env_name}; clip actions when collecting"
        )
    scaled = jnp.clip(sac.from_env_action(action, low, high), -1.0, 1.0)
    return Dataset(
        obs=obs,
        action=scaled,
        reward=jnp.asarray(transitions.reward, jnp.float32),
        next_obs=jnp.asarray(transitions.next_obs, jnp.float32),
        terminal=jnp.asarray(transitions.terminal, jnp.bool_),
    )


def init(config: Config, key: PRNGKey, hparams: sac.HParams | None = None) -> TrainState:
    """Fresh actor, critics (targets equal to them), temperatures and optimisers; update_step 0.

    `hparams` (default: the config's) supplies the optimisers' learning rates.
    """
    hp = config.hparams() if hparams is None else hparams
    actor, critic = sac.make_networks(config)
    key, actor_key, critic_key = jax.random.split(key, 3)
    probe = envs.make(config.env_name)
    obs = jnp.zeros((1, *probe.observation_space.shape), jnp.float32)
    action = jnp.zeros((1, envs.action_dim(probe.action_space)), jnp.float32)
    actor_params = actor.init(actor_key, obs)
    critic_params = critic.init(critic_key, obs, action)
    log_alpha = jnp.log(jnp.float32(config.init_alpha))
    log_cql_alpha = jnp.log(jnp.float32(max(config.cql_alpha, 1e-30)))
    return TrainState(
        actor_params=actor_params,
        critic_params=critic_params,
        target_critic_params=critic_params,
        log_alpha=log_alpha,
        actor_opt_state=optax.adam(hp.actor_lr).init(actor_params),
        critic_opt_state=optax.adam(hp.critic_lr).init(critic_params),
        alpha_opt_state=optax.adam(hp.alpha_lr).init(log_alpha),
        log_cql_alpha=log_cql_alpha,
        cql_alpha_opt_state=optax.adam(config.cql_alpha_lr).init(log_cql_alpha),
        key=key,
        update_step=jnp.zeros((), jnp.int32),
    )


# --------------------------------------------------------------------------------------------
# 2. The conservative penalty


def conservative_gap(
    q_uniform: jax.Array,
    q_current: jax.Array,
    q_next: jax.Array,
    log_prob_current: jax.Array,
    log_prob_next: jax.Array,
    q_data: jax.Array,
    action_dim: int,
    temperature: float = 1.0,
) -> jax.Array:
    """Per critic, E_s[ T log E_{a~mu}[exp(Q(s,a)/T) / mu(a|s)]-style soft maximum - Q(s, a_data) ].

    Q-values have shape [num_critics, batch, num_samples] (q_data: [num_critics, batch]). The
    log-sum-exp of Q over all actions is estimated by importance sampling from an equal mixture of
    three proposals: uniform on (-1, 1)^d (density 2^-d), pi(.|s) and pi(.|s'), each sample's Q
    corrected by its proposal's log-density. Subtracting log(3N) makes it an estimate of
    log-integral-exp Q rather than of N times it, so the gap is comparable with a target gap.
    Returns the gap per critic, shape [num_critics].
    """
    uniform_log_density = -action_dim * math.log(2.0)
    corrected = jnp.concatenate(
        [
            q_uniform - uniform_log_density,
            q_current - log_prob_current,
            q_next - log_prob_next,
        ],
        axis=-1,
    )
    num_samples = corrected.shape[-1]
    soft_max = temperature * (
        jax.nn.logsumexp(corrected / temperature, axis=-1) - math.log(num_samples)
    )
    return (soft_max - q_data).mean(axis=-1)


def make_penalty(
    config: Config, actor: Any, critic: Any
) -> Callable[[Params, dict[str, jax.Array], PRNGKey, TrainState], tuple[jax.Array, Metrics]]:
    """`penalty(critic_params, batch, key, state) -> (weight * sum over critics of the gap,
    metrics)`. With `lagrangian`, the weight's objective is alpha' * (gap - target_gap): the
    critics minimise it, the multiplier (updated separately) maximises it."""
    action_dim = envs.action_dim(envs.make(config.env_name).action_space)
    n = config.num_action_samples

    def policy_samples(actor_params, obs, key):
        """n actions of pi(.|obs) per row, shape [batch, n, d], and their log-probs [batch, n]."""
        dist = actor.apply(actor_params, obs)
        actions, log_probs = dist.sample_and_log_prob(seed=key, sample_shape=(n,))
        return jnp.swapaxes(actions, 0, 1), jnp.swapaxes(log_probs, 0, 1)

    def q_many(critic_params, obs, actions):
        """Q of each row's k actions ([batch, k, d]): [num_critics, batch, k]."""
        batch, k = actions.shape[:2]
        repeated_obs = jnp.repeat(obs, k, axis=0)
        q = critic.apply(critic_params, repeated_obs, actions.reshape(batch * k, -1))
        return q.reshape(q.shape[0], batch, k)

    def penalty(critic_params, batch, key, state):
        uniform_key, current_key, next_key = jax.random.split(key, 3)
        obs, batch_size = batch["obs"], batch["obs"].shape[0]
        uniform = jax.random.uniform(uniform_key, (batch_size, n, action_dim), minval=-1, maxval=1)
        current, log_prob_current = policy_samples(state.actor_params, obs, current_key)
        following, log_prob_next = policy_samples(state.actor_params, batch["next_obs"], next_key)
        # The policy's samples are constants here: this term trains the critics only.
        current, log_prob_current, following, log_prob_next = jax.lax.stop_gradient(
            (current, log_prob_current, following, log_prob_next)
        )
        # All 3n proposals of a state through the critics at once: one set of large matrix
        # products (forward and backward) rather than three.
        q_uniform, q_current, q_next = jnp.split(
            q_many(critic_params, obs, jnp.concatenate([uniform, current, following], axis=1)),
            3,
            axis=-1,
        )
        gap = conservative_gap(
            q_uniform=q_uniform,
            q_current=q_current,
            q_next=q_next,
            log_prob_current=log_prob_current,
            log_prob_next=log_prob_next,
            q_data=critic.apply(critic_params, obs, batch["action"]),
            action_dim=action_dim,
            temperature=config.cql_temperature,
        )
        weight = jnp.exp(state.log_cql_alpha)
        if config.lagrangian:
            weighted = weight * (gap - config.target_action_gap).sum()
        else:
            weighted = weight * gap.sum()
        return weighted, {"cql_gap": gap.mean(), "cql_alpha": weight}

    return penalty


# --------------------------------------------------------------------------------------------
# 3. One gradient step


def make_gradient_step(
    config: Config,
) -> Callable[[TrainState, dict[str, jax.Array], PRNGKey, sac.HParams], tuple[TrainState, Metrics]]:
    """`gradient_step(state, batch, key, hparams) -> (state, metrics)`: SAC's step with the
    conservative penalty in the critic loss, then (with `lagrangian`) a dual-ascent step of the
    penalty weight log(cql_alpha), clipped to [-10, 10]."""
    actor, critic = sac.make_networks(config)
    soft_step = sac.make_gradient_step(config, actor, critic, make_penalty(config, actor, critic))
    multiplier_optimizer = optax.adam(config.cql_alpha_lr)

    def gradient_step(state, batch, key, hp):
        new_state, metrics = soft_step(state, batch, key, hp)
        if config.lagrangian:
            # Dual ascent: raise alpha' while the gap exceeds its target, lower it below. The gap
            # is the one the critics saw before their step (a constant for the multiplier).
            gap = jax.lax.stop_gradient(metrics["cql_gap"])
            grad = -(gap - config.target_action_gap)
            update, opt_state = multiplier_optimizer.update(grad, state.cql_alpha_opt_state)
            log_cql_alpha = jnp.clip(state.log_cql_alpha + update, -10.0, 10.0)
            new_state = new_state.replace(
                log_cql_alpha=log_cql_alpha, cql_alpha_opt_state=opt_state
            )
        return new_state, metrics

    return gradient_step


# --------------------------------------------------------------------------------------------
# 4. Training chunks with evaluation in the environment


def normalized_score(episode_return: Any, random_return: float, expert_return: float) -> Any:
    """D4RL's normalized score: 0 is the random policy, 100 the expert."""
    return 100.0 * (episode_return - random_return) / (expert_return - random_return)


def make_update(
    config: Config,
) -> Callable[[TrainState, sac.HParams, Dataset], tuple[TrainState, Metrics]]:
    """`update(state, hparams, data) -> (state, metrics)`: one gradient step of one run on a
    batch drawn uniformly, with replacement, from `data`; `metrics` are scalars."""
    gradient_step = make_gradient_step(config)

    def update(state: TrainState, hp: sac.HParams, data: Dataset) -> tuple[TrainState, Metrics]:
        key, sample_key, step_key = jax.random.split(state.key, 3)
        rows = jax.random.randint(sample_key, (config.batch_size,), 0, data.size)
        batch = {
            "obs": data.obs[rows],
            "action": data.action[rows],
            "reward": data.reward[rows],
            "next_obs": data.next_obs[rows],
            "terminated": data.terminal[rows],
        }
        state, metrics = gradient_step(state.replace(key=key), batch, step_key, hp)
        return state.replace(update_step=state.update_step + 1), metrics

    return update


def make_train_chunk(
    config: Config,
    num_updates: int,
    callback: Callable[[jax.Array, Metrics], None] | None = None,
    callback_every: int = 1,
    evaluate: bool = True,
) -> Callable[[TrainState, sac.HParams, Dataset, PRNGKey], tuple[TrainState, Metrics]]:
    """`chunk(states, hparams, data, eval_keys) -> (states, metrics)` for a batch of runs (leading
    run axis on states, hparams and eval_keys; the dataset is shared).

    `num_updates` gradient steps, with `callback(update_step, block-mean metrics)` every
    `callback_every` steps, then (if `evaluate`) `metrics["eval_return"]`: each run's mean return
    over `eval_episodes` episodes of its deterministic policy in the environment.
    """
    if num_updates % callback_every:
        raise ValueError(
            f"num_updates ({num_updates}) must be a multiple of callback_every ({callback_every})"
        )
    batched_update = jax.vmap(make_update(config), in_axes=(0, 0, None))
    batched_evaluate = jax.vmap(sac.make_evaluate(config))

    def block(states, hparams, data):
        states, metrics = jax.lax.scan(
            lambda s, _: batched_update(s, hparams, data), states, None, length=callback_every
        )
        metrics = jax.tree.map(lambda m: m.mean(axis=0), metrics)
        if callback is not None:
            jax.debug.callback(callback, states.update_step[0], metrics)
        return states, metrics

    def chunk(
        states: TrainState, hparams: sac.HParams, data: Dataset, eval_keys: PRNGKey
    ) -> tuple[TrainState, Metrics]:
        states, metrics = jax.lax.scan(
            lambda s, _: block(s, hparams, data),
            states,
            None,
            length=num_updates // callback_every,
        )
        metrics = jax.tree.map(lambda m: m[-1], metrics)  # the chunk's last block
        if evaluate:
            metrics["eval_return"] = batched_evaluate(states, eval_keys).mean(axis=-1)
        return states, metrics

    return chunk
