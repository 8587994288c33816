"""Multi-turn episodes sampled inside one compiled program: the policy speaks a turn, a text
environment answers, its answer joins the context, and so on until every episode is over.

    episodes, env_states = converse(model_config, params, env, reset_keys, sample_keys, config)

`env` has `reset(key) -> (state, message)` and `step(state, utterance) -> (state, message,
reward, done)` over token ids (`envs.text.multiturn.TextEnv`; a message has `.ids` [L] and
`.length`), pure and vmappable; `converse` vmaps them over the batch. An environment marked
`batched` (a host environment, `envs.text.host_env`) takes the whole batch itself.

One KV cache holds the whole conversation. The opening is prefilled; each turn decodes up to
`config.max_new_tokens` tokens (a row's turn ends at its end-of-turn token, `config.eos_id`);
a turn cut off by that budget gets the end-of-turn token appended, so the context stays in the
chat format; the environment reads the turn and its answer is prefilled after it. Rows finish at
different times, so the cache's slots are shared and a row's unused slots are masked out of the
attention. Every slot written is also recorded (token, mask, position), so the training pass
reads exactly the context the sampler saw: one forward over `Episodes.tokens` with
`Episodes.mask` and `Episodes.positions` gives the sampled tokens' log-probs again. Only the
policy's own tokens (`policy_mask`) carry a loss; the environment's tokens are context.

Episodes of one game (the same reset key) share their opening, slot for slot:
`shared_opening_logits` runs a group's opening once and packs its episodes' turns after it, the
same logits up to rounding (`PolicyPass` chooses between the two passes).
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from jaxrl.lm.model import ModelConfig, Transformer, init_cache
from jaxrl.lm.sampler import SamplingConfig, sample_token

Array = jax.Array


class Episodes(NamedTuple):
    """A batch of conversations as the cache holds them, [B, S] per slot, plus per-turn
    outcomes [B, max_turns]."""

    tokens: Array  # [B, S] int32
    mask: Array  # [B, S] bool: a real token (the attention's key mask)
    positions: Array  # [B, S] int32 rotary positions
    policy_mask: Array  # [B, S] bool: sampled by the policy (end-of-turn included): the loss mask
    log_probs: Array  # [B, S] fp32: the sampler's log-prob of each policy token, 0 elsewhere
    turn_index: Array  # [B, S] int32: the turn a policy token belongs to, -1 elsewhere
    rewards: Array  # [B, T] fp32: the environment's reward after each turn
    spoke: Array  # [B, T] bool: the policy spoke that turn (the episode was not yet over)
    done: Array  # [B] bool: the episode ended (solved, or out of turns)
    length: Array  # int32: slots used (the same for every row)


def episode_length(opening: int, max_turns: int, turn_tokens: int, message_tokens: int) -> int:
    """Slots a conversation can need: the opening, then per turn the policy's budget, an
    appended end of turn, and the environment's widest message."""
    return opening + turn_slots(max_turns, turn_tokens, message_tokens)


def turn_slots(max_turns: int, turn_tokens: int, message_tokens: int) -> int:
    """The slots after the opening (`episode_length` less the opening): every turn's."""
    return max_turns * (turn_tokens + 1 + message_tokens)


def converse(
    model_config: ModelConfig,
    params: Any,
    env: Any,
    reset_keys: Array,
    sample_keys: Array,
    config: SamplingConfig,
    mesh: Any = None,
    rules: Any = None,
) -> tuple[Episodes, Any]:
    """One episode per row of `reset_keys` [B] (the environment's draw: episodes with the same
    reset key play the same game) and `sample_keys` [B] (the policy's): reset, then turns until
    every episode is done or `env.max_turns` have been spoken. Returns the episodes and the
    environments' final states."""
    model = Transformer(model_config, mesh=mesh, rules=rules)
    env_state, opening = env_reset(env)(reset_keys)
    opening_width = opening.ids.shape[1]
    size = episode_length(
        opening_width, env.max_turns, config.max_new_tokens, env.max_message_tokens
    )
    steps = conversation_steps(model, params, env, config, type(opening))
    carry = start_conversations(model_config, env, config, env_state, sample_keys, size, size, 0)
    carry = steps.feed(
        carry, opening.ids, jnp.arange(opening_width)[None] < opening.length[:, None]
    )
    carry = jax.lax.while_loop(lambda c: ~jnp.all(c["done"]), steps.one_turn, carry)
    return episodes_of(carry), carry["env"]


