"""Conservative Q-Learning (Kumar et al., 2020), CQL(H) on top of SAC, from a fixed dataset.

    data = cql.device_dataset(load_transitions(path), config)          # (-1, 1) actions, on device
    algorithm = cql.make(config)
    chunk = jax.jit(loop.make_chunk(algorithm.update, 1_000))
    states, metrics = chunk(states, data, hparams)                       # a batch of seeds at once

Offline, the critic's errors on actions the dataset never shows are never corrected by experience,
and the actor climbs exactly those errors. CQL adds to SAC's critic loss a term that pushes Q down
on actions from a broad proposal and up on the dataset's actions, so that the learned Q lower-bounds
the policy's value off the data. Read top to bottom:
  1. Config (SAC's learner, `sac.LearnerConfig`, plus the conservative settings), the dataset;
  2. the conservative penalty: an importance-sampled log-sum-exp of Q over uniform, current-policy
     and next-policy actions, minus Q of the dataset action, checked against NumPy in tests;
  3. the algorithm (`make`): each update is SAC's gradient step with the penalty in the critic
     loss, on a batch drawn from the on-device dataset, then (Lagrangian variant) a dual step of
     the penalty's weight; evaluation is the deterministic policy in the JAX environment.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import jax
import jax.numpy as jnp
import optax
from flax import struct

import envs
from algos import sac
from jaxrl import replay
from jaxrl.config import require, require_positive
from jaxrl.hparams import HParams, static, swept
from jaxrl.loop import Algorithm, zeros_step
from jaxrl.types import Metrics, Params, PRNGKey, Transition

# --------------------------------------------------------------------------------------------
# 1. Configuration, state and dataset


@dataclasses.dataclass(frozen=True)
class Config(sac.LearnerConfig):
    """CQL settings: SAC's learner (`sac.LearnerConfig`) plus the conservative term. Defaults
    follow Kumar et al.'s continuous-control settings (fixed weight 5, 10 sampled actions per
    proposal). Fields marked `swept` may differ between the runs of one program."""

    # Kumar et al.'s learning rates: the policy learns slower than the critics, and than online.
    actor_lr: float = swept(1e-4)
    critic_lr: float = swept(3e-4)
    alpha_lr: float = swept(1e-4)
    num_steps: int = 20_000  # gradient steps per seed
    cql_alpha: float = swept(5.0)  # weight of the penalty (the multiplier's start: `lagrangian`)
    num_action_samples: int = 10  # per proposal (uniform, pi(.|s), pi(.|s')) and state
    cql_temperature: float = swept(1.0)  # log-sum-exp temperature
    lagrangian: bool = False  # tune the weight so the action gap stays at target_action_gap
    target_action_gap: float = swept(10.0)  # the gap the Lagrangian variant holds the critics to
    cql_alpha_lr: float = swept(3e-4)  # learning rate of log(cql_alpha) with `lagrangian`
    eval_episodes: int = 10  # episodes of the deterministic policy per evaluation

    def __post_init__(self) -> None:
        super().__post_init__()
        require_positive(
            self,
            "num_steps",
            "num_action_samples",
            "cql_temperature",
            "cql_alpha_lr",
            "eval_episodes",
        )
        require(
            self.cql_alpha >= 0,
            "cql_alpha",
            f"must be >= 0, got {self.cql_alpha}",
            "set cql_alpha >= 0 (0 is plain offline SAC)",
        )
        require(
            not self.lagrangian or self.cql_alpha > 0,
            "cql_alpha",
            "the Lagrangian variant starts its multiplier at cql_alpha, which must be > 0",
            "set cql_alpha > 0, e.g. 1.0",
        )


@struct.dataclass
class TrainState:
    """SAC's learner state, the penalty's multiplier (Lagrangian variant), PRNG key and step."""

    learner: sac.LearnerState
    log_cql_alpha: jax.Array  # the multiplier, learned only with `lagrangian`
    cql_alpha_opt_state: optax.OptState
    key: PRNGKey
    step: jax.Array  # gradient steps done


def device_dataset(transitions: Transition, config: Config) -> Transition:
    """Environment-scale transitions (e.g. `jaxrl.data.load_transitions(path)`) on device with
    actions scaled to (-1, 1): what `update` draws its batches from. `terminated` is True only for
    absorbing states; a time-limit end is an ordinary transition whose next observation
    bootstraps.

    Raises a ValueError naming the field when shapes do not fit the environment, and when actions
    lie outside its action box (they would map outside (-1, 1), where tanh cannot reach).
    """
    probe = envs.make(config.env_name)
    obs_shape = tuple(probe.observation_space.shape)
    action_dim = envs.action_dim(probe.action_space)
    obs = jnp.asarray(transitions.obs, jnp.float32)
    action = jnp.asarray(transitions.action, jnp.float32).reshape(obs.shape[0], -1)
    if obs.shape[1:] != obs_shape:
        raise ValueError(
            f"dataset obs: shape {obs.shape[1:]} per row, but {config.env_name} observations "
            f"have shape {obs_shape}; pass the dataset collected on this environment"
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
    return Transition(
        obs=obs,
        action=jnp.clip(sac.from_env_action(action, low, high), -1.0, 1.0),
        reward=jnp.asarray(transitions.reward, jnp.float32),
        next_obs=jnp.asarray(transitions.next_obs, jnp.float32),
        terminated=jnp.asarray(transitions.terminated, jnp.bool_),
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
    temperature: float | jax.Array = 1.0,
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
    config: Config, learner: sac.Learner
) -> Callable[[Params, Params, Transition, PRNGKey, jax.Array, HParams], tuple[jax.Array, Metrics]]:
    """`penalty(critic_params, actor_params, batch, key, weight, hparams) -> (loss, metrics)`:
    weight * the sum over critics of the gap. With `lagrangian` the loss is weight * (gap -
    target_action_gap): the critics minimise it, the multiplier (updated separately) maximises
    it."""
    config = static(config)
    actor, critic = learner.actor, learner.critic
    n = config.num_action_samples

    def policy_samples(actor_params, obs, key):
        """n actions of pi(.|obs) per row, shape [batch, n, d], and their log-probs [batch, n]."""
        actions, log_probs = actor.dist(actor_params, obs).sample_and_log_prob(
            seed=key, sample_shape=(n,)
        )
        return jnp.swapaxes(actions, 0, 1), jnp.swapaxes(log_probs, 0, 1)

    def q_many(critic_params, obs, actions):
        """Q of each row's k actions ([batch, k, d]): [num_critics, batch, k]."""
        batch, k = actions.shape[:2]
        repeated_obs = jnp.repeat(obs, k, axis=0)
        q = critic.apply(critic_params, repeated_obs, actions.reshape(batch * k, -1))
        return q.reshape(q.shape[0], batch, k)

    def penalty(critic_params, actor_params, batch, key, weight, hp):
        uniform_key, current_key, next_key = jax.random.split(key, 3)
        obs = batch.obs
        shape = (obs.shape[0], n, actor.action_dim)
        uniform = jax.random.uniform(uniform_key, shape, minval=-1, maxval=1)
        current, log_prob_current = policy_samples(actor_params, obs, current_key)
        following, log_prob_next = policy_samples(actor_params, batch.next_obs, next_key)
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
            q_data=critic.apply(critic_params, obs, batch.action),
            action_dim=actor.action_dim,
            temperature=hp.cql_temperature,
        )
        held_to = hp.target_action_gap if config.lagrangian else 0.0
        return weight * (gap - held_to).sum(), {"cql_gap": gap.mean(), "cql_alpha": weight}

    return penalty


