"""Multi-turn RL for language-model agents: GRPO over groups of whole conversations with a text
environment, sampling, the environment's turns and the update in one compiled program.

    env = make_guess_my_number(tokenizer)                   # envs.text.multiturn
    algorithm = multiturn.make(Config(), model, env, params, tokenizer.eos_id, tokenizer.pad_id)
    algorithm = multiturn.make(..., rollout=Partial(rollout_budget=2, max_staleness=2))

Each update, for `batch_size` games drawn from the environment (one reset key each):

1. `group_size` episodes of each game, all the same game (the same reset key), sampled by the
   current policy turn by turn (`jaxrl.lm.dialogue.converse`): the policy speaks up to
   `max_new_tokens` tokens a turn, the environment answers, its answer joins the context, until
   the game ends or `env.max_turns` turns are spoken.
2. Credit (`credit`):
   - "episode": the episode's return compared within its group, as GRPO compares completions
     (`variant` picks the baseline and scaling: grpo, dr_grpo, dapo, rloo); every token the
     policy spoke gets its episode's advantage;
   - "turn": the discounted return from each turn on, G_t = sum_k gamma^(k-t) r_k, compared
     with the group's other episodes at the same turn (those that reached it); the tokens of
     turn t get turn t's advantage. Where rewards come only at the end this moves credit
     towards the turns near it (gamma < 1: a win in fewer turns is worth more).
3. The clipped policy-gradient loss of GRPO (`grpo.policy_loss`) over the policy's own tokens
   only; the environment's tokens are context and carry no loss. Old log-probs are recomputed
   by one forward pass over the recorded conversations (`dialogue.policy_log_probs` gives the
   sampler's log-probs again). With `shared_prompt` every pass runs each game's opening once,
   its group_size episodes' turns packed after it (`dialogue.shared_opening_logits`).

How generation meets training is the rollout passed to `make` (`algos.rollouts`): `Sync()` by
default, `algos.partial.Partial` (conversations carried across updates, its budget in turns:
`algos.multiturn_partial`) or `algos.asynchronous.Async` (episodes played on a generation mesh).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from algos import grpo, optimizer_steps
from algos.dynamic_sampling import group_has_signal, keep_varied_groups
from algos.rollouts import Learner, Sync
from jaxrl.config import require
from jaxrl.hparams import HParams, static, swept
from jaxrl.lm import dialogue
from jaxrl.lm.model import ModelConfig, Transformer, token_statistics
from jaxrl.loop import Algorithm

Array = jax.Array

CREDIT = ("episode", "turn")


@dataclasses.dataclass(frozen=True)
class Config(grpo.GroupConfig):
    """The settings GRPO shares (`grpo.GroupConfig`), read for conversations: `batch_size` games
    per update, `group_size` episodes of each, `sampling.max_new_tokens` the most tokens of one
    turn; and how credit is assigned over the turns."""

    credit: str = "episode"  # "episode" (the return) or "turn" (discounted return per turn)
    gamma: float = swept(1.0)  # the per-turn discount of credit="turn"
    # A game's group_size episodes share their opening (the same reset): each group's opening
    # runs through the model once per pass (the loss's forward and backward, the old policy's,
    # the reference's), its episodes' turns packed after it (`dialogue.PolicyPass`): the same
    # update up to rounding, with opening x (group_size - 1) fewer slots per game. Minibatches
    # then shuffle whole games (with num_minibatches > 1 a different draw of which episodes step
    # together), and every micro-batch must hold whole games on each batch shard. Off by
    # default: the packed attention grows with (opening + group_size x turns)^2, so it is
    # slower where the turns outweigh the opening (the guess_my_number preset: docs/multiturn.md).
    shared_prompt: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        require(
            self.credit in CREDIT,
            "credit",
            f"unknown credit {self.credit!r}",
            f"use one of {CREDIT}",
        )
        require(0.0 < self.gamma <= 1.0, "gamma", f"got {self.gamma}", "use a discount in (0, 1]")
        require(
            self.credit == "turn" or self.gamma == 1.0,
            "gamma",
            "is read only by credit=turn; with credit=episode it would be ignored",
            "drop it, or set credit=turn",
        )
        require(
            self.spec.baseline != "greedy",
            "variant",
            "remax's greedy baseline is not built for conversations",
            "use grpo, dr_grpo, dapo or rloo",
        )
        require(self.lora_rank == 0, "lora_rank", "LoRA is not built for multi-turn yet", "use 0")
        optimizer_steps.validate_shared_prompt(self, None)


# --- credit over turns ---------------------------------------------------------------------------


def discounted_turn_returns(rewards: Array, spoke: Array, gamma: float | Array) -> Array:
    """G_t = r_t + gamma * G_{t+1} over the turns spoken, [..., T] -> [..., T]; 0 where the
    episode was already over."""
    rewards = jnp.where(spoke, rewards, 0.0)

    def back(following, reward):
        value = reward + gamma * following
        return value, value

    _, returns = jax.lax.scan(
        back, jnp.zeros(rewards.shape[:-1]), jnp.moveaxis(rewards, -1, 0), reverse=True
    )
    return jnp.where(spoke, jnp.moveaxis(returns, 0, -1), 0.0)


def turn_advantages(
    returns: Array, spoke: Array, baseline: str, scale_by_std: bool, std_eps: float = 1e-4
) -> Array:
    """[games, group, T] per-turn returns -> advantages: each episode's G_t against the group's
    episodes that also spoke turn t (their mean; or, leave_one_out, the mean of the others), and
    with scale_by_std divided by their standard deviation (ddof 1) + std_eps. 0 where the
    episode did not speak turn t, or where it was the only one of its group to."""
    weight = spoke.astype(jnp.float32)
    count = weight.sum(axis=1, keepdims=True)
    total = (returns * weight).sum(axis=1, keepdims=True)
    if baseline == "leave_one_out":
        reference = (total - returns) / jnp.maximum(count - 1, 1.0)
    else:
        reference = total / jnp.maximum(count, 1.0)
    advantages = returns - reference
    if scale_by_std:
        mean = total / jnp.maximum(count, 1.0)
        variance = ((returns - mean) ** 2 * weight).sum(axis=1, keepdims=True)
        std = jnp.sqrt(variance / jnp.maximum(count - 1, 1.0))
        advantages = advantages / (std + std_eps)
    return jnp.where(spoke & (count > 1), advantages, 0.0)


def token_advantages(per_turn: Array, turn_index: Array, valid: Array) -> Array:
    """Each policy token's advantage, its turn's: [N, T] and [N, K] turn ids -> [N, K]."""
    taken = jnp.take_along_axis(per_turn, jnp.maximum(turn_index, 0), axis=1)
    return jnp.where(valid, taken, 0.0)


# --- the loss ---------------------------------------------------------------------------------


def policy_logits_of(
    model: Transformer,
    params: Any,
    batch: dict[str, Array],
    policy_pass: dialogue.PolicyPass = dialogue.PER_EPISODE,
) -> Array:
    """The policy tokens' logits of a batch of recorded conversations, by `policy_pass`
    (every episode over its own slots, or each game's opening once)."""
    return policy_pass(
        model, params, batch["tokens"], batch["positions"], batch["mask"], batch["predictors"]
    )


def choose_policy_pass(config: Config, env: Any) -> dialogue.PolicyPass:
    """The pass config.shared_prompt chooses over `env`'s conversations: each game's opening
    once (the slots before `dialogue.turn_slots`), or every episode's own."""
    if not config.shared_prompt:
        return dialogue.PER_EPISODE
    turns = dialogue.turn_slots(
        env.max_turns, config.sampling.max_new_tokens, env.max_message_tokens
    )
    return dialogue.PolicyPass(config.group_size, turns)


def make_loss(
    model: Transformer,
    config: Config,
    capacity: int,
    behaviour_clip: bool = False,
    policy_pass: dialogue.PolicyPass = dialogue.PER_EPISODE,
) -> Callable[..., tuple]:
    """`loss_fn(params, batch, hparams) -> (loss, metrics)` over a batch of conversations: the
    recorded slots (tokens, mask, positions [N, S]), the policy's tokens gathered (predictors,
    targets, valid [N, K]), token advantages [N, K] and episode weights [N]; old_log_probs
    [N, K] when samples are reused; behaviour_log_probs [N, K] when the episodes are older than
    the proximal policy; sampler_log_probs and fresh_mask [N, K] for the logprob_mismatch
    metrics. With behaviour_log_probs in the batch, `behaviour_clip` is `grpo.policy_loss`'s.
    `policy_pass` computes the logits (`policy_logits_of`).
    """
    config = static(config)
    spec = config.spec

    def loss_fn(params: Any, batch: dict[str, Array], hp: HParams):
        logits = policy_logits_of(model, params, batch, policy_pass)
        log_probs, entropy, uniform_kl = token_statistics(
            logits, batch["targets"], config.sampling.temperature
        )
        old = batch.get("old_log_probs", jax.lax.stop_gradient(log_probs))
        loss, metrics = grpo.policy_loss(
            log_probs, old, batch["advantages"], batch["valid"], batch["weights"],
            clip_low=hp.clip_low, clip_high=grpo.upper_clip(spec, hp.clip_low, hp.clip_high),
            aggregation=spec.aggregation, max_new_tokens=capacity, kl_beta=hp.kl_beta,
            reference_log_probs=batch.get("reference_log_probs"),
            # Present when the episodes may be older than the proximal policy (async mode with
            # max_staleness > 0): AReaL's decoupled objective, with the clip around the
            # behaviour policy that one optimizer step per batch needs (`grpo.policy_loss`).
            behaviour_log_probs=batch.get("behaviour_log_probs"),
            totals=grpo.step_totals(batch), behaviour_clip=behaviour_clip,
            surrogate=spec.surrogate,
        )  # fmt: skip
        # The step's denominators (`optimizer_steps.normalisers` over `valid`): each term is
        # these episodes' share of the step's.
        return grpo.regularised(loss, metrics, batch, "valid", (old, entropy, uniform_kl), hp)

    return loss_fn


# --- init and update --------------------------------------------------------------------------


class Inputs(NamedTuple):
    """The KL penalty's reference parameters (None: no penalty)."""

    reference_params: Any = None


def episode_metrics(episodes: dialogue.Episodes, group_size: int) -> dict[str, Array]:
    """The played episodes' metrics (all of them, before dynamic sampling keeps some): return,
    success (a positive return), turns, zero_variance_fraction (games whose group_size
    episodes all returned the same) and slots_used."""
    returns = episodes.rewards.sum(axis=1)
    varied = group_has_signal(returns.reshape(-1, group_size))
    return {
        "return": returns.mean(),
        "success": (returns > 0).mean(),
        "turns": episodes.spoke.sum(axis=1).mean(),
        "zero_variance_fraction": 1.0 - varied.mean(),
        "slots_used": episodes.length.astype(jnp.float32),
    }


def keep_varied_games(config: Config, episodes: dialogue.Episodes) -> tuple[Any, dict]:
    """Dynamic sampling over games: of the drawn games' episodes (group_size per game, a game's
    adjacent), keep batch_size games, those whose episodes' returns differ first, and report the
    counts (`algos.dynamic_sampling.keep_varied_groups`)."""
    returns = episodes.rewards.sum(axis=1).reshape(-1, config.group_size)
    varied = group_has_signal(returns)
    kept, _, selected = keep_varied_groups(episodes, varied, config.batch_size, config.group_size)
    return kept, selected


def training_batch(
    config: Config, episodes: dialogue.Episodes, hp: HParams, capacity: int, max_turns: int
) -> tuple[dict[str, Array], dialogue.PolicyTokens]:
    """The batch an update trains on from batch_size x group_size episodes (a game's group_size
    adjacent), their credit assigned (`credit`), and the policy's tokens gathered."""
    games, group = config.batch_size, config.group_size
    gathered = dialogue.policy_tokens(episodes, capacity)
    returns = episodes.rewards.sum(axis=1)
    if config.credit == "episode":
        advantages = grpo.group_advantages(
            returns.reshape(games, group), config.spec.baseline, config.spec.scale_by_std,
            config.std_eps,
        ).reshape(-1)  # fmt: skip
        per_token = jnp.where(gathered.valid, advantages[:, None], 0.0)
    else:
        turn_returns = discounted_turn_returns(episodes.rewards, episodes.spoke, hp.gamma)
        shape = (games, group, max_turns)
        per_turn = turn_advantages(
            turn_returns.reshape(shape), episodes.spoke.reshape(shape),
            config.spec.baseline, config.spec.scale_by_std, config.std_eps,
        ).reshape(games * group, max_turns)  # fmt: skip
        per_token = token_advantages(per_turn, gathered.turn_index, gathered.valid)
    grouped = returns.reshape(games, group)
    varied = jnp.repeat(jnp.std(grouped, axis=1) > 0, group)
    weights = varied if config.spec.drop_zero_variance_groups else jnp.ones_like(varied)
    batch = {
        "tokens": episodes.tokens, "mask": episodes.mask, "positions": episodes.positions,
        "predictors": gathered.predictors, "targets": gathered.tokens,
        "valid": gathered.valid, "advantages": per_token,
        "weights": weights.astype(jnp.float32),
        # The sampler's log-probs of the policy's tokens: the behaviour policy of async and
        # partial mode's decoupled loss, and the logprob_mismatch metrics against the trainer's.
        "sampler_log_probs": gathered.sampled_log_probs, "fresh_mask": gathered.valid,
    }  # fmt: skip
    return batch, gathered


def make_rollout(
    config: Config, model: ModelConfig, env: Any, eos_id: int, pad_id: int, mesh: Any = None
) -> Callable[..., tuple[dict[str, Array], dict[str, Array]]]:
    """rollout(policy, key, hparams, data=None) -> (the batch of conversations an update trains
    on, the episodes' metrics): batch_size games played group_size times each by `policy` on
    `mesh`, their credit assigned. `data` is unused (the games come from `env`); it is there so
    that async mode drives this as it drives GRPO's rollout."""
    config = static(config)
    capacity = env.max_turns * config.sampling.max_new_tokens
    sampling = config.sampling.for_tokens(eos_id, pad_id)
    group = config.group_size

    def rollout(policy: Any, key: Array, hp: HParams, data: Any = None):
        del data
        game_key, sample_key = jax.random.split(key)
        # batch_size games, or with dynamic sampling oversample_factor times as many, of which
        # the episodes of batch_size games are kept (`keep_varied_games`).
        drawn = config.prompts_drawn
        reset_keys = jnp.repeat(jax.random.split(game_key, drawn), group, axis=0)
        sample_keys = jax.random.split(sample_key, drawn * group)
        episodes, _ = dialogue.converse(model, policy, env, reset_keys, sample_keys, sampling, mesh)
        drawn_metrics = episode_metrics(episodes, group)
        if config.dynamic_sampling:
            episodes, selected = keep_varied_games(config, episodes)
            drawn_metrics.update(selected)
        batch, gathered = training_batch(config, episodes, hp, capacity, env.max_turns)
        metrics = drawn_metrics | {"policy_tokens": gathered.valid.sum(axis=1).mean()}
        return batch, metrics

    return rollout


def make_optimize(
    transformer: Transformer,
    loss_fn: Callable,
    config: Config,
    mesh: Any,
    policy_pass: dialogue.PolicyPass = dialogue.PER_EPISODE,
) -> Callable:
    """The optimizer steps on one batch of conversations, as every rollout mode takes them
    (`optimizer_steps.optimize_with`): the old and reference log-probs of the policy's tokens
    by one forward pass over the recorded conversations, then the minibatch epochs.
    `policy_pass` is the no-grad passes' (the loss's must be the same): with a shared opening,
    minibatches shuffle whole games."""
    config = static(config)
    temperature = config.sampling.temperature

    def log_probs_of(params: Any, batch: dict[str, Array]) -> Array:
        logits = policy_logits_of(transformer, params, batch, policy_pass)
        log_probs = token_statistics(logits, batch["targets"], temperature).log_probs
        return jax.lax.stop_gradient(log_probs)

    return optimizer_steps.optimize_with(
        loss_fn, log_probs_of, config, mesh, group_size=policy_pass.group_size,
        denominators=step_normalisers,
    )  # fmt: skip


def step_normalisers(batch: dict[str, Array]) -> dict[str, Array]:
    """GRPO's denominators (`optimizer_steps.normalisers`) over a step's conversations: their
    policy tokens are the `valid` ones."""
    return optimizer_steps.normalisers(batch, mask="valid")


def unpack_inputs(inputs: Inputs | None) -> tuple[Any, None]:
    """An update's `inputs` as (reference parameters or None, the rollout's data: none)."""
    return (inputs.reference_params if inputs is not None else None), None


def learner(
    config: Config,
    model: ModelConfig,
    env: Any,
    params: Any,
    eos_id: int,
    pad_id: int,
    mesh: Any = None,
) -> Learner:
    """Multi-turn GRPO's pieces as every rollout mode assembles them (`algos.rollouts.Learner`):
    the synchronous rollout of whole episodes on a given mesh, the optimizer steps on a batch of
    conversations, the inputs' unpacking and the trainer's log-probs of the policy's tokens."""
    transformer = Transformer(model, mesh=mesh)
    capacity = env.max_turns * config.sampling.max_new_tokens
    temperature = config.sampling.temperature
    logits_pass = choose_policy_pass(config, env)

    def optimize_for(behaviour_clip: bool) -> Callable:
        loss_fn = make_loss(transformer, config, capacity, behaviour_clip, logits_pass)
        return make_optimize(transformer, loss_fn, config, mesh, logits_pass)

    def make_rollout_on(on: Any, row_buckets: int) -> Callable:
        del row_buckets  # 0: `check_rollout`
        return make_rollout(config, model, env, eos_id, pad_id, on)

    def trainer_log_probs(on: Any) -> Callable[[Any, dict], Array]:
        return lambda params, batch: (
            token_statistics(
                policy_logits_of(Transformer(model, mesh=on), params, batch, logits_pass),
                batch["targets"],
                temperature,
            ).log_probs
        )

    return Learner(
        name="multi-turn GRPO",
        config=config,
        model=model,
        params=params,
        mesh=mesh,
        source=env,
        sampling=config.sampling.for_tokens(eos_id, pad_id),
        make_rollout=make_rollout_on,
        make_optimize=optimize_for,
        unpack_inputs=unpack_inputs,
        make_trainer_log_probs=trainer_log_probs,
        check_memory=lambda: None,
    )


def check_rollout(config: Config, rollout: Any) -> None:
    """A rollout mode's settings against multi-turn GRPO's Config (one-line ConfigErrors);
    partial mode's turn budget against the game is `multiturn_partial.check_game`'s."""
    require(
        rollout.decode_row_buckets == 0,
        "decode_row_buckets",
        "multi-turn episodes decode every conversation's turn together",
        "use 0 with multi-turn GRPO",
    )
    rollout.check(config)


def make(
    config: Config,
    model: ModelConfig,
    env: Any,
    params: Any,
    eos_id: int,
    pad_id: int,
    mesh: Any = None,
    rollout: Any = None,
) -> Algorithm:
    """Multi-turn GRPO on `env` (an `envs.text.multiturn.TextEnv`) as pure functions of one run,
    from `params`: `init(key, hparams)` and `update(state, inputs, hparams)`, where one update
    plays batch_size x group_size episodes and takes num_epochs x num_minibatches optimizer
    steps on them. `eos_id` ends a turn (a chat template's end-of-turn token). Update i draws
    its games and samples from fold_in(state.key, i), so a resumed run repeats an uninterrupted
    one. Metrics: `return` (mean episode return), `success` (the fraction with a positive
    return), `turns`, `policy_tokens` (per episode), the sampler/trainer `logprob_mismatch_*`,
    and the optimizer steps' means.

    `rollout` (`algos.rollouts`): `Sync()` when None; `algos.asynchronous.Async(...)` plays the
    episodes on the generation mesh beside the training mesh `mesh`, from weights up to
    max_staleness versions old (`update` is then a host function: call it, do not jit it);
    `algos.partial.Partial(...)` carries conversations across updates in the state's slots,
    rollout_budget turns per update (`algos.multiturn_partial`)."""
    rollout = Sync() if rollout is None else rollout
    check_rollout(config, rollout)
    return rollout.make(learner(config, model, env, params, eos_id, pad_id, mesh))
