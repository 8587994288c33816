"""Partial rollouts (APRIL; issue 39): GRPO whose updates never wait for the longest completion.

In synchronous GRPO every update decodes until its longest completion ends, and rows that ended
early compute padding meanwhile. Here the sampler's state lives in the algorithm's state:
rollout_groups x group_size slots (rollout_groups defaults to batch_size; more is APRIL's
over-provisioning), each with its KV cache, next-token logits, the tokens generated so far and
the policy version that sampled each of them. One update, still one compiled program:

    refill       <- groups whose slots hold nothing (at the start, or trained or dropped last
                    update) get new prompts, prefilled once per group and shared by its rows
                    (continuous batching at fixed shapes: every update prefills rollout_groups
                    prompts and keeps those that land in free groups)
    decode       <- every unfinished row decodes until the budget (`rollout_budget` steps), or
                    until batch_size groups have ended and no row risks its staleness bound
    train        <- the batch_size ended groups that started first (fewer, at weight 0, when
                    fewer ended) are scored and trained on at GRPO's fixed shapes; ended groups
                    beyond them wait in their slots; unfinished ones go on next update
    update       <- GRPO's loss; with max_staleness > 0, AReaL's decoupled objective: the
                    behaviour policy is the sampler's recorded log-prob, the proximal one the
                    parameters the update starts from, plus a clip around the behaviour policy
                    (`grpo.policy_loss`'s behaviour_clip)

The policy version of a token is the update (`state.step`) that sampled it; a trained token's
staleness is the training update's version minus its own. `Partial.check` requires a completion
of max_new_tokens to fit in max_staleness + 1 budgets, and decoding never stops before the budget
while some row could otherwise miss its bound, so every completion ends in time. A group that
would still break the bound (an ended group that waited too long for a training slot, with
over-provisioning) is dropped -- its slot freed without training, counted in `dropped_groups`
-- rather than trained: training on it would exceed the bound, and cutting a completion short
would train on an unfinished answer that synchronous GRPO would never score at that length.

The KV cache is used through `init_cache`, the model's apply and its `index` (the column the
next tokens are written at), never its layout: which axis of each cache array is the batch and
which the sequence is read off `init_cache`'s shapes. Column order is time order in the cache,
so the write column cannot wrap around: each update starts by moving the cache left by the
previous update's decode steps, which puts every carried row's history just before a fixed
column and leaves room for a budget of steps after it.

With max_staleness 0 (then the budget must cover max_new_tokens) and rollout_groups =
batch_size, every group starts and ends in one update and the samples and the parameters are
those of synchronous GRPO, bit for bit (behaviour == proximal, so no importance weight is
applied).

The mode is the `Partial` passed to `grpo.make` (or `multiturn.make`, whose budget counts turns:
`algos.multiturn_partial`); what the two share is `algos.carried_rollouts`.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, ClassVar, NamedTuple

import jax
import jax.numpy as jnp

from algos import grpo, multiturn, multiturn_partial
from algos.carried_rollouts import (
    State,
    choose_groups,
    move_cache_left,
    staleness_metrics,
    train_if_any,
)
from algos.dynamic_sampling import group_has_signal
from algos.rollouts import Learner, check_decode_row_buckets, require_decode_row_buckets
from envs.text import PromptBatch
from jaxrl import sharding
from jaxrl.config import require, require_count
from jaxrl.hparams import HParams, static
from jaxrl.lm import training
from jaxrl.lm.model import Transformer, init_cache, positions_from_mask
from jaxrl.lm.sampler import (
    Completion,
    decode_live_rows,
    generation_copy,
    map_cache,
    row_draws,
    sample_token,
)
from jaxrl.loop import Algorithm

Array = jax.Array


@dataclasses.dataclass(frozen=True)
class Partial:
    """Partial rollouts (APRIL): every update decodes at most `rollout_budget` steps (0:
    max_new_tokens; multi-turn GRPO: turns, 0 the game's max_turns); groups whose completions
    all ended train, unfinished ones keep their KV-cache slot and continue in the next update,
    freed slots take new prompts. The KV cache holds the prompt + budget x (1 + floor(
    (max_new_tokens - 1) / budget)) columns (`geometry`): synchronous GRPO's prompt +
    max_new_tokens when the budget divides max_new_tokens, up to budget - 1 more otherwise, and
    every decode step reads them all."""

    rollout_budget: int = 0
    # Prompt groups decoded at once (APRIL's over-provisioning): decoding stops once batch_size
    # of them have ended, which train; 0 means batch_size.
    rollout_groups: int = 0
    # The oldest policy a trained token may come from, in updates (AReaL's max offpolicyness).
    max_staleness: int = 0
    # Decode only the rows still sampling (`algos.rollouts.Sync`'s); single completions only.
    decode_row_buckets: int = 0
    host_loop: ClassVar[bool] = False

    def __post_init__(self) -> None:
        for name in ("rollout_budget", "rollout_groups", "max_staleness"):
            require_count(self, name, "use a whole number, 0 or more")
        require_decode_row_buckets(self)

    def check(self, config: Any) -> None:
        """These settings against the algorithm's Config: the batch and mesh the slots split
        over, what partial mode does not support yet and, for single completions, the decode
        budget against max_new_tokens and the staleness bound (multi-turn GRPO's budget is
        checked against the game, `multiturn_partial.check_game`)."""
        require(
            self.rollout_groups == 0 or self.rollout_groups >= config.batch_size,
            "rollout_groups",
            f"got {self.rollout_groups}, fewer than the batch_size={config.batch_size} groups "
            "an update trains",
            f"use 0 (batch_size) or {config.batch_size} or more",
        )
        shards = training.check_mesh_shape(config.mesh_shape)
        slot_rows = self.slot_groups(config) * config.group_size
        require(
            slot_rows % shards == 0,
            "rollout_groups",
            f"{slot_rows} slot rows (rollout_groups x group_size) do not split over the mesh's "
            f"data*fsdp = {shards} batch shards",
            f"make rollout_groups x group_size a multiple of {shards}",
        )
        require(
            config.lora_rank == 0,
            "rollout_mode",
            "partial rollouts train every parameter for now, not LoRA adapters",
            "use rollout_mode=sync with LoRA, or lora_rank=0",
        )
        require(
            not config.dynamic_sampling,
            "rollout_mode",
            "partial rollouts do not combine with dynamic_sampling yet",
            "use rollout_mode=sync with dynamic sampling",
        )
        require(
            config.spec.baseline != "greedy",
            "rollout_mode",
            "partial rollouts do not generate ReMax's greedy baseline",
            "use rollout_mode=sync with variant=remax",
        )
        if isinstance(config, multiturn.Config):
            return  # the budget counts turns (`multiturn_partial.check_game`)
        new_tokens = config.sampling.max_new_tokens
        require(
            self.rollout_budget <= new_tokens,
            "rollout_budget",
            f"got {self.rollout_budget}, more decode steps than a completion of "
            f"max_new_tokens={new_tokens} can take",
            f"use at most {new_tokens} (0 means max_new_tokens)",
        )
        steps = self.budget(new_tokens)
        updates = math.ceil(new_tokens / steps)
        require(
            updates - 1 <= self.max_staleness,
            "max_staleness",
            f"a completion of max_new_tokens={new_tokens} takes {updates} updates of "
            f"{steps} decode steps, so its first tokens are {updates - 1} versions old when "
            f"it trains, beyond the bound {self.max_staleness}",
            f"raise max_staleness to {updates - 1}, or rollout_budget to "
            f"{math.ceil(new_tokens / (self.max_staleness + 1))}",
        )
        check_decode_row_buckets(self.decode_row_buckets, config, self.rollout_groups)

    def slot_groups(self, config: Any) -> int:
        """Groups decoded at once: rollout_groups, or the Config's batch_size when it is 0."""
        return self.rollout_groups or config.batch_size

    def budget(self, limit: int) -> int:
        """Decode steps (turns) per update: rollout_budget, or `limit` (max_new_tokens, or the
        game's max_turns) when it is 0."""
        return self.rollout_budget or limit

    def make(self, learner: Learner) -> Algorithm:
        """The learner's algorithm with partial rollouts: single completions (GRPO) here,
        conversations in `algos.multiturn_partial`."""
        if isinstance(learner.config, multiturn.Config):
            return multiturn_partial.make(self, learner)
        return make_completions(self, learner)


class Slots(NamedTuple):
    """The carried generation state: B = batch_size x group_size rows, a group's rows adjacent."""

    prompts: PromptBatch  # [B] each row's prompt (and answer, for the rewards)
    cache: Any  # the model's KV cache for the B rows (`init_cache`)
    logits: Array  # [B, V] each row's next-token logits
    position: Array  # [B] the position id of each row's next token
    length: Array  # [B] tokens generated so far
    done: Array  # [B] the completion ended (EOS or max_new_tokens)
    live: Array  # [B] the slot holds a completion not trained on yet (the same for a group)
    tokens: Array  # [B, N] generated ids, pad after the end
    log_probs: Array  # [B, N] the sampler's log-prob of each token (the behaviour policy's)
    mask: Array  # [B, N] generated tokens
    versions: Array  # [B, N] the policy version (update) that sampled each token
    started: Array  # [B] the version that prefilled the row's prompt
    shift: Array  # decode steps of the last update: how far the cache moves left before the next


class Geometry(NamedTuple):
    """Where rows sit in the cache: prompts end (and carried rows' histories end) at column
    `start`; an update decodes into columns start ... start + budget - 1 < length."""

    start: int
    length: int


def geometry(prompt_length: int, max_new_tokens: int, steps: int) -> Geometry:
    """A carried row holds a whole number of updates' tokens, fewer than max_new_tokens: at
    most steps x floor((max_new_tokens - 1) / steps). With steps >= max_new_tokens nothing is
    carried and the cache is synchronous GRPO's (prompt + max_new_tokens columns)."""
    carried = steps * ((max_new_tokens - 1) // steps)
    start = prompt_length + carried
    return Geometry(start, start + steps)


def make_completions(rollout: Partial, learner: Learner) -> Algorithm:
    """GRPO with partial rollouts as `init(key, hparams)` and `update(state, inputs, hparams)`
    (the contract of `grpo.make`). The state is a `State` holding `Slots`; update i draws its
    prompts and samples from fold_in(state.key, i) as GRPO does."""
    config, model, task, mesh = learner.config, learner.model, learner.source, learner.mesh
    groups, group_size = config.batch_size, config.group_size
    slot_groups = rollout.slot_groups(config)  # groups decoded at once; batch_size train
    new_tokens = config.sampling.max_new_tokens
    rows, steps = slot_groups * group_size, rollout.budget(new_tokens)
    grpo.check_memory(config, model, task, slot_groups=slot_groups, budget=steps)
    transformer = Transformer(model, mesh=mesh)
    # With max_staleness > 0, the clip around the behaviour policy too (`grpo.policy_loss`):
    # AReaL's clip, around this update's own start, never acts on one optimizer step per
    # batch, and without it staleness 1 collapsed reverse_digits after learning it (README).
    max_staleness = rollout.max_staleness
    optimize = learner.make_optimize(max_staleness > 0)
    config = static(config)
    spec = config.spec
    sampling = learner.sampling
    prompt_shape = jax.eval_shape(
        lambda key: task.sample_prompts(key, slot_groups, task.data), jax.random.key(0)
    )
    prompt_length = prompt_shape.tokens.shape[1]
    where = geometry(prompt_length, new_tokens, steps)
    base_init = training.make_init(learner.params, config, mesh, model)

    def empty_slots() -> Slots:
        per_row = lambda s: jnp.zeros((rows, *s.shape[1:]), s.dtype)  # noqa: E731
        return Slots(
            prompts=jax.tree.map(per_row, prompt_shape),
            cache=init_cache(model, rows, where.length),
            logits=jnp.zeros((rows, model.vocab_size), jnp.float32),
            position=jnp.zeros((rows,), jnp.int32),
            length=jnp.zeros((rows,), jnp.int32),
            done=jnp.zeros((rows,), bool),
            live=jnp.zeros((rows,), bool),
            tokens=jnp.full((rows, new_tokens), task.pad_id, jnp.int32),
            log_probs=jnp.zeros((rows, new_tokens), jnp.float32),
            mask=jnp.zeros((rows, new_tokens), bool),
            versions=jnp.zeros((rows, new_tokens), jnp.int32),
            started=jnp.zeros((rows,), jnp.int32),
            shift=jnp.zeros((), jnp.int32),
        )

    def placed(slots: Slots) -> Slots:
        """The slots split over the mesh's batch shards by row (each cache leaf along its
        batch axis), as the update leaves them; made on one device, a multi-device run would
        hold every carried row on device 0."""
        if mesh is None:
            return slots

        def spec(ndim: int, axis: int | None) -> jax.sharding.NamedSharding:
            axes = [sharding.BATCH_AXES if i == axis else None for i in range(ndim)]
            return jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(*axes))

        cache = map_cache(
            model, lambda b, s, leaf: jax.device_put(leaf, spec(leaf.ndim, b)), slots.cache
        )
        rest = jax.tree.map(
            lambda x: jax.device_put(x, spec(x.ndim, 0 if x.ndim else None)),
            slots._replace(cache=None),
        )
        return rest._replace(cache=cache)

    def init(key: Array, hp: HParams) -> State:
        state = base_init(key, hp)
        return State(state.params, state.opt_state, state.key, state.step, placed(empty_slots()))

    def refill(slots: Slots, generation_params: Any, prompts: PromptBatch, version: Array):
        """Move the cache left by the last update's steps, then give every free group one of
        `prompts` (group g the g-th), prefilled once and shared by its rows."""
        cache = dict(
            move_cache_left(model, slots.cache, slots.shift),
            index=jnp.asarray(where.start, jnp.int32),
        )
        fresh = dict(init_cache(model, slot_groups, where.length))
        fresh["index"] = jnp.asarray(where.start - prompt_length, jnp.int32)
        positions = positions_from_mask(prompts.mask.astype(bool))
        logits, fresh = transformer.apply(
            {"params": generation_params},
            prompts.tokens,
            positions,
            prompts.mask.astype(bool),
            fresh,
            logits_for_last=1,
        )
        share = lambda x, axis=0: jnp.repeat(x, group_size, axis, total_repeat_length=rows)  # noqa: E731
        free = ~slots.live

        def pick(new: Array, old: Array, axis: int = 0) -> Array:
            shape = [1] * old.ndim
            shape[axis] = rows
            return jnp.where(free.reshape(shape), new, old)

        cache = map_cache(
            model,
            lambda b, s, new, old: old if b is None else pick(share(new, b), old, b),
            fresh,
            cache,
        )
        grouped = jax.tree.map(lambda new, old: pick(share(new), old), prompts, slots.prompts)
        blank = empty_slots()
        return Slots(
            prompts=grouped,
            cache=cache,
            logits=pick(share(logits[:, -1]), slots.logits),
            position=pick(share(positions[:, -1] + 1), slots.position),
            length=pick(blank.length, slots.length),
            done=pick(blank.done, slots.done),
            live=jnp.ones_like(slots.live),
            tokens=pick(blank.tokens, slots.tokens),
            log_probs=pick(blank.log_probs, slots.log_probs),
            mask=pick(blank.mask, slots.mask),
            versions=pick(blank.versions, slots.versions),
            started=jnp.where(free, version, slots.started),
            shift=slots.shift,
        )

    def decode(slots: Slots, generation_params: Any, key: Array, version: Array) -> Slots:
        """At most `steps` decode steps for every live, unfinished row; stops early once none
        is left. Step i samples with the i-th split of `key`, as the synchronous sampler does.
        With decode_row_buckets, only the rows still sampling are decoded (`decode_live_rows`)."""
        columns = jnp.arange(new_tokens)
        alive_of = lambda carry: carry[2].live & ~carry[2].done  # noqa: E731

        def unfinished(carry: tuple) -> Array:
            step, _, s = carry
            # APRIL: stop once batch_size groups have ended, or at the budget -- but not while
            # a row could still need more steps than the budget gives it in the updates its
            # staleness bound leaves (max_new_tokens - length > budget x (bound - age)):
            # stopping then would drop the longest completions and bias training to short ones.
            alive = s.live & ~s.done
            ended = jnp.all((s.live & s.done).reshape(slot_groups, group_size), axis=1)
            age = version - s.started
            at_risk = alive & (new_tokens - s.length > steps * (max_staleness - age))
            enough = (ended.sum() >= groups) & ~jnp.any(at_risk)
            return (step < steps) & jnp.any(alive) & ~enough

        def one_step(carry: tuple, cache: Any, logits: Array, decoded: Array | None) -> tuple:
            # `decoded`: the slot rows this step decodes (None: all); `cache` and `logits` theirs.
            step, key, s = carry
            at = (lambda x: x) if decoded is None else (lambda x: x[decoded])  # noqa: E731
            put = (  # noqa: E731
                (lambda _, x: x) if decoded is None else (lambda full, x: full.at[decoded].set(x))
            )
            key, sample_key = jax.random.split(key)
            draws = row_draws(sample_key, rows, decoded)
            token, log_prob = sample_token(logits, sample_key, sampling, draws)
            alive = at(s.live & ~s.done)
            token = jnp.where(alive, token, sampling.pad_id)
            length = at(s.length)
            here = (columns[None] == length[:, None]) & alive[:, None]
            ended = (token == sampling.eos_id) | (length + alive >= new_tokens)
            logits, cache = transformer.apply(
                {"params": generation_params},
                token[:, None],
                at(s.position)[:, None],
                alive[:, None],
                cache,
            )
            s = s._replace(
                position=s.position + 1,
                length=put(s.length, length + alive),
                done=put(s.done, at(s.done) | (alive & ended)),
                tokens=put(s.tokens, jnp.where(here, token[:, None], at(s.tokens))),
                log_probs=put(s.log_probs, jnp.where(here, log_prob[:, None], at(s.log_probs))),
                mask=put(s.mask, at(s.mask) | here),
                versions=put(s.versions, jnp.where(here, version, at(s.versions))),
            )
            return (step + 1, key, s), cache, logits[:, -1]

        carried = slots._replace(cache=None, logits=None)
        (taken, _, slots), cache, logits = decode_live_rows(
            model,
            one_step,
            unfinished,
            alive_of,
            (jnp.int32(0), key, carried),
            slots.cache,
            slots.logits,
            rollout.decode_row_buckets,
        )
        return slots._replace(cache=cache, logits=logits, shift=taken)

    def update(state: State, inputs: Any, hp: HParams):
        reference_params, task_data = learner.unpack_inputs(inputs)
        version = state.step
        # GRPO's key schedule, so that with nothing carried the samples are synchronous GRPO's.
        rollout_key, shuffle_key = jax.random.split(jax.random.fold_in(state.key, state.step))
        prompt_key, sample_key = jax.random.split(rollout_key)
        generation_params = generation_copy(state.params, model)

        slots = state.slots
        # The staleness bound: a group that would train on tokens older than max_staleness
        # versions is dropped (see the module docstring; a valid config never has one).
        too_old = slots.live & (version - slots.started > max_staleness)
        slots = slots._replace(live=slots.live & ~too_old)
        prompts = task.sample_prompts(prompt_key, slot_groups, task_data)
        refilled = ~slots.live
        slots = refill(slots, generation_params, prompts, version)
        slots = decode(slots, generation_params, sample_key, version)

        # Groups whose rows all ended train now (up to batch_size of them, the oldest first);
        # the rest go on, or wait, in their slots until the next update.
        complete = jnp.all((slots.live & slots.done).reshape(slot_groups, group_size), axis=1)
        chosen, trains, freed = choose_groups(complete, slots.started[::group_size], groups)
        chosen_rows = (chosen[:, None] * group_size + jnp.arange(group_size)).reshape(-1)
        take = lambda x: jnp.take(x, chosen_rows, axis=0)  # noqa: E731
        picked = jax.tree.map(take, (slots.prompts, slots.tokens, slots.log_probs, slots.mask))
        grouped, tokens, log_probs, mask = picked
        lengths, versions, started = take(slots.length), take(slots.versions), take(slots.started)
        grouped = sharding.constrain_batch(grouped, mesh)
        completion = Completion(tokens, log_probs, mask, lengths)
        trained_rows = jnp.repeat(trains, group_size, total_repeat_length=groups * group_size)
        rewards = jnp.zeros(lengths.shape, jnp.float32)
        weight = trained_rows.astype(jnp.float32)
        count = jnp.maximum(weight.sum(), 1.0)
        metrics = {}
        for term in task.reward_terms:
            value = term.fn(grouped, completion).astype(jnp.float32)
            metrics[f"reward_{term.name}"] = jnp.sum(value * weight) / count
            rewards = rewards + term.weight * value
        rewards = rewards + grpo.overlong_penalty(
            lengths, new_tokens, config.overlong_buffer, hp.overlong_penalty
        )
        by_group = rewards.reshape(groups, group_size)
        has_signal = group_has_signal(by_group)
        advantages = grpo.group_advantages(
            by_group, spec.baseline, spec.scale_by_std, config.std_eps
        )
        weights = jnp.broadcast_to(trains[:, None], by_group.shape).astype(jnp.float32)
        if spec.drop_zero_variance_groups:
            weights = weights * has_signal[:, None]
        trained_mask = mask & trained_rows[:, None]
        batch = {
            "tokens": jnp.concatenate([grouped.tokens, tokens], axis=1),
            "attention_mask": jnp.concatenate([grouped.mask, mask], axis=1),
            "completion_mask": mask,
            "advantages": advantages.reshape(-1),
            "weights": weights.reshape(-1),
            "sampler_log_probs": log_probs,
            # The same parameters sampled these rows' every token and cache entry.
            "fresh_mask": trained_mask & (started == version)[:, None],
        }
        if max_staleness > 0:
            # Older samples: AReaL's decoupled objective. With the bound at 0 every token is
            # the proximal policy's and the loss stays GRPO's, bit for bit.
            batch["behaviour_log_probs"] = log_probs
        train_state, step_metrics = train_if_any(
            optimize, state, batch, hp, shuffle_key, reference_params, jnp.any(trains)
        )
        metrics.update(step_metrics)

        staleness = version - versions
        trained_tokens = trained_mask.sum()
        trained_groups = jnp.maximum(trains.sum(), 1)
        ended_with_eos = jnp.any(mask & (tokens == task.eos_id), axis=1)
        metrics.update(
            reward=jnp.sum(rewards * weight) / count,
            reward_std=jnp.sum(jnp.std(by_group, axis=1, ddof=1) * trains) / trained_groups,
            zero_variance_fraction=jnp.sum(~has_signal & trains) / trained_groups,
            completion_length=jnp.sum(lengths * weight) / count,
            ended_with_eos=jnp.sum(ended_with_eos * weight) / count,
            prefilled_tokens=jnp.sum(refilled) // group_size * prompt_length,
            trained_groups=trains.sum().astype(jnp.float32),
            waiting_groups=(complete.sum() - trains.sum()).astype(jnp.float32),
            trained_tokens=trained_tokens.astype(jnp.float32),
            decode_steps=slots.shift.astype(jnp.float32),
            dropped_groups=too_old.sum().astype(jnp.float32) / group_size,
        )
        metrics.update(staleness_metrics(staleness, trained_mask, max_staleness))
        freed_rows = jnp.repeat(freed, group_size, total_repeat_length=rows)
        slots = slots._replace(live=slots.live & ~freed_rows)
        state = State(train_state.params, train_state.opt_state, state.key, state.step + 1, slots)
        return state, metrics

    return Algorithm(init, update)
