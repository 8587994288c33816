"""Supervised fine-tuning: maximise the log-likelihood of the completion tokens given the prompt.

DPO and GRPO start from such a model. The loss is the mean negative log-likelihood over the tokens
in `loss_mask` (the completion and its EOS; prompt tokens are context, not targets), so a batch of
short answers weighs as much per token as a batch of long ones.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from jaxrl.lm import training
from jaxrl.lm.model import ModelConfig, Transformer, token_log_probs

Array = jax.Array


@dataclasses.dataclass(frozen=True)
class Config(training.TrainConfig):
    """SFT settings: `TrainConfig`'s optimisation settings with a higher default learning rate."""

    learning_rate: float = 1e-3


def make_loss(model: Transformer) -> training.LossFn:
    """`loss_fn(params, batch, _unused=None) -> (loss, metrics)`: mean NLL of `loss_mask` tokens.

    `batch` holds tokens, attention_mask and loss_mask, each [B, L]; `metrics["token_accuracy"]` is
    the greedy next-token accuracy on those tokens.
    """

    def loss_fn(params: Any, batch: dict[str, Array], _unused: Any = None):
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


def make_train_chunk(
    model_config: ModelConfig,
    config: Config,
    mesh: Any = None,
    callback: Callable[[Any, dict[str, Any]], None] | None = None,
) -> Callable[..., tuple[training.TrainState, dict[str, Array]]]:
    """chunk(state, batches) -> (state, metrics per step); batches stacked
    [K, grad_accum_steps, micro_batch, L]. Jit it (see experiments/sft.py)."""
    model = Transformer(model_config, mesh=mesh)
    return training.make_train_chunk(make_loss(model), config.optimizer(), callback)
