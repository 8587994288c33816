"""Direct Preference Optimisation and its relatives, on a (sharded) Flax transformer.

Given pairs (prompt x, chosen answer y_w, rejected answer y_l), DPO (Rafailov et al., 2023) trains
the policy pi so that its implicit reward r(x, y) = beta * log(pi(y|x) / pi_ref(y|x)) ranks y_w
above y_l, with no reward model and no sampling. The reference pi_ref is the model DPO starts from
(an SFT model). This file reads top to bottom:

1. `Config`: the loss variant and its coefficients, on top of the shared optimisation settings.
2. `preference_loss`: every variant as a pure function of summed sequence log-probs.
3. `score_pairs`: one forward pass over chosen and rejected sequences stacked along the batch.
4. `make_loss` / `make`: the loss, and DPO as the learner contract's `init` and `update`.
5. `reference_log_probs` and `evaluate_pairs`: the reference pass and held-out reward accuracy.

Loss variants (`loss_type`):
- "sigmoid": DPO, -log sigmoid(beta * h) with h the log-ratio margin
  h = [log pi(y_w) - log pi_ref(y_w)] - [log pi(y_l) - log pi_ref(y_l)].
  With `label_smoothing` = eps > 0 it becomes conservative DPO (labels flipped with probability
  eps): -(1 - eps) log sigmoid(beta h) - eps log sigmoid(-beta h).
- "ipo": IPO (Azar et al., 2023), (h - 1 / (2 beta))^2, regressing the margin to a fixed target
  instead of pushing it to infinity.
- "simpo": SimPO (Meng et al., 2024), reference-free: the reward is the length-normalised
  log-prob beta * log pi(y) / |y|, and -log sigmoid(r_w - r_l - gamma) asks for a margin gamma.
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
LOSS_TYPES = ("sigmoid", "ipo", "simpo")
REFERENCE_MODES = ("precomputed", "in_step")


# --- 1. configuration --------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Config(training.TrainConfig):
    """DPO settings: the loss variant and its coefficients, plus `TrainConfig`'s optimisation.
    The coefficients are `swept`: they may differ between the runs of one program."""

    loss_type: str = "sigmoid"  # one of LOSS_TYPES: "sigmoid" (DPO), "ipo", "simpo"
    beta: float = swept(0.1)  # scale of the implicit reward (IPO: target margin 1 / (2 beta))
    label_smoothing: float = swept(0.0)  # > 0: conservative DPO (sigmoid and simpo only)
    simpo_gamma: float = swept(0.5)  # SimPO's target reward margin
    # "precomputed": one pass of the reference model over the dataset before training;
    # "in_step": the reference runs inside every step (no dataset pass, twice the forward work).
    reference: str = "precomputed"

    def __post_init__(self) -> None:
        super().__post_init__()
        require(
            self.loss_type in LOSS_TYPES,
            "loss_type",
            f"got {self.loss_type!r}",
            f"use one of {LOSS_TYPES}",
        )
        require(self.beta > 0, "beta", f"got {self.beta}", "use beta > 0 (0.1 is common for DPO)")
        require(
            0 <= self.label_smoothing < 0.5,
            "label_smoothing",
            f"got {self.label_smoothing}",
            "use a flip probability in [0, 0.5)",
        )
        require(
            self.label_smoothing == 0 or self.loss_type != "ipo",
            "label_smoothing",
            "IPO has no labels to smooth",
            "set label_smoothing=0 with loss_type='ipo'",
        )
        require(
            self.reference in REFERENCE_MODES,
            "reference",
            f"got {self.reference!r}",
            f"use one of {REFERENCE_MODES}",
        )

    @property
    def uses_reference(self) -> bool:
        """Whether the loss needs a reference model (every variant but reference-free SimPO)."""
        return self.loss_type != "simpo"


# --- 2. the preference losses ------------------------------------------------------------------


def preference_loss(
    policy_chosen: Array,
    policy_rejected: Array,
    reference_chosen: Array,
    reference_rejected: Array,
    chosen_length: Array,
    rejected_length: Array,
    loss_type: str,
    beta: float | Array,
    label_smoothing: float | Array = 0.0,
    simpo_gamma: float | Array = 0.5,
) -> tuple[Array, Array, Array]:
    """Per-pair losses and the implicit rewards of the chosen and rejected answers.

    The log-prob inputs are [B]: summed log-probs of each answer under the policy and the
    reference; the lengths are the answers' token counts (SimPO's length normalisation)."""
    eps = label_smoothing
    if loss_type == "simpo":
        chosen_reward = beta * policy_chosen / chosen_length
        rejected_reward = beta * policy_rejected / rejected_length
        logits = chosen_reward - rejected_reward - simpo_gamma
        losses = -(1 - eps) * jax.nn.log_sigmoid(logits) - eps * jax.nn.log_sigmoid(-logits)
        return losses, chosen_reward, rejected_reward

    chosen_log_ratio = policy_chosen - reference_chosen
    rejected_log_ratio = policy_rejected - reference_rejected
    margin = chosen_log_ratio - rejected_log_ratio
    if loss_type == "sigmoid":
        losses = -(1 - eps) * jax.nn.log_sigmoid(beta * margin) - eps * jax.nn.log_sigmoid(
            -beta * margin
        )
    else:  # ipo
        losses = (margin - 1 / (2 * beta)) ** 2
    return losses, beta * chosen_log_ratio, beta * rejected_log_ratio


# --- 3. scoring pairs --------------------------------------------------------------------------


def score_pairs(
    model: Transformer, params: Any, batch: dict[str, Array], scored_length: int | None = None
) -> dict[str, Array]:
    """Summed answer log-probs and lengths for chosen and rejected, from ONE forward pass over
    the two sets of sequences stacked along the batch axis. `scored_length`
    (`training.scored_length` of the data's loss masks) runs the head on the answers only."""
    stack = lambda name: jnp.concatenate([batch[f"chosen_{name}"], batch[f"rejected_{name}"]])
    log_probs, lengths = training.sequence_log_probs(
        model,
        params,
        stack("tokens"),
        stack("attention_mask"),
        stack("loss_mask"),
        scored_length,
    )
    chosen_lp, rejected_lp = jnp.split(log_probs, 2)
    chosen_len, rejected_len = jnp.split(lengths, 2)
    return {
        "chosen": chosen_lp,
        "rejected": rejected_lp,
        "chosen_length": chosen_len,
        "rejected_length": rejected_len,
    }


# --- 4. training -------------------------------------------------------------------------------


def make_loss(
    model: Transformer, config: Config, scored_length: int | None = None
) -> Callable[..., tuple[Array, dict]]:
    """`loss_fn(params, batch, hp, reference_params) -> (mean loss over pairs, metrics)`. The
    reference log-probs come from the batch ("reference_chosen"/"reference_rejected",
    precomputed) or, with reference="in_step", from a forward pass of `reference_params` on the
    same batch."""
    config = static(config)

    def loss_fn(params: Any, batch: dict[str, Array], hp: HParams, reference_params: Any):
        policy = score_pairs(model, params, batch, scored_length)
        if not config.uses_reference:
            reference_chosen = reference_rejected = jnp.zeros_like(policy["chosen"])
        elif config.reference == "in_step":
            reference = score_pairs(
                model, jax.lax.stop_gradient(reference_params), batch, scored_length
            )
            reference_chosen, reference_rejected = reference["chosen"], reference["rejected"]
        else:
            reference_chosen, reference_rejected = (
                batch["reference_chosen"],
                batch["reference_rejected"],
            )
        losses, chosen_reward, rejected_reward = preference_loss(
            policy["chosen"],
            policy["rejected"],
            reference_chosen,
            reference_rejected,
            policy["chosen_length"],
            policy["rejected_length"],
            config.loss_type,
            hp.beta,
            hp.label_smoothing,
            hp.simpo_gamma,
        )
        metrics = {
            "reward_accuracy": jnp.mean(chosen_reward > rejected_reward),
            "reward_margin": jnp.mean(chosen_reward - rejected_reward),
            "chosen_reward": jnp.mean(chosen_reward),
            "rejected_reward": jnp.mean(rejected_reward),
            "chosen_log_prob": jnp.mean(policy["chosen"]),
            "rejected_log_prob": jnp.mean(policy["rejected"]),
        }
        return jnp.mean(losses), metrics

    return loss_fn


def make(
    config: Config,
    model: ModelConfig,
    params: Any,
    mesh: Any = None,
    scored_length: int | None = None,
) -> Algorithm:
    """DPO as pure functions of one run, starting from `params` (the SFT model, placed on `mesh`
    if given): `init(key, hparams)` and `update(state, (batch, reference_params), hparams)`, one
    optimizer step on a batch of pairs shaped [grad_accum_steps, micro_batch, ...].

    `reference_params` are used only with reference="in_step" (None otherwise); they are an input
    rather than part of the state, so checkpoints hold only what training changes. With
    config.lora_rank > 0 only LoRA adapters train (the reference stays the base model); the
    state's `params` are then the merged parameters. `scored_length` (`training.scored_length`
    of every loss mask the run reads) restricts the head to the answers."""
    loss_fn = make_loss(Transformer(model, mesh=mesh), config, scored_length)
    config = static(config)

    def update(state: training.TrainState, inputs: Any, hp: HParams):
        batch, reference_params = inputs
        state, metrics = training.train_step(
            lambda p, micro_batch: loss_fn(p, micro_batch, hp, reference_params),
            state,
            batch,
            hp,
            config,
        )
        return state._replace(step=state.step + 1), metrics

    return Algorithm(training.make_init(params, config, mesh, model), update)


# --- 5. the reference pass and evaluation ------------------------------------------------------


def make_score(
    model_config: ModelConfig, mesh: Any = None, scored_length: int | None = None
) -> Callable[[Any, dict[str, Array]], dict]:
    """score(params, batch) -> summed answer log-probs and lengths (jit it)."""
    model = Transformer(model_config, mesh=mesh)
    return lambda params, batch: score_pairs(model, params, batch, scored_length)


def reference_log_probs(
    score: Callable, reference_params: Any, arrays: dict, batch_size: int, place=None
) -> dict:
    """The reference model's summed answer log-probs for every pair, computed once."""
    scores = training.score_pairs_in_batches(score, reference_params, arrays, batch_size, place)
    return {"reference_chosen": scores["chosen"], "reference_rejected": scores["rejected"]}


def evaluate_pairs(
    score: Callable,
    params: Any,
    reference: dict[str, np.ndarray],
    arrays: dict[str, np.ndarray],
    config: Config,
    batch_size: int,
    place=None,
) -> dict[str, float]:
    """Held-out preference metrics: reward accuracy (chosen reward > rejected reward, TRL's
    `rewards/accuracies`: a tie counts as wrong), the fraction of ties (equal rewards: every
    pair of a policy that is its own reference, so its accuracy reads 0), margin and loss,
    with the policy's implicit rewards against `reference` log-probs. Runs on the host after
    training, so it reads the coefficients from the (single-run) `config`."""
    policy = training.score_pairs_in_batches(score, params, arrays, batch_size, place)
    losses, chosen_reward, rejected_reward = preference_loss(
        jnp.asarray(policy["chosen"]),
        jnp.asarray(policy["rejected"]),
        jnp.asarray(reference["reference_chosen"]),
        jnp.asarray(reference["reference_rejected"]),
        jnp.asarray(policy["chosen_length"]),
        jnp.asarray(policy["rejected_length"]),
        config.loss_type,
        config.beta,
        config.label_smoothing,
        config.simpo_gamma,
    )
    return {
        "eval_reward_accuracy": float(jnp.mean(chosen_reward > rejected_reward)),
        "eval_reward_ties": float(jnp.mean(chosen_reward == rejected_reward)),
        "eval_reward_margin": float(jnp.mean(chosen_reward - rejected_reward)),
        "eval_loss": float(jnp.mean(losses)),
    }
