"""PPO for language models (RLHF): generation, reward, values and the update in one XLA program.

The setup of InstructGPT (Ouyang et al., 2022) and of "Secrets of RLHF in Large Language Models
Part I: PPO" (Zheng et al., 2023). The completion is an episode: the state is the prompt and the
tokens so far, the action is the next token. One update, all inside one `jax.jit`:

    prompts       <- batch_size from the task's prompt sampler
    completions   <- one sample per prompt from the KV-cache sampler (jaxrl.lm.sampler)
    scores        <- the reward model's score of prompt + completion (an ensemble's, combined by
                     `ensemble_rule`), or without one the task's verifiable reward; minus
                     missing_eos_penalty for a completion that never ended
    old log-probs and values <- one forward pass of the policy with its value head (a second
                     pass for a separate critic); reference log-probs <- the reference model
    token rewards r_t = -kl_coef * (log pi_old(y_t) - log pi_ref(y_t)), plus the score on the
                     completion's last token (the KL penalty folded into the reward)
    advantages, returns <- GAE over the completion's tokens (gamma, gae_lambda), whitened over
                     the batch's tokens
    num_epochs x num_minibatches optimizer steps on the clipped surrogate plus vf_coef x the
                     clipped value loss
    kl_coef       <- the adaptive controller of Ziegler et al. (2019) when target_kl > 0

The completion's last token is terminal: EOS ends the episode, and at max_new_tokens the reward
model scores the text as it stands. The length limit belongs to the environment, and no reward
comes after it, so nothing is bootstrapped past it.

The file reads top to bottom: `Config`; the pure pieces tests compare with NumPy
(`kl_penalized_rewards`, `token_gae`, `masked_whiten`, `ppo_lm_losses`, `adaptive_kl_coef`); the
parameters (policy plus value head or critic); the forward pass; and `make`, the learner
contract's `init` and `update`:

    params = ppo_lm.init_params(sft_params, model, key)                  # policy + value head
    algorithm = ppo_lm.make(config, model, task, params, mesh, reward_model=rm_config)
    state = algorithm.init(jax.random.PRNGKey(seed), hparams)
    state, metrics = algorithm.update(state, ppo_lm.Inputs(sft_params, rm_params), hparams)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from algos import ppo, reward_model
from envs.text import TextTask
from envs.text.reward_terms import task_rewards
from jaxrl import sharding
from jaxrl.config import require, require_in_range, require_positive
from jaxrl.hparams import HParams, static, swept
from jaxrl.lm import training
from jaxrl.lm.log_probs import completion_log_probs
from jaxrl.lm.model import ModelConfig, Transformer, head_logits, token_statistics
from jaxrl.lm.sampler import Sampling, generate, require_sampling
from jaxrl.loop import Algorithm

Array = jax.Array

CRITICS = ("value_head", "separate")
KL_HORIZON = 10_000  # Ziegler et al.'s horizon of the adaptive KL controller, in completions


# --- 1. configuration --------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Config(training.TrainConfig):
    """PPO settings on top of the shared optimisation ones. `batch_size` counts prompts per update,
    one completion each, split into `num_minibatches` optimizer steps per epoch (each accumulated
    over `grad_accum_steps` micro-batches). Defaults follow TRL's PPO trainer where it has the
    setting. Fields marked `swept` may differ between the runs of one program."""

    batch_size: int = 16  # prompts (= completions) per update
    # "value_head": a linear value head on the policy's own final hidden states, trained through
    # the shared backbone; "separate": a critic transformer of its own (`init_params`).
    critic: str = "value_head"
    num_epochs: int = 4  # passes over each update's completions
    num_minibatches: int = 1  # optimizer steps per epoch
    clip_ratio: float = swept(0.2)  # the policy ratio is clipped to [1 - c, 1 + c]
    clip_value: float = swept(0.2)  # the new value stays within this of the old one
    vf_coef: float = swept(0.1)  # weight of the value loss
    gamma: float = swept(1.0)  # discount over the completion's tokens
    gae_lambda: float = swept(0.95)
    kl_coef: float = swept(0.05)  # the KL penalty's weight in the reward (the start, if adaptive)
    # > 0: adapt kl_coef towards this sequence KL to the reference (Ziegler et al., 2019); 0 keeps
    # it fixed.
    target_kl: float = swept(0.0)
    kl_horizon: int = KL_HORIZON  # the adaptive controller's horizon, in completions
    whiten_advantages: bool = True  # to mean 0 and variance 1 over the batch's tokens
    missing_eos_penalty: float = swept(0.0)  # subtracted from the score of an unended completion
    # How the scores of a reward-model ensemble combine (reward_model.ensemble_reward).
    ensemble_rule: str = "mean"
    ensemble_std_coefficient: float = swept(1.0)  # k of "mean_minus_std"
    # max_new_tokens, temperature (also applied to the trained log-probs), top_k, top_p; the
    # flags keep their flat names (--config.temperature).
    sampling: Sampling = dataclasses.field(default_factory=Sampling)

    def __post_init__(self) -> None:
        object.__setattr__(self, "mesh_shape", tuple(self.mesh_shape))
        self.validate_lora()
        require_positive(
            self,
            "learning_rate",
            "batch_size",
            "num_epochs",
            "num_minibatches",
            "grad_accum_steps",
            "num_steps",
            "max_grad_norm",
            "clip_ratio",
            "clip_value",
            "kl_horizon",
        )
        require(
            self.lora_rank == 0,
            "lora_rank",
            "PPO here trains every parameter of the policy and its value head",
            "set lora_rank=0",
        )
        require(
            self.critic in CRITICS,
            "critic",
            f"unknown critic {self.critic!r}",
            f"choose one of {CRITICS}",
        )
        require(
            self.ensemble_rule in reward_model.ENSEMBLE_RULES,
            "ensemble_rule",
            f"unknown rule {self.ensemble_rule!r}",
            f"choose one of {reward_model.ENSEMBLE_RULES}",
        )
        require_in_range(self, "gamma", 0.0, 1.0)
        require_in_range(self, "gae_lambda", 0.0, 1.0)
        for name in (
            "vf_coef",
            "kl_coef",
            "target_kl",
            "missing_eos_penalty",
            "warmup_steps",
            "weight_decay",
        ):
            value = getattr(self, name)
            require(value >= 0, name, f"got {value}", "use 0 or more")
        # The controller multiplies kl_coef by 1 + e * batch_size / kl_horizon, |e| <= 0.2.
        require(
            self.target_kl == 0 or self.kl_coef > 0,
            "kl_coef",
            "0 with target_kl > 0: the adaptive controller scales kl_coef, so it would stay 0",
            "start kl_coef above 0 (0.05, say)",
        )
        require(
            self.kl_horizon >= self.batch_size,
            "kl_horizon",
            f"{self.kl_horizon} is below batch_size={self.batch_size}, so one update could move "
            "kl_coef by more than 20%",
            f"use {self.batch_size} or more (10000 is usual)",
        )
        require(
            self.target_kl > 0 or self.kl_horizon == KL_HORIZON,
            "kl_horizon",
            "is read only by the adaptive controller (target_kl > 0), which is off, so it "
            "would be ignored",
            "drop it, or set target_kl",
        )
        require(
            self.ensemble_rule == "mean_minus_std" or self.ensemble_std_coefficient == 1.0,
            "ensemble_std_coefficient",
            f"is read only by ensemble_rule='mean_minus_std', not {self.ensemble_rule!r}, so it "
            "would be ignored",
            "drop it, or set ensemble_rule=mean_minus_std",
        )
        require_sampling(self)
        steps = self.num_minibatches * self.grad_accum_steps
        require(
            self.batch_size % steps == 0,
            "num_minibatches",
            f"num_minibatches * grad_accum_steps = {steps} does not divide the {self.batch_size} "
            "completions per update (batch_size)",
            "choose them so their product divides batch_size",
        )
        shards = training.check_mesh_shape(self.mesh_shape)
        micro = self.batch_size // steps
        require(
            micro % shards == 0,
            "batch_size",
            f"micro-batch of {micro} completions (batch_size / (num_minibatches * "
            f"grad_accum_steps)) does not split over the mesh's data*fsdp = {shards} batch shards",
            f"make it a multiple of {shards}",
        )


# --- 2. the pure pieces ------------------------------------------------------------------------


def kl_penalized_rewards(
    scores: Array,
    log_probs: Array,
    reference_log_probs: Array,
    mask: Array,
    kl_coef: float | Array,
) -> Array:
    """Per-token rewards [B, N] of completions whose `mask` is a prefix of their N slots: the KL
    penalty -kl_coef * (log pi(y_t) - log pi_ref(y_t)) on every token (the sampled-token estimate
    of the KL, as InstructGPT), plus the sequence's score [B] on its last token; 0 after it."""
    mask = mask.astype(jnp.float32)
    penalty = -kl_coef * (log_probs - reference_log_probs) * mask
    length = mask.sum(axis=1).astype(jnp.int32)
    last = jax.nn.one_hot(jnp.maximum(length - 1, 0), mask.shape[1]) * (length > 0)[:, None]
    return penalty + scores[:, None] * last


