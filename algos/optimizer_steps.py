"""GRPO's optimizer steps on one sampled batch of completions, as every rollout mode takes them
(`make_optimize`; `optimize_with` is the same steps over any batch, multi-turn GRPO's
conversations too): the no-grad log-prob passes (the old policy's when samples are reused, the
reference's for the KL penalty), then num_epochs x num_minibatches steps of GRPO's loss.

Length buckets (TRL's padding-free, verl's remove-padding, at fixed shapes):
`Config.length_buckets` = k > 0 sorts each micro-batch's completions by the positions they need
and splits them into k sub-batches, each run at the smallest of max_new_tokens / 8, / 4, / 2,
/ 1 that holds its longest completion (`jaxrl.lm.training`'s `LengthBuckets`). Every sub-batch
carries the step's denominators (`normalisers`), so their gradients sum to the step's: the
same update, up to rounding. The no-grad passes run in the same buckets.

One mean over the step's batch: every loss here is a mean over the optimizer step's whole
batch (its kept sequences or tokens, `normalisers`), each micro-batch and length bucket giving
its share, so grad_accum_steps and length_buckets change the memory and never the objective.

Shared prompts (`Config.shared_prompt`, `log_prob_pass`): every pass takes the rows as
contiguous groups of group_size sharing their prompt and runs each group's prompt once
(`jaxrl.lm.log_probs.LogProbPass`). Everything that splits the batch then keeps groups whole:
minibatches shuffle groups, micro-batches and length buckets hold whole groups (a group sorts
by its longest completion), and each batch shard holds whole groups.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from jaxrl.config import require, require_count
from jaxrl.lm import training
from jaxrl.lm.log_probs import PER_ROW, LogProbPass
from jaxrl.lm.model import Transformer

Array = jax.Array


def validate_length_buckets(config: Any) -> None:
    """Check length_buckets against the micro-batch it splits and the mesh that splits it."""
    require_count(
        config, "length_buckets", "use 0 (off) or a number of sub-batches per micro-batch"
    )
    buckets = config.length_buckets
    if buckets == 0:
        return
    micro = config.micro_batch_size
    require(
        micro % buckets == 0,
        "length_buckets",
        f"{buckets} does not divide the micro-batch of {micro} completions",
        f"choose a divisor of {micro}",
    )
    shards = training.check_mesh_shape(config.mesh_shape)
    require(
        (micro // buckets) % shards == 0,
        "length_buckets",
        f"sub-batches of {micro // buckets} completions (micro-batch {micro} / {buckets}) do "
        f"not split over the mesh's data*fsdp = {shards} batch shards",
        f"choose length_buckets so that {micro} / length_buckets is a multiple of {shards}",
    )


def validate_shared_prompt(config: Any, length_buckets: int | None) -> None:
    """With shared_prompt, every pass's rows must be whole groups on each batch shard: the
    micro-batch (or its length bucket) a multiple of group_size x the mesh's batch shards.
    GRPO's Config (its `length_buckets`) and multi-turn GRPO's (None: it has no length buckets;
    games' episodes share their opening) both."""
    if not config.shared_prompt or config.group_size == 1:
        return
    buckets = length_buckets or 0
    unit = config.micro_batch_size // max(buckets, 1)
    shards = training.check_mesh_shape(config.mesh_shape)
    what = "length bucket" if buckets else "micro-batch"
    fewer = "num_minibatches, grad_accum_steps or length_buckets"
    if length_buckets is None:
        fewer = "num_minibatches or grad_accum_steps"
    require(
        unit % (config.group_size * shards) == 0,
        "shared_prompt",
        f"a {what} of {unit} completions does not hold whole groups of group_size = "
        f"{config.group_size} on each of the mesh's data*fsdp = {shards} batch shards",
        f"set shared_prompt False, or make the {what} a multiple of "
        f"{config.group_size * shards} (fewer {fewer})",
    )


def log_prob_pass(config: Any) -> LogProbPass:
    """The log-prob pass config.shared_prompt chooses: each group's prompt once, or (off, or
    group_size 1) every row's."""
    return LogProbPass(config.group_size if config.shared_prompt else 1)


def bucket_lengths(max_new_tokens: int) -> tuple[int, ...]:
    """The static completion lengths length buckets run at: max_new_tokens / 8, / 4, / 2 and
    / 1, rounded up (fewer when they coincide)."""
    return tuple(sorted({-(-max_new_tokens // d) for d in (8, 4, 2, 1)}))


def completion_extent(completion_mask: Array) -> Array:
    """[B, N] -> [B] the positions each row's completion needs: its last masked one + 1."""
    positions = jnp.arange(1, completion_mask.shape[1] + 1)
    return jnp.max(jnp.where(completion_mask, positions, 0), axis=1)


def cut_batch(batch: dict[str, Array], length: int) -> dict[str, Array]:
    """A GRPO batch with its completions cut to their first `length` positions: arrays over the
    whole sequence [B, prompt + N] keep prompt + length columns, those over the completion
    [B, N] keep length; per-row ones stay. Causal attention leaves the kept positions' log-probs
    as they were."""
    completion = batch["completion_mask"].shape[1]
    full = batch["tokens"].shape[1]
    keep = full - completion + length

    def cut(x: Array) -> Array:
        if x.ndim >= 2 and x.shape[1] == full:
            return x[:, :keep]
        if x.ndim >= 2 and x.shape[1] == completion:
            return x[:, :length]
        return x

    return {name: cut(x) for name, x in batch.items()}


def normalisers(batch: dict[str, Array], mask: str = "completion_mask") -> dict[str, Array]:
    """The denominators of GRPO's loss and metrics over an optimizer step's whole batch (any
    leading shape; the `mask` column [..., N] marks its tokens): kept sequences, kept tokens,
    all tokens, fresh tokens (`grpo.aggregate`'s and `log_prob_mismatch`'s). The step puts them
    on every row (`training.with_denominators`), so every micro-batch and length bucket computes
    its share of one mean over the step's batch: DAPO's and CISPO's token mean counts every
    token of the step, whatever grad_accum_steps and length_buckets are."""
    weights = batch["weights"]
    tokens = batch[mask].astype(jnp.float32)
    values = {
        "norm_sequences": jnp.maximum(weights.sum(), 1.0),
        "norm_tokens": jnp.maximum(jnp.sum(tokens * weights[..., None]), 1.0),
        "norm_all_tokens": jnp.maximum(tokens.sum(), 1.0),
    }
    if "fresh_mask" in batch:
        values["norm_fresh"] = jnp.maximum(batch["fresh_mask"].sum(), 1).astype(jnp.float32)
    return values


def group_extent(completion_mask: Array, group_size: int) -> Array:
    """[B, N] -> [B] the positions each row's group needs: the longest of its G rows'
    `completion_extent`. Sorted stably by it, a group's rows stay contiguous and in order."""
    if group_size == 1:
        return completion_extent(completion_mask)
    extent = completion_extent(completion_mask).reshape(-1, group_size).max(axis=1)
    return jnp.repeat(extent, group_size, total_repeat_length=completion_mask.shape[0])


def length_buckets(
    config: Any, mesh: Any = None, group_size: int = 1
) -> training.LengthBuckets | None:
    """config.length_buckets as `training.LengthBuckets` over GRPO's batches (None when 0);
    with `group_size` > 1 (a shared-prompt pass) groups of rows sort and split whole."""
    if config.length_buckets == 0:
        return None
    return training.LengthBuckets(
        count=config.length_buckets,
        lengths=bucket_lengths(config.sampling.max_new_tokens),
        row_lengths=lambda batch: group_extent(batch["completion_mask"], group_size),
        cut=cut_batch,
        mesh=mesh,
    )


def log_probs_in_buckets(
    log_probs_of: Callable[[dict[str, Array]], Array],
    batch: dict[str, Array],
    buckets: training.LengthBuckets,
    parts: int,
) -> Array:
    """`log_probs_of(sub_batch) -> [rows, length]` (a no-grad pass: the old policy's, the
    reference's) over `batch` split by length into `parts` sub-batches, each cut to its bucket's
    length; back in the batch's row order at its full width [B, N], zeros past a cut (no
    completion token sits there)."""
    completion = batch["completion_mask"].shape[1]

    def at_length(part: dict[str, Array]) -> Array:
        log_probs = log_probs_of(part)
        return jnp.pad(log_probs, ((0, 0), (0, completion - log_probs.shape[1])))

    split, index, order = training.split_by_length(batch, buckets, parts)
    log_probs = jax.lax.map(
        lambda args: training.at_bucket_length(at_length, buckets, args[1], args[0]),
        (split, index),
    )
    # Back to the batch's row order.
    return log_probs.reshape(-1, completion).at[order].set(log_probs.reshape(-1, completion))


def optimize_with(
    loss_fn: Callable,
    no_grad_log_probs: Callable[[Any, dict[str, Array]], Array],
    config: Any,
    mesh: Any,
    buckets: training.LengthBuckets | None = None,
    group_size: int = 1,
    *,
    denominators: training.Denominators,
) -> Callable:
    """The optimizer steps on one sampled batch, as every rollout mode takes them (GRPO's single
    completions, multi-turn GRPO's conversations): `optimize(state, batch, hp, shuffle_key,
    policy, reference_params) -> (state, step_metrics)` adds the old log-probs under `policy`
    (when samples are reused) and the reference's (when given) to the batch, each from
    `no_grad_log_probs(params, batch)`, then runs the minibatch epochs of `loss_fn(params,
    batch, hparams)` with this update's dropout stream (in length `buckets`, if given;
    minibatches shuffling whole groups of `group_size` rows; each loss a mean over its step's
    batch with `denominators`: `normalisers` over the batch's token mask)."""

    def optimize(state, batch, hp, shuffle_key, policy, reference_params):
        batch = dict(batch)
        if config.reuses_samples:
            batch["old_log_probs"] = no_grad_log_probs(policy, batch)
        if reference_params is not None:
            batch["reference_log_probs"] = no_grad_log_probs(reference_params, batch)
        # LoRA dropout: one mask per optimizer step, from this update's own stream.
        dropout_key = jax.random.fold_in(
            jax.random.fold_in(state.key, state.step), training.DROPOUT_STREAM
        )
        return training.minibatch_epochs(
            lambda p, micro_batch: loss_fn(p, micro_batch, hp), state, batch, hp, config,
            shuffle_key, config.num_epochs, config.num_minibatches, mesh, dropout_key, buckets,
            group_size, denominators,
        )  # fmt: skip

    return optimize


def make_optimize(
    transformer: Transformer,
    loss_fn: Callable,
    config: Any,
    mesh: Any,
    log_prob_pass: LogProbPass = PER_ROW,
) -> Callable:
    """GRPO's optimizer steps on one sampled batch of completions (`optimize_with`). With
    config.length_buckets > 0 the training and the no-grad passes run in length buckets
    (`length_buckets`). With one optimizer step per batch no old log-prob pass runs: those
    log-probs are the loss's own, held constant (`grpo.make_loss`), and so are the proximal
    policy's of AReaL's decoupled objective in partial and async mode (the parameters the
    update starts from); forcing the pass changes nothing but the time
    (test_partial_rollouts). `log_prob_pass` is the no-grad passes' (the loss's must be the
    same): with a shared-prompt pass, buckets and minibatches keep groups whole."""
    group_size = log_prob_pass.group_size
    buckets = length_buckets(config, mesh, group_size)
    temperature = config.sampling.temperature
    # The no-grad passes split the whole batch into sub-batches as small as training's.
    parts = config.length_buckets * config.num_minibatches * config.grad_accum_steps

    def no_grad_log_probs(params: Any, batch: dict[str, Array]) -> Array:
        def log_probs_of(part: dict[str, Array]) -> Array:
            return log_prob_pass(transformer, params, part, temperature)[0]

        if buckets is not None:
            log_probs = log_probs_in_buckets(log_probs_of, batch, buckets, parts)
            return jax.lax.stop_gradient(log_probs)
        return jax.lax.stop_gradient(log_probs_of(batch))

    return optimize_with(
        loss_fn, no_grad_log_probs, config, mesh, buckets, group_size, denominators=normalisers
    )