# --------------------------------------------------------------------------------------------
# 3. The algorithm


def make(config: Config) -> Algorithm:
    """CQL as pure functions of one run: `init(key, hparams)`, `update(state, data, hparams)` (one
    gradient step on a batch drawn uniformly, with replacement, from the `device_dataset`) and
    `evaluate(state, key)` (`eval_return[eval_episodes]` of the deterministic policy)."""
    learner = sac.make_learner(config)
    penalty = make_penalty(config, learner)
    config = static(config)

    def init(key: PRNGKey, hp: HParams) -> TrainState:
        key, actor_key, critic_key = jax.random.split(key, 3)
        # Without `lagrangian` the weight is hp.cql_alpha itself (possibly 0) and this is unused.
        log_cql_alpha = jnp.log(jnp.maximum(hp.cql_alpha, 1e-30))
        return TrainState(
            learner=learner.init(actor_key, critic_key, hp),
            log_cql_alpha=log_cql_alpha,
            cql_alpha_opt_state=optax.adam(hp.cql_alpha_lr).init(log_cql_alpha),
            key=key,
            step=zeros_step(),
        )

    def update(state: TrainState, data: Transition, hp: HParams) -> tuple[TrainState, Metrics]:
        key, sample_key, step_key = jax.random.split(state.key, 3)
        batch = replay.sample_uniform(data, sample_key, config.batch_size)
        weight = jnp.exp(state.log_cql_alpha) if config.lagrangian else hp.cql_alpha
        actor_params = state.learner.actor_params

        def critic_penalty(critic_params, key):
            return penalty(critic_params, actor_params, batch, key, weight, hp)

        learner_state, metrics = learner.gradient_step(
            state.learner, batch, step_key, hp, critic_penalty
        )
        log_cql_alpha, opt_state = state.log_cql_alpha, state.cql_alpha_opt_state
        if config.lagrangian:
            # Dual ascent: raise the weight while the gap exceeds its target, lower it below. The
            # gap is the one the critics saw before their step (a constant for the multiplier).
            grad = -(jax.lax.stop_gradient(metrics["cql_gap"]) - hp.target_action_gap)
            step, opt_state = optax.adam(hp.cql_alpha_lr).update(grad, opt_state)
            log_cql_alpha = jnp.clip(log_cql_alpha + step, -10.0, 10.0)
        new_state = TrainState(learner_state, log_cql_alpha, opt_state, key, state.step + 1)
        return new_state, metrics

    def evaluate(state: TrainState, key: PRNGKey) -> Metrics:
        returns = learner.actor.evaluate(state.learner.actor_params, key, config.eval_episodes)
        return {"eval_return": returns}

    return Algorithm(init, update, evaluate)