def token_gae(
    rewards: Array,
    values: Array,
    mask: Array,
    gamma: float | Array,
    gae_lambda: float | Array,
) -> tuple[Array, Array]:
    """Generalised advantage estimation over completion tokens [B, N] (`mask` a prefix of each
    row): (advantages, returns = advantages + values), 0 after each completion's end. The last
    token is terminal, so the recursion is `ppo.gae`'s with every episode ending there."""
    mask = mask.astype(jnp.float32)
    values = values * mask
    next_mask = jnp.concatenate([mask[:, 1:], jnp.zeros_like(mask[:, :1])], axis=1)
    next_values = jnp.concatenate([values[:, 1:], jnp.zeros_like(values[:, :1])], axis=1)
    ended = 1.0 - next_mask  # the last token and the padding after it: nothing follows
    advantages, returns = ppo.gae(
        rewards.T, values.T, next_values.T, ended.T, ended.T, gamma, gae_lambda
    )
    return advantages.T * mask, returns.T * mask


def masked_mean(x: Array, mask: Array, count: Array | None = None) -> Array:
    """The mean of x over the positions where mask is 1; with `count` (a larger batch's marked
    positions), these positions' share of that batch's mean."""
    mask = mask.astype(jnp.float32)
    return jnp.sum(x * mask) / (jnp.maximum(mask.sum(), 1.0) if count is None else count)


