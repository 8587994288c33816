"""Token log-probs of sampled completions under a model, with their distributions' entropy and
uniform KL (`jaxrl.lm.model.TokenStatistics`), and the gap between
the sampler's log-prob of a token and the trainer's: what every algorithm that trains on its own
samples (GRPO and its relatives, multi-turn GRPO, PPO, online DPO) computes the same way.

A completion batch holds `tokens` and `attention_mask` [B, prompt + N] and `completion_mask`
[B, N]: the prompt, left-padded, then the N sampled tokens. Log-probs are taken at the sampling
temperature, so that the trained policy is the one that sampled.

Where the rows come in groups of G that share their prompt (GRPO's samples of one prompt, rows
g*G ... g*G + G - 1), `grouped_completion_log_probs` computes the same log-probs while each
group's prompt goes through the model once: the group is packed into one sequence [prompt,
completion 1, ..., completion G] whose completions attend to the prompt and to their own tokens
only (`Transformer`'s segment_ids). `LogProbPass` is the choice between the two as a part an
update is built with.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from jaxrl.lm.model import (
    TokenStatistics,
    Transformer,
    head_log_probs,
    positions_from_mask,
)

Array = jax.Array


def completion_log_probs(
    model: Transformer, params: Any, batch: dict[str, Array], temperature: float
) -> TokenStatistics:
    """Log-probs of the completion tokens under the policy at the sampling temperature, and the
    per-position entropy and uniform KL of that distribution (`TokenStatistics`, each [B, N])."""
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


def grouped_completion_log_probs(
    model: Transformer,
    params: Any,
    batch: dict[str, Array],
    temperature: float,
    group_size: int,
) -> TokenStatistics:
    """`completion_log_probs` of a batch whose rows come in contiguous groups of `group_size`
    that share their prompt (tokens and mask of the first P columns), with each group's prompt
    run through the model once: its `TokenStatistics` [B, N] in the batch's row order.

    Each group of G rows becomes one sequence of P + G * N tokens, [prompt, completion 1, ...,
    completion G]: the prompt attends causally to itself (its left padding masked), completion
    j to the prompt and causally to its own tokens, never to another completion, and its tokens
    keep the positions they have in their own row. The first token of every completion is
    predicted from the prompt's last position, which the group shares, so the gradient through
    the prompt is summed over the group in one backward pass. The head runs only on the G * N
    positions that predict a completion token. Rows of one group whose prompts differ get the
    log-probs of the group's first prompt: the caller keeps groups whole and in order."""
    tokens, mask = batch["tokens"], batch["attention_mask"]
    rows, total = tokens.shape
    completion_length = batch["completion_mask"].shape[1]
    prompt_length = total - completion_length
    if rows % group_size or prompt_length < 1:
        raise ValueError(
            f"grouped_completion_log_probs: {rows} rows with prompts of {prompt_length} "
            f"tokens; needs a prompt and whole groups of group_size = {group_size}"
        )
    groups = rows // group_size
    # Each token's position as its own row has it (a left-padded prompt starts at 0), so that
    # every completion continues its prompt exactly as it does unpacked.
    positions = positions_from_mask(mask)

    def pack(x: Array) -> Array:
        """[rows, P + N] -> [groups, P + G * N]: the group's first prompt, then its completions."""
        grouped = x.reshape(groups, group_size, total)
        prompt = grouped[:, 0, :prompt_length]
        completions = grouped[:, :, prompt_length:].reshape(groups, -1)
        return jnp.concatenate([prompt, completions], axis=1)

    segments = jnp.concatenate(
        [
            jnp.zeros(prompt_length, jnp.int32),
            jnp.repeat(jnp.arange(1, group_size + 1, dtype=jnp.int32), completion_length),
        ]
    )
    # Completion j's token t is predicted at the prompt's last slot (t = 0) or at its own
    # previous token's slot.
    steps = jnp.arange(completion_length)
    starts = prompt_length + completion_length * jnp.arange(group_size)
    reads = jnp.where(steps == 0, prompt_length - 1, starts[:, None] + steps - 1).reshape(-1)
    hidden, _ = model.apply(
        {"params": params},
        pack(tokens),
        pack(positions),
        pack(mask),
        logit_positions=jnp.broadcast_to(reads, (groups, reads.shape[0])),
        hidden_only=True,
        segment_ids=jnp.broadcast_to(segments, (groups, segments.shape[0])),
    )
    return head_log_probs(
        model.config,
        params,
        hidden.reshape(rows, completion_length, -1),
        tokens[:, -completion_length:],
        temperature,
    )


@dataclasses.dataclass(frozen=True)
class LogProbPass:
    """How an update's log-prob passes run over a completion batch, chosen once when the update
    is built. `group_size` 1: every row with its own copy of the prompt
    (`completion_log_probs`). G > 1: the rows come in contiguous groups of G that share their
    prompt, each group's prompt run once (`grouped_completion_log_probs`); whoever splits the
    batch (minibatches, micro-batches, length buckets, mesh shards) keeps groups whole and in
    order. Both give the same log-probs, entropies and uniform KLs up to rounding.

    Called as `log_prob_pass(model, params, batch, temperature) -> TokenStatistics`, each
    [B, N]; `PER_ROW` is `LogProbPass(1)`."""

    group_size: int = 1

    def __post_init__(self) -> None:
        if self.group_size < 1:
            raise ValueError(f"LogProbPass: group_size {self.group_size}; use 1 or more")

    def __call__(
        self, model: Transformer, params: Any, batch: dict[str, Array], temperature: float
    ) -> TokenStatistics:
        if self.group_size == 1:
            return completion_log_probs(model, params, batch, temperature)
        return grouped_completion_log_probs(model, params, batch, temperature, self.group_size)

    def tokens(self, rows: int, prompt_length: int, new_tokens: int) -> int:
        """Tokens the model runs per pass over `rows` completions of `new_tokens` after prompts
        of `prompt_length` (the head runs on rows x new_tokens positions either way)."""
        groups = rows // self.group_size
        return groups * (prompt_length + self.group_size * new_tokens)


PER_ROW = LogProbPass()  # today's pass: every row with its own copy of the prompt


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
