"""Reward models: a scalar head on the transformer, trained on preference pairs.

The reward of a sequence (prompt and answer) is a linear function of the transformer's final
hidden state at its last real token, r(x, y) = w . h_last + b, the head InstructGPT (Ouyang et al.,
2022) and TRL's reward trainer put on a pretrained or SFT model. Training maximises the
Bradley-Terry likelihood that the chosen answer beats the rejected one,

    loss = -log sigmoid(r(x, y_w) - r(x, y_l) - m),

with m an optional per-pair margin (Llama 2, Touvron et al., 2023: larger for pairs the labellers
were surer of; 0 by default). The data are the DPO data: the same pairs, the same arrays
(`jaxrl.data.preferences.tokenize_preferences`). This file reads top to bottom:

1. `Config`: the shared optimisation settings and the reward-centering coefficient.
2. `bradley_terry_loss`: the loss as a pure function of the two rewards.
3. `init_params` and `sequence_rewards`: the head on the transformer and a sequence's reward.
4. `make_loss` / `make`: the loss over a batch of pairs, and the learner contract's `init` and
   `update`.
5. `evaluate_pairs`: held-out pair accuracy (the chosen answer gets the higher reward).
6. `ensemble_reward`: K reward models' rewards combined for RL. An ensemble is K states updated
   by `jax.vmap(algorithm.update)`: one program, each member with its own head and data order.

    params = reward_model.init_params(lm_params, model, key)
    algorithm = reward_model.make(config, model, params)
    state = algorithm.init(key, hparams)
    state, metrics = algorithm.update(state, batch, hparams)  # batch: [accum, micro_batch, ...]
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl.config import require
from jaxrl.hparams import HParams, static, swept
from jaxrl.lm import training
from jaxrl.lm.model import ModelConfig, Transformer
from jaxrl.loop import Algorithm

Array = jax.Array


# --- 1. configuration --------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Config(training.TrainConfig):
    """Reward-model settings: `TrainConfig`'s optimisation, a reward-model learning rate, and
    the optional pull of rewards towards zero."""

    learning_rate: float = swept(1e-5)
    # Adds coef * mean((r_w + r_l)^2) to the loss (Eisenstein et al., 2023; TRL's
    # center_rewards_coefficient): the Bradley-Terry loss sees only differences, so without it
    # the rewards' level drifts freely, and an RL step that adds them to a KL penalty needs it
    # fixed. 0 disables it.
    center_rewards_coefficient: float = swept(0.0)

    def __post_init__(self) -> None:
        super().__post_init__()
        require(
            self.center_rewards_coefficient >= 0,
            "center_rewards_coefficient",
            f"got {self.center_rewards_coefficient}",
            "use a coefficient >= 0 (0.01 is common; 0 disables it)",
        )
        require(
            self.lora_rank == 0,
            "lora_rank",
            "a reward model trains every parameter and its head here",
            "set lora_rank=0",
        )


# --- 2. the loss -------------------------------------------------------------------------------


def bradley_terry_loss(chosen_reward: Array, rejected_reward: Array, margin: Array | float = 0.0):
    """Per-pair -log sigmoid(r_w - r_l - margin); the inputs are [B] (the margin may be a
    scalar)."""
    return -jax.nn.log_sigmoid(chosen_reward - rejected_reward - margin)


# --- 3. the reward head ------------------------------------------------------------------------


def init_params(lm_params: Any, model: ModelConfig, key: Array) -> dict[str, Any]:
    """A reward model starting from a language model's parameters (pretrained or SFT): the
    transformer as `backbone` and a new scalar head. The head's weights are drawn with standard
    deviation 1 / sqrt(hidden_size + 1), as OpenAI's lm-human-preferences initialised its reward
    head, so the initial rewards are of order one; the bias starts at 0. An untied LM head is
    left out: the reward never reads it, and AdamW would keep moments for it."""
    std = 1.0 / np.sqrt(model.hidden_size + 1)
    return {
        "backbone": {name: value for name, value in lm_params.items() if name != "lm_head"},
        "score_kernel": std * jax.random.normal(key, (model.hidden_size,), jnp.float32),
        "score_bias": jnp.zeros((), jnp.float32),
    }


def sequence_rewards(
    model: Transformer, params: dict[str, Any], tokens: Array, attention_mask: Array
) -> Array:
    """The reward of each sequence [B, L]: the head on the final hidden state at its last real
    token (only that position goes through the final norm), [B] fp32. Padding may be on either
    side or both (a left-padded prompt followed by a right-padded completion)."""
    length = attention_mask.shape[-1]
    last = length - 1 - jnp.argmax(jnp.flip(attention_mask.astype(bool), axis=-1), axis=-1)
    hidden, _ = model.apply(
        {"params": params["backbone"]},
        tokens,
        None,
        attention_mask,
        logit_positions=last[:, None],
        hidden_only=True,
    )
    hidden = hidden[:, 0].astype(jnp.float32)
    return hidden @ params["score_kernel"] + params["score_bias"]


def score_pairs(model: Transformer, params: dict[str, Any], batch: dict[str, Array]):
    """(chosen rewards [B], rejected rewards [B]) from ONE forward pass over the two sets of
    sequences stacked along the batch axis."""
    stack = lambda name: jnp.concatenate([batch[f"chosen_{name}"], batch[f"rejected_{name}"]])  # noqa: E731
    rewards = sequence_rewards(model, params, stack("tokens"), stack("attention_mask"))
    chosen, rejected = jnp.split(rewards, 2)
    return chosen, rejected


# --- 4. training -------------------------------------------------------------------------------


def make_loss(model: Transformer, config: Config) -> Callable[..., tuple[Array, dict]]:
    """`loss_fn(params, batch, hp) -> (mean loss over pairs, metrics)`. A batch holds the pair
    arrays of `tokenize_preferences` (chosen_/rejected_ tokens and attention_mask) and, if the
    data give one, a per-pair `margin` [B]."""
    del config  # the coefficients are read from `hp`, so a sweep can vary them

    def loss_fn(params: dict[str, Any], batch: dict[str, Array], hp: HParams):
        chosen, rejected = score_pairs(model, params, batch)
        losses = bradley_terry_loss(chosen, rejected, batch.get("margin", 0.0))
        centering = jnp.mean((chosen + rejected) ** 2)
        metrics = {
            "pair_accuracy": jnp.mean(chosen > rejected),
            "reward_margin": jnp.mean(chosen - rejected),
            "mean_reward": jnp.mean((chosen + rejected) / 2),
        }
        return jnp.mean(losses) + hp.center_rewards_coefficient * centering, metrics

    return loss_fn


def make(config: Config, model: ModelConfig, params: dict[str, Any], mesh: Any = None) -> Algorithm:
    """Reward-model training as pure functions of one run, starting from `params`
    (`init_params`, placed on `mesh` if given): `init(key, hparams)` and `update(state, batch,
    hparams)`, one optimizer step on a batch of pairs shaped [grad_accum_steps, micro_batch,
    ...]."""
    loss_fn = make_loss(Transformer(model, mesh=mesh), config)
    config = static(config)

    def update(state: training.TrainState, batch: dict[str, Array], hp: HParams):
        state, metrics = training.train_step(
            lambda p, micro_batch: loss_fn(p, micro_batch, hp), state, batch, hp, config
        )
        return state._replace(step=state.step + 1), metrics

    return Algorithm(training.make_init(params, config, mesh), update)


# --- 5. evaluation -----------------------------------------------------------------------------


def make_score(model_config: ModelConfig, mesh: Any = None) -> Callable[..., dict[str, Array]]:
    """score(params, batch) -> {"chosen": rewards, "rejected": rewards} (jit it)."""
    model = Transformer(model_config, mesh=mesh)

    def score(params: Any, batch: dict[str, Array]) -> dict[str, Array]:
        chosen, rejected = score_pairs(model, params, batch)
        return {"chosen": chosen, "rejected": rejected}

    return score


def evaluate_pairs(
    score: Callable,
    params: Any,
    arrays: dict[str, np.ndarray],
    batch_size: int,
    place: Callable | None = None,
) -> dict[str, float]:
    """Held-out pair accuracy (the chosen answer's reward above the rejected one's) and the mean
    Bradley-Terry loss, over every pair of `arrays` (`training.score_pairs_in_batches`)."""
    rewards = training.score_pairs_in_batches(score, params, arrays, batch_size, place)
    chosen_all, rejected_all = rewards["chosen"], rewards["rejected"]
    margin = arrays.get("margin", 0.0)
    losses = bradley_terry_loss(jnp.asarray(chosen_all), jnp.asarray(rejected_all), margin)
    return {
        "eval_pair_accuracy": float(np.mean(chosen_all > rejected_all)),
        "eval_loss": float(jnp.mean(losses)),
    }


# --- 6. ensembles ------------------------------------------------------------------------------

ENSEMBLE_RULES = ("mean", "mean_minus_std", "min")


def ensemble_reward(rewards: Array, rule: str = "mean", std_coefficient: float = 1.0) -> Array:
    """Combine an ensemble's rewards [K, B] into one reward per sequence [B]: their "mean";
    "mean_minus_std", mean - std_coefficient * std over the members (uncertainty-weighted
    optimisation, Coste et al., 2024: the policy is not paid for what the members disagree on);
    or their "min" (worst-case optimisation, the same paper). Both guard RL against exploiting
    one proxy's errors (over-optimisation, Gao et al., 2022)."""
    require(rule in ENSEMBLE_RULES, "rule", f"got {rule!r}", f"use one of {ENSEMBLE_RULES}")
    if rule == "mean":
        return rewards.mean(axis=0)
    if rule == "min":
        return rewards.min(axis=0)
    return rewards.mean(axis=0) - std_coefficient * rewards.std(axis=0)