def step_tokens(batch: dict[str, Array]) -> dict[str, Array]:
    """The denominator of PPO-LM's losses over an optimizer step's whole batch: its completion
    tokens. Every micro-batch's loss is then its share of one token mean over the step
    (`training.accumulated_gradient`), whatever grad_accum_steps is."""
    return {"norm_tokens": jnp.maximum(batch["completion_mask"].astype(jnp.float32).sum(), 1.0)}


def masked_whiten(x: Array, mask: Array, eps: float = 1e-8) -> Array:
    """x shifted and scaled to mean 0 and (population) variance 1 over the masked positions;
    0 elsewhere."""
    mean = masked_mean(x, mask)
    variance = masked_mean(jnp.square(x - mean), mask)
    return (x - mean) * jax.lax.rsqrt(variance + eps) * mask.astype(jnp.float32)


def ppo_lm_losses(
    log_probs: Array,
    old_log_probs: Array,
    advantages: Array,
    values: Array,
    old_values: Array,
    returns: Array,
    mask: Array,
    clip_ratio: float | Array,
    clip_value: float | Array,
    count: Array | None = None,
) -> tuple[Array, Array, dict[str, Array]]:
    """(policy loss, value loss, metrics), each a mean over the masked tokens of [B, N] inputs
    (with `count`, the step's tokens: these rows' share of the step's mean).

    Policy: the clipped surrogate -min(ratio * A, clip(ratio, 1 - c, 1 + c) * A). Value: half the
    larger squared error of the new value and of the new value clipped to within clip_value of
    the old one (PPO2's value clipping, which TRL and the RLHF papers keep)."""
    log_ratio = log_probs - old_log_probs
    ratio = jnp.exp(log_ratio)
    low, high = 1.0 - clip_ratio, 1.0 + clip_ratio
    surrogate = -jnp.minimum(ratio * advantages, jnp.clip(ratio, low, high) * advantages)
    was_clipped = ((ratio < low) & (advantages < 0)) | ((ratio > high) & (advantages > 0))

    clipped_values = old_values + jnp.clip(values - old_values, -clip_value, clip_value)
    error = jnp.square(values - returns)
    clipped_error = jnp.square(clipped_values - returns)
    metrics = {
        "clip_fraction": masked_mean(was_clipped.astype(jnp.float32), mask, count),
        "value_clip_fraction": masked_mean(
            (clipped_error > error).astype(jnp.float32), mask, count
        ),
        # Schulman's low-variance estimate of KL(old || new), as control PPO logs it.
        "approx_kl": masked_mean((ratio - 1.0) - log_ratio, mask, count),
    }
    policy_loss = masked_mean(surrogate, mask, count)
    value_loss = 0.5 * masked_mean(jnp.maximum(error, clipped_error), mask, count)
    return policy_loss, value_loss, metrics


