"""Supervised fine-tuning: maximise the log-likelihood of the completion tokens given the prompt.

DPO and GRPO start from such a model. The loss is the mean negative log-likelihood over the tokens
in `loss_mask` (the completion and its EOS; prompt tokens are context, not targets), so a batch of
short answers weighs as much per token as a batch of long ones.

    algorithm = sft.make(config, model, params)
    state = algorithm.init(key, hparams)
    state, metrics = algorithm.update(state, batch, hparams)   # batch: [accum, micro_batch, L]
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from jaxrl.hparams import HParams, static, swept
from jaxrl.lm import training
from jaxrl.lm.model import ModelConfig, Transformer, token_log_probs
from jaxrl.loop import Algorithm

Array = jax.Array


@dataclasses.dataclass(frozen=True)
class Config(training.TrainConfig):
    """SFT settings: `TrainConfig`'s optimisation settings with a higher default learning rate."""

    learning_rate: float = swept(1e-3)


def make_loss(model: Transformer) -> training.LossFn:
    """`loss_fn(params, batch) -> (loss, metrics)`: mean NLL of the `loss_mask` tokens.

    `batch` holds tokens, attention_mask and loss_mask, each [B, L]; `metrics["token_accuracy"]` is
    the greedy next-token accuracy on those tokens.
    """

    def loss_fn(params: Any, batch: dict[str, Array]):
        logits, _ = model.apply({"params": params}, batch["tokens"], None, batch["attention_mask"])
        mask = batch["loss_mask"].astype(jnp.float32)
        log_probs = token_log_probs(logits, batch["tokens"])
        num_targets = jnp.maximum(mask.sum(), 1.0)
        # Greedy next-token accuracy on the targets: logits[t - 1] predicts tokens[t].
        predicted = jnp.pad(jnp.argmax(logits[:, :-1], axis=-1), ((0, 0), (1, 0)))
        correct = (predicted == batch["tokens"]) * mask
        metrics = {"token_accuracy": correct.sum() / num_targets}
        return -(log_probs * mask).sum() / num_targets, metrics

    return loss_fn


def make(config: Config, model: ModelConfig, params: Any, mesh: Any = None) -> Algorithm:
    """SFT as pure functions of one run, starting from `params` (placed on `mesh`, if given):
    `init(key, hparams)` and `update(state, batch, hparams)`, one optimizer step on a batch
    shaped [grad_accum_steps, micro_batch, L]. (Evaluation decodes text: see experiments/sft.py.)
    With config.lora_rank > 0 only LoRA adapters train; the state's `params` are then the merged
    parameters.
    """
    config = static(config)
    loss_fn = make_loss(Transformer(model, mesh=mesh))

    def update(state: training.TrainState, batch: dict[str, Array], hp: HParams):
        state, metrics = training.train_step(loss_fn, state, batch, hp, config)
        return state._replace(step=state.step + 1), metrics

    return Algorithm(training.make_init(params, config, mesh, model), update)
