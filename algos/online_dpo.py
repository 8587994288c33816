"""Online DPO: preference pairs sampled from the current policy and ranked by a reward, then
the DPO loss, all in one XLA program per update.

Offline DPO (`algos/dpo.py`) learns from a fixed dataset of pairs written by other policies.
Online (or iterative) DPO (Guo et al., 2024, "Direct Language Model Alignment from Online AI
Feedback"; Xiong et al., 2024, "RLHF Workflow") labels the policy's own samples as it trains:

    prompts      <- batch_size from the task's prompt sampler
    completions  <- num_samples samples per prompt from the current policy (KV-cache sampler)
    scores       <- a reward model's (an ensemble's, combined by `ensemble_rule`) or the task's
                    reward; minus missing_eos_penalty for a completion that never ended
    pairs        <- per prompt, the best-scored sample is chosen and the worst rejected
                    (`best_and_worst`); a prompt whose samples all score the same gives no pair
                    and weighs 0 in the loss (with label_noise > 0 the noise breaks such ties
                    at random, as a noisy annotator would)
    update       <- num_epochs x num_minibatches optimizer steps on any of dpo.py's losses
                    (sigmoid, ipo, simpo), the reference's log-probs computed in the step

    algorithm = online_dpo.make(config, model, task, sft_params, reward_model_config=rm)
    state = algorithm.init(jax.random.PRNGKey(seed), hparams)
    state, metrics = algorithm.update(state, online_dpo.Inputs(sft_params, rm_params), hparams)
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from algos import dpo, ppo_lm, reward_model
from algos.dynamic_sampling import (
    no_signal_monitor,
    select_groups,
    selection_metrics,
    validate_dynamic_sampling,
)
from envs.text import TextTask
from envs.text.reward_terms import task_rewards
from jaxrl import sharding
from jaxrl.config import require, require_positive
from jaxrl.hparams import HParams, static, swept
from jaxrl.lm import training
from jaxrl.lm.log_probs import LogProbPass
from jaxrl.lm.model import ModelConfig, Transformer
from jaxrl.lm.sampler import Sampling, generate, require_sampling
from jaxrl.loop import Algorithm

Array = jax.Array
LABEL_NOISE_STREAM = 0x1AB  # fold_in tag of an update's key for the simulated annotator's noise


@dataclasses.dataclass(frozen=True)
class Config(dpo.Config):
    """dpo.py's loss settings, plus the sampling of the pairs. `batch_size` counts prompts per
    update (one pair each), split into `num_minibatches` optimizer steps per epoch."""

    batch_size: int = 16  # prompts (= pairs) per update
    num_samples: int = 2  # completions per prompt; the best and the worst make the pair
    num_epochs: int = 1
    num_minibatches: int = 1
    missing_eos_penalty: float = swept(0.0)  # subtracted from the score of an unended completion
    # > 0: Gumbel noise of this scale is added to every score before the ranking, a simulated
    # noisy annotator: with two samples the first is then chosen with the Bradley-Terry
    # probability sigmoid((s1 - s2) / label_noise). 0 ranks by the scores themselves.
    label_noise: float = swept(0.0)
    ensemble_rule: str = "mean"  # how a reward-model ensemble's scores combine
    ensemble_std_coefficient: float = swept(1.0)  # k of "mean_minus_std"
    # max_new_tokens, temperature, top_k, top_p (flags keep their flat names)
    sampling: Sampling = dataclasses.field(default_factory=Sampling)
    reference: str = "in_step"  # on-policy samples: the reference runs in the step
    # DAPO-style dynamic sampling (as in grpo.py): draw oversample_factor x batch_size prompts
    # and keep batch_size pairs, those with a preference (not every sample scored the same)
    # first. A one-line warning when more than half the drawn pairs are tied in
    # warn_no_signal_updates consecutive updates (0: never).
    dynamic_sampling: bool = False
    oversample_factor: int = 2
    warn_no_signal_updates: int = 3
    # Each pair's two completions follow the same prompt: with shared_prompt the policy's and the
    # reference's passes run each pair as one sequence, its prompt once and both completions
    # after it (`score_pairs_sharing_prompt`), prompt fewer tokens a pair; the same loss and
    # gradients up to rounding. Off by default, as GRPO's: rounding alone redraws a run.
    shared_prompt: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        require_positive(self, "num_epochs", "num_minibatches")
        validate_dynamic_sampling(self)
        require_sampling(self)
        require(
            self.num_samples >= 2,
            "num_samples",
            f"got {self.num_samples}; a pair needs two completions of the prompt",
            "use 2 or more",
        )
        require(
            self.reference == "in_step",
            "reference",
            "online pairs are sampled during training, so there is no dataset to precompute the "
            "reference's log-probs over",
            "set reference='in_step'",
        )
        require(
            self.ensemble_rule in reward_model.ENSEMBLE_RULES,
            "ensemble_rule",
            f"unknown rule {self.ensemble_rule!r}",
            f"choose one of {reward_model.ENSEMBLE_RULES}",
        )
        require(self.label_noise >= 0, "label_noise", f"got {self.label_noise}", "use 0 or more")
        require(
            self.missing_eos_penalty >= 0,
            "missing_eos_penalty",
            f"got {self.missing_eos_penalty}",
            "use 0 or more",
        )
        steps = self.num_minibatches * self.grad_accum_steps
        require(
            self.batch_size % steps == 0,
            "num_minibatches",
            f"num_minibatches * grad_accum_steps = {steps} does not divide the {self.batch_size} "
            "pairs per update (batch_size)",
            "choose them so their product divides batch_size",
        )
        shards = training.check_mesh_shape(self.mesh_shape)
        require(
            (self.batch_size // steps) % shards == 0 and self.batch_size % shards == 0,
            "batch_size",
            f"micro-batches of {self.batch_size // steps} pairs do not split over the mesh's "
            f"data*fsdp = {shards} batch shards",
            f"make batch_size / (num_minibatches * grad_accum_steps) a multiple of {shards}",
        )


def best_and_worst(scores: Array) -> tuple[Array, Array, Array]:
    """From scores [num_prompts, num_samples]: the index of each prompt's best-scored sample
    (chosen; the first of equals), of its worst (rejected; the last of equals), and the pair's
    weight, 0 where every sample scored the same (no preference to learn from)."""
    chosen = jnp.argmax(scores, axis=1)
    last = scores.shape[1] - 1
    rejected = last - jnp.argmin(jnp.flip(scores, axis=1), axis=1)
    weight = (jnp.max(scores, axis=1) > jnp.min(scores, axis=1)).astype(jnp.float32)
    return chosen, rejected, weight


def score_pairs_sharing_prompt(
    model: Transformer, params: Any, batch: dict[str, Array], new_tokens: int
) -> dict[str, Array]:
    """`dpo.score_pairs` of sampled pairs, whose sides are [prompt | completion] rows with the
    same left-padded prompt in their first columns and `new_tokens` completion columns after it:
    each pair runs as one sequence, [prompt, chosen, rejected], the prompt once
    (`LogProbPass(2)`), each completion attending to the prompt and to itself. The same summed
    log-probs and lengths of the loss-masked tokens, up to rounding."""
    total = batch["chosen_tokens"].shape[1]

    def interleaved(name: str) -> Array:
        """[pairs, total] x 2 -> [2 x pairs, total]: rows chosen 0, rejected 0, chosen 1, ..."""
        both = jnp.stack([batch[f"chosen_{name}"], batch[f"rejected_{name}"]], axis=1)
        return both.reshape(-1, total)

    scored = interleaved("loss_mask")[:, -new_tokens:]
    rows = {
        "tokens": interleaved("tokens"),
        "attention_mask": interleaved("attention_mask"),
        "completion_mask": scored,
    }
    log_probs = LogProbPass(2)(model, params, rows, 1.0).log_probs
    sums = jnp.sum(log_probs * scored, axis=1).reshape(-1, 2)
    lengths = scored.sum(axis=1).astype(jnp.float32).reshape(-1, 2)
    return {
        "chosen": sums[:, 0],
        "rejected": sums[:, 1],
        "chosen_length": lengths[:, 0],
        "rejected_length": lengths[:, 1],
    }


class Inputs(NamedTuple):
    """What one update reads besides its state: the reference's parameters (the SFT model; unused
    by SimPO), the reward model's (None: the task's reward) and the task's `data`."""

    reference_params: Any
    reward_params: Any = None
    task_data: Any = None