def adaptive_kl_coef(
    kl_coef: Array, kl: Array, target: float | Array, horizon: int, num_sequences: int
) -> Array:
    """Ziegler et al. (2019)'s proportional controller: kl_coef * (1 + e * n / horizon), with the
    error e = clip(kl / target - 1, -0.2, 0.2) of the batch's mean sequence KL and n completions
    in the batch."""
    error = jnp.clip(kl / target - 1.0, -0.2, 0.2)
    return kl_coef * (1.0 + error * num_sequences / horizon)


# --- 3. parameters: the policy and its critic ------------------------------------------------


def init_params(
    lm_params: Any,
    model: ModelConfig,
    key: Array | None = None,
    critic: str = "value_head",
    critic_params: Any = None,
) -> dict[str, Any]:
    """The trained parameters: the policy and, for critic="value_head", a linear value head on
    its final hidden states that starts at zero (every value 0 until the value loss has moved
    it); for critic="separate", a critic with a reward model's layout (`reward_model.
    init_params`): `critic_params` if given (TRL starts its value model from the reward model),
    else the policy's transformer with a new head drawn from `key`."""
    require(critic in CRITICS, "critic", f"unknown critic {critic!r}", f"choose one of {CRITICS}")
    if critic == "value_head":
        head = {
            "kernel": jnp.zeros((model.hidden_size,), jnp.float32),
            "bias": jnp.zeros((), jnp.float32),
        }
        return {"policy": lm_params, "value_head": head}
    if critic_params is None:
        if key is None:
            raise ValueError(
                "init_params: a separate critic without critic_params needs a key; pass key= "
                "(its head is drawn from it) or critic_params="
            )
        critic_params = reward_model.init_params(lm_params, model, key)
    return {"policy": lm_params, "critic": critic_params}


def make_forward(
    model: ModelConfig, critic_model: ModelConfig | None, mesh: Any, config: Config
) -> Callable[[dict[str, Any], dict[str, Array]], tuple[Array, Array, Array]]:
    """forward(params, batch) -> (log-probs, entropy, values), each [B, N] over the completion
    tokens of `batch` (tokens and attention_mask [B, P + N], completion_mask [B, N]). A token's
    value is the critic's estimate of the state it was sampled in, read at the position before
    it, where the policy's logits for it are read."""
    policy = Transformer(model, mesh=mesh)
    critic = Transformer(critic_model or model, mesh=mesh)

    def forward(params: dict[str, Any], batch: dict[str, Array]):
        length = batch["completion_mask"].shape[1]
        tokens, attention_mask = batch["tokens"], batch["attention_mask"]
        completion = tokens[:, -length:]
        if config.critic == "value_head":
            # One pass: the final hidden states feed both the LM head and the value head.
            hidden, _ = policy.apply(
                {"params": params["policy"]},
                tokens,
                None,
                attention_mask,
                logits_for_last=length + 1,
                hidden_only=True,
            )
            hidden = hidden[:, :-1]
            logits = head_logits(model, params["policy"], hidden)
            head = params["value_head"]
            values = hidden.astype(jnp.float32) @ head["kernel"] + head["bias"]
        else:
            logits, _ = policy.apply(
                {"params": params["policy"]},
                tokens,
                None,
                attention_mask,
                logits_for_last=length + 1,
            )
            logits = logits[:, :-1]
            hidden, _ = critic.apply(
                {"params": params["critic"]["backbone"]},
                tokens,
                None,
                attention_mask,
                logits_for_last=length + 1,
                hidden_only=True,
            )
            head = params["critic"]
            values = hidden[:, :-1].astype(jnp.float32) @ head["score_kernel"] + head["score_bias"]
        log_probs, entropy, _ = token_statistics(logits, completion, config.sampling.temperature)
        return log_probs, entropy, values

    return forward


