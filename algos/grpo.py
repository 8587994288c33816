"""GRPO and its relatives: generation, verifiable reward and policy update in one XLA program.

Group relative policy optimisation (Shao et al., 2024) needs no value network. Each prompt gets a
group of sampled completions, and a completion's advantage is its reward measured against the
rest of its group. One update, all of it inside one `jax.jit` and sharded over the mesh:

    prompts      <- the task's prompt sampler (pure JAX), batch_size of them
    completions  <- group_size samples per prompt from the KV-cache sampler (jaxrl.lm.sampler)
    rewards      <- a weighted sum of the task's reward terms (envs.text.TextTask): JAX
                    functions of the tokens, or host Python functions f(prompts, completions,
                    **columns) called through io_callback (`envs.text.reward_terms`); plus
                    DAPO's soft overlong penalty when overlong_buffer > 0
    advantages   <- reward minus the group's mean (or the leave-one-out mean), divided by the
                    group's standard deviation where the variant says so
    num_epochs x num_minibatches clipped policy-gradient steps on these samples:
        ratio = pi(token) / pi_old(token),  loss = -min(ratio * A, clip(ratio, 1 - lo, 1 + hi) * A)
        + kl_beta * k3(pi, pi_ref) per token, k3 = exp(ref - logp) - (ref - logp) - 1
        - entropy_coef * the mean entropy of the policy over the completion tokens
        + uniform_kl_coef * the mean KL(uniform over the vocabulary || pi) over them

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
- "gspo" (Zheng et al., 2025, "Group Sequence Policy Optimization"): GRPO's advantages, but one
  importance ratio per sequence, the geometric mean of its tokens' ratios
  s = exp(mean_t log(pi / pi_old)), clipped to [1 - clip_low, 1 + clip_high] and averaged over
  sequences. TRL: importance_sampling_level="sequence"; the paper clips at 3e-4 and 4e-4
  (clip_low=3e-4, clip_high=4e-4) with kl_beta=0. Like every ratio here it is 1 on the first
  step over fresh samples, so it differs from GRPO only with num_epochs or num_minibatches > 1
  (or stale samples).
- "cispo" (MiniMax, 2025, "MiniMax-M1", eq. 4): GRPO's advantages; no token leaves the
  gradient: each token's log-prob is weighted by its importance ratio clipped to
  [1 - clip_low, 1 + clip_high] and held constant, -sg(clip(r)) * A * log pi, one token mean
  over the batch. TRL: loss_type="cispo". The paper sets no lower bound (clip_low=1.0).

Dynamic sampling (DAPO's, `Config.dynamic_sampling`, with any variant; `algos.dynamic_sampling`):
the rollout draws oversample_factor x batch_size prompts, samples and scores all their groups,
and keeps batch_size groups, those with signal first, at fixed shapes, inside the program.

How generation meets training is a part passed to `make` (`algos.rollouts`): `Sync()` by
default, every update sampling its completions to the end; `algos.partial.Partial` (APRIL's
partial rollouts, unfinished completions carried in the state) and `algos.asynchronous.Async`
(AReaL's: generation and training on disjoint devices, staleness bounded).

The file reads top to bottom: `Config`; the pure pieces (`group_advantages`, `overlong_penalty`,
`policy_loss`) that tests compare with NumPy; the rollout; the loss; and `make`, GRPO as the
learner contract's `init` and `update`:

    task = make_task("reverse_digits", num_digits=3).text_task(tokenizer)   # prompts, rewards
    algorithm = grpo.make(config, model, task, params, mesh)                 # rollout=Sync()
    state = algorithm.init(jax.random.PRNGKey(seed), hparams)
    state, metrics = algorithm.update(state, grpo.Inputs(reference_params), hparams)

A user's prompt file becomes a task with `envs.text.prompt_dataset`; its token table travels in
`Inputs.task_data`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from algos import optimizer_steps
from algos.dynamic_sampling import group_has_signal, keep_varied_groups, validate_dynamic_sampling
from algos.rollouts import Learner, Sync
from envs.text import PromptBatch, TextTask
from envs.text.reward_terms import task_rewards
from jaxrl import sharding
from jaxrl.config import require, require_finite, require_in_range, require_positive
from jaxrl.hparams import HParams, static, swept
from jaxrl.lm import memory, sampler, training
from jaxrl.lm.log_probs import PER_ROW, LogProbPass, completion_log_probs, log_prob_mismatch
from jaxrl.lm.model import ModelConfig, Transformer
from jaxrl.lm.sampler import Completion, Sampling, generate, require_sampling
from jaxrl.loop import Algorithm

Array = jax.Array


class Variant(NamedTuple):
    """What distinguishes the algorithms in `VARIANTS`: advantage baseline, scaling, aggregation."""

    baseline: str  # "group_mean", "leave_one_out" or "greedy" (the greedy completion's reward)
    scale_by_std: bool  # divide advantages by the group's reward standard deviation
    aggregation: str  # "sequence_mean", "token_mean" or "constant_length"
    drop_zero_variance_groups: bool  # give groups with all-equal rewards weight 0 (DAPO)
    clip_high: float | None  # the default upper clip; None means the same as clip_low
    # What is clipped: "token_ratio" (PPO's min over each token's clipped ratio),
    # "sequence_ratio" (GSPO's one length-normalised ratio per sequence) or "weight" (CISPO's
    # clipped, constant importance weight on the log-prob).
    surrogate: str = "token_ratio"


VARIANTS = {
    "grpo": Variant("group_mean", True, "sequence_mean", False, None),
    "dr_grpo": Variant("group_mean", False, "constant_length", False, None),
    "dapo": Variant("group_mean", True, "token_mean", True, 0.28),
    "rloo": Variant("leave_one_out", False, "constant_length", False, None),
    "remax": Variant("greedy", False, "constant_length", False, None),
    "gspo": Variant("group_mean", True, "sequence_mean", False, None, "sequence_ratio"),
    "cispo": Variant("group_mean", True, "token_mean", False, None, "weight"),
}


@dataclasses.dataclass(frozen=True)
class GroupConfig(training.TrainConfig):
    """What GRPO and multi-turn GRPO (`algos.multiturn`) share on top of the optimisation
    settings: groups of samples per prompt, the clipped group-relative loss, sampling and
    dynamic sampling. `batch_size` counts prompts (games) per update; each gets `group_size`
    samples, split into `num_minibatches` optimizer steps per epoch, each accumulated over
    `grad_accum_steps` micro-batches. Fields marked `swept` may differ between the runs of one
    program (`jaxrl.hparams.sweep`)."""

    batch_size: int = 16  # prompts per update
    group_size: int = 8  # completions sampled per prompt
    # a key of VARIANTS: "grpo", "dr_grpo", "dapo", "rloo", "remax", "gspo" or "cispo"
    variant: str = "grpo"
    num_epochs: int = 1  # passes over each update's completions
    num_minibatches: int = 1  # optimizer steps per epoch
    clip_low: float = swept(0.2)  # the ratio's lower clip is 1 - clip_low
    clip_high: float = swept(0.0)  # 0: the variant's default (0.28 for DAPO, else clip_low)
    # Weight of the k3 KL penalty to the reference model, which the update gets as its input
    # (without one, no penalty is computed: the scripts pass it when kl_beta > 0).
    kl_beta: float = swept(0.0)
    entropy_coef: float = swept(0.0)  # token-entropy bonus; slows collapse onto one answer
    # With entropy_floor > 0 the bonus acts only while the mean token entropy is below it
    # (`entropy_bonus`): no pull toward uniform above the floor, a push back up below it.
    entropy_floor: float = swept(0.0)
    # Weight of KL(uniform over the vocabulary || policy) per token, the log-barrier regulariser
    # (`uniform_kl_penalty`): it pushes up every token's log-prob at a rate that does not fade
    # with the token's probability, so a token the policy has stopped sampling comes back.
    uniform_kl_coef: float = swept(0.0)
    # max_new_tokens, temperature (also applied to the trained log-probs), top_k, top_p; the
    # flags keep their flat names (--config.temperature).
    sampling: Sampling = dataclasses.field(default_factory=Sampling)
    std_eps: float = 1e-4  # added to the group's standard deviation before dividing
    # DAPO's dynamic sampling (`algos.dynamic_sampling`): draw oversample_factor x batch_size
    # prompts (each with its group), keep batch_size groups whose rewards vary, filling up with
    # uniform ones if too few vary; the update trains on batch_size x group_size either way.
    dynamic_sampling: bool = False
    oversample_factor: int = 2  # prompts drawn per kept prompt, with dynamic_sampling
    # A one-line warning when more than half the drawn groups carry no signal (all rewards
    # equal) in this many consecutive updates; 0 never warns.
    warn_no_signal_updates: int = 3

    def __post_init__(self) -> None:
        object.__setattr__(self, "mesh_shape", tuple(self.mesh_shape))
        self.validate_lora()
        require_positive(self, "learning_rate", "batch_size", "group_size", "num_epochs")
        require_positive(self, "num_minibatches", "grad_accum_steps", "num_steps", "max_grad_norm")
        require_sampling(self)
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
        # A coefficient of inf or NaN passed the >= 0 checks below, compiled, and stopped at
        # step 1 blaming the learning rate.
        coefficients = ("clip_high", "kl_beta", "entropy_coef", "entropy_floor", "uniform_kl_coef")
        require_finite(self, *coefficients, "weight_decay")
        require_in_range(self, "clip_low", 0.0, 1.0)  # 1.0: no lower bound
        require(self.clip_high >= 0, "clip_high", f"got {self.clip_high}", "use 0 or more")
        require(self.kl_beta >= 0, "kl_beta", f"got {self.kl_beta}", "use 0 (off) or more")
        require(
            self.entropy_coef >= 0,
            "entropy_coef",
            f"got {self.entropy_coef}",
            "use 0 (off) or more",
        )
        require(
            self.entropy_floor >= 0, "entropy_floor", f"got {self.entropy_floor}", "use 0 or more"
        )
        require(
            self.entropy_floor == 0 or self.entropy_coef > 0,
            "entropy_floor",
            f"{self.entropy_floor} with entropy_coef 0 does nothing",
            "set --config.entropy_coef too (e.g. 0.05), or entropy_floor=0 for no entropy bonus",
        )
        require(
            self.uniform_kl_coef >= 0,
            "uniform_kl_coef",
            f"got {self.uniform_kl_coef}",
            "use 0 (off) or more",
        )
        require(self.warmup_steps >= 0, "warmup_steps", f"got {self.warmup_steps}", "use 0 or more")
        require(self.weight_decay >= 0, "weight_decay", f"got {self.weight_decay}", "use 0 or more")
        validate_dynamic_sampling(self)
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


@dataclasses.dataclass(frozen=True)
class Config(GroupConfig):
    """GRPO's settings: the shared ones (`GroupConfig`), DAPO's overlong penalty and length
    buckets. How generation meets training is not a setting here but the rollout passed to
    `make` (`algos.rollouts`)."""

    overlong_buffer: int = 0  # DAPO's soft overlong penalty over the last N tokens; 0 is off
    overlong_penalty: float = swept(1.0)  # the penalty at max_new_tokens
    # Length-bucketed training (`algos.optimizer_steps`): 0 trains every row at prompt +
    # max_new_tokens positions; k > 0 splits each micro-batch into k sub-batches by completion
    # length, each run at the smallest of max_new_tokens / 8, / 4, / 2, / 1 that holds it. The
    # update is the same up to rounding; the old and reference log-prob passes use them too.
    length_buckets: int = 0
    # Each group's prompt runs through the model once per log-prob pass (the loss's forward and
    # backward, the old policy's, the reference's), its group_size completions packed after it
    # (`jaxrl.lm.log_probs.LogProbPass`): the same update up to rounding, with prompt x
    # (group_size - 1) fewer tokens per group. Minibatches then shuffle whole groups (not rows:
    # with num_minibatches > 1 a different draw of which completions step together), and every
    # micro-batch (length bucket) must hold whole groups on each batch shard. Off by default:
    # rounding alone redraws seed-sensitive runs, and the packed attention grows with
    # (prompt + group_size x max_new_tokens)^2, more than per row once completions are long.
    shared_prompt: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        new_tokens = self.sampling.max_new_tokens
        require(
            0 <= self.overlong_buffer < new_tokens,
            "overlong_buffer",
            f"got {self.overlong_buffer} with max_new_tokens={new_tokens}",
            "use 0 (off) or fewer tokens than max_new_tokens",
        )
        optimizer_steps.validate_length_buckets(self)
        optimizer_steps.validate_shared_prompt(self, self.length_buckets)
        shards = training.check_mesh_shape(self.mesh_shape)
        require(
            self.spec.baseline != "greedy" or self.batch_size % shards == 0,
            "batch_size",
            f"{self.batch_size} prompts, each with one greedy completion, do not split over the "
            f"mesh's data*fsdp = {shards} batch shards",
            f"make batch_size a multiple of {shards}",
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


def k3_kl(log_probs: Array, reference_log_probs: Array) -> Array:
    """Per-token k3 estimator of KL(pi || pi_ref) from samples of pi (Schulman, 2020): unbiased
    and never negative."""
    log_ratio = reference_log_probs - log_probs
    return jnp.exp(log_ratio) - log_ratio - 1.0


def entropy_bonus(entropy: Array, hp: HParams, share: float | Array = 1.0) -> Array:
    """The entropy term subtracted from the loss: entropy_coef x the mean token entropy, or with
    entropy_floor > 0, entropy_coef x min(entropy, entropy_floor), whose gradient is the bonus's
    while the entropy is below the floor and zero above it. A floor keeps the policy sampling
    alternatives where it would otherwise settle on one answer per prompt (all rewards of a
    group equal: no gradient) without pulling it toward uniform while it is still broad.

    In a step accumulated over parts (micro-batches, length buckets) `entropy` is these rows'
    share of the step's mean and `share` their share of its tokens: each part compares its own
    mean (entropy / share) with the floor, since the step's mean is not known until every part
    has run. That equals the step's floor whenever the parts' means lie on the same side of it."""
    own = entropy / jnp.maximum(share, 1e-12)
    above = (hp.entropy_floor > 0) & (own >= hp.entropy_floor)
    return hp.entropy_coef * jnp.where(above, share * hp.entropy_floor, entropy)


def uniform_kl_penalty(uniform_kl: Array, hp: HParams) -> Array:
    """The term added to the loss: uniform_kl_coef x the mean over tokens of KL(uniform || pi),
    which is -log(vocab) - the mean of log pi over the vocabulary: the log-barrier (relative
    entropy) regulariser of softmax policies in Agarwal, Kakade, Lee and Mahajan, "On the theory
    of policy gradient methods" (2020). Its gradient on a token's logit is uniform_kl_coef x
    (pi - 1/vocab) per position, so a token the policy has all but stopped sampling is pushed up
    at the same rate whatever its probability; an entropy bonus's push, pi x (-log pi -
    entropy), goes mostly to the alternatives already sampled and fades with the probability.
    The price: the policy keeps about uniform_kl_coef / (the advantage gap) of its mass off the
    best token."""
    return hp.uniform_kl_coef * uniform_kl


def regularisers(metrics: dict[str, Array], hp: HParams, share: float | Array = 1.0) -> Array:
    """What GRPO's and multi-turn GRPO's losses add to the policy loss, from the batch's token
    means `metrics["entropy"]` and `metrics["uniform_kl"]` (`regularised`'s; in a step of several
    parts, these rows' shares, `share` of the step's tokens): the uniform KL's penalty minus
    the entropy bonus."""
    bonus = entropy_bonus(metrics["entropy"], hp, share)
    return uniform_kl_penalty(metrics["uniform_kl"], hp) - bonus


def step_totals(batch: dict[str, Array]) -> tuple[Array, Array] | None:
    """`aggregate`'s totals (kept sequences, kept tokens) from the step's denominators on the
    batch (`optimizer_steps.normalisers`): these rows' share of the step's loss and metrics.
    None for a batch of its own (its own means)."""
    if "norm_sequences" not in batch:
        return None
    return batch["norm_sequences"][0], batch["norm_tokens"][0]


def regularised(
    loss: Array,
    metrics: dict[str, Array],
    batch: dict[str, Array],
    mask: str,
    per_token: tuple[Array, Array, Array],
    hp: HParams,
) -> tuple[Array, dict[str, Array]]:
    """GRPO's and multi-turn GRPO's policy `loss` with `regularisers` added, and its metrics
    with the sampler/trainer log-prob gap (where the batch records the sampler's) and the mean
    token entropy and KL(uniform || pi) over every token `batch[mask]` marks (kept or not);
    `per_token` is (old log-probs, entropy, uniform KL). With the step's denominators on the
    batch each is these rows' share of the step's."""
    old, entropy, uniform_kl = per_token
    in_step = "norm_all_tokens" in batch
    if "sampler_log_probs" in batch:
        count = batch["norm_fresh"][0] if in_step else None
        metrics.update(
            log_prob_mismatch(batch["sampler_log_probs"], old, batch["fresh_mask"], count)
        )
    count = (None, batch["norm_all_tokens"][0]) if in_step else None
    ones = jnp.ones(batch[mask].shape[0])
    metrics["entropy"] = aggregate(entropy, batch[mask], ones, "token_mean", 1, count)
    metrics["uniform_kl"] = aggregate(uniform_kl, batch[mask], ones, "token_mean", 1, count)
    share = 1.0
    if in_step:  # these rows' share of the step's tokens, for the entropy floor
        share = batch[mask].astype(jnp.float32).sum() / batch["norm_all_tokens"][0]
    return loss + regularisers(metrics, hp, share), metrics


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
    surrogate: str = "token_ratio",
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
    behaviour policy.

    `surrogate` (the variant's): "token_ratio" is the above. "sequence_ratio" is GSPO: every
    token's ratio is its sequence's s = exp(mean over its tokens of log(pi / pi_old)), written as
    GSPO-token writes it (sg(s) * pi / sg(pi): the value s, the gradient of the token's own
    log-prob times s), which with one advantage per sequence and sequence_mean aggregation is
    GSPO's sequence objective exactly, gradient included. "weight" is CISPO:
    -sg(clip(r, 1 - lo, 1 + hi)) * A * log pi; every token keeps a gradient, and clip_fraction
    counts the tokens whose weight was clipped."""
    log_ratio = log_probs - old_log_probs
    if surrogate == "sequence_ratio":
        token_mask = mask.astype(jnp.float32)
        sequence = jnp.sum(log_ratio * token_mask, axis=1) / jnp.maximum(token_mask.sum(axis=1), 1)
        log_ratio = jax.lax.stop_gradient(sequence)[:, None] + (
            log_probs - jax.lax.stop_gradient(log_probs)
        )
    ratio = jnp.exp(log_ratio)
    low, high = 1.0 - clip_low, 1.0 + clip_high
    advantage = advantages if advantages.ndim == 2 else advantages[:, None]
    if surrogate == "weight":
        weight = jax.lax.stop_gradient(jnp.clip(ratio, low, high))
        per_token = -weight * advantage * log_probs
    else:
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
    # direction the advantage rewards (CISPO's: wherever the weight was clipped).
    if surrogate == "weight":
        was_clipped = (ratio < low) | (ratio > high)
    else:
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


# --- the rollout: prompts, completions, rewards, advantages ----------------------------------


def make_rollout(
    config: Config,
    model: ModelConfig,
    task: TextTask,
    mesh: Any = None,
    decode_row_buckets: int = 0,
) -> Callable[..., tuple[dict[str, Array], dict[str, Array]]]:
    """rollout(params, key, hparams, task_data=None) -> (the batch the update trains on, rollout
    metrics); `task_data` is the task's `data` (its prompt table) as the program received it.
    `decode_row_buckets`: the sampler's (`algos.rollouts.Sync`)."""
    config = static(config)
    sampling = config.sampling.for_tokens(task.eos_id, task.pad_id)
    new_tokens = sampling.max_new_tokens
    greedy = dataclasses.replace(sampling, temperature=0.0)
    spec = config.spec

    def penalised_rewards(prompts: PromptBatch, completion: Completion, hp: HParams):
        rewards, metrics = task_rewards(task, prompts, completion)
        rewards = rewards + overlong_penalty(
            completion.lengths, new_tokens, config.overlong_buffer, hp.overlong_penalty
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
        completion = sampler.generate_in_chunks(
            lambda tokens, mask, key: generate(
                model,
                params,
                tokens,
                mask,
                key,
                sampling,
                mesh,
                group_size=config.group_size,
                row_buckets=decode_row_buckets,
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
            candidates = (grouped, completion, by_group, greedy_rewards)
            kept, has_signal, selected = keep_varied_groups(
                candidates, has_signal, config.batch_size, config.group_size
            )
            grouped, completion, by_group, greedy_rewards = kept
            grouped = sharding.constrain_batch(grouped, mesh)
            metrics.update(selected)

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


# --- the loss ---------------------------------------------------------------------------------


def make_loss(
    model: Transformer,
    config: Config,
    behaviour_clip: bool = False,
    log_prob_pass: LogProbPass = PER_ROW,
) -> Callable[..., tuple[Array, dict]]:
    """`loss_fn(params, batch, hparams) -> (loss, metrics)` on a rollout batch of B completions.

    `batch` holds tokens and attention_mask [B, prompt + N], completion_mask [B, N], advantages
    and weights [B], and optionally old_log_probs and reference_log_probs [B, N] (absent: the
    current policy's, held constant; no KL penalty). `metrics`: clip_fraction, entropy and, with a
    reference, kl. With behaviour_log_probs in the batch, `behaviour_clip` is `policy_loss`'s.
    `log_prob_pass`: every row's prompt (default) or each group's once
    (`optimizer_steps.log_prob_pass`).
    """
    config = static(config)
    spec = config.spec
    temperature = config.sampling.temperature

    def loss_fn(params: Any, batch: dict[str, Array], hp: HParams):
        log_probs, entropy, uniform_kl = log_prob_pass(model, params, batch, temperature)
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
            max_new_tokens=config.sampling.max_new_tokens,
            kl_beta=hp.kl_beta,
            reference_log_probs=batch.get("reference_log_probs"),
            # Present when the samples may be older than the proximal policy (partial
            # rollouts): AReaL's decoupled objective.
            behaviour_log_probs=batch.get("behaviour_log_probs"),
            totals=step_totals(batch),
            behaviour_clip=behaviour_clip,
            surrogate=spec.surrogate,
        )
        return regularised(loss, metrics, batch, "completion_mask", (old, entropy, uniform_kl), hp)

    return loss_fn


# --- GRPO: init and update -------------------------------------------------------------------


def check_memory(
    config: Config, model: ModelConfig, task: TextTask, slot_groups: int = 0, budget: int = 0
) -> None:
    """Refuse, in one line naming the setting to change, an update whose estimated peak memory
    per device (`jaxrl.lm.memory`) the device cannot hold; no check where the device does not
    report its memory (the CPU). `slot_groups` and `budget`: partial rollouts' carried slots
    and decode steps per update (0: none)."""
    if memory.device_memory() is None:
        return
    prompts = jax.eval_shape(
        lambda key: task.sample_prompts(key, config.batch_size, task.data), jax.random.key(0)
    )
    estimate = memory.grpo_estimate(
        config, model, prompts.tokens.shape[1], slot_groups=slot_groups, budget=budget
    )
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


def learner(
    config: Config, model: ModelConfig, task: TextTask, params: Any, mesh: Any = None
) -> Learner:
    """GRPO's pieces as every rollout mode assembles them (`algos.rollouts.Learner`): the
    synchronous rollout on a given mesh, the optimizer steps (with or without the clip around
    the behaviour policy), the inputs' unpacking and the trainer's log-probs."""
    transformer = Transformer(model, mesh=mesh)
    temperature = config.sampling.temperature
    # Every pass of the update, the loss's and the no-grad ones, is this one (per row, or each
    # group's prompt once: config.shared_prompt).
    log_prob_pass = optimizer_steps.log_prob_pass(config)

    def optimize_for(behaviour_clip: bool) -> Callable:
        loss_fn = make_loss(transformer, config, behaviour_clip, log_prob_pass)
        return optimizer_steps.make_optimize(
            transformer, loss_fn, static(config), mesh, log_prob_pass
        )

    def trainer_log_probs(on: Any) -> Callable[[Any, dict], Array]:
        return lambda params, batch: completion_log_probs(
            Transformer(model, mesh=on), params, batch, temperature
        )[0]

    return Learner(
        name=f"GRPO ({config.variant})", config=config, model=model, params=params, mesh=mesh,
        source=task, sampling=config.sampling.for_tokens(task.eos_id, task.pad_id),
        make_rollout=lambda on, row_buckets: make_rollout(config, model, task, on, row_buckets),
        make_optimize=optimize_for, unpack_inputs=unpack_inputs,
        make_trainer_log_probs=trainer_log_probs,
        check_memory=lambda: check_memory(config, model, task), data=task.data,
    )  # fmt: skip


def check_rollout(config: Config, rollout: Any) -> None:
    """A rollout mode's settings against GRPO's Config (one-line ConfigErrors)."""
    rollout.check(config)


def make(
    config: Config,
    model: ModelConfig,
    task: TextTask,
    params: Any,
    mesh: Any = None,
    rollout: Any = None,
) -> Algorithm:
    """GRPO as pure functions of one run on `task`, starting from `params` (placed on `mesh`, if
    given): `init(key, hparams)` and `update(state, inputs, hparams)`, one rollout and
    num_epochs x num_minibatches optimizer steps on it. `inputs` is an `Inputs` (None: neither
    a reference model nor task data). `rollout` is how generation meets training
    (`algos.rollouts`): `Sync()` when None, `algos.partial.Partial(...)`, or
    `algos.asynchronous.Async(...)` (whose `update` is a host function: call it, do not jit it).

    Update i draws its prompts and samples from fold_in(state.key, i): the state's key never
    changes, so a resumed run repeats exactly what an uninterrupted one does. The reference
    parameters (None for no KL penalty) and the task's prompt table are inputs rather than part
    of the state, so checkpoints hold only what training changes. The update's metrics are
    scalars: the rollout's rewards (`reward`, `reward_<term>`, ...) and the optimizer steps'
    means (`loss`, `clip_fraction`, `entropy`, `kl`, `grad_norm`). With config.lora_rank > 0
    only LoRA adapters train and sampling uses the merged parameters (the state's `params`).
    """
    rollout = Sync() if rollout is None else rollout
    check_rollout(config, rollout)
    return rollout.make(learner(config, model, task, params, mesh))
