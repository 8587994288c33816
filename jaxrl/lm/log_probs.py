"""Token log-probs of sampled completions under a model, their entropies, and the gap between
the sampler's log-prob of a token and the trainer's: what every algorithm that trains on its own
samples (GRPO and its relatives, multi-turn GRPO, PPO, online DPO) computes the same way.

A completion batch holds `tokens` and `attention_mask` [B, prompt + N] and `completion_mask`
[B, N]: the prompt, left-padded, then the N sampled tokens. Log-probs are taken at the sampling
temperature, so that the trained policy is the one that sampled.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from jaxrl.lm.model import Transformer, head_log_probs

Array = jax.Array


def completion_log_probs(
    model: Transformer, params: Any, batch: dict[str, Array], temperature: float
) -> tuple[Array, Array]:
    """Log-probs of the completion tokens under the policy at the sampling temperature, and the
    per-position entropy of that distribution; both [B, N]."""
    completion_length = batch["completion_mask"].shape[1]
    # Position t predicts token t + 1: the hidden states before each completion token, and only
    # those (the head over the prompt positions would be most of the memory, for nothing); the
    # head then runs over them in chunks (`head_log_probs`).
    hidden, _ = model.apply(
        {"params": params},
        batch["tokens"],
        None,
        batch["attention_mask"],
        logits_for_last=completion_length + 1,
        hidden_only=True,
    )
    return head_log_probs(
        model.config,
        params,
        hidden[:, :-1],
        batch["tokens"][:, -completion_length:],
        temperature,
    )


def log_probs_and_entropy(logits: Array, tokens: Array, temperature: float) -> tuple[Array, Array]:
    """From the logits [B, N, vocab] before each of `tokens` [B, N]: each token's log-prob at the
    sampling temperature and the entropy of that distribution, both [B, N]."""
    log_softmax = jax.nn.log_softmax(logits / temperature, axis=-1)
    log_probs = jnp.take_along_axis(log_softmax, tokens[..., None], axis=-1)[..., 0]
    entropy = -jnp.sum(jnp.exp(log_softmax) * log_softmax, axis=-1)
    return log_probs, entropy


def log_prob_mismatch(
    sampler: Array, trainer: Array, mask: Array, count: Array | None = None
) -> dict[str, Array]:
    """The gap between the sampler's log-prob of a token and the trainer's for the same token
    and parameters, over the [B, N] tokens `mask` marks: logprob_mismatch_mean and _max of
    |sampler - trainer| (0 where no token is marked). `count`: the mean's denominator, when
    these rows are a length bucket of a larger batch."""
    gap = jnp.where(mask, jnp.abs(sampler - trainer), 0.0)
    count = jnp.maximum(mask.sum(), 1) if count is None else count
    return {"logprob_mismatch_mean": gap.sum() / count, "logprob_mismatch_max": gap.max()}