def make_reward_model_scores(reward_config: ModelConfig, mesh: Any = None) -> Callable[..., Array]:
    """scores(reward_params, tokens, attention_mask, hp, rule) -> [B]: the reward model's score of
    each sequence or, for an ensemble (parameters stacked on a leading axis of K members, as
    `jax.vmap` of reward-model training leaves them), the members' scores combined by `rule`."""
    scorer = Transformer(reward_config, mesh=mesh)

    def scores(reward_params: Any, tokens: Array, attention_mask: Array, hp: HParams, rule: str):
        def one(params: Any) -> Array:
            return reward_model.sequence_rewards(scorer, params, tokens, attention_mask)

        if reward_params["score_bias"].ndim == 0:
            return one(reward_params)
        members = jax.vmap(one)(reward_params)
        return reward_model.ensemble_reward(members, rule, hp.ensemble_std_coefficient)

    return scores


# --- 4. PPO: init and update -------------------------------------------------------------------


class Inputs(NamedTuple):
    """What one update reads besides its state: the reference policy's parameters (the KL
    penalty's), the reward model's (None: the task's verifiable reward) and the task's `data`
    (a prompt file's table; None for the built-in tasks)."""

    reference_params: Any
    reward_params: Any = None
    task_data: Any = None


class State(NamedTuple):
    """`training.TrainState`'s fields (params: policy plus value head or critic) and the KL
    penalty's current coefficient."""

    params: Any
    opt_state: Any
    key: Array
    step: Array
    kl_coef: Array  # fp32 scalar; moves only when target_kl > 0