def step_pairs(batch: dict[str, Array]) -> dict[str, Array]:
    """The denominator of online DPO's loss over an optimizer step's whole batch: its pairs that
    carry a preference. A micro-batch's loss is then its share of one mean over the step
    (`training.accumulated_gradient`): with tied pairs left out, micro-batches keep different
    numbers of pairs, and averaging their own means would weigh pairs unequally."""
    return {"norm_pairs": jnp.maximum(batch["weight"].sum(), 1.0)}


def make(
    config: Config,
    model: ModelConfig,
    task: TextTask,
    params: Any,
    mesh: Any = None,
    reward_model_config: ModelConfig | None = None,
) -> Algorithm:
    """Online DPO as pure functions of one run on `task` from `params` (on `mesh`, if given):
    `init(key, hparams)` and `update(state, inputs, hparams)`. Update i samples from
    fold_in(state.key, i). Metrics: `score` (mean over all samples), `pair_score_gap` (chosen
    minus rejected score, over pairs with a preference), `tied_fraction`, the task's `reward` and
    `reward_<term>`, `completion_length`, and the optimizer steps' means of `loss`,
    `reward_accuracy`, `reward_margin` (dpo.py's implicit rewards) and the answers' log-probs."""
    transformer = Transformer(model, mesh=mesh)
    scores_of = (
        ppo_lm.make_reward_model_scores(reward_model_config, mesh) if reward_model_config else None
    )
    config = static(config)
    sampling = config.sampling.for_tokens(task.eos_id, task.pad_id)
    samples = config.num_samples
    monitor = None
    if config.warn_no_signal_updates > 0:
        monitor = no_signal_monitor(
            "online DPO", config.warn_no_signal_updates, "tied_fraction", config.dynamic_sampling
        )

    if config.shared_prompt:
        new_tokens = config.sampling.max_new_tokens

        def score_pairs(model: Transformer, params: Any, batch: dict[str, Array]):
            return score_pairs_sharing_prompt(model, params, batch, new_tokens)
    else:
        score_pairs = dpo.score_pairs

    def loss_fn(params: Any, batch: dict[str, Array], hp: HParams, reference_params: Any):
        """dpo.py's loss, averaged over the pairs that carry a preference (weight 1): over the
        step's (`step_pairs`, on every row), these pairs' share of that mean."""
        policy = score_pairs(transformer, params, batch)
        if config.uses_reference:
            reference = score_pairs(transformer, jax.lax.stop_gradient(reference_params), batch)
        else:
            reference = {side: jnp.zeros_like(policy[side]) for side in ("chosen", "rejected")}
        losses, chosen_reward, rejected_reward = dpo.preference_loss(
            policy["chosen"],
            policy["rejected"],
            reference["chosen"],
            reference["rejected"],
            # A tied pair's answers score 0 tokens (its loss masks are zeroed); SimPO divides.
            jnp.maximum(policy["chosen_length"], 1),
            jnp.maximum(policy["rejected_length"], 1),
            config.loss_type,
            hp.beta,
            hp.label_smoothing,
            hp.simpo_gamma,
        )
        weight = batch["weight"]
        count = batch["norm_pairs"][0] if "norm_pairs" in batch else jnp.maximum(weight.sum(), 1.0)
        mean = lambda x: jnp.sum(x * weight) / count  # noqa: E731
        metrics = {
            "reward_accuracy": mean((chosen_reward > rejected_reward).astype(jnp.float32)),
            "reward_margin": mean(chosen_reward - rejected_reward),
            "chosen_log_prob": mean(policy["chosen"]),
            "rejected_log_prob": mean(policy["rejected"]),
        }
        return mean(losses), metrics

    def pairs(state: Any, inputs: Inputs, key: Array, hp: HParams):
        prompt_key, sample_key = jax.random.split(key)
        noise_key = jax.random.fold_in(key, LABEL_NOISE_STREAM)
        drawn = config.batch_size * (config.oversample_factor if config.dynamic_sampling else 1)
        prompts = task.sample_prompts(prompt_key, drawn, inputs.task_data)
        grouped = jax.tree.map(lambda x: jnp.repeat(x, samples, axis=0), prompts)
        grouped = sharding.constrain_batch(grouped, mesh)
        # Each prompt is prefilled once; its samples share its KV cache.
        completion = generate(
            model,
            state.params,
            prompts.tokens,
            prompts.mask,
            sample_key,
            sampling,
            mesh,
            group_size=samples,
        )
        tokens = jnp.concatenate([grouped.tokens, completion.tokens], axis=1)
        attention_mask = jnp.concatenate([grouped.mask, completion.mask], axis=1)
        task_reward, metrics = task_rewards(task, grouped, completion)
        metrics["reward"] = task_reward.mean()
        if scores_of is None:
            scores = task_reward
        else:
            scores = scores_of(
                inputs.reward_params, tokens, attention_mask, hp, config.ensemble_rule
            )
        ended = jnp.any(completion.mask & (completion.tokens == task.eos_id), axis=1)
        scores = scores - hp.missing_eos_penalty * (1.0 - ended.astype(jnp.float32))

        by_prompt = scores.reshape(drawn, samples)
        noise = jax.random.gumbel(noise_key, by_prompt.shape) * hp.label_noise
        chosen, rejected, weight = best_and_worst(by_prompt + noise)
        metrics["tied_fraction"] = 1.0 - weight.mean()  # of the drawn pairs
        prompt_index = jnp.arange(config.batch_size)
        if config.dynamic_sampling:
            # Keep batch_size of the drawn prompts' pairs, those with a preference first.
            prompt_index = select_groups(weight > 0, config.batch_size)
            metrics.update(selection_metrics(weight > 0, weight[prompt_index] > 0))
            chosen, rejected, weight = (
                chosen[prompt_index],
                rejected[prompt_index],
                weight[prompt_index],
            )
            by_prompt = by_prompt[prompt_index]
        rows = prompt_index * samples
        loss_mask = jnp.concatenate([jnp.zeros_like(grouped.mask), completion.mask], axis=1)
        batch = {"weight": weight}
        for side, index in (("chosen", rows + chosen), ("rejected", rows + rejected)):
            batch[f"{side}_tokens"] = tokens[index]
            batch[f"{side}_attention_mask"] = attention_mask[index]
            # A tied pair's loss masks are zeroed (and its weight is 0): nothing to score.
            batch[f"{side}_loss_mask"] = loss_mask[index] * weight[:, None].astype(bool)
        gap = jnp.take_along_axis(by_prompt, chosen[:, None], 1) - jnp.take_along_axis(
            by_prompt, rejected[:, None], 1
        )
        metrics.update(
            score=scores.mean(),
            pair_score_gap=jnp.sum(gap[:, 0] * weight) / jnp.maximum(weight.sum(), 1.0),
            completion_length=completion.lengths.mean(),
            ended_with_eos=ended.mean(),
        )
        return batch, metrics

    def update(state: Any, inputs: Inputs, hp: HParams):
        if not isinstance(inputs, Inputs):
            raise TypeError(
                f"online_dpo update: inputs are a {type(inputs).__name__}; pass "
                "online_dpo.Inputs(reference_params, reward_params, task_data)"
            )
        if scores_of is not None and inputs.reward_params is None:
            raise ValueError(
                "online_dpo update: made with a reward model, but Inputs.reward_params is None; "
                "pass its parameters, or make the algorithm without reward_model_config"
            )
        sample_key, shuffle_key = jax.random.split(jax.random.fold_in(state.key, state.step))
        batch, metrics = pairs(state, inputs, sample_key, hp)
        batch = jax.lax.stop_gradient(batch)

        # LoRA dropout: one mask per optimizer step, from this update's own stream.
        dropout_key = jax.random.fold_in(
            jax.random.fold_in(state.key, state.step), training.DROPOUT_STREAM
        )

        state, step_metrics = training.minibatch_epochs(
            lambda p, micro: loss_fn(p, micro, hp, inputs.reference_params), state, batch, hp,
            config, shuffle_key, config.num_epochs, config.num_minibatches, mesh, dropout_key,
            denominators=step_pairs,
        )  # fmt: skip
        metrics.update(jax.tree.map(jnp.mean, step_metrics))
        if monitor is not None:
            jax.debug.callback(monitor, state.step, metrics["tied_fraction"])
        return state._replace(step=state.step + 1), metrics

    return Algorithm(training.make_init(params, config, mesh, model), update)
