"""Partial rollouts of multi-turn episodes (issue 39, item 4): conversations carried across
updates, so that an update never waits for the longest conversation.

Multi-turn GRPO (`algos.multiturn`) plays every update's conversations to their end. Here the
turn loop of `jaxrl.lm.dialogue` is resumable and its state lives in the algorithm's state:
rollout_groups x group_size slots (rollout_groups defaults to batch_size), each holding one
conversation -- its KV cache, next-token logits and position, the environment's state, its turn
counter and rewards, its sampling key, and its record: every token so far with the mask of the
policy's tokens (the loss mask) against the environment's, the sampler's log-prob of each policy
token (the behaviour policy's) and the policy version (update) that sampled it. One update,
still one compiled program:

    refill   <- slots whose conversation trained (or was dropped) last update, and every slot
                at the start, get a new game: reset, opening prefilled (at fixed shapes: every
                update resets and prefills a game per slot and keeps those of free slots)
    turns    <- every conversation not over speaks at most `rollout_budget` turns (the game
                answers each), fewer once every one is over
    train    <- the batch_size groups (the games' group_size conversations) whose members all
                ended, those that started first, are scored and trained on at multi-turn GRPO's
                fixed shapes (fewer, at weight 0, when fewer ended); the others go on, or wait,
                in their slots

The budget counts turns, not decode steps: a turn is the unit the environment acts on (its
`step` reads a whole utterance, and a host game would be called once per turn), so stopping at
a turn boundary carries nothing half-said, and the carried state is the turn loop's own. A
budget in decode steps would have to carry a half-spoken turn too; a turn is at most
max_new_tokens steps, so the turn budget bounds the decode steps as well.

Staleness: a conversation's tokens are at most ceil(max_turns / budget) - 1 versions old when
it trains, and `check_game` requires that within max_staleness, so no conversation is ever
cut short. A group that would still exceed the bound -- an ended group that waited too long
for a training slot, with rollout_groups > batch_size -- is finished and dropped (its slots
freed untrained, counted in `dropped_groups`), as in single-turn partial mode: training on it
would exceed the bound, and cutting it earlier would score an unfinished conversation.

The cache's write column is shared by the slots; each update starts by moving the cache left
by the previous update's columns (`carried_rollouts.move_cache_left`), which puts every carried
conversation's history just before a fixed column, and a slot's record is its own (the row's
`origin`: the cache column of its record's slot 0). With max_staleness 0, a budget of max_turns
and rollout_groups = batch_size, every conversation starts and ends in one update and the
samples and the parameters are synchronous multi-turn GRPO's, bit for bit.

With `shared_prompt` (each game's opening once per pass, `multiturn.Config`) nothing changes
here: a game's slots start together from one reset, so their records hold the same opening from
slot 0, and the games that train are whole and in order.

The mode is `algos.partial.Partial` passed to `multiturn.make`, which hands it here.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from algos import multiturn
from algos.carried_rollouts import (
    State,
    choose_groups,
    move_cache_left,
    staleness_metrics,
    train_if_any,
)
from algos.rollouts import Learner
from jaxrl.config import require
from jaxrl.hparams import HParams, static
from jaxrl.lm import dialogue, training
from jaxrl.lm.model import Transformer
from jaxrl.lm.sampler import map_cache
from jaxrl.loop import Algorithm

Array = jax.Array


def check_game(rollout: Any, env: Any) -> None:
    """Partial mode's checks that need the game (the others are `Partial.check`'s): one-line
    ConfigErrors naming the field. `rollout` is the `algos.partial.Partial`."""
    require(
        not getattr(env, "batched", False),
        "rollout_mode",
        "partial rollouts of multi-turn episodes need a JAX game (a host game's episodes live "
        "on the host and are not carried in the state)",
        "use rollout_mode=sync or async with a host game",
    )
    require(
        rollout.rollout_budget <= env.max_turns,
        "rollout_budget",
        f"got {rollout.rollout_budget} turns, more than a game's max_turns={env.max_turns}",
        f"use at most {env.max_turns} (0 means max_turns)",
    )
    turns = rollout.budget(env.max_turns)
    updates = math.ceil(env.max_turns / turns)
    require(
        updates - 1 <= rollout.max_staleness,
        "max_staleness",
        f"a conversation of max_turns={env.max_turns} takes {updates} updates of "
        f"{turns} turns, so its first tokens are {updates - 1} versions old when "
        f"it trains, beyond the bound {rollout.max_staleness}",
        f"raise max_staleness to {updates - 1}, or rollout_budget to "
        f"{math.ceil(env.max_turns / (rollout.max_staleness + 1))}",
    )


class Slots(NamedTuple):
    """The carried conversations: B = rollout_groups x group_size rows, a game's rows adjacent."""

    conversations: dict  # the turn loop's state (`dialogue.start_conversations`), keys as data
    live: Array  # [B] the slot holds a conversation not trained on yet (the same for a group)
    started: Array  # [B] the version (update) that started the conversation
    shift: Array  # cache columns the last update used: how far the cache moves left next


