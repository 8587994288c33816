"""What the multi-turn scripts share (`multiturn.py`, and `sft.py` on a game's demonstrations): the
game a run plays, built from its task section; a teacher's demonstrations laid out exactly as
the sampler lays out a conversation; and the evaluation of a policy by playing episodes, with
transcripts a person can read.

A game's messages are rendered with the tokenizer's chat template when it has one (the
environment speaks in user turns, the policy in assistant turns ending with the end-of-sequence
token, e.g. SmolLM2's <|im_end|>), and as plain lines otherwise (the byte tokenizer). SFT and RL
build the game from the same task section, so the demonstrations an SFT run imitates and the
conversations RL samples share one layout.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import ml_collections
import numpy as np

from envs.text import multiturn as games
from envs.text import tools
from envs.text.host_env import host_text_env
from jaxrl.config import fail
from jaxrl.data.chat import has_chat_template
from jaxrl.lm import dialogue
from jaxrl.lm.model import ModelConfig
from jaxrl.lm.sampler import SamplingConfig

TEACHERS = ("scripted", "plausible", "random")
# The task section's fields that one game reads, with their defaults.
GAME_ARGUMENTS = {"guess_my_number": {"maximum": 32}, "multiplication": {"digits": 2}}
# A game in host Python (envs.text.host_env): multiply two numbers, with a calculator to call
# ("calc: 37 * 48").
TOOL_GAME = "multiplication"
# The fields that only games in host Python read (the tool game, a game of your own
# "module:Class"), with their defaults: the widest answer and opening in tokens, once rendered,
# and how long one call may take.
HOST_SETTINGS = {"max_message_tokens": 48, "max_opening_tokens": 160, "timeout_s": 10.0}
TOOLS = {"calc": tools.calculator}
TRANSCRIPTS_SHOWN = 8


def game_task(demonstrations: bool = False, **overrides: Any) -> ml_collections.ConfigDict:
    """The `task` section of a run on a game: which game, and how it is played and rendered;
    with `demonstrations` (SFT's), the teacher's episodes it imitates: num_train by `teacher`,
    or by the near-optimal player in `scripted_fraction` of them."""
    section = dict(
        # one of envs.text.multiturn.GAMES, "multiplication" (with a calculator), or a host
        # game of your own, "module.path:GameClass"
        game="guess_my_number",
        maximum=32,  # guess_my_number's numbers are 1..maximum
        digits=2,  # multiplication's numbers have this many digits
        max_turns=6,
        tokenizer="",  # as the LM scripts: "" is the checkpoint's own (bytes without one)
        system="",  # a system prompt before the opening (chat templates only)
        num_eval=256,  # RL: evaluation episodes, the same before and after; SFT: held out
        **HOST_SETTINGS,
        data_seed=0,
    )
    if demonstrations:
        section |= dict(teacher="plausible", scripted_fraction=0.0, num_train=4096)
    return ml_collections.ConfigDict(section | overrides)


class Game(NamedTuple):
    """A run's game: the environment, how its messages are rendered, and the end-of-turn id."""

    env: games.TextEnv
    render: Callable[[str, bool], str]
    end_of_turn: int
    arguments: dict[str, Any]  # the game's own keyword arguments (guess_my_number's maximum)


def make_game(
    section: ml_collections.ConfigDict, tokenizer: Any, given: Callable[[], Any] | None = None
) -> Game:
    """The task section's game for `tokenizer` (one error line for a bad setting): a built-in
    one by name, or the host game class `given` (which config.task.game describes as
    "module:GameClass")."""
    name = section.game
    own = ":" in name  # "module.path:GameClass", a host game of the user's
    if not own and name not in (*games.GAMES, TOOL_GAME):
        known = ", ".join((*games.GAMES, TOOL_GAME))
        fail(
            f"config.task.game: unknown game {name!r}; use one of {known}, or a host game of "
            "your own as 'module.path:GameClass'"
        )
    if section.max_turns < 1:
        fail(f"config.task.max_turns: got {section.max_turns}; use at least 1")
    if section.num_eval < 1:
        fail(f"config.task.num_eval: got {section.num_eval}; use at least 1")
    for game, fields in GAME_ARGUMENTS.items():
        for field, default in fields.items():
            if game != name and section[field] != default:
                fail(f"config.task.{field}: is read only by {game}, not {name}; drop it")
    if not own and name != TOOL_GAME:
        for field, default in HOST_SETTINGS.items():
            if section[field] != default:
                fail(f"config.task.{field}: is read only by games in host Python; drop it")
    for field in ("max_message_tokens", "max_opening_tokens"):
        if section[field] < 1:
            fail(f"config.task.{field}: got {section[field]}; use at least 1")
    if not section.timeout_s > 0:
        fail(f"config.task.timeout_s: got {section.timeout_s}; use a positive number of seconds")
    arguments = {field: section[field] for field in GAME_ARGUMENTS.get(name, {})}
    if name == "guess_my_number" and section.maximum < 2:
        fail(f"config.task.maximum: got {section.maximum}; use at least 2")
    if name == TOOL_GAME and not 1 <= section.digits <= 9:
        fail(f"config.task.digits: got {section.digits}; use 1..9")
    if has_chat_template(tokenizer):
        end_of_turn = tokenizer.special_tokens.get("eos_token", "")
        try:
            render = games.chat_render(tokenizer, end_of_turn, section.system or None)
        except ValueError as error:
            fail(f"config.task.tokenizer: {error}")
    else:
        if section.system:
            fail("config.task.system: a system prompt needs a chat template; drop it")
        render = games.plain_render
    if own or name == TOOL_GAME:
        make = user_game(name, given) if own else tool_game(section.digits)
        env = host_text_env(
            name, make, tokenizer, section.max_turns, section.max_message_tokens,
            section.max_opening_tokens, render, section.timeout_s,
        )  # fmt: skip
    else:
        env = games.GAMES[name](tokenizer, max_turns=section.max_turns, render=render, **arguments)
    return Game(env, render, tokenizer.eos_id, arguments)


def user_game(spec: str, make: Any) -> Callable[[], Any]:
    """A user's game class (or factory) `make`, which `spec` ("module.path:GameClass") names:
    objects with `reset(seed) -> opening` and `step(utterance) -> (answer, reward, done)`. Tried
    once, before anything compiles (a new game, reset(0), then one step), so that a game that
    cannot even start is one error line, not a failure inside the program."""
    if not callable(make):
        fail(f"config.task.game: {spec!r} is not a class or function; name the game's class")
    try:
        game = make()
        opening = game.reset(0)
        answer = game.step("")
    except Exception as error:  # the user's code: any failure is reported, in one line
        fail(
            f"config.task.game: {spec}: {type(error).__name__}: {error} (tried as a new game, "
            "reset(0), then step('')); fix the game"
        )
    if not isinstance(opening, str):
        fail(f"config.task.game: {spec}: reset(0) returned {opening!r}; return the opening text")
    if not (isinstance(answer, tuple) and len(answer) == 3):
        fail(
            f"config.task.game: {spec}: step('') returned {answer!r}; return (answer, reward, done)"
        )
    return make


def tool_game(digits: int) -> Callable[[], Any]:
    """The multiplication game with the calculator, as host_text_env makes its games."""
    return tools.with_tools(lambda: tools.Multiplication(digits), TOOLS)


def teachers(section: ml_collections.ConfigDict, game: Game, count: int, seed: int) -> list[Any]:
    """`count` teacher players, which one plays each episode drawn by `seed`."""
    if section.teacher not in TEACHERS:
        fail(f"config.task.teacher: got {section.teacher!r}; use one of {', '.join(TEACHERS)}")
    if not 0.0 <= section.scripted_fraction <= 1.0:
        fail(f"config.task.scripted_fraction: got {section.scripted_fraction}; use 0..1")
    rng = np.random.default_rng(seed)
    chosen = np.where(rng.random(count) < section.scripted_fraction, "scripted", section.teacher)
    if ":" in section.game:
        fail(
            "config.task.game: a game of your own has no teacher to demonstrate it; train "
            "multiturn.py on it from a model that already plays it a little (config.init_from)"
        )
    if section.game == TOOL_GAME:
        return [tools.multiplication_players()[kind] for kind in chosen]
    return [games.scripted_players(section.game, **game.arguments)[kind] for kind in chosen]


def demonstrations(
    section: ml_collections.ConfigDict, game: Game, tokenizer: Any, count: int, seed: int
) -> tuple[dict[str, np.ndarray], float, int]:
    """`count` teacher episodes (drawn by `seed`) as SFT rows (`games.conversation_batch`: the
    sampler's layout, the loss on the policy's turns), the teacher's success rate, and the
    longest turn it spoke in tokens (RL's max_new_tokens must hold it)."""
    players = teachers(section, game, count, seed)
    if section.game == TOOL_GAME:
        played = tools.play_host(tool_game(section.digits), players, section.max_turns, seed)
    else:
        played = games.play(game.env, players, tokenizer, jax.random.key(seed), 256, seed)
    longest = max(
        len(tokenizer.encode(text))
        for transcript in played["transcripts"]
        for speaker, text in transcript
        if speaker == "policy"
    )
    opening = max(len(tokenizer.encode(game.render(t[0][1], True))) for t in played["transcripts"])
    width = dialogue.episode_length(
        opening, game.env.max_turns, longest, game.env.max_message_tokens
    )
    rows = games.conversation_batch(
        played["transcripts"], tokenizer, game.end_of_turn, width, game.render
    )
    used = int(rows["attention_mask"].sum(axis=1).max())  # the longest episode, not the bound
    rows = {key: value[:, :used] for key, value in rows.items()}
    return rows, float(played["returns"].mean()), longest


# --- evaluation ----------------------------------------------------------------------------------


class Played(NamedTuple):
    """A policy's evaluation episodes."""

    success: np.ndarray  # [num_eval] 1.0 where the episode was won (a positive return)
    turns: np.ndarray  # [num_eval] turns spoken
    tool_calls: np.ndarray  # [num_eval] 1.0 where the policy called a tool (the tool game only)
    transcripts: list[str]  # the first few episodes, as text


def turns_of(episodes: dialogue.Episodes, row: int, tokenizer: Any) -> list[tuple[str, str]]:
    """One recorded conversation as (speaker, text) in order: "env" for the environment's
    messages (as rendered), "policy" for the policy's turns."""
    mask = np.asarray(episodes.mask[row])
    tokens, policy = np.asarray(episodes.tokens[row]), np.asarray(episodes.policy_mask[row])
    slots = np.flatnonzero(mask)
    spoken, start = [], 0
    for end in range(1, len(slots) + 1):
        if end == len(slots) or policy[slots[end]] != policy[slots[start]]:
            text = tokenizer.decode([int(t) for t in tokens[slots[start:end]]]).strip()
            spoken.append(("policy" if policy[slots[start]] else "env", text))
            start = end
    return spoken


def transcript(spoken: list[tuple[str, str]], episode_return: float) -> str:
    """A conversation as text, each line marked by who spoke, and its return."""
    lines = [f"{who:>6}: {text}" for who, text in spoken]
    return "\n".join(lines) + f"\n  return {episode_return:g}\n"


def evaluator(
    section: ml_collections.ConfigDict,
    game: Game,
    model: ModelConfig,
    tokenizer: Any,
    turn_tokens: int,
    mesh: Any = None,
) -> Callable[[Any, float], Played]:
    """evaluate(params, temperature) -> Played: num_eval episodes with fixed games and sampling
    keys (the same before and after training, so the two are paired)."""
    count = section.num_eval
    keys = jax.random.split(jax.random.key(section.data_seed + 1), 2 * count)
    reset_keys, sample_keys = keys[:count], keys[count:]

    @functools.partial(jax.jit, static_argnums=1)  # temperature 0 is another program: argmax
    def episodes(params: Any, temperature: float) -> dialogue.Episodes:
        sampling = SamplingConfig(turn_tokens, game.end_of_turn, tokenizer.pad_id, temperature)
        played, _ = dialogue.converse(
            model, params, game.env, reset_keys, sample_keys, sampling, mesh
        )
        return played

    def evaluate(params: Any, temperature: float) -> Played:
        played = jax.device_get(episodes(params, temperature))
        returns = played.rewards.sum(axis=1)
        # Every episode is decoded only where tool calls are counted; otherwise the shown ones.
        decoded = count if section.game == TOOL_GAME else min(TRANSCRIPTS_SHOWN, count)
        spoken = [turns_of(played, row, tokenizer) for row in range(decoded)]
        called = np.zeros(count)
        if section.game == TOOL_GAME:
            called = np.array([
                any(who == "policy" and tools.tool_call(text, TOOLS) for who, text in turns)
                for turns in spoken
            ], np.float64)  # fmt: skip
        shown = [
            transcript(spoken[row], returns[row]) for row in range(min(TRANSCRIPTS_SHOWN, count))
        ]
        return Played(
            (returns > 0).astype(np.float64), played.spoke.sum(axis=1).astype(np.float64),
            called, shown,
        )  # fmt: skip

    @functools.partial(jax.jit, static_argnums=(1, 2))
    def sampled(params: Any, temperature: float, num_samples: int) -> jax.Array:
        sampling = SamplingConfig(turn_tokens, game.end_of_turn, tokenizer.pad_id, temperature)
        resets = jax.numpy.repeat(reset_keys, num_samples, axis=0)  # each game n times
        draws = jax.random.split(jax.random.key(section.data_seed + 2), count * num_samples)
        played, _ = dialogue.converse(model, params, game.env, resets, draws, sampling, mesh)
        return (played.rewards.sum(axis=1) > 0).reshape(count, num_samples)

    def successes(params: Any, temperature: float, num_samples: int) -> np.ndarray:
        """[num_eval, num_samples]: 1 where an episode of each evaluation game succeeded, each
        game played `num_samples` times with fixed keys (for pass@k)."""
        return np.asarray(jax.device_get(sampled(params, temperature, num_samples)), np.float64)

    evaluate.successes = successes  # type: ignore[attr-defined]
    return evaluate
