"""GRPO and its relatives: generation, verifiable reward and policy update in one XLA program.

Group relative policy optimisation (Shao et al., 2024) needs no value network. Each prompt gets a
group of sampled completions, and a completion's advantage is its reward measured against the
rest of its group. One update, all of it inside one `jax.jit` and sharded over the mesh:

    prompts      <- the task's prompt sampler (pure JAX), batch_size of them
    completions  <- group_size samples per prompt from the KV-cache sampler (jaxrl.lm.sampler)
    rewards      <- a weighted sum of the task's reward terms (envs.text.TextTask): JAX
                    functions of the tokens, or host Python functions f(prompts, completions,
                    **columns) called through io_callback (`host_reward`); plus DAPO's soft
                    overlong penalty when overlong_buffer > 0
    advantages   <- reward minus the group's mean (or the leave-one-out mean), divided by the
                    group's standard deviation where the variant says so
    num_epochs x num_minibatches clipped policy-gradient steps on these samples:
        ratio = pi(token) / pi_old(token),  loss = -min(ratio * A, clip(ratio, 1 - lo, 1 + hi) * A)
        + kl_beta * k3(pi, pi_ref) per token, k3 = exp(ref - logp) - (ref - logp) - 1
        - entropy_coef * the mean entropy of the policy over the completion tokens

Variants (`Config.variant`):
- "grpo": std-normalised advantages; each sequence's token losses are averaged, then sequences.
- "dr_grpo" (Liu et al., 2025, "Understanding R1-Zero-like training"): no std normalisation and
  token sums divided by the constant max_new_tokens, which removes GRPO's length and difficulty
  biases.
- "dapo" (Yu et al., 2025): std-normalised; one token-level mean over the whole batch; clip-higher
  (clip_high defaults to 0.28); groups whose rewards are all equal carry no signal and are left out
  of the loss (dynamic filtering, done by masking because shapes are fixed); with overlong_buffer
  > 0, completions running into the last overlong_buffer tokens are penalised linearly.
- "rloo" (Ahmadian et al., 2024): REINFORCE with the leave-one-out baseline, mean of the other
  group_size - 1 rewards; sequence-level, so token sums divided by the constant max_new_tokens.
- "remax" (Li et al., 2024): REINFORCE whose baseline is the reward of the policy's own greedy
  completion of the prompt, generated in the same program (one per prompt); token sums divided
  by max_new_tokens like RLOO. It needs no critic and works from group_size 1.

Dynamic sampling (DAPO's, `Config.dynamic_sampling`, with any variant): a group whose rewards are
all equal gives no gradient, so the rollout draws oversample_factor x batch_size prompts, samples
and scores all their groups, and keeps batch_size groups, those with signal first
(`select_groups`), filling up with uniform groups when too few vary (counted as
`groups_filled_uniform`). Shapes stay fixed: the update trains on batch_size x group_size
completions either way, and the selection happens inside the program. Every update logs
`zero_variance_fraction` of the drawn groups; with `warn_no_signal_updates` > 0, more than half
of them without signal for that many updates in a row prints one warning line.

The file reads top to bottom: `Config`; the pure pieces (`group_advantages`, `overlong_penalty`,
`policy_loss`) that tests compare with NumPy; host reward terms; the rollout; the loss; and `make`,
GRPO as the learner contract's `init` and `update`:

    task = make_task("reverse_digits", num_digits=3).text_task(tokenizer)   # prompts, rewards
    algorithm = grpo.make(config, model, task, params, mesh)
    state = algorithm.init(jax.random.PRNGKey(seed), hparams)
    state, metrics = algorithm.update(state, grpo.Inputs(reference_params), hparams)

A user's prompt file becomes a task with `envs.text.prompt_dataset`; its token table travels in
`Inputs.task_data`.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import io_callback

from envs.text import PromptBatch, RewardTerm, TextTask
from jaxrl import host, sharding
from jaxrl.config import require, require_count, require_in_range, require_positive
from jaxrl.hparams import HParams, static, swept
from jaxrl.lm import lora, memory, training
from jaxrl.lm.model import ModelConfig, Transformer, head_log_probs
from jaxrl.lm.sampler import Completion, SamplingConfig, generate
from jaxrl.loop import Algorithm

if TYPE_CHECKING:
    from jaxrl.data.prompts import PromptTable

Array = jax.Array


class Variant(NamedTuple):
    """What distinguishes the algorithms in `VARIANTS`: advantage baseline, scaling, aggregation."""

    baseline: str  # "group_mean", "leave_one_out" or "greedy" (the greedy completion's reward)
    scale_by_std: bool  # divide advantages by the group's reward standard deviation
    aggregation: str  # "sequence_mean", "token_mean" or "constant_length"
    drop_zero_variance_groups: bool  # give groups with all-equal rewards weight 0 (DAPO)
    clip_high: float | None  # the default upper clip; None means the same as clip_low


VARIANTS = {
    "grpo": Variant("group_mean", True, "sequence_mean", False, None),
    "dr_grpo": Variant("group_mean", False, "constant_length", False, None),
    "dapo": Variant("group_mean", True, "token_mean", True, 0.28),
    "rloo": Variant("leave_one_out", False, "constant_length", False, None),
    "remax": Variant("greedy", False, "constant_length", False, None),
}


def validate_dynamic_sampling(config: Any) -> None:
    """Check a Config's dynamic_sampling, oversample_factor and warn_no_signal_updates (GRPO's,
    multi-turn's and online DPO's)."""
    require(
        isinstance(config.dynamic_sampling, bool),
        "dynamic_sampling",
        f"got {config.dynamic_sampling!r}",
        "use True or False",
    )
    require(
        isinstance(config.oversample_factor, int) and config.oversample_factor >= 1,
        "oversample_factor",
        f"got {config.oversample_factor!r}",
        "use a whole number of prompts drawn per prompt kept, 2 or more",
    )
    require(
        not config.dynamic_sampling or config.oversample_factor >= 2,
        "oversample_factor",
        "1 draws only the groups the update keeps, so dynamic sampling has none to choose from",
        "use 2 or more",
    )
    require(
        config.dynamic_sampling or config.oversample_factor == 2,
        "oversample_factor",
        f"got {config.oversample_factor}, but it is read only with dynamic_sampling=True",
        "set dynamic_sampling=True, or drop oversample_factor",
    )
    require(
        isinstance(config.warn_no_signal_updates, int) and config.warn_no_signal_updates >= 0,
        "warn_no_signal_updates",
        f"got {config.warn_no_signal_updates!r}",
        "use a number of updates, or 0 for no warning",
    )


def validate_rollout_mode(config: Any) -> None:
    """Check rollout_mode and the settings it reads; each mode's own checks live with it in
    `algos.partial` and `algos.asynchronous`."""
    require(
        config.rollout_mode in ("sync", "partial", "async"),
        "rollout_mode",
        f"unknown mode {config.rollout_mode!r}",
        "choose sync, partial or async",
    )
    if config.rollout_mode == "partial":
        from algos import partial  # it builds on this module

        partial.validate(config)
    elif config.rollout_mode == "async":
        from algos import asynchronous  # it builds on this module

        asynchronous.validate(config)
    else:
        require(
            config.max_staleness == 0,
            "max_staleness",
            f"got {config.max_staleness!r}, but it is read only with rollout_mode=partial or async",
            "set rollout_mode=partial or async, or drop it",
        )
    if config.rollout_mode != "partial":
        for name in ("rollout_budget", "rollout_groups"):
            require(
                getattr(config, name) == 0,
                name,
                f"got {getattr(config, name)!r}, but it is read only with rollout_mode=partial",
                "set rollout_mode=partial, or drop it",
            )
    if config.rollout_mode != "async":
        for name, default in (
            ("generation_mesh_shape", (1, 1, 1)),
            ("generation_dtype", "bfloat16"),
        ):
            require(
                getattr(config, name) == default,
                name,
                f"got {getattr(config, name)!r}, but it is read only with rollout_mode=async",
                "set rollout_mode=async, or drop it",
            )


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


def validate_decode_row_buckets(config: Any) -> None:
    """Check decode_row_buckets against the rows one sampler call decodes and the mesh."""
    require_count(config, "decode_row_buckets", "use 0 (off) or a number of row buckets")
    buckets = config.decode_row_buckets
    if buckets == 0:
        return
    require(
        config.rollout_budget_unit == "decode steps",
        "decode_row_buckets",
        "multi-turn episodes decode every conversation's turn together",
        "use 0 with multi-turn GRPO",
    )
    groups = config.rollout_groups if config.rollout_mode == "partial" else 0
    rows = (groups or config.batch_size) * config.group_size
    shards = training.check_mesh_shape(config.mesh_shape)
    require(
        rows % (buckets * shards) == 0,
        "decode_row_buckets",
        f"{buckets} buckets of the {rows} rows a rollout decodes do not split evenly over "
        f"the mesh's data*fsdp = {shards} batch shards",
        f"choose a number of buckets that divides {rows // shards}",
    )


@dataclasses.dataclass(frozen=True)
class Config(training.TrainConfig):
    """GRPO settings on top of the shared optimisation ones. `batch_size` counts prompts per
    update; each gets `group_size` completions, and those are split into `num_minibatches`
    optimizer steps per epoch, each accumulated over `grad_accum_steps` micro-batches. Fields
    marked `swept` may differ between the runs of one program (`jaxrl.hparams.sweep`)."""

    batch_size: int = 16  # prompts per update
    group_size: int = 8  # completions sampled per prompt
    variant: str = "grpo"  # a key of VARIANTS: "grpo", "dr_grpo", "dapo", "rloo" or "remax"
    num_epochs: int = 1  # passes over each update's completions
    num_minibatches: int = 1  # optimizer steps per epoch
    clip_low: float = swept(0.2)  # the ratio's lower clip is 1 - clip_low
    clip_high: float = swept(0.0)  # 0: the variant's default (0.28 for DAPO, else clip_low)
    # Weight of the k3 KL penalty to the reference model, which the update gets as its input
    # (without one, no penalty is computed: the scripts pass it when kl_beta > 0).
    kl_beta: float = swept(0.0)
    entropy_coef: float = swept(0.0)  # token-entropy bonus; slows collapse onto one answer
    max_new_tokens: int = 8  # completion length; sampling stops there
    temperature: float = 1.0  # sampling temperature, also applied to the trained log-probs
    top_k: int = 0  # 0: no top-k filtering
    top_p: float = 1.0  # 1: no nucleus filtering
    overlong_buffer: int = 0  # DAPO's soft overlong penalty over the last N tokens; 0 is off
    overlong_penalty: float = swept(1.0)  # the penalty at max_new_tokens
    std_eps: float = 1e-4  # added to the group's standard deviation before dividing
    # DAPO's dynamic sampling: draw oversample_factor x batch_size prompts (each with its group),
    # keep batch_size groups whose rewards vary, filling up with uniform ones if too few vary
    # (`select_groups`); the update trains on batch_size x group_size completions either way.
    dynamic_sampling: bool = False
    oversample_factor: int = 2  # prompts drawn per kept prompt, with dynamic_sampling
    # A one-line warning when more than half the drawn groups carry no signal (all rewards
    # equal) in this many consecutive updates; 0 never warns.
    warn_no_signal_updates: int = 3
    # How generation meets training (issue 39). "sync": every update samples its completions to
    # the end. "partial" (APRIL's partial rollouts, `algos.partial`): every update decodes at
    # most rollout_budget steps; groups whose completions all ended train, unfinished ones keep
    # their KV-cache slot and continue in the next update, freed slots take new prompts.
    rollout_mode: str = "sync"
    # Decode steps per update in partial mode; 0 means max_new_tokens. The KV cache holds the
    # prompt + budget x (1 + floor((max_new_tokens - 1) / budget)) columns (`partial.geometry`):
    # synchronous GRPO's prompt + max_new_tokens when the budget divides max_new_tokens, up to
    # budget - 1 more otherwise, and every decode step reads them all (README, the profile).
    rollout_budget: int = 0
    # What rollout_budget counts (not a field): multi-turn GRPO's budget counts turns.
    rollout_budget_unit: ClassVar[str] = "decode steps"
    # Prompt groups decoded at once in partial mode (APRIL's over-provisioning): decoding stops
    # once batch_size of them have ended, which train; 0 means batch_size.
    rollout_groups: int = 0
    # "async" (`algos.asynchronous`): generation and training on disjoint parts of the devices,
    # two programs that overlap; the weights are resharded to the generation layout after every
    # update. mesh_shape is the training mesh (the first devices), generation_mesh_shape the
    # generation mesh (the next ones), generation_dtype the dtype of the weights copied there
    # (bfloat16, HybridFlow's; float32 samples exactly as the fp32 trainer would).
    generation_mesh_shape: tuple[int, int, int] = (1, 1, 1)
    generation_dtype: str = "bfloat16"
    # The oldest policy a trained token may come from, in updates (AReaL's max offpolicyness).
    max_staleness: int = 0
    # Length-bucketed training (TRL's padding-free, verl's remove-padding, at fixed shapes): 0
    # trains every row at prompt + max_new_tokens positions. k > 0 sorts each micro-batch's
    # completions by length and splits them into k sub-batches, each run at the smallest of
    # max_new_tokens / 8, / 4, / 2, / 1 that holds its longest completion; their gradients sum
    # to the micro-batch's (same normalisers), so the update is the same up to rounding. The
    # old and reference log-prob passes run in the same buckets.
    length_buckets: int = 0
    # Decode row buckets: 0 decodes every row until the last one ends (rows that ended compute
    # padding). k > 0 gathers the rows still sampling into the smallest of rows x 1/k, 2/k,
    # ..., 1 that holds them (`sampler.decode_live_rows`): the same samples, up to the
    # rounding of a smaller matmul. It pays where a decode step costs about its rows (a CPU);
    # on a GPU a step mostly reads the weights, whatever its rows.
    decode_row_buckets: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "mesh_shape", tuple(self.mesh_shape))
        object.__setattr__(self, "generation_mesh_shape", tuple(self.generation_mesh_shape))
        self.validate_lora()
        require_positive(
            self,
            "learning_rate",
            "batch_size",
            "group_size",
            "num_epochs",
            "num_minibatches",
            "grad_accum_steps",
            "num_steps",
            "max_grad_norm",
            "max_new_tokens",
            "temperature",
        )
        require(
            self.variant in VARIANTS,
            "variant",
            f"unknown variant {self.variant!r}",
            f"choose one of {sorted(VARIANTS)}",
        )
        require(
            self.group_size >= 2 or self.spec.baseline == "greedy",
            "group_size",
            f"got {self.group_size}; advantages compare completions within a group",
            "use 2 or more (or variant=remax, whose baseline is the greedy completion)",
        )
        require_in_range(self, "clip_low", 0.0, 1.0)
        require(self.clip_high >= 0, "clip_high", f"got {self.clip_high}", "use 0 or more")
        require(self.kl_beta >= 0, "kl_beta", f"got {self.kl_beta}", "use 0 (off) or more")
        require(
            self.entropy_coef >= 0,
            "entropy_coef",
            f"got {self.entropy_coef}",
            "use 0 (off) or more",
        )
        require(
            0 <= self.overlong_buffer < self.max_new_tokens,
            "overlong_buffer",
            f"got {self.overlong_buffer} with max_new_tokens={self.max_new_tokens}",
            "use 0 (off) or fewer tokens than max_new_tokens",
        )
        require(self.warmup_steps >= 0, "warmup_steps", f"got {self.warmup_steps}", "use 0 or more")
        require(self.weight_decay >= 0, "weight_decay", f"got {self.weight_decay}", "use 0 or more")
        validate_dynamic_sampling(self)
        validate_rollout_mode(self)
        validate_length_buckets(self)
        validate_decode_row_buckets(self)
        SamplingConfig(  # validates temperature / top_k / top_p
            self.max_new_tokens, 0, 0, self.temperature, self.top_k, self.top_p
        )
        completions = self.batch_size * self.group_size
        steps = self.num_minibatches * self.grad_accum_steps
        require(
            completions % steps == 0,
            "num_minibatches",
            f"num_minibatches * grad_accum_steps = {steps} does not divide the "
            f"{completions} completions per update (batch_size * group_size)",
            "choose them so their product divides batch_size * group_size",
        )
        shards = training.check_mesh_shape(self.mesh_shape)
        require(
            self.spec.baseline != "greedy" or self.batch_size % shards == 0,
            "batch_size",
            f"{self.batch_size} prompts, each with one greedy completion, do not split over the "
            f"mesh's data*fsdp = {shards} batch shards",
            f"make batch_size a multiple of {shards}",
        )
        require(
            self.micro_batch_size % shards == 0,
            "batch_size",
            f"micro-batch of {self.micro_batch_size} completions (batch_size * group_size / "
            f"(num_minibatches * grad_accum_steps)) does not split over the mesh's data*fsdp = "
            f"{shards} batch shards",
            f"make it a multiple of {shards}",
        )

    @property
    def prompts_drawn(self) -> int:
        """Prompts sampled per update: batch_size, times oversample_factor with dynamic
        sampling."""
        return self.batch_size * (self.oversample_factor if self.dynamic_sampling else 1)

    @property
    def spec(self) -> Variant:
        """The `Variant` named by `variant`."""
        return VARIANTS[self.variant]

    @property
    def upper_clip(self) -> float:
        """The ratio's upper clip is 1 + this: clip_high if set, else the variant's default
        (what `upper_clip` computes inside the program from the run's hyper-parameters)."""
        if self.clip_high > 0:
            return self.clip_high
        return self.spec.clip_high if self.spec.clip_high is not None else self.clip_low

    @property
    def completions_per_update(self) -> int:
        """batch_size * group_size."""
        return self.batch_size * self.group_size

    @property
    def micro_batch_size(self) -> int:
        """Completions per micro-batch: completions_per_update / (num_minibatches *
        grad_accum_steps)."""
        return self.completions_per_update // (self.num_minibatches * self.grad_accum_steps)

    @property
    def reuses_samples(self) -> bool:
        """More than one optimizer step per batch of samples: the policy moves away from the one
        that sampled, so the old log-probs need their own forward pass."""
        return self.num_epochs * self.num_minibatches > 1

    def sampling(self, eos_id: int, pad_id: int) -> SamplingConfig:
        """The sampler's settings for a tokenizer's EOS and padding ids."""
        return SamplingConfig(
            self.max_new_tokens, eos_id, pad_id, self.temperature, self.top_k, self.top_p
        )


# --- the pure pieces ------------------------------------------------------------------------


def group_advantages(
    rewards: Array,
    baseline: str,
    scale_by_std: bool,
    std_eps: float = 1e-4,
    greedy_rewards: Array | None = None,
) -> Array:
    """[num_prompts, group_size] rewards -> advantages of the same shape.
    group_mean: r - mean(group); leave_one_out: r - mean(the other members); greedy: r - the
    reward of the prompt's greedy completion (`greedy_rewards` [num_prompts]). With
    scale_by_std the result is divided by the group's (unbiased) standard deviation + std_eps."""
    group_size = rewards.shape[1]
    mean = rewards.mean(axis=1, keepdims=True)
    if baseline == "greedy":
        if greedy_rewards is None:
            raise ValueError("group_advantages: the greedy baseline needs greedy_rewards")
        advantages = rewards - greedy_rewards[:, None]
    elif baseline == "leave_one_out":
        others_mean = (rewards.sum(axis=1, keepdims=True) - rewards) / (group_size - 1)
        advantages = rewards - others_mean
    else:
        advantages = rewards - mean
    if scale_by_std:
        advantages = advantages / (jnp.std(rewards, axis=1, keepdims=True, ddof=1) + std_eps)
    return advantages


def overlong_penalty(
    lengths: Array, max_new_tokens: int, buffer: int, penalty: float | Array
) -> Array:
    """DAPO's soft overlong punishment: 0 up to max_new_tokens - buffer tokens, then falling
    linearly to -penalty at max_new_tokens."""
    if buffer == 0:
        return jnp.zeros(lengths.shape, jnp.float32)
    excess = jnp.maximum(lengths - (max_new_tokens - buffer), 0)
    return -penalty * excess.astype(jnp.float32) / buffer


def group_has_signal(rewards: Array, greedy_rewards: Array | None = None) -> Array:
    """[num_prompts, group_size] rewards -> [num_prompts] whether the group carries a learning
    signal: its rewards differ (or, with the greedy baseline, some sample scored unlike the
    greedy completion)."""
    if greedy_rewards is not None:
        return jnp.any(rewards != greedy_rewards[:, None], axis=1)
    return jnp.ptp(rewards, axis=1) > 0


def select_groups(has_signal: Array, count: int) -> Array:
    """DAPO's dynamic sampling at fixed shapes: the indices of `count` of the drawn groups, the
    ones with signal first in the order drawn, then (if fewer than `count` have signal) uniform
    ones in the order drawn to fill the batch. The drawn prompts are independent draws, so
    taking the first ones biases nothing."""
    return jnp.argsort(jnp.logical_not(has_signal).astype(jnp.int32), stable=True)[:count]


def take_groups(tree: Any, groups: Array, num_groups: int, group_size: int) -> Any:
    """The chosen `groups` (indices among `num_groups`) of every array in `tree`: an array with
    a row per completion (leading dimension num_groups * group_size, a group's rows adjacent)
    gives those groups' rows, one with a row per group (num_groups) those rows; a scalar (a
    value shared by every row) stays as it is."""
    rows = (groups[:, None] * group_size + jnp.arange(group_size)).reshape(-1)

    def take(leaf: Array) -> Array:
        if jnp.ndim(leaf) == 0:
            return leaf
        if leaf.shape[0] == num_groups * group_size:
            return jnp.take(leaf, rows, axis=0)
        if leaf.shape[0] == num_groups:
            return jnp.take(leaf, groups, axis=0)
        raise ValueError(f"take_groups: a leaf of {leaf.shape[0]} rows for {num_groups} groups")

    return jax.tree.map(take, tree)


def k3_kl(log_probs: Array, reference_log_probs: Array) -> Array:
    """Per-token k3 estimator of KL(pi || pi_ref) from samples of pi (Schulman, 2020): unbiased
    and never negative."""
    log_ratio = reference_log_probs - log_probs
    return jnp.exp(log_ratio) - log_ratio - 1.0


def aggregate(
    per_token: Array,
    mask: Array,
    weights: Array,
    aggregation: str,
    max_new_tokens: int,
    totals: tuple[Array, Array] | None = None,
) -> Array:
    """A scalar from [B, N] per-token values over the masked tokens of sequences with weight 1.
    sequence_mean: mean over kept sequences of each one's token mean; token_mean: one mean over
    every kept token; constant_length: token sums / max_new_tokens, mean over kept sequences.

    `totals` (kept sequences, kept tokens; `normalisers`) replace the counts of these rows by a
    larger batch's: these rows' share of that batch's value (length buckets sum the shares)."""
    mask = mask.astype(jnp.float32) * weights[:, None]
    summed = jnp.sum(per_token * mask, axis=1)
    if totals is None:
        kept, tokens = jnp.maximum(weights.sum(), 1.0), jnp.maximum(mask.sum(), 1.0)
    else:
        kept, tokens = totals
    if aggregation == "sequence_mean":
        return jnp.sum(summed / jnp.maximum(mask.sum(axis=1), 1.0)) / kept
    if aggregation == "token_mean":
        return summed.sum() / tokens
    if aggregation == "constant_length":
        return summed.sum() / (kept * max_new_tokens)
    raise ValueError(f"unknown aggregation {aggregation!r}")


def upper_clip(variant: Variant, clip_low: float | Array, clip_high: float | Array) -> Array:
    """The ratio's upper clip is 1 + this: `clip_high` where it is set (> 0), else the variant's
    default (clip_low when it has none). The clips may be a sweep's traced values."""
    default = clip_low if variant.clip_high is None else variant.clip_high
    return jnp.where(clip_high > 0, clip_high, default)


def policy_loss(
    log_probs: Array,
    old_log_probs: Array,
    advantages: Array,
    mask: Array,
    weights: Array,
    *,
    clip_low: float | Array,
    clip_high: float | Array,
    aggregation: str,
    max_new_tokens: int,
    kl_beta: float | Array = 0.0,
    reference_log_probs: Array | None = None,
    behaviour_log_probs: Array | None = None,
    behaviour_weight_cap: float | None = None,
    totals: tuple[Array, Array] | None = None,
    behaviour_clip: bool = False,
) -> tuple[Array, dict[str, Array]]:
    """The clipped surrogate (plus kl_beta x the k3 KL to the reference, when its log-probs are
    given) over [B, N] completion tokens, aggregated as `aggregation` says. advantages: [B] (one
    per sequence) or [B, N] (one per token: a multi-turn episode's turns differ); weights [B];
    weights 0 leave a sequence out. The ratio is clipped to [1 - clip_low, 1 + clip_high].

    With `behaviour_log_probs` (the log-probs the sampler recorded, possibly from older
    parameters) this is AReaL's decoupled objective (Fu et al., 2025): `old_log_probs` are then
    the proximal policy's, the one the clip is taken around, and each token's surrogate is
    weighted by pi_prox / pi_behav, held constant:
        -(pi_prox / pi_behav) * min(r * A, clip(r, 1 - lo, 1 + hi) * A),  r = pi / pi_prox.
    With behaviour == proximal the weight is exactly 1 and this is the loss above. With
    `behaviour_weight_cap`, tokens whose weight exceeds it leave the loss (AReaL's cap on
    the behaviour importance weight). `totals`: `aggregate`'s, for the loss and the metrics.

    With `behaviour_clip` the trust region also bounds the move away from the behaviour policy:
    a token whose rho = pi / pi_behav has left [1 - lo, 1 + hi] in the direction its advantage
    rewards keeps its loss value but gives no gradient (metric behaviour_clip_fraction). When
    the proximal policy is the current one and each batch gets one optimizer step (r = 1), the
    clip above never acts, so this is the only trust region: without it a stale sample keeps
    pushing a token that the updates since its sampling have already moved (async mode's
    failure to learn reverse_digits, README). The gradient is then PPO's, clipped around the
    behaviour policy."""
    ratio = jnp.exp(log_probs - old_log_probs)
    low, high = 1.0 - clip_low, 1.0 + clip_high
    advantage = advantages if advantages.ndim == 2 else advantages[:, None]
    unclipped = ratio * advantage
    clipped = jnp.clip(ratio, low, high) * advantage
    per_token = -jnp.minimum(unclipped, clipped)
    if behaviour_log_probs is not None:
        behaviour_weight = jax.lax.stop_gradient(jnp.exp(old_log_probs - behaviour_log_probs))
        per_token = per_token * behaviour_weight
        if behaviour_weight_cap is not None:
            mask = mask & (behaviour_weight <= behaviour_weight_cap)
        if behaviour_clip:
            rho = jax.lax.stop_gradient(jnp.exp(log_probs - behaviour_log_probs))
            beyond = ((rho < low) & (advantage < 0)) | ((rho > high) & (advantage > 0))
            per_token = jnp.where(beyond, jax.lax.stop_gradient(per_token), per_token)
    # The clip is active where it changed the minimum: the ratio left the trust region in the
    # direction the advantage rewards.
    was_clipped = ((ratio < low) & (advantage < 0)) | ((ratio > high) & (advantage > 0))
    metrics = {
        "clip_fraction": aggregate(
            was_clipped.astype(jnp.float32), mask, weights, "token_mean", max_new_tokens, totals
        )
    }
    if behaviour_log_probs is not None and behaviour_clip:
        metrics["behaviour_clip_fraction"] = aggregate(
            beyond.astype(jnp.float32), mask, weights, "token_mean", max_new_tokens, totals
        )
    if reference_log_probs is not None:
        kl = k3_kl(log_probs, reference_log_probs)
        per_token = per_token + kl_beta * kl
        metrics["kl"] = aggregate(kl, mask, weights, "token_mean", max_new_tokens, totals)
    loss = aggregate(per_token, mask, weights, aggregation, max_new_tokens, totals)
    return loss, metrics


# --- host reward terms ----------------------------------------------------------------------


def host_reward(
    fn: Callable[..., Sequence[float]],
    tokenizer: Any,
    name: str = "host",
    weight: float = 1.0,
    mesh: Any = None,
    table: PromptTable | None = None,
) -> RewardTerm:
    """A reward computed by ordinary Python on the host, `fn(prompts, completions, **columns)`
    (TRL's signature), called from inside the compiled step through `io_callback`.

    On a prompt file's task (`table` given: the `PromptTable` the task samples) `prompts` are the
    rows' prompts as the file gives them (strings or chat messages), `completions` the decoded
    completions (as `[{"role": "assistant", "content": ...}]` when the prompts are chat messages)
    and every other column of the rows arrives as a keyword argument. On a built-in digit task
    both are decoded text and the one column is `answer`.

    On a mesh every batch shard calls back with its own rows (under `shard_map`), so no device
    waits on another's host call: a callback pinned to one device inside a loop with collectives
    can deadlock the multi-device CPU runtime. Even so, a host reward on a multi-device *CPU* mesh
    hung once in our tests (jaxlib 0.10.2); on one device it is reliable."""

    qualified = f"{getattr(fn, '__module__', None)}:{getattr(fn, '__qualname__', None)}"
    function_name = f"reward function {qualified if 'None' not in qualified else repr(fn)}"

    def decode(tokens: Any, mask: Any) -> list[str]:
        return [tokenizer.decode(row[row_in]) for row, row_in in zip(tokens, mask, strict=True)]

    def score(prompts: list, completions: list[str], **columns: list) -> np.ndarray:
        # Through jaxrl.host, so a failure (an exception, or NaN rewards) reaches the user as one
        # line naming the function, not as a traceback of callback plumbing.
        values = host.call(function_name, fn, prompts, completions, **columns)
        return host.check_rewards(function_name, values, len(completions))

    def on_host_digits(prompt_tokens, prompt_mask, tokens, mask, answer_tokens, answer_length):
        answers = [a[:n] for a, n in zip(answer_tokens, answer_length, strict=True)]
        return score(
            decode(prompt_tokens, prompt_mask),
            decode(tokens, mask),
            answer=[tokenizer.decode(a) for a in answers],
        )

    def on_host_rows(rows, tokens, mask):
        picked = [table.rows[i] for i in rows]
        completions: list = decode(tokens, mask)
        if table.conversational:
            completions = [[{"role": "assistant", "content": c}] for c in completions]
        columns = {name: [row.columns[name] for row in picked] for name in table.column_names()}
        return score([row.prompt for row in picked], completions, **columns)

    on_rows = on_host_digits if table is None else on_host_rows

    def on_host(*arrays: Any) -> np.ndarray:
        # NumPy before anything iterates or slices them: the callback gets jax.Arrays, and a
        # loop over one dispatches a JAX computation (unstack) from inside the running program.
        # On a CPU whose thread pool has one thread (a process pinned to one core) the callback
        # holds that thread, the computation waits for it, and the update hangs for good.
        return on_rows(*(np.asarray(a) for a in arrays))

    def call_back(*arrays: Array) -> Array:
        shape = jax.ShapeDtypeStruct(arrays[0].shape[:1], jnp.float32)
        return io_callback(on_host, shape, *arrays, ordered=False)

    def reward(prompts: PromptBatch, completion: Completion) -> Array:
        if table is None:
            arrays = (prompts.tokens, prompts.mask, completion.tokens, completion.mask)
            arrays += (prompts.answer_tokens, prompts.answer_length)
        else:
            arrays = (prompts.row, completion.tokens, completion.mask)
        if mesh is None:
            return call_back(*arrays)
        rows = jax.sharding.PartitionSpec(sharding.BATCH_AXES)
        per_shard = jax.shard_map(
            call_back, mesh=mesh, in_specs=(rows,) * len(arrays), out_specs=rows, check_vma=False
        )
        return per_shard(*arrays)

    return RewardTerm(name, weight, reward)


# --- the rollout: prompts, completions, rewards, advantages ----------------------------------


def task_rewards(
    task: TextTask, prompts: PromptBatch, completion: Completion
) -> tuple[Array, dict[str, Array]]:
    """The task's reward of each completion [B], the weighted sum of its terms, and each term's
    batch mean as the metric `reward_<name>`."""
    metrics = {}
    rewards = jnp.zeros(completion.lengths.shape, jnp.float32)
    for term in task.reward_terms:
        value = term.fn(prompts, completion).astype(jnp.float32)
        metrics[f"reward_{term.name}"] = value.mean()
        rewards = rewards + term.weight * value
    return rewards, metrics


def make_rollout(
    config: Config, model: ModelConfig, task: TextTask, mesh: Any = None
) -> Callable[..., tuple[dict[str, Array], dict[str, Array]]]:
    """rollout(params, key, hparams, task_data=None) -> (the batch the update trains on, rollout
    metrics); `task_data` is the task's `data` (its prompt table) as the program received it."""
    config = static(config)
    sampling = config.sampling(task.eos_id, task.pad_id)
    greedy = dataclasses.replace(sampling, temperature=0.0)
    spec = config.spec

    def penalised_rewards(prompts: PromptBatch, completion: Completion, hp: HParams):
        rewards, metrics = task_rewards(task, prompts, completion)
        rewards = rewards + overlong_penalty(
            completion.lengths, config.max_new_tokens, config.overlong_buffer, hp.overlong_penalty
        )
        return rewards, metrics

    def rollout(params: Any, key: Array, hp: HParams, task_data: Any = None):
        prompt_key, sample_key = jax.random.split(key)
        # batch_size prompts, or with dynamic sampling oversample_factor times as many, of
        # which `keep_varied_groups` keeps batch_size.
        drawn = config.prompts_drawn
        prompts = task.sample_prompts(prompt_key, drawn, task_data)
        grouped = jax.tree.map(lambda x: jnp.repeat(x, config.group_size, axis=0), prompts)
        grouped = sharding.constrain_batch(grouped, mesh)
        # Each prompt is prefilled once; its G samples share its KV cache.
        completion = generate_in_chunks(
            lambda tokens, mask, key: generate(
                model,
                params,
                tokens,
                mask,
                key,
                sampling,
                mesh,
                group_size=config.group_size,
                row_buckets=config.decode_row_buckets,
            ),
            prompts.tokens,
            prompts.mask,
            sample_key,
            drawn // config.batch_size,
        )
        # One count over the parts (it is per call, not per row).
        completion = completion._replace(prefilled_tokens=jnp.sum(completion.prefilled_tokens))

        rewards, metrics = penalised_rewards(grouped, completion, hp)
        greedy_rewards = None
        if spec.baseline == "greedy":
            prompts = sharding.constrain_batch(prompts, mesh)
            # The greedy completion needs no randomness; the sample key is passed for its shape.
            baseline = generate(
                model, params, prompts.tokens, prompts.mask, sample_key, greedy, mesh
            )
            greedy_rewards, _ = penalised_rewards(prompts, baseline, hp)
            metrics["greedy_reward"] = greedy_rewards.mean()

        by_group = rewards.reshape(drawn, config.group_size)
        has_signal = group_has_signal(by_group, greedy_rewards)
        # The drawn completions' statistics: what the policy does, before any selection.
        ended_with_eos = jnp.any(completion.mask & (completion.tokens == task.eos_id), axis=1)
        metrics.update(
            reward=rewards.mean(),
            reward_std=jnp.std(by_group, axis=1, ddof=1).mean() if config.group_size > 1 else 0.0,
            zero_variance_fraction=1.0 - has_signal.mean(),
            completion_length=completion.lengths.mean(),
            ended_with_eos=ended_with_eos.mean(),
            # Prompt tokens the prefill ran: each drawn prompt once, not once per sample.
            prefilled_tokens=completion.prefilled_tokens,
        )
        if config.dynamic_sampling:
            kept, selection_metrics = keep_varied_groups(
                config, (grouped, completion, by_group, greedy_rewards, has_signal)
            )
            grouped, completion, by_group, greedy_rewards, has_signal = kept
            grouped = sharding.constrain_batch(grouped, mesh)
            metrics.update(selection_metrics)

        advantages = group_advantages(
            by_group, spec.baseline, spec.scale_by_std, config.std_eps, greedy_rewards
        )
        weights = jnp.ones_like(by_group)
        if spec.drop_zero_variance_groups:
            weights = jnp.broadcast_to(has_signal[:, None], by_group.shape).astype(jnp.float32)

        batch = {
            "tokens": jnp.concatenate([grouped.tokens, completion.tokens], axis=1),
            "attention_mask": jnp.concatenate([grouped.mask, completion.mask], axis=1),
            "completion_mask": completion.mask,
            "advantages": advantages.reshape(-1),
            "weights": weights.reshape(-1),
            # The sampler's log-probs, for the loss's logprob_mismatch metrics (every token was
            # sampled by the parameters the update starts from).
            "sampler_log_probs": completion.log_probs,
            "fresh_mask": completion.mask,
        }
        return batch, metrics

    return rollout


def generate_in_chunks(
    generate_fn: Callable[[Array, Array, Array], Completion],
    tokens: Array,
    mask: Array,
    key: Array,
    chunks: int,
) -> Completion:
    """`generate_fn(tokens, mask, key)` over the rows in `chunks` consecutive parts, one after
    the other (`lax.map`), so dynamic sampling's oversample_factor x more completions take one
    part's memory at a time; part i samples with split i of `key`. One part: a plain call."""
    if chunks == 1:
        return generate_fn(tokens, mask, key)
    parts = lambda x: x.reshape(chunks, x.shape[0] // chunks, *x.shape[1:])  # noqa: E731
    out = jax.lax.map(
        lambda args: generate_fn(*args), (parts(tokens), parts(mask), jax.random.split(key, chunks))
    )
    return jax.tree.map(lambda x: x.reshape(-1, *x.shape[2:]), out)


def keep_varied_groups(config: Config, drawn: tuple) -> tuple[tuple, dict[str, Array]]:
    """Dynamic sampling's selection inside the program: from the drawn (prompts, completions,
    rewards [drawn, group_size], greedy rewards or None, has_signal [drawn]) keep batch_size
    groups, those with signal first (`select_groups`). Metrics: groups_drawn, groups_varied
    (of those drawn), groups_kept_varied and groups_filled_uniform (kept without signal,
    because too few varied)."""
    grouped, completion, by_group, greedy_rewards, has_signal = drawn
    num_drawn = has_signal.shape[0]
    keep = select_groups(has_signal, config.batch_size)
    kept = take_groups(
        (grouped, completion, by_group, greedy_rewards, has_signal),
        keep,
        num_drawn,
        config.group_size,
    )
    return kept, selection_metrics(has_signal, kept[4])


def selection_metrics(drawn_has_signal: Array, kept_has_signal: Array) -> dict[str, Array]:
    """Dynamic sampling's per-update counts: groups_drawn, groups_varied (of those drawn),
    groups_kept_varied and groups_filled_uniform (kept without signal: too few varied)."""
    kept_varied = kept_has_signal.sum().astype(jnp.float32)
    return {
        "groups_drawn": jnp.float32(drawn_has_signal.shape[0]),
        "groups_varied": drawn_has_signal.sum().astype(jnp.float32),
        "groups_kept_varied": kept_varied,
        "groups_filled_uniform": kept_has_signal.shape[0] - kept_varied,
    }


def no_signal_monitor(
    name: str, patience: int, metric: str = "zero_variance_fraction", dynamic: bool = False
) -> Callable[[Any, Any], None]:
    """A host function `monitor(step, fraction)`, called once per update from inside the
    program with the fraction of drawn groups whose rewards were all equal (no gradient from
    them; the metric `metric`), that prints one warning line when it is above one half in
    `patience` consecutive updates, and again only after an update with signal. Updates may
    report out of order (unordered callbacks): it keeps each update's fraction by step. With
    `dynamic` (dynamic sampling already on) it suggests drawing more instead."""
    remedy = "raise --config.oversample_factor" if dynamic else "set --config.dynamic_sampling=True"
    fractions: dict[int, float] = {}
    warned_at: list[int] = []

    def monitor(step: Any, fraction: Any) -> None:
        steps = np.asarray(step).reshape(-1)
        values = np.asarray(fraction, dtype=np.float64).reshape(-1)
        # Several runs of one program (a sweep): the fraction over all of them.
        current = int(steps.max())
        fractions[current] = float(values.mean())
        streak = [fractions.get(current - i) for i in range(patience)]
        if any(value is None or value <= 0.5 for value in streak):
            return
        if warned_at and all(
            fractions.get(s, 1.0) > 0.5 for s in range(warned_at[-1], current + 1)
        ):
            return  # the same streak as the last warning
        warned_at.append(current)
        if jax.process_index() == 0:
            print(
                f"warning: {name}: more than half the prompt groups got the same reward for "
                f"every completion in {patience} consecutive updates ({metric} "
                f"{fractions[current]:.2f} in update {current + 1}), so they give no gradient; "
                f"{remedy}, raise group_size or temperature, or make the rewards finer or the "
                "prompts easier",
                file=sys.stderr,
            )

    return monitor


# --- the loss ---------------------------------------------------------------------------------


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


def make_loss(
    model: Transformer, config: Config, behaviour_clip: bool = False
) -> Callable[..., tuple[Array, dict]]:
    """`loss_fn(params, batch, hparams) -> (loss, metrics)` on a rollout batch of B completions.

    `batch` holds tokens and attention_mask [B, prompt + N], completion_mask [B, N], advantages
    and weights [B], and optionally old_log_probs and reference_log_probs [B, N] (absent: the
    current policy's, held constant; no KL penalty). `metrics`: clip_fraction, entropy and, with a
    reference, kl. With behaviour_log_probs in the batch, `behaviour_clip` is `policy_loss`'s.
    """
    config = static(config)
    spec = config.spec

    def loss_fn(params: Any, batch: dict[str, Array], hp: HParams):
        log_probs, entropy = completion_log_probs(model, params, batch, config.temperature)
        # A length bucket: its share of the micro-batch's loss and metrics (`normalisers`).
        bucketed = "norm_sequences" in batch
        totals = (batch["norm_sequences"][0], batch["norm_tokens"][0]) if bucketed else None
        # With one optimizer step per batch of samples the sampling policy is the current one,
        # so its log-probs are these, held constant (the ratio is 1, its gradient is not 0).
        old = batch.get("old_log_probs", jax.lax.stop_gradient(log_probs))
        loss, metrics = policy_loss(
            log_probs,
            old,
            batch["advantages"],
            batch["completion_mask"],
            batch["weights"],
            clip_low=hp.clip_low,
            clip_high=upper_clip(spec, hp.clip_low, hp.clip_high),
            aggregation=spec.aggregation,
            max_new_tokens=config.max_new_tokens,
            kl_beta=hp.kl_beta,
            reference_log_probs=batch.get("reference_log_probs"),
            # Present when the samples may be older than the proximal policy (partial
            # rollouts): AReaL's decoupled objective.
            behaviour_log_probs=batch.get("behaviour_log_probs"),
            totals=totals,
            behaviour_clip=behaviour_clip,
        )
        if "sampler_log_probs" in batch:
            count = batch["norm_fresh"][0] if bucketed else None
            metrics.update(
                log_prob_mismatch(batch["sampler_log_probs"], old, batch["fresh_mask"], count)
            )
        all_tokens = (None, batch["norm_all_tokens"][0]) if bucketed else None
        metrics["entropy"] = aggregate(
            entropy,
            batch["completion_mask"],
            jnp.ones_like(batch["weights"]),
            "token_mean",
            1,
            all_tokens,
        )
        return loss - hp.entropy_coef * metrics["entropy"], metrics

    return loss_fn


# --- GRPO: init and update -------------------------------------------------------------------


def check_memory(config: Config, model: ModelConfig, task: TextTask) -> None:
    """Refuse, in one line naming the setting to change, an update whose estimated peak memory
    per device (`jaxrl.lm.memory`) the device cannot hold; no check where the device does not
    report its memory (the CPU)."""
    if memory.device_memory() is None:
        return
    prompts = jax.eval_shape(
        lambda key: task.sample_prompts(key, config.batch_size, task.data), jax.random.key(0)
    )
    estimate = memory.grpo_estimate(config, model, prompts.tokens.shape[1])
    memory.check_fits(estimate, model, "one GRPO update")


class Inputs(NamedTuple):
    """What one update reads besides its state: the KL penalty's reference parameters (None: no
    penalty) and the task's `data`, the prompt table of a task made from a file (None for the
    built-in tasks, which draw prompts in JAX)."""

    reference_params: Any = None
    task_data: Any = None


def unpack_inputs(inputs: Inputs | None) -> Inputs:
    """An update's `inputs` (None: no reference, no prompt table); anything else is a TypeError
    that says what to pass."""
    if inputs is None:
        return Inputs()
    if not isinstance(inputs, Inputs):
        raise TypeError(
            f"grpo update: inputs are a {type(inputs).__name__}; pass "
            "grpo.Inputs(reference_params, task_data), or None"
        )
    return inputs


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


def normalisers(batch: dict[str, Array]) -> dict[str, Array]:
    """The batch with the denominators of its loss and metrics, computed over all its rows and
    repeated per row (so they follow the rows into length buckets): kept sequences, kept
    tokens, all completion tokens, fresh tokens (`aggregate`'s and `log_prob_mismatch`'s)."""
    rows = batch["weights"].shape[0]
    mask = batch["completion_mask"].astype(jnp.float32)
    kept_tokens = jnp.sum(mask * batch["weights"][:, None])
    values = {
        "norm_sequences": jnp.maximum(batch["weights"].sum(), 1.0),
        "norm_tokens": jnp.maximum(kept_tokens, 1.0),
        "norm_all_tokens": jnp.maximum(mask.sum(), 1.0),
    }
    if "fresh_mask" in batch:
        values["norm_fresh"] = jnp.maximum(batch["fresh_mask"].sum(), 1).astype(jnp.float32)
    return dict(batch, **{k: jnp.broadcast_to(v, (rows,)) for k, v in values.items()})


def make_length_buckets(config: Any, mesh: Any = None) -> training.LengthBuckets | None:
    """config.length_buckets as `training.LengthBuckets` over GRPO's batches (None when 0)."""
    if config.length_buckets == 0:
        return None
    return training.LengthBuckets(
        count=config.length_buckets,
        lengths=bucket_lengths(config.max_new_tokens),
        row_lengths=lambda batch: completion_extent(batch["completion_mask"]),
        cut=cut_batch,
        prepare=normalisers,
        mesh=mesh,
    )


def make_optimize(transformer: Transformer, loss_fn: Callable, config: Any, mesh: Any) -> Callable:
    """GRPO's optimizer steps on one sampled batch, as every rollout mode takes them:
    `optimize(state, batch, hp, shuffle_key, policy, reference_params) -> (state, step_metrics)`
    adds the old log-probs under `policy` (when samples are reused) and the reference's (when
    given) to the batch, then runs the minibatch epochs with this update's dropout stream.
    With config.length_buckets > 0 all three run in length buckets (`make_length_buckets`).
    With one optimizer step per batch no old log-prob pass runs: those log-probs are the
    loss's own, held constant (`make_loss`), and so are the proximal policy's of AReaL's
    decoupled objective in partial and async mode (the parameters the update starts from);
    forcing the pass changes nothing but the time (test_partial_rollouts)."""
    buckets = make_length_buckets(config, mesh)
    # The no-grad passes split the whole batch into sub-batches as small as training's.
    parts = config.length_buckets * config.num_minibatches * config.grad_accum_steps

    def no_grad_log_probs(params: Any, batch: dict[str, Array]) -> Array:
        if buckets is None:
            log_probs, _ = completion_log_probs(transformer, params, batch, config.temperature)
            return jax.lax.stop_gradient(log_probs)
        completion = batch["completion_mask"].shape[1]

        def at_length(part: dict[str, Array]) -> Array:
            log_probs, _ = completion_log_probs(transformer, params, part, config.temperature)
            # Zeros past the cut: no completion token sits there.
            return jnp.pad(log_probs, ((0, 0), (0, completion - log_probs.shape[1])))

        split, index, order = training.split_by_length(batch, buckets, parts)
        log_probs = jax.lax.map(
            lambda args: training.at_bucket_length(at_length, buckets, args[1], args[0]),
            (split, index),
        )
        # Back to the batch's row order.
        log_probs = (
            log_probs.reshape(-1, completion).at[order].set(log_probs.reshape(-1, completion))
        )
        return jax.lax.stop_gradient(log_probs)

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
        )  # fmt: skip

    return optimize


def make(
    config: Config, model: ModelConfig, task: TextTask, params: Any, mesh: Any = None
) -> Algorithm:
    """GRPO as pure functions of one run on `task`, starting from `params` (placed on `mesh`, if
    given): `init(key, hparams)` and `update(state, inputs, hparams)`, one rollout and
    num_epochs x num_minibatches optimizer steps on it. `inputs` is an `Inputs` (None: neither
    a reference model nor task data).

    Update i draws its prompts and samples from fold_in(state.key, i): the state's key never
    changes, so a resumed run repeats exactly what an uninterrupted one does. The reference
    parameters (None for no KL penalty) and the task's prompt table are inputs rather than part
    of the state, so checkpoints hold only what training changes. The update's metrics are
    scalars: the rollout's rewards (`reward`, `reward_<term>`, ...) and the optimizer steps'
    means (`loss`, `clip_fraction`, `entropy`, `kl`, `grad_norm`). With config.lora_rank > 0
    only LoRA adapters train and sampling uses the merged parameters (the state's `params`).
    """
    if config.rollout_mode == "partial":
        from algos import partial  # it builds on this module

        return partial.make(config, model, task, params, mesh)
    if config.rollout_mode == "async":
        from algos import asynchronous  # it builds on this module

        return asynchronous.make(config, model, task, params, mesh)
    check_memory(config, model, task)
    rollout = make_rollout(config, model, task, mesh)
    monitor = None
    if config.warn_no_signal_updates > 0:
        monitor = no_signal_monitor(
            f"GRPO ({config.variant})",
            config.warn_no_signal_updates,
            dynamic=config.dynamic_sampling,
        )
    transformer = Transformer(model, mesh=mesh)
    loss_fn = make_loss(transformer, config)
    config = static(config)
    optimize = make_optimize(transformer, loss_fn, config, mesh)

    def update(state: training.TrainState, inputs: Inputs | None, hp: HParams):
        reference_params, task_data = unpack_inputs(inputs)
        rollout_key, shuffle_key = jax.random.split(jax.random.fold_in(state.key, state.step))
        policy = sampled = state.params
        if isinstance(state, training.LoraTrainState):
            # The sampler reads plain weights in the compute dtype (its generation copy): merge
            # the adapters straight into that copy, one layer at a time. The old log-probs
            # read base and adapters as the loss does (`lora.attach`), so no fp32 merged copy
            # of the model is made.
            sampled = lora.merge(state.base, state.adapters, state.scale, dtype=model.dtype)
            policy = lora.attach(state.base, state.adapters, state.scale)
        batch, metrics = rollout(sampled, rollout_key, hp, task_data)
        state, step_metrics = optimize(state, batch, hp, shuffle_key, policy, reference_params)
        metrics.update(jax.tree.map(jnp.mean, step_metrics))
        if monitor is not None:
            jax.debug.callback(monitor, state.step, metrics["zero_variance_fraction"])
        return state._replace(step=state.step + 1), metrics

    return Algorithm(training.make_init(params, config, mesh, model), update)