def _typed(key: Array) -> bool:
    return jnp.issubdtype(key.dtype, jax.dtypes.prng_key)


def make(rollout: Any, learner: Learner) -> Algorithm:
    """Multi-turn GRPO with partial rollouts as `init(key, hparams)` and `update(state, inputs,
    hparams)` (`algos.partial.Partial.make` hands `multiturn.make`'s learner here); the state
    is a `carried_rollouts.State` holding `Slots`. Update i draws its new games and sampling
    keys from fold_in(state.key, i) as multi-turn GRPO does, so a resumed run repeats an
    uninterrupted one."""
    config, model, env, mesh = learner.config, learner.model, learner.source, learner.mesh
    check_game(rollout, env)
    max_staleness = rollout.max_staleness
    # The decoupled objective's clip around the behaviour policy with max_staleness > 0.
    optimize = learner.make_optimize(max_staleness > 0)
    config = static(config)
    transformer = Transformer(model, mesh=mesh)
    sampling = learner.sampling
    new_tokens = sampling.max_new_tokens
    groups, group_size = config.batch_size, config.group_size
    slot_groups = rollout.slot_groups(config)
    rows, turns = slot_groups * group_size, rollout.budget(env.max_turns)
    capacity = env.max_turns * new_tokens
    reset = dialogue.env_reset(env)
    opening_shape = jax.eval_shape(lambda k: reset(k)[1], jax.random.split(jax.random.key(0), rows))
    opening_width, message_type = opening_shape.ids.shape[1], type(opening_shape)
    size = dialogue.episode_length(opening_width, env.max_turns, new_tokens, env.max_message_tokens)
    # Cache geometry: a turn writes at most max_new_tokens + 1 (an appended end of turn) +
    # the widest message columns. A carried conversation has spoken a whole number of
    # budgets, fewer than max_turns turns; its history ends at column `start` after the move
    # left, and an update writes at most `turns` turns after it.
    turn_columns = new_tokens + 1 + env.max_message_tokens
    start = opening_width + turns * ((env.max_turns - 1) // turns) * turn_columns
    cache_length = start + turns * turn_columns
    base_init = training.make_init(learner.params, config, mesh, model)

    def pick(free: Array, new: Any, old: Any) -> Any:
        """Per row, `new` where `free`, else `old` (the cache by each leaf's batch axis)."""

        def by_axis(axis: int | None, n: Array, o: Array) -> Array:
            if axis is None:
                return n
            shape = [1] * o.ndim
            shape[axis] = rows
            return jnp.where(free.reshape(shape), n, o)

        cache = map_cache(model, lambda a, _, n, o: by_axis(a, n, o), new["cache"], old["cache"])
        rest = {k: v for k, v in new.items() if k != "cache"}
        olds = {k: v for k, v in old.items() if k != "cache"}
        rest = jax.tree.map(lambda n, o: by_axis(0 if o.ndim else None, n, o), rest, olds)
        return dict(rest, cache=cache)

    def fresh_conversations(generation_params: Any, game_key: Array, sample_key: Array) -> dict:
        """A new game in every slot (a game's group_size rows the same game), its opening
        prefilled to end at column `start`: multi-turn GRPO's draws for `slot_groups` games."""
        reset_keys = jnp.repeat(jax.random.split(game_key, slot_groups), group_size, axis=0)
        sample_keys = jax.random.split(sample_key, rows)
        env_state, opening = reset(reset_keys)
        carry = dialogue.start_conversations(
            model, env, sampling, env_state, sample_keys, size, cache_length,
            start - opening_width, versions=True,
        )  # fmt: skip
        steps = dialogue.conversation_steps(
            transformer, generation_params, env, sampling, message_type
        )
        real = jnp.arange(opening_width)[None] < opening.length[:, None]
        return steps.feed(carry, opening.ids, real)

    def init(key: Array, hp: HParams) -> State:
        state = base_init(key, hp)
        shapes = jax.eval_shape(
            lambda p, k: fresh_conversations(p, *jax.random.split(k)), state.params, key
        )
        empty = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)
        # The per-row sampling keys are kept as their data (uint32) so a slot can take a new
        # one by `jnp.where`; typed again for the turn loop.
        keys = jax.random.split(key, rows)
        empty["keys"] = jax.random.key_data(keys) if _typed(keys) else keys
        slots = Slots(
            empty, jnp.zeros((rows,), bool), jnp.zeros((rows,), jnp.int32), jnp.zeros((), jnp.int32)
        )
        return State(state.params, state.opt_state, state.key, state.step, slots)

    def update(state: State, inputs: Any, hp: HParams):
        reference_params, _ = learner.unpack_inputs(inputs)
        version = state.step
        # Multi-turn GRPO's key schedule: with nothing carried, its games and samples.
        rollout_key, shuffle_key = jax.random.split(jax.random.fold_in(state.key, state.step))
        game_key, sample_key = jax.random.split(rollout_key)
        as_data = lambda k: jax.random.key_data(k) if _typed(k) else k  # noqa: E731
        as_keys = (  # noqa: E731
            (lambda d: jax.random.wrap_key_data(d, impl=jax.random.key_impl(state.key)))
            if _typed(state.key)
            else (lambda d: d)
        )

        slots = state.slots
        # The staleness bound: a group that would train on tokens older than max_staleness
        # versions is dropped (see the module docstring; it can only happen to a group that
        # waited for a training slot, with rollout_groups > batch_size).
        too_old = slots.live & (version - slots.started > max_staleness)
        free = ~(slots.live & ~too_old)

        carried = dict(slots.conversations)
        carried["cache"] = dict(
            move_cache_left(model, carried["cache"], slots.shift),
            index=jnp.asarray(start, jnp.int32),
        )
        carried["origin"] = carried["origin"] - slots.shift
        fresh = fresh_conversations(state.params, game_key, sample_key)
        fresh["keys"] = as_data(fresh["keys"])
        conversations = pick(free, fresh, carried)
        started = jnp.where(free, version, slots.started)
        conversations.update(
            keys=as_keys(conversations["keys"]),
            version=version,
            # Conversations started this update write holes while others speak, as the
            # synchronous sampler's do; carried ones, which may have ended long ago, only
            # while they speak.
            writing=started == version,
        )

        steps = dialogue.conversation_steps(transformer, state.params, env, sampling, message_type)
        _, conversations = jax.lax.while_loop(
            lambda c: (c[0] < turns) & ~jnp.all(c[1]["done"]),
            lambda c: (c[0] + 1, steps.one_turn(c[1])),
            (jnp.int32(0), conversations),
        )
        shift = conversations["cache"]["index"] - start
        conversations["keys"] = as_data(conversations["keys"])

        # Groups whose conversations all ended train now (up to batch_size, the oldest first).
        done = conversations["done"]
        complete = jnp.all(done.reshape(slot_groups, group_size), axis=1)
        chosen, trains, freed = choose_groups(complete, started[::group_size], groups)
        chosen_rows = (chosen[:, None] * group_size + jnp.arange(group_size)).reshape(-1)
        take = lambda x: jnp.take(x, chosen_rows, axis=0)  # noqa: E731
        chosen_conversations = jax.tree.map(
            take, {k: conversations[k] for k in ("record", "rewards", "spoke", "done", "origin")}
        )
        record = dict(chosen_conversations["record"])
        versions = record.pop("versions")
        episodes = dialogue.Episodes(
            **record,
            rewards=chosen_conversations["rewards"],
            spoke=chosen_conversations["spoke"],
            done=chosen_conversations["done"],
            length=jnp.asarray(size, jnp.int32),
        )
        batch, gathered = multiturn.training_batch(config, episodes, hp, capacity, env.max_turns)
        trained_rows = jnp.repeat(trains, group_size, total_repeat_length=groups * group_size)
        batch["weights"] = batch["weights"] * trained_rows
        trained_mask = gathered.valid & trained_rows[:, None]
        token_versions = jnp.take_along_axis(versions, gathered.slots, axis=1)
        # The same parameters sampled these conversations' every token and cache entry.
        batch["fresh_mask"] = trained_mask & (take(started) == version)[:, None]
        if max_staleness > 0:
            # Older conversations: AReaL's decoupled objective, as in single-turn partial mode.
            # With the bound at 0 every token is the proximal policy's and the loss stays
            # multi-turn GRPO's, bit for bit.
            batch["behaviour_log_probs"] = gathered.sampled_log_probs
        train_state, metrics = train_if_any(
            optimize, state, batch, hp, shuffle_key, reference_params, jnp.any(trains)
        )

        weight = trained_rows.astype(jnp.float32)
        count = jnp.maximum(weight.sum(), 1.0)
        returns = episodes.rewards.sum(axis=1)
        still_going = ~done & ~jnp.repeat(freed, group_size, total_repeat_length=rows)
        metrics.update(
            {
                "return": jnp.sum(returns * weight) / count,
                "success": jnp.sum((returns > 0) * weight) / count,
                "turns": jnp.sum(episodes.spoke.sum(axis=1) * weight) / count,
                "policy_tokens": jnp.sum(gathered.valid.sum(axis=1) * weight) / count,
                "trained_groups": trains.sum().astype(jnp.float32),
                "waiting_groups": (complete.sum() - trains.sum()).astype(jnp.float32),
                "trained_tokens": trained_mask.sum().astype(jnp.float32),
                "dropped_groups": too_old.sum().astype(jnp.float32) / group_size,
                # Conversations carried into the next update unfinished.
                "carried_conversations": still_going.sum().astype(jnp.float32),
                "decode_columns": shift.astype(jnp.float32),
            }
        )
        metrics.update(staleness_metrics(version - token_versions, trained_mask, max_staleness))
        freed_rows = jnp.repeat(freed, group_size, total_repeat_length=rows)
        slots = Slots(conversations, ~freed_rows, started, shift)
        state = State(train_state.params, train_state.opt_state, state.key, state.step + 1, slots)
        return state, metrics

    return Algorithm(init, update)