def env_reset(env: Any) -> Any:
    """`env.reset` over a batch of reset keys (a host environment takes the batch itself)."""
    return env.reset if getattr(env, "batched", False) else jax.vmap(env.reset)


def start_conversations(
    model_config: ModelConfig,
    env: Any,
    config: SamplingConfig,
    env_state: Any,
    sample_keys: Array,
    size: int,
    cache_length: int,
    origin: Array,
    versions: bool = False,
) -> dict:
    """The state of B conversations before their opening is fed (`ConversationSteps.feed`): an
    empty record of `size` (`episode_length`) slots per row, an empty KV cache of `cache_length`
    columns whose write column is `origin` (where each row's record begins in the cache), the
    environments' states and the policy's per-row sampling keys. With `versions` the record
    also holds the policy version of each policy token (`carry["version"]`, set by the
    caller)."""
    batch = sample_keys.shape[0]
    record = {
        "tokens": jnp.full((batch, size), config.pad_id, jnp.int32),
        "mask": jnp.zeros((batch, size), bool),
        "positions": jnp.zeros((batch, size), jnp.int32),
        "policy_mask": jnp.zeros((batch, size), bool),
        "log_probs": jnp.zeros((batch, size), jnp.float32),
        "turn_index": jnp.full((batch, size), -1, jnp.int32),
    }
    if versions:
        record["versions"] = jnp.zeros((batch, size), jnp.int32)
    cache = dict(init_cache(model_config, batch, cache_length))
    cache["index"] = jnp.asarray(origin, jnp.int32)
    return {
        "cache": cache,
        "record": record,
        "logits": jnp.zeros((batch, model_config.vocab_size), jnp.float32),
        "position": jnp.zeros((batch,), jnp.int32),
        "env": env_state,
        "done": jnp.zeros((batch,), bool),
        "turn": jnp.zeros((batch,), jnp.int32),
        "rewards": jnp.zeros((batch, env.max_turns), jnp.float32),
        "spoke": jnp.zeros((batch, env.max_turns), bool),
        "keys": sample_keys,
        # The cache column of each row's record slot 0: the record is per row, the cache's
        # write column shared (a caller may move the cache and this with it).
        "origin": jnp.full((batch,), origin, jnp.int32),
        "version": jnp.zeros((), jnp.int32),
        # Rows that write their record in every turn, spoken or not (holes while others
        # speak); the others write only while they speak (a conversation kept, ended, while
        # others go on: partial rollouts).
        "writing": jnp.ones((batch,), bool),
    }


class ConversationSteps(NamedTuple):
    """The turn loop's pieces over a conversation state (`start_conversations`'s dict):
    `feed(carry, tokens, real)` prefills a message, `one_turn(carry)` has every row not done
    speak one turn and the environment answer it."""

    feed: Any
    one_turn: Any


def episodes_of(carry: dict) -> Episodes:
    """The conversations' record as `Episodes` (`length`: the cache columns used)."""
    record = {name: value for name, value in carry["record"].items() if name != "versions"}
    return Episodes(
        **record, rewards=carry["rewards"], spoke=carry["spoke"], done=carry["done"],
        length=carry["cache"]["index"] - jnp.min(carry["origin"]),
    )  # fmt: skip


