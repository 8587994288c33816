"""Text environments written in plain host Python, behind the same interface as the JAX games of
`envs.text.multiturn`, so `jaxrl.lm.dialogue.converse` runs them inside the compiled program.

    class Echo:                                       # any object with these two methods
        def reset(self, seed: int) -> str: ...        # the opening message
        def step(self, utterance: str) -> tuple[str, float, bool]: ...   # answer, reward, done

    env = host_text_env("echo", Echo, tokenizer, max_turns=4, max_message_tokens=32)

Each episode gets its own game object (`make_game()`), kept on the host under an episode number
that is all the program's state holds. `reset` and `step` reach the host through `io_callback`
for the whole batch at once (the returned `TextEnv` is `batched`); the utterances arrive as
decoded text and the answers go back tokenised, rendered as the JAX games render theirs.

A game is user code, so every call is guarded (through `jaxrl.host`, which the scripts turn into
one `error:` line with the traceback in the run's error.log): an exception, a call that does not
return within `timeout_s`, or output that is not (str, finite float, bool) stops the program
with a failure naming the game, the episode and the problem. A call that hangs cannot be killed
from Python; it is abandoned in its thread, and the run stops rather than wait on it.
"""

from __future__ import annotations

import concurrent.futures
import itertools
import math
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import io_callback

from envs.text.multiturn import TextEnv, Tokens, plain_render
from jaxrl import host

Array = jax.Array


class HostState(NamedTuple):
    """A host game's state as the compiled loop sees it: an episode key and the turn counters."""

    episode: Array  # [B] int32: the host's key for this episode's game object
    turn: Array  # [B] int32
    done: Array  # [B] bool
    said: Array  # [B] int32: -1 (a host game's messages are not tabulated)


