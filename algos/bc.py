"""Behaviour cloning: the baseline every offline RL method must beat on the same data.

    data = cql.device_dataset(load_transitions(path), cql_config)     # CQL's data, (-1, 1) actions
    train = jax.jit(loop.make_train(bc.make(config), config.num_steps))
    state, metrics = train(key, hparams(config), data)

The actor is SAC's (`sac.Actor`, a tanh-squashed Gaussian); its deterministic action tanh(mean) is
regressed onto the dataset's (-1, 1) actions by mean squared error. Regression rather than maximum
likelihood: the tanh-Gaussian's log-density diverges at the box edges where bang-bang data piles
up, while the squared error stays bounded. Evaluation is the actor's: the deterministic policy in
the environment, as for CQL.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import optax
from flax import struct

import envs
from algos import sac
from jaxrl import replay
from jaxrl.config import ConfigError, require, require_positive
from jaxrl.hparams import HParams, static, swept
from jaxrl.loop import Algorithm, zeros_step
from jaxrl.nets import ACTIVATIONS
from jaxrl.types import Metrics, Params, PRNGKey, Transition


@dataclasses.dataclass(frozen=True)
class Config:
    """Behaviour-cloning settings. `learning_rate` may differ between the runs of one program."""

    env_name: str = "Pendulum-v1"  # evaluation environment; also fixes the action bounds
    num_steps: int = 5_000  # gradient steps per seed
    batch_size: int = 256  # transitions drawn uniformly from the dataset per gradient step
    learning_rate: float = swept(1e-3)  # Adam's
    hidden_sizes: tuple[int, ...] = (256, 256)  # of the actor's MLP
    activation: str = "relu"  # a key of jaxrl.nets.ACTIVATIONS
    eval_episodes: int = 10  # episodes of the deterministic policy per evaluation

    def __post_init__(self) -> None:
        object.__setattr__(self, "hidden_sizes", tuple(self.hidden_sizes))
        require_positive(self, "num_steps", "batch_size", "learning_rate", "eval_episodes")
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
        envs.require_jax_env(self.env_name, "behaviour cloning")


@struct.dataclass
class TrainState:
    """One run's actor parameters, Adam state, PRNG key and gradient steps taken."""

    params: Params  # of the `sac.Actor`
    opt_state: optax.OptState
    key: PRNGKey
    step: jax.Array


def bc_loss(predicted_action: jax.Array, data_action: jax.Array) -> jax.Array:
    """Mean over the batch of the squared distance between policy and dataset actions."""
    return jnp.square(predicted_action - data_action).sum(axis=-1).mean()


def make(config: Config) -> Algorithm:
    """Behaviour cloning as pure functions of one run: `init(key, hparams)`, `update(state, data,
    hparams)` (one Adam step on a batch drawn uniformly, with replacement, from the
    `cql.device_dataset`; metrics `{"bc_loss"}`) and `evaluate(state, key)`
    (`eval_return[eval_episodes]` of the deterministic policy)."""
    config = static(config)
    actor = sac.make_actor(config.env_name, config.hidden_sizes, config.activation)

    def init(key: PRNGKey, hp: HParams) -> TrainState:
        key, actor_key = jax.random.split(key)
        params = actor.init(actor_key)
        return TrainState(params, optax.adam(hp.learning_rate).init(params), key, zeros_step())

    def loss_fn(params, batch):
        return bc_loss(sac.deterministic_action(actor.dist(params, batch.obs)), batch.action)

    def update(state: TrainState, data: Transition, hp: HParams) -> tuple[TrainState, Metrics]:
        key, sample_key = jax.random.split(state.key)
        batch = replay.sample_uniform(data, sample_key, config.batch_size)
        loss, grads = jax.value_and_grad(loss_fn)(state.params, batch)
        updates, opt_state = optax.adam(hp.learning_rate).update(grads, state.opt_state)
        params = optax.apply_updates(state.params, updates)
        return TrainState(params, opt_state, key, state.step + 1), {"bc_loss": loss}

    def evaluate(state: TrainState, key: PRNGKey) -> Metrics:
        return {"eval_return": actor.evaluate(state.params, key, config.eval_episodes)}

    return Algorithm(init, update, evaluate)