def conversation_steps(
    model: Transformer,
    params: Any,
    env: Any,
    config: SamplingConfig,
    message_type: Any,
) -> ConversationSteps:
    """The turn loop over a conversation state, under `params`. Every row writes its record
    at the cache's write column less its `origin`; a row already done when a turn begins writes
    holes while the others speak only if it is marked `writing`."""
    batch_rows = lambda carry: carry["done"].shape[0]  # noqa: E731
    env_step = env.step if getattr(env, "batched", False) else jax.vmap(env.step)
    message_width, budget, max_turns = env.max_message_tokens, config.max_new_tokens, env.max_turns

    def write(carry: dict, writing: Array, **values: Array) -> dict:
        """Record [B, W] values at each row's slots column..column+W (the cache's columns
        just written, less the row's origin), for the rows `writing`."""
        columns = carry["cache"]["index"] - carry["origin"]

        def put(array: Array, value: Array) -> Array:
            placed = jax.vmap(lambda row, v, c: jax.lax.dynamic_update_slice(row, v, (c,)))(
                array, value.astype(array.dtype), columns
            )
            return jnp.where(writing[:, None], placed, array)

        return {
            name: put(array, values[name]) if name in values else array
            for name, array in carry["record"].items()
        }

    def feed(carry: dict, tokens: Array, real: Array, writing: Array | None = None) -> dict:
        """Prefill a right-padded message [B, W] (rows with real tokens only): record it, extend
        the cache, and keep the logits after each row's last real token."""
        writing = jnp.ones(tokens.shape[:1], bool) if writing is None else writing
        positions = carry["position"][:, None] + jnp.cumsum(real, axis=1) - 1
        last = jnp.maximum(jnp.sum(real, axis=1) - 1, 0)[:, None]
        logits, cache = model.apply(
            {"params": params}, tokens, positions, real, carry["cache"], logit_positions=last
        )
        spoke = jnp.any(real, axis=1)
        record = write(carry, writing, tokens=tokens, mask=real, positions=positions)
        return dict(
            carry,
            cache=cache,
            record=record,
            logits=jnp.where(spoke[:, None], logits[:, 0], carry["logits"]),
            position=carry["position"] + jnp.sum(real, axis=1),
        )

    def speak_one(state: dict) -> dict:
        """Sample one token per row still speaking this turn, record it, feed it back."""
        carry, said, ended = state["carry"], state["said"], state["ended"]
        keys = jax.vmap(jax.random.split)(carry["keys"])
        token, log_prob = jax.vmap(lambda row, k: sample_token(row[None], k, config))(
            carry["logits"], keys[:, 1]
        )
        token, log_prob = token[:, 0], log_prob[:, 0]
        alive = ~ended
        token = jnp.where(alive, token, config.pad_id)
        positions = carry["position"]
        record = write(
            carry, state["writing"], tokens=token[:, None], mask=alive[:, None],
            positions=positions[:, None], policy_mask=alive[:, None],
            log_probs=jnp.where(alive, log_prob, 0.0)[:, None],
            turn_index=jnp.where(alive, carry["turn"], -1)[:, None],
            versions=jnp.broadcast_to(carry["version"], token.shape)[:, None],
        )  # fmt: skip
        logits, cache = model.apply(
            {"params": params}, token[:, None], positions[:, None], alive[:, None], carry["cache"]
        )
        carry = dict(
            carry, cache=cache, record=record, keys=keys[:, 0],
            logits=jnp.where(alive[:, None], logits[:, -1], carry["logits"]),
            position=positions + alive,
        )  # fmt: skip
        said = jax.lax.dynamic_update_slice(said, token[:, None], (0, state["step"]))
        finished = ended | (alive & (token == config.eos_id))
        return dict(state, carry=carry, said=said, ended=finished, step=state["step"] + 1,
                    length=state["length"] + alive)  # fmt: skip

    def one_turn(carry: dict) -> dict:
        batch = batch_rows(carry)
        speaking = ~carry["done"]
        writing = carry["writing"] | speaking
        turn = {
            "carry": carry,
            "said": jnp.full((batch, budget), config.pad_id, jnp.int32),
            "ended": ~speaking,
            "writing": writing,
            "step": jnp.zeros((), jnp.int32),
            "length": jnp.zeros((batch,), jnp.int32),
        }
        turn = jax.lax.while_loop(
            lambda t: (t["step"] < budget) & ~jnp.all(t["ended"]), speak_one, turn
        )
        carry, said, length = turn["carry"], turn["said"], turn["length"]
        # A turn cut off by the budget gets its end-of-turn token (context, not policy): a row
        # still speaking when the loop stopped never said it.
        unfinished = speaking & ~turn["ended"]
        eos = jnp.full((batch, 1), config.eos_id, jnp.int32)
        carry = feed(carry, eos, unfinished[:, None], writing)
        utterance = message_type(said, length)
        env_state, message, reward, done = env_step(carry["env"], utterance)
        # Each row's own turn counter: rows carried across updates are at different turns.
        rows, index = jnp.arange(batch), carry["turn"]
        at = jnp.minimum(index, max_turns - 1)
        over = done | (index + 1 >= max_turns)
        carry = dict(
            carry, env=env_state, done=carry["done"] | (speaking & over),
            rewards=carry["rewards"].at[rows, at].set(
                jnp.where(speaking, reward, carry["rewards"][rows, at])
            ),
            spoke=carry["spoke"].at[rows, at].set(speaking | carry["spoke"][rows, at]),
            turn=index + speaking,
        )  # fmt: skip
        real = (jnp.arange(message_width)[None] < message.length[:, None]) & ~carry["done"][:, None]
        return feed(carry, message.ids, real, writing)

    return ConversationSteps(feed, one_turn)