def host_text_env(
    name: str,
    make_game: Callable[[], Any],
    tokenizer: Any,
    max_turns: int,
    max_message_tokens: int,
    max_opening_tokens: int = 256,
    render: Callable[[str, bool], str] = plain_render,
    timeout_s: float = 10.0,
) -> TextEnv:
    """A batched `TextEnv` over host game objects (see the module's docstring). Answers longer
    than `max_message_tokens` tokens (openings longer than `max_opening_tokens`) once rendered
    are failures, not silently cut. After `max_turns` turns an episode ends whatever the game
    says (its last reward counts)."""
    games: dict[int, Any] = {}
    numbers = itertools.count()
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)
    label = f"host environment {name}"

    def guarded(what: str, fn: Callable[..., Any], *args: Any) -> Any:
        def timed() -> Any:
            future = pool.submit(fn, *args)
            try:
                return future.result(timeout=timeout_s)
            except concurrent.futures.TimeoutError:
                raise TimeoutError(f"{what} did not return within {timeout_s:g} s") from None

        return host.call(label, timed)

    def encode(text: Any, width: int, first: bool, where: str) -> list[int]:
        if not isinstance(text, str):
            host.fail(label, f"{where} returned a {type(text).__name__} message; return a str")
        ids = tokenizer.encode(render(text, first))
        if len(ids) > width:
            host.fail(
                label,
                f"{where} said {len(ids)} tokens, more than the {width} it may "
                f"({'max_opening_tokens' if first else 'max_message_tokens'}); raise that, or "
                "say less",
            )
        return ids

    # The callbacks turn their arguments into NumPy first: io_callback may hand them jax.Arrays,
    # and indexing one dispatches a JAX computation from inside the running program, which
    # deadlocks when the CPU runtime has one thread (a run pinned to one core) -- as GRPO's host
    # rewards did.
    def on_reset(seeds: np.ndarray) -> tuple[np.ndarray, ...]:
        seeds = np.asarray(seeds)
        ids = np.full((len(seeds), max_opening_tokens), tokenizer.pad_id, np.int32)
        lengths, episodes = np.zeros(len(seeds), np.int32), np.zeros(len(seeds), np.int32)
        for row, seed in enumerate(seeds):
            number = next(numbers)
            game = host.call(label, make_game)
            opening = guarded(f"reset of episode {number}", game.reset, int(seed))
            tokens = encode(opening, max_opening_tokens, True, f"reset of episode {number}")
            games[number] = [game, 0]
            ids[row, : len(tokens)], lengths[row], episodes[row] = tokens, len(tokens), number
        return ids, lengths, episodes

    def on_step(episodes, done, utterance_ids, utterance_lengths) -> tuple[np.ndarray, ...]:
        episodes, done = np.asarray(episodes), np.asarray(done)
        utterance_ids, utterance_lengths = np.asarray(utterance_ids), np.asarray(utterance_lengths)
        rows = len(episodes)
        ids = np.full((rows, max_message_tokens), tokenizer.pad_id, np.int32)
        lengths, rewards = np.zeros(rows, np.int32), np.zeros(rows, np.float32)
        finished = np.array(done, bool)
        for row in np.flatnonzero(~finished):
            number, where = int(episodes[row]), f"step of episode {int(episodes[row])}"
            text = tokenizer.decode(utterance_ids[row, : utterance_lengths[row]])
            game = games[number]
            result = guarded(where, game[0].step, text)
            if not (isinstance(result, tuple) and len(result) == 3):
                host.fail(label, f"{where} returned {result!r}; return (answer, reward, done)")
            answer, reward, ended = result
            if isinstance(reward, str | bytes) or not isinstance(reward, int | float | np.number):
                host.fail(label, f"{where} returned reward {reward!r}; return a float")
            if not math.isfinite(float(reward)):
                host.fail(label, f"{where} returned reward {reward}; return a finite float")
            if not isinstance(ended, bool | np.bool_):
                host.fail(label, f"{where} returned done {ended!r}; return a bool")
            tokens = encode(answer, max_message_tokens, False, where)
            ids[row, : len(tokens)], lengths[row] = tokens, len(tokens)
            rewards[row], finished[row] = float(reward), bool(ended)
            game[1] += 1
            if ended or game[1] >= max_turns:  # the episode is over: forget its game
                games.pop(number, None)
        return ids, lengths, rewards, finished

    def reset(keys: Array) -> tuple[HostState, Tokens]:
        rows = keys.shape[0]
        seeds = jax.vmap(lambda key: jax.random.bits(key, (), jnp.uint32))(keys)
        shapes = (
            jax.ShapeDtypeStruct((rows, max_opening_tokens), jnp.int32),
            jax.ShapeDtypeStruct((rows,), jnp.int32),
            jax.ShapeDtypeStruct((rows,), jnp.int32),
        )
        ids, lengths, episodes = io_callback(on_reset, shapes, seeds, ordered=False)
        zeros = jnp.zeros((rows,), jnp.int32)
        state = HostState(episodes, zeros, jnp.zeros((rows,), bool), zeros - 1)
        return state, Tokens(ids, lengths)

    def step(state: HostState, utterance: Tokens):
        rows = state.episode.shape[0]
        shapes = (
            jax.ShapeDtypeStruct((rows, max_message_tokens), jnp.int32),
            jax.ShapeDtypeStruct((rows,), jnp.int32),
            jax.ShapeDtypeStruct((rows,), jnp.float32),
            jax.ShapeDtypeStruct((rows,), bool),
        )
        ids, lengths, rewards, ended = io_callback(
            on_step, shapes, state.episode, state.done, utterance.ids, utterance.length,
            ordered=False,
        )  # fmt: skip
        turn = state.turn + jnp.where(state.done, 0, 1)
        done = state.done | ended | (turn >= max_turns)
        rewards = jnp.where(state.done, 0.0, rewards)
        lengths = jnp.where(state.done, 0, lengths)
        return state._replace(turn=turn, done=done), Tokens(ids, lengths), rewards, done

    return TextEnv(name, reset, step, max_turns, max_message_tokens, (), batched=True)