def make(
    config: Config,
    model: ModelConfig,
    task: TextTask,
    params: dict[str, Any],
    mesh: Any = None,
    reward_model_config: ModelConfig | None = None,
    critic_model: ModelConfig | None = None,
) -> Algorithm:
    """PPO as pure functions of one run on `task`, starting from `params` (`init_params`, placed
    on `mesh` if given): `init(key, hparams)` and `update(state, inputs, hparams)`, one rollout
    and num_epochs x num_minibatches optimizer steps on it. With `reward_model_config`, the
    score is that reward model's (its parameters arrive in `Inputs.reward_params`) and the
    task's own reward terms are logged beside it as `reward_<name>`: on a testbed whose task
    reward is the gold one, the measure of over-optimisation. `critic_model` is a separate
    critic's architecture (default: the policy's).

    Update i draws its prompts, samples and minibatch order from fold_in(state.key, i), so a
    resumed run repeats what an uninterrupted one does. Metrics (scalars): `score` (what the
    policy was rewarded with, before the KL penalty), the task's `reward` and each of its terms'
    `reward_<term>`, `kl` (mean sequence KL
    to the reference, summed over tokens), `kl_coef`, `non_score_reward`, `completion_length`,
    `ended_with_eos`, `value`, `return`, and the optimizer steps' means of `loss`,
    `policy_loss`, `value_loss`, `clip_fraction`, `value_clip_fraction`, `approx_kl`,
    `entropy` and `grad_norm`."""
    forward = make_forward(model, critic_model, mesh, config)
    reference = Transformer(model, mesh=mesh)
    scores_of = make_reward_model_scores(reward_model_config, mesh) if reward_model_config else None
    config = static(config)
    sampling = config.sampling.for_tokens(task.eos_id, task.pad_id)
    base_init = training.make_init(params, config, mesh)

    def init(key: Array, hp: HParams) -> State:
        state = base_init(key, hp)
        kl_coef = jnp.asarray(hp.kl_coef, jnp.float32)
        if mesh is not None and not isinstance(kl_coef, jax.core.Tracer):
            kl_coef = jax.device_put(kl_coef, sharding.replicated(mesh))
        return State(*state, kl_coef=kl_coef)

    def loss_fn(params: dict[str, Any], batch: dict[str, Array], hp: HParams):
        log_probs, entropy, values = forward(params, batch)
        mask = batch["completion_mask"]
        count = batch["norm_tokens"][0] if "norm_tokens" in batch else None  # `step_tokens`
        policy_loss, value_loss, metrics = ppo_lm_losses(
            log_probs,
            batch["old_log_probs"],
            batch["advantages"],
            values,
            batch["old_values"],
            batch["returns"],
            mask,
            hp.clip_ratio,
            hp.clip_value,
            count,
        )
        metrics.update(
            policy_loss=policy_loss,
            value_loss=value_loss,
            entropy=masked_mean(entropy, mask, count),
        )
        return policy_loss + hp.vf_coef * value_loss, metrics

    def rollout(state: State, inputs: Inputs, key: Array, hp: HParams):
        """The batch the update trains on, with advantages and returns, and its metrics."""
        prompt_key, sample_key = jax.random.split(key)
        prompts = task.sample_prompts(prompt_key, config.batch_size, inputs.task_data)
        prompts = sharding.constrain_batch(prompts, mesh)
        completion = generate(
            model, state.params["policy"], prompts.tokens, prompts.mask, sample_key, sampling, mesh
        )
        batch = {
            "tokens": jnp.concatenate([prompts.tokens, completion.tokens], axis=1),
            "attention_mask": jnp.concatenate([prompts.mask, completion.mask], axis=1),
            "completion_mask": completion.mask,
        }
        task_reward, metrics = task_rewards(task, prompts, completion)
        metrics["reward"] = task_reward.mean()  # the task's, whatever the score is
        if scores_of is None:
            scores = task_reward
        else:
            scores = scores_of(
                inputs.reward_params,
                batch["tokens"],
                batch["attention_mask"],
                hp,
                config.ensemble_rule,
            )
        ended = jnp.any(completion.mask & (completion.tokens == task.eos_id), axis=1)
        scores = scores - hp.missing_eos_penalty * (1.0 - ended.astype(jnp.float32))

        old_log_probs, _, old_values = jax.lax.stop_gradient(forward(state.params, batch))
        reference_log_probs = jax.lax.stop_gradient(
            completion_log_probs(
                reference, inputs.reference_params, batch, config.sampling.temperature
            ).log_probs
        )
        mask = completion.mask
        rewards = kl_penalized_rewards(
            scores, old_log_probs, reference_log_probs, mask, state.kl_coef
        )
        advantages, returns = token_gae(rewards, old_values, mask, hp.gamma, hp.gae_lambda)
        if config.whiten_advantages:
            advantages = masked_whiten(advantages, mask)
        batch.update(
            old_log_probs=old_log_probs,
            old_values=old_values,
            advantages=advantages,
            returns=returns,
        )
        kl = jnp.mean(jnp.sum((old_log_probs - reference_log_probs) * mask, axis=1))
        metrics.update(
            score=scores.mean(),
            kl=kl,
            kl_coef=state.kl_coef,
            non_score_reward=-state.kl_coef * kl,
            value=masked_mean(old_values, mask),
            **{"return": masked_mean(returns, mask)},
            completion_length=completion.lengths.mean(),
            ended_with_eos=ended.mean(),
        )
        return batch, metrics

    def update(state: State, inputs: Inputs, hp: HParams) -> tuple[State, dict[str, Array]]:
        if not isinstance(inputs, Inputs):
            raise TypeError(
                f"ppo_lm update: inputs are a {type(inputs).__name__}; pass "
                "ppo_lm.Inputs(reference_params, reward_params, task_data)"
            )
        if scores_of is not None and inputs.reward_params is None:
            raise ValueError(
                "ppo_lm update: made with a reward model, but Inputs.reward_params is None; pass "
                "its parameters, or make the algorithm without reward_model_config"
            )
        rollout_key, shuffle_key = jax.random.split(jax.random.fold_in(state.key, state.step))
        batch, metrics = rollout(state, inputs, rollout_key, hp)

        train_state = training.TrainState(state.params, state.opt_state, state.key, state.step)
        train_state, step_metrics = training.minibatch_epochs(
            lambda p, micro_batch: loss_fn(p, micro_batch, hp), train_state, batch, hp, config,
            shuffle_key, config.num_epochs, config.num_minibatches, mesh,
            denominators=step_tokens,
        )  # fmt: skip
        metrics.update(jax.tree.map(jnp.mean, step_metrics))

        adapted = adaptive_kl_coef(
            state.kl_coef,
            metrics["kl"],
            jnp.maximum(hp.target_kl, 1e-8),
            config.kl_horizon,
            config.batch_size,
        )
        kl_coef = jnp.where(hp.target_kl > 0, adapted, state.kl_coef)
        state = State(train_state.params, train_state.opt_state, state.key, state.step + 1, kl_coef)
        return state, metrics

    return Algorithm(init, update)