class PolicyTokens(NamedTuple):
    """The policy's tokens of each conversation gathered to the front, [B, K] with K the most a
    conversation can hold (max_turns x turn budget); `valid` marks the real ones."""

    slots: Array  # [B, K] int32: where each sits in `Episodes.tokens`
    predictors: Array  # [B, K] int32: the slot whose output predicts it (the last real before)
    tokens: Array  # [B, K] int32
    valid: Array  # [B, K] bool
    turn_index: Array  # [B, K] int32 (-1 where not valid)
    sampled_log_probs: Array  # [B, K] fp32: what the sampler recorded


def policy_tokens(episodes: Episodes, capacity: int) -> PolicyTokens:
    """Gather each row's policy tokens, in order, to [B, capacity]."""
    order = jnp.argsort(~episodes.policy_mask, axis=1, stable=True)[:, :capacity]
    take = lambda array: jnp.take_along_axis(array, order, axis=1)  # noqa: E731
    valid = take(episodes.policy_mask)
    return PolicyTokens(
        order.astype(jnp.int32), take(previous_real_slot(episodes.mask)), take(episodes.tokens),
        valid, jnp.where(valid, take(episodes.turn_index), -1), take(episodes.log_probs),
    )  # fmt: skip


def previous_real_slot(mask: Array) -> Array:
    """[B, S]: the last real slot before each slot (0 where there is none). A token's logits come
    from there: rows share the cache's slots, so the slot just before may be another turn's hole."""
    slots = jnp.arange(mask.shape[1])
    latest = jax.lax.cummax(jnp.where(mask, slots[None], -1), axis=1)
    return jnp.maximum(jnp.concatenate([jnp.full_like(latest[:, :1], -1), latest[:, :-1]], 1), 0)


def policy_logits(
    model: Transformer,
    params: Any,
    tokens: Array,
    positions: Array,
    mask: Array,
    predictors: Array,
) -> Array:
    """Logits [B, K, V] that predict the policy's tokens under `params`: one forward pass over
    the recorded slots (`Episodes.tokens`, `.positions`, `.mask`), the head only at each policy
    token's predictor (`PolicyTokens.predictors`)."""
    logits, _ = model.apply({"params": params}, tokens, positions, mask, logit_positions=predictors)
    return logits


