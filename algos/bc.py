"""Behaviour cloning: the baseline every offline RL method must beat on the same data.

    data = cql.device_dataset(load_transitions(path), config)        # same dataset type as CQL
    states, metrics = jax.jit(bc.make_train_chunk(config, 5_000))(states, data, eval_keys)

The actor is SAC's tanh-squashed Gaussian; its deterministic action tanh(mean) is regressed onto
the dataset's (-1, 1) actions by mean squared error. Regression rather than maximum likelihood:
the tanh-Gaussian's log-density diverges at the box edges where bang-bang data piles up, while
the squared error stays bounded. Evaluation is CQL's: the deterministic policy in the environment.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax
import jax.numpy as jnp
import optax
from flax import struct

import envs
from algos import cql, sac
from jaxrl.config import ConfigError, require, require_positive
from jaxrl.nets import ACTIVATIONS
from jaxrl.types import Metrics, Params, PRNGKey


@dataclasses.dataclass(frozen=True)
class Config:
    """Behaviour-cloning settings."""

    env_name: str = "Pendulum-v1"  # evaluation environment; also fixes the action bounds
    num_updates: int = 5_000  # gradient steps per seed
    batch_size: int = 256  # transitions drawn uniformly from the dataset per gradient step
    learning_rate: float = 1e-3  # Adam's
    hidden_sizes: tuple[int, ...] = (256, 256)  # of the actor's MLP
    activation: str = "relu"  # a key of jaxrl.nets.ACTIVATIONS
    eval_episodes: int = 10  # episodes of the deterministic policy per evaluation

    def __post_init__(self) -> None:
        object.__setattr__(self, "hidden_sizes", tuple(self.hidden_sizes))
        require_positive(self, "num_updates", "batch_size", "learning_rate", "eval_episodes")
        require(
            self.activation in ACTIVATIONS,
            "activation",
            f"unknown activation {self.activation!r}",
            f"choose one of {sorted(ACTIVATIONS)}",
        )
        try:
            envs.make(self.env_name)
        except ValueError as error:
            raise ConfigError(f"env_name: {error}") from None


@struct.dataclass
class TrainState:
    """One run's actor parameters, Adam state, PRNG key and gradient steps taken."""

    actor_params: Params
    opt_state: optax.OptState
    key: PRNGKey
    update_step: jax.Array


def bc_loss(predicted_action: jax.Array, data_action: jax.Array) -> jax.Array:
    """Mean over the batch of the squared distance between policy and dataset actions."""
    return jnp.square(predicted_action - data_action).sum(axis=-1).mean()


def init(config: Config, key: PRNGKey) -> TrainState:
    """A fresh actor (SAC's) and optimiser; update_step 0."""
    actor = sac.make_actor(config)
    key, actor_key = jax.random.split(key)
    obs = jnp.zeros((1, *envs.make(config.env_name).observation_space.shape), jnp.float32)
    params = actor.init(actor_key, obs)
    return TrainState(
        params, optax.adam(config.learning_rate).init(params), key, jnp.zeros((), jnp.int32)
    )


def make_update(config: Config) -> Callable[[TrainState, cql.Dataset], tuple[TrainState, Metrics]]:
    """`update(state, data) -> (state, {"bc_loss": scalar})`: one Adam step of one run on a batch
    drawn uniformly, with replacement, from `data`."""
    actor = sac.make_actor(config)
    optimizer = optax.adam(config.learning_rate)

    def loss_fn(params, obs, action):
        return bc_loss(sac.deterministic_action(actor.apply(params, obs)), action)

    def update(state: TrainState, data: cql.Dataset) -> tuple[TrainState, Metrics]:
        key, sample_key = jax.random.split(state.key)
        rows = jax.random.randint(sample_key, (config.batch_size,), 0, data.size)
        loss, grads = jax.value_and_grad(loss_fn)(
            state.actor_params, data.obs[rows], data.action[rows]
        )
        updates, opt_state = optimizer.update(grads, state.opt_state)
        params = optax.apply_updates(state.actor_params, updates)
        return TrainState(params, opt_state, key, state.update_step + 1), {"bc_loss": loss}

    return update


def make_train_chunk(
    config: Config, num_updates: int
) -> Callable[[TrainState, cql.Dataset, PRNGKey], tuple[TrainState, Metrics]]:
    """`chunk(states, data, eval_keys) -> (states, metrics)` over a batch of runs: `num_updates`
    steps, then `metrics["eval_return"]` per run (deterministic policy, `eval_episodes`)."""
    batched_update = jax.vmap(make_update(config), in_axes=(0, None))
    evaluate = jax.vmap(sac.make_evaluate(config))

    def chunk(states: TrainState, data: cql.Dataset, eval_keys: PRNGKey):
        states, metrics = jax.lax.scan(
            lambda s, _: batched_update(s, data), states, None, length=num_updates
        )
        metrics = {"bc_loss": metrics["bc_loss"][-1]}
        metrics["eval_return"] = evaluate(states, eval_keys).mean(axis=-1)
        return states, metrics

    return chunk