def shared_opening_logits(
    model: Transformer,
    params: Any,
    tokens: Array,
    positions: Array,
    mask: Array,
    predictors: Array,
    opening: int,
    group_size: int,
) -> Array:
    """`policy_logits` of conversations whose rows come in contiguous groups of `group_size`
    that share their first `opening` slots (the episodes of one game: the same reset, so the same
    opening, tokens, mask and positions), with each group's opening run through the model once:
    logits [B, K, V] in the batch's row order.

    Each group of G rows [S] becomes one sequence of opening + G * (S - opening) slots: the
    group's first opening, then every episode's slots after it, each episode a segment
    (`Transformer`'s segment_ids) that reads the opening and its own earlier slots, never
    another episode's, at the positions and under the mask its own row records. So every slot
    reads exactly the keys it reads in its row. A predictor inside the opening (the slot before
    an episode's first policy token) is the group's shared one; the gradient through the opening
    is summed over the group in one backward pass. Rows of a group whose openings differ get the
    group's first opening: the caller keeps groups whole and in order."""
    rows, size = tokens.shape
    if rows % group_size or not 0 < opening < size:
        raise ValueError(
            f"shared_opening_logits: {rows} rows of {size} slots with an opening of {opening}; "
            f"needs whole groups of group_size = {group_size} and slots after the opening"
        )
    games, rest = rows // group_size, size - opening

    def pack(x: Array) -> Array:
        """[rows, S] -> [games, opening + G * rest]: the group's first opening, then each
        episode's slots after it."""
        grouped = x.reshape(games, group_size, size)
        after = grouped[:, :, opening:].reshape(games, group_size * rest)
        return jnp.concatenate([grouped[:, 0, :opening], after], axis=1)

    segments = jnp.concatenate(
        [
            jnp.zeros(opening, jnp.int32),
            jnp.repeat(jnp.arange(1, group_size + 1, dtype=jnp.int32), rest),
        ]
    )
    # Episode j's slot p after the opening sits at p + j * rest in its group's sequence; a slot
    # of the opening stays where it is.
    episode = (jnp.arange(rows, dtype=jnp.int32) % group_size)[:, None]
    reads = jnp.where(predictors < opening, predictors, predictors + episode * rest)
    logits, _ = model.apply(
        {"params": params},
        pack(tokens),
        pack(positions),
        pack(mask),
        logit_positions=reads.reshape(games, -1),
        segment_ids=jnp.broadcast_to(segments, (games, segments.shape[0])),
    )
    return logits.reshape(rows, predictors.shape[1], -1)


@dataclasses.dataclass(frozen=True)
class PolicyPass:
    """How an update's passes over recorded conversations compute the policy tokens' logits,
    chosen once when the update is built. `group_size` 1: every row over its own slots
    (`policy_logits`). G > 1: the rows come in contiguous groups of G episodes of one game,
    whose openings (the slots before the last `turn_slots`, `turn_slots`) are the same, and
    each group's opening runs once (`shared_opening_logits`); whoever splits the batch keeps
    groups whole and in order. Both give the same logits up to rounding.

    Called as `policy_pass(model, params, tokens, positions, mask, predictors) -> logits [B, K,
    V]`; `PER_EPISODE` is `PolicyPass()`."""

    group_size: int = 1
    turn_slots: int = 0  # slots after the opening, `turn_slots(...)`; read when group_size > 1

    def __post_init__(self) -> None:
        if self.group_size < 1 or (self.group_size > 1 and self.turn_slots < 1):
            raise ValueError(
                f"PolicyPass: group_size {self.group_size} with turn_slots {self.turn_slots}; "
                "use group_size 1, or more with turn_slots of 1 or more"
            )

    def __call__(
        self,
        model: Transformer,
        params: Any,
        tokens: Array,
        positions: Array,
        mask: Array,
        predictors: Array,
    ) -> Array:
        if self.group_size == 1:
            return policy_logits(model, params, tokens, positions, mask, predictors)
        opening = tokens.shape[1] - self.turn_slots
        return shared_opening_logits(
            model, params, tokens, positions, mask, predictors, opening, self.group_size
        )

    def tokens(self, rows: int, size: int) -> int:
        """Slots the model runs per pass over `rows` conversations of `size` slots (the head
        runs on the policy's tokens either way)."""
        if self.group_size == 1:
            return rows * size
        opening = size - self.turn_slots
        return rows // self.group_size * opening + rows * self.turn_slots


PER_EPISODE = PolicyPass()  # every episode over its own slots, its opening included


def policy_log_probs(
    model: Transformer, params: Any, episodes: Episodes, gathered: PolicyTokens, temperature: float
) -> Array:
    """Log-probs [B, K] of the policy's tokens under `params`, at the sampling temperature as
    the sampler recorded them; 0 where not valid."""
    logits = policy_logits(
        model, params, episodes.tokens, episodes.positions, episodes.mask, gathered.predictors
    )
    if temperature > 0:
        logits = logits / temperature
    log_probs = jax.nn.log_softmax(logits, axis=-1)
    chosen = jnp.take_along_axis(log_probs, gathered.tokens[..., None], axis=-1)[..., 0]
    return jnp.where(gathered.valid, chosen, 0.0)
