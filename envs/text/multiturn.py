"""Multi-turn text environments as pure JAX functions: a conversation in which a language-model
policy speaks a turn, the environment answers, and so on until the episode ends.

    env = make_guess_my_number(tokenizer, maximum=32, max_turns=6)
    state, observation = env.reset(key)                         # the opening message, as tokens
    state, observation, reward, done = env.step(state, utterance)   # the policy's turn, as tokens

Both functions are pure and work on fixed shapes, so they `vmap` over a batch of episodes and run
inside the same compiled program as the sampler and the update (LMRL-Gym's tasks, Abdulhai et
al. 2023, there run as host Python). Text crosses the boundary only as token ids:

- What the environment says is one of a fixed set of messages known when it is built (the
  opening, "Higher.", a Wordle pattern...), each tokenised once into a table, so answering is a
  row lookup. `render(text, first)` formats a message before it is tokenised: a chat template's
  user turn and assistant header, say, so the answer can be appended to the context as it is.
- What the policy says is read back as bytes: every vocabulary entry is decoded once into a
  [V, K] byte table, and an utterance's bytes are its tokens' rows laid end to end. Reading
  bytes, not token ids, makes one environment work with any tokenizer. The games read those
  bytes narrowly: the last integer (guess-my-number), or the utterance normalised (lower case,
  punctuation as spaces) and matched exactly against a list of phrases (twenty questions, the
  word game). Anything else is an invalid turn, answered as such; it still uses up the turn.

`done` is the end of the game by its own rules: solved, or out of turns (a game of six guesses
is lost after the sixth, so running out of turns is a terminal state, never a truncation to
bootstrap over). After `done`, `step` changes nothing and returns reward 0 and an empty message.

The games (`make_guess_my_number`, `make_twenty_questions`, `make_word_game`) each come with a
scripted near-optimal policy and a random one (`scripted_policies`) to show they play as designed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

Array = jax.Array

MAX_INTEGER_DIGITS = 9  # int32 holds 9 decimal digits exactly; longer numbers never match


class Tokens(NamedTuple):
    """A message as token ids: `ids[:length]` are real, the rest pad."""

    ids: Array  # [L] int32
    length: Array  # int32 scalar


class TextEnv(NamedTuple):
    """A conversation environment: pure functions, vmappable over episodes.

    reset(key) -> (state, opening message)
    step(state, utterance) -> (state, answer, reward, done)
    """

    name: str
    reset: Callable[[Array], tuple[Any, Tokens]]
    step: Callable[[Any, Tokens], tuple[Any, Tokens, Array, Array]]
    max_turns: int  # the policy speaks at most this many turns
    max_message_tokens: int  # the widest answer it can send (the answers' Tokens.ids length)
    messages: tuple[str, ...]  # every message it can send, unrendered, by table row (transcripts)
    batched: bool = False  # reset/step take the whole batch (a host environment), not one episode


def plain_render(text: str, first: bool) -> str:
    """The default rendering without a chat template: each message on its own lines."""
    return text + "\n" if first else "\n" + text + "\n"


def chat_render(
    tokenizer: Any, end_of_turn: str, system: str | None = None
) -> Callable[[str, bool], str]:
    """A `render` for chat models: the environment speaks in user turns of the tokenizer's chat
    template and the policy in assistant turns, each ending with `end_of_turn` (the template's
    end-of-turn token, e.g. "<|im_end|>", which the sampler stops at and keeps). The opening is
    the conversation up to the first assistant header (after `system`, if given); each later
    message is what the template writes between an assistant turn's end-of-turn token and the
    next assistant header. Found by rendering a conversation of markers, so any template that
    renders a prefix of a conversation as the conversation's start works."""
    a, x, b = "\x00opening\x00", "\x00turn\x00", "\x00answer\x00"
    head = [{"role": "system", "content": system}] if system else []
    user = lambda text: {"role": "user", "content": text}  # noqa: E731
    first = tokenizer.apply_chat_template([*head, user(a)], add_generation_prompt=True)
    full = tokenizer.apply_chat_template(
        [*head, user(a), {"role": "assistant", "content": x}, user(b)], add_generation_prompt=True
    )
    after_turn = full.split(x, 1)[1] if x in full else ""
    if not full.startswith(first) or not after_turn.startswith(end_of_turn) or b not in after_turn:
        raise ValueError(
            f"chat_render: the chat template does not end an assistant turn with {end_of_turn!r} "
            "followed by the next user turn; pass the template's end-of-turn token, or a render "
            "of your own"
        )
    opening_before, opening_after = first.split(a)
    answer_before, answer_after = after_turn[len(end_of_turn) :].split(b)

    def render(text: str, is_first: bool) -> str:
        if is_first:
            return opening_before + text + opening_after
        return answer_before + text + answer_after

    return render


# --- messages out: a table of tokenised messages ----------------------------------------------


class MessageTable(NamedTuple):
    """A game's fixed messages, tokenised once: a turn picks a row instead of encoding text."""

    opening: Tokens  # the first message, messages[0], rendered as the conversation's start
    ids: Array  # [M, L] int32: messages[1:] by row (row 0 empty), pad after each
    lengths: Array  # [M] int32


def message_table(
    texts: Sequence[str], tokenizer: Any, render: Callable[[str, bool], str]
) -> MessageTable:
    """Every message the environment can send, rendered and tokenised once: texts[0] is the
    opening (rendered with first=True), the rest are answers, as wide as the widest answer."""
    opening = tokenizer.encode(render(texts[0], True))
    encoded = [[]] + [tokenizer.encode(render(text, False)) for text in texts[1:]]
    width = max(len(ids) for ids in encoded)
    ids = np.full((len(texts), width), tokenizer.pad_id, np.int32)
    for row, message in enumerate(encoded):
        ids[row, : len(message)] = message
    lengths = jnp.asarray([len(m) for m in encoded], jnp.int32)
    opening = Tokens(jnp.asarray(opening, jnp.int32), jnp.asarray(len(opening), jnp.int32))
    return MessageTable(opening, jnp.asarray(ids), lengths)


def message(table: MessageTable, row: Array) -> Tokens:
    """The tokens of message `row` (0 is the empty message)."""
    return Tokens(table.ids[row], table.lengths[row])


def no_message(table: MessageTable) -> Tokens:
    """An empty message: what the environment says after the conversation ended."""
    return Tokens(jnp.zeros_like(table.ids[0]), jnp.zeros((), jnp.int32))


# --- utterances in: token ids to bytes, and reading the bytes ----------------------------------


class ByteTable(NamedTuple):
    """Each token id's decoded text as UTF-8 bytes: `data[t, :length[t]]`."""

    data: Array  # [V, K] uint8
    length: Array  # [V] int32


def token_text(tokenizer: Any) -> Callable[[int], str]:
    """A token's text as it reads inside a sentence. Decoding a token alone drops the leading
    space of SentencePiece-style tokens ("▁word" reads "word"), so each is decoded after an anchor
    token and the anchor's text taken off; where that does not hold, alone."""
    anchor = tokenizer.encode("a")
    anchor_text = tokenizer.decode(anchor) if len(anchor) == 1 else None

    def text(token: int) -> str:
        if anchor_text is not None:
            both = tokenizer.decode([*anchor, token])
            if both.startswith(anchor_text):
                return both[len(anchor_text) :]
        return tokenizer.decode([token])

    return text


def byte_table(tokenizer: Any, max_token_bytes: int = 32) -> ByteTable:
    """Decode the vocabulary once. Special tokens (pad, BOS, EOS, end of turn) decode to nothing,
    as `tokenizer.decode` drops them; a token longer than `max_token_bytes` keeps its start."""
    data = np.zeros((tokenizer.vocab_size, max_token_bytes), np.uint8)
    length = np.zeros(tokenizer.vocab_size, np.int32)
    read = token_text(tokenizer)
    for token in range(tokenizer.vocab_size):
        text = read(token).encode("utf-8")[:max_token_bytes]
        data[token, : len(text)] = np.frombuffer(text, np.uint8)
        length[token] = len(text)
    return ByteTable(jnp.asarray(data), jnp.asarray(length))


def _compact(values: Array, keep: Array, width: int) -> tuple[Array, Array]:
    """The kept entries of `values` [N] moved to the front of a [width] array (zeros after), in
    order, and how many there are (at most width)."""
    position = jnp.cumsum(keep) - 1
    target = jnp.where(keep & (position < width), position, width)  # width: dropped
    out = jnp.zeros((width,), values.dtype).at[target].set(values, mode="drop")
    return out, jnp.minimum(jnp.sum(keep), width).astype(jnp.int32)


def utterance_bytes(utterance: Tokens, table: ByteTable, width: int) -> tuple[Array, Array]:
    """The utterance's text as bytes [width] (zeros after) and its byte length (at most width)."""
    real = jnp.arange(utterance.ids.shape[0]) < utterance.length
    chunks = table.data[utterance.ids]  # [T, K]
    keep = real[:, None] & (
        jnp.arange(chunks.shape[1])[None] < table.length[utterance.ids][:, None]
    )
    return _compact(chunks.reshape(-1), keep.reshape(-1), width)


def normalize(text: Array, length: Array) -> tuple[Array, Array]:
    """ASCII lower case, every byte that is not a letter or digit as a space, runs of spaces as
    one, none at either end: "Is it an ANIMAL?" and "is it an animal" read the same."""
    real = jnp.arange(text.shape[0]) < length
    lower = jnp.where((text >= ord("A")) & (text <= ord("Z")), text + 32, text)
    word = ((lower >= ord("a")) & (lower <= ord("z"))) | ((lower >= ord("0")) & (lower <= ord("9")))
    word &= real
    # A space survives only between two words: after a word byte and before a later one.
    words_before = jnp.cumsum(word) - word
    words_after = jnp.cumsum(word[::-1])[::-1] - word
    previous_is_word = jnp.concatenate([jnp.zeros(1, bool), word[:-1]])
    space = real & ~word & previous_is_word & (words_before > 0) & (words_after > 0)
    values = jnp.where(word, lower, ord(" ")).astype(text.dtype)
    return _compact(values, word | space, text.shape[0])


class PhraseTable(NamedTuple):
    """Normalised phrases as zero-padded bytes, compared in the program with what was said."""

    data: Array  # [P, W] uint8, the normalised phrases, zeros after
    length: Array  # [P] int32


def phrase_table(phrases: Sequence[str], width: int) -> PhraseTable:
    """The phrases an environment understands, normalised as `normalize` does on the host."""
    normal = [normalize_text(p).encode() for p in phrases]
    if max(len(p) for p in normal) > width:
        raise ValueError(f"phrase_table: a phrase is longer than the {width} bytes read")
    data = np.zeros((len(phrases), width), np.uint8)
    for row, phrase in enumerate(normal):
        data[row, : len(phrase)] = np.frombuffer(phrase, np.uint8)
    return PhraseTable(jnp.asarray(data), jnp.asarray([len(p) for p in normal], jnp.int32))


def normalize_text(text: str) -> str:
    """`normalize` on a host string (ASCII letters and digits kept, anything else a separator)."""
    words, word = [], []
    for character in text:
        if character.isascii() and character.isalnum():
            word.append(character.lower())
        elif word:
            words.append("".join(word))
            word = []
    if word:
        words.append("".join(word))
    return " ".join(words)


def match_phrase(text: Array, length: Array, phrases: PhraseTable) -> Array:
    """The row of the phrase the normalised text equals exactly, or -1."""
    equal = jnp.all(phrases.data == text[None, : phrases.data.shape[1]], axis=1)
    fits = length <= phrases.data.shape[1]
    hit = equal & (phrases.length == length) & fits
    return jnp.where(jnp.any(hit), jnp.argmax(hit), -1).astype(jnp.int32)


def last_integer(text: Array, length: Array) -> tuple[Array, Array]:
    """(value, found) of the last run of ASCII digits in the text, a non-negative integer of at
    most MAX_INTEGER_DIGITS digits ("my guess is 12." reads 12; "-3" reads 3)."""

    def step(carry, byte_and_real):
        value, digits, last, last_digits = carry
        byte, real = byte_and_real
        is_digit = real & (byte >= ord("0")) & (byte <= ord("9"))
        ends = real & ~is_digit & (digits > 0)
        last = jnp.where(ends, value, last)
        last_digits = jnp.where(ends, digits, last_digits)
        extended = jnp.where(digits < MAX_INTEGER_DIGITS, value * 10 + (byte - ord("0")), value)
        value = jnp.where(is_digit, extended, jnp.where(real, 0, value))
        digits = jnp.where(is_digit, digits + 1, jnp.where(real, 0, digits))
        return (value, digits, last, last_digits), None

    zero = jnp.zeros((), jnp.int32)
    real = jnp.arange(text.shape[0]) < length
    (value, digits, last, last_digits), _ = jax.lax.scan(
        step, (zero, zero, zero, zero), (text.astype(jnp.int32), real)
    )
    value, digits = jnp.where(digits > 0, value, last), jnp.where(digits > 0, digits, last_digits)
    return value, (digits > 0) & (digits <= MAX_INTEGER_DIGITS)


# --- the games ---------------------------------------------------------------------------------


class GameState(NamedTuple):
    """What every game here keeps: its secret, the turns spoken, whether it is over, and the
    row of `TextEnv.messages` it said last (for transcripts and scripted players)."""

    secret: Array  # int32: the number, or an index into the game's objects or words
    turn: Array  # int32: turns the policy has spoken
    done: Array  # bool
    said: Array  # int32


def _start(secret: Array, table: MessageTable) -> tuple[GameState, Tokens]:
    zero = jnp.zeros((), jnp.int32)
    return GameState(secret, zero, jnp.zeros((), bool), zero), table.opening


def _advance(state: GameState, solved: Array, reply: Array, table: MessageTable, max_turns: int):
    """The step shared by the games: count the turn, end on success or after the last turn,
    reward 1 for success; an episode already over stays as it was and says nothing."""
    turn = state.turn + 1
    new = GameState(state.secret, turn, solved | (turn >= max_turns), reply.astype(jnp.int32))
    over = state.done
    new = jax.tree.map(lambda old, value: jnp.where(over, old, value), state, new)
    said = jax.tree.map(
        lambda empty, spoken: jnp.where(over, empty, spoken),
        no_message(table),
        message(table, reply),
    )
    reward = jnp.where(over | ~solved, 0.0, 1.0).astype(jnp.float32)
    return new, said, reward, new.done


# guess my number


def make_guess_my_number(
    tokenizer: Any,
    maximum: int = 32,
    max_turns: int = 6,
    render: Callable[[str, bool], str] = plain_render,
    utterance_bytes_read: int = 64,
) -> TextEnv:
    """The environment picks a secret integer in [1, maximum]; each turn the policy names a
    number (the last integer it writes) and hears "Higher.", "Lower." or "Correct!". Reward 1
    on the turn it is found, else 0. Binary search finds any secret in ceil(log2(maximum + 1))
    turns, so with max_turns at least that the optimum is a success rate of 1."""
    opening = (
        f"I am thinking of a whole number from 1 to {maximum}. Guess it in at most {max_turns} "
        "tries; after each guess I will say higher or lower."
    )
    texts = (opening, "Higher.", "Lower.", "Correct!", "Please guess a whole number.")
    HIGHER, LOWER, CORRECT, INVALID = range(1, len(texts))
    table, bytes_of = message_table(texts, tokenizer, render), byte_table(tokenizer)

    def reset(key: Array) -> tuple[GameState, Tokens]:
        return _start(jax.random.randint(key, (), 1, maximum + 1, jnp.int32), table)

    def step(state: GameState, utterance: Tokens):
        text, length = utterance_bytes(utterance, bytes_of, utterance_bytes_read)
        guess, found = last_integer(text, length)
        reply = jnp.where(
            ~found, INVALID, jnp.where(guess == state.secret, CORRECT, jnp.where(
                guess < state.secret, HIGHER, LOWER))
        )  # fmt: skip
        return _advance(state, found & (guess == state.secret), reply, table, max_turns)

    return TextEnv("guess_my_number", reset, step, max_turns, table.ids.shape[1], texts)


# twenty questions

# A small world of objects and yes/no properties (a rule-based answerer, after LMRL-Gym's twenty
# questions, whose answerer is a language model). Every object answers the properties
# differently; the best questioner needs at most 5 questions and a guess (6 turns), as does the
# greedy one of `GreedyQuestioner` (5.1 turns on average).
OBJECTS = (
    "cat", "dog", "eagle", "salmon", "oak", "rose", "apple", "carrot",
    "car", "bicycle", "hammer", "spoon", "chair", "phone", "book", "ball",
)  # fmt: skip
PROPERTIES = {
    "alive": ("cat", "dog", "eagle", "salmon", "oak", "rose", "apple", "carrot"),
    "an animal": ("cat", "dog", "eagle", "salmon"),
    "a plant": ("oak", "rose", "apple", "carrot"),
    "a pet": ("cat", "dog"),
    "able to fly": ("eagle",),
    "able to swim": ("salmon", "dog"),
    "food": ("salmon", "apple", "carrot"),
    "a fruit": ("apple",),
    "a tree": ("oak", "apple"),
    "a vehicle": ("car", "bicycle"),
    "made of metal": ("car", "bicycle", "hammer", "spoon", "phone"),
    "a tool": ("hammer", "spoon", "phone"),
    "used in a kitchen": ("spoon",),
    "electronic": ("phone", "car"),
    "made of paper": ("book",),
    "furniture": ("chair",),
    "round": ("ball", "apple"),
    "bigger than a person": ("car", "oak"),
}


def question_phrases() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(property questions, guesses) as the policy must say them (case and punctuation free)."""
    questions = tuple(f"Is it {name}?" for name in PROPERTIES)
    guesses = tuple(f"Is it a {name}?" for name in OBJECTS)
    return questions, guesses


def make_twenty_questions(
    tokenizer: Any,
    max_turns: int = 8,
    render: Callable[[str, bool], str] = plain_render,
    utterance_bytes_read: int = 64,
) -> TextEnv:
    """The environment thinks of one of OBJECTS; each turn the policy asks "Is it <property>?"
    (one of PROPERTIES) and hears "Yes." or "No.", or guesses "Is it a <object>?" and hears
    "Yes, it is!" (reward 1, the end) or "No."; anything else is "I can only answer the
    listed kinds of question." The opening names the objects and two example questions."""
    questions, guesses = question_phrases()
    opening = (
        "I am thinking of one of these: " + ", ".join(OBJECTS) + ". Ask yes/no questions such "
        f"as 'Is it alive?' or guess with 'Is it a cat?'. You have {max_turns} questions."
    )
    texts = (
        opening,
        "Yes.",
        "No.",
        "Yes, it is!",
        "I can only answer the listed kinds of question.",
    )
    YES, NO, SOLVED, INVALID = range(1, len(texts))
    table, bytes_of = message_table(texts, tokenizer, render), byte_table(tokenizer)
    phrases = phrase_table(questions + guesses, utterance_bytes_read)
    # answers[q, o]: the answer to phrase q when the secret is object o.
    answers = np.zeros((len(questions) + len(guesses), len(OBJECTS)), bool)
    for q, members in enumerate(PROPERTIES.values()):
        answers[q] = [name in members for name in OBJECTS]
    answers[len(questions) :] = np.eye(len(OBJECTS), dtype=bool)
    answers = jnp.asarray(answers)

    def reset(key: Array) -> tuple[GameState, Tokens]:
        return _start(jax.random.randint(key, (), 0, len(OBJECTS), jnp.int32), table)

    def step(state: GameState, utterance: Tokens):
        text, length = normalize(*utterance_bytes(utterance, bytes_of, utterance_bytes_read))
        asked = match_phrase(text, length, phrases)
        yes = answers[jnp.maximum(asked, 0), state.secret]
        solved = (asked >= len(questions)) & yes
        reply = jnp.where(asked < 0, INVALID, jnp.where(solved, SOLVED, jnp.where(yes, YES, NO)))
        return _advance(state, solved, reply, table, max_turns)

    return TextEnv("twenty_questions", reset, step, max_turns, table.ids.shape[1], texts)


# the word game

WORDS = (
    "bake", "band", "bank", "bark", "barn", "bead", "beam", "bean", "bear", "beat",
    "bell", "belt", "bend", "bird", "bite", "boat", "bold", "bone", "book", "boot",
    "cake", "calm", "camp", "card", "care", "cart", "cast", "cave", "coat", "code",
    "cold", "cone", "cook", "cool", "core", "corn", "cost", "dark", "dart", "date",
)  # fmt: skip
GREEN, YELLOW, GREY = 0, 1, 2  # a letter in place, elsewhere in the word, absent
PATTERN_SYMBOLS = "GY_"


def word_feedback(guess: str, secret: str) -> tuple[int, ...]:
    """Wordle's rule per letter: green where it is in place; then, left to right, yellow while
    the secret has that letter left over after the greens and earlier yellows; else grey."""
    marks, spare = [GREY] * len(guess), {}
    for g, s in zip(guess, secret, strict=True):
        if g != s:
            spare[s] = spare.get(s, 0) + 1
    for i, (g, s) in enumerate(zip(guess, secret, strict=True)):
        if g == s:
            marks[i] = GREEN
        elif spare.get(g, 0) > 0:
            marks[i], spare[g] = YELLOW, spare[g] - 1
    return tuple(marks)


def pattern_text(marks: Sequence[int]) -> str:
    """The word game's feedback marks as text, one symbol per letter."""
    return " ".join(PATTERN_SYMBOLS[m] for m in marks)


def make_word_game(
    tokenizer: Any,
    words: Sequence[str] = WORDS,
    max_turns: int = 6,
    render: Callable[[str, bool], str] = plain_render,
    utterance_bytes_read: int = 64,
) -> TextEnv:
    """Wordle on a short list: the secret is one of `words` (all of one length n); each turn the
    policy names a word of the list and hears its pattern, one symbol per letter: G (in place),
    Y (elsewhere in the word), _ (absent), e.g. "G _ Y _"; the all-G pattern is the win (reward
    1). A word not on the list is "Not a word from the list." and costs the turn. Every pattern
    is one of 3^n messages, tabulated once; feedback[g, s] for every pair of words too."""
    n = len(words[0])
    if any(len(w) != n or not w.isascii() or not w.isalpha() for w in words):
        raise ValueError("make_word_game: the words must be ASCII letters, all of one length")
    opening = (
        f"I am thinking of one of these {n}-letter words: " + ", ".join(words) + ". Guess it in "
        f"at most {max_turns} tries. After each guess I mark every letter G (right place), Y "
        "(in the word, elsewhere) or _ (not in the word)."
    )
    patterns = [tuple(int(d) for d in np.base_repr(i, 3).zfill(n)) for i in range(3**n)]
    texts = (opening, "Not a word from the list.", *(pattern_text(p) for p in patterns))
    INVALID, FIRST_PATTERN = 1, 2
    table, bytes_of = message_table(texts, tokenizer, render), byte_table(tokenizer)
    phrases = phrase_table(words, utterance_bytes_read)
    index = {p: i for i, p in enumerate(patterns)}
    feedback = np.array([[index[word_feedback(g, s)] for s in words] for g in words], np.int32)
    feedback, win = jnp.asarray(feedback), index[(GREEN,) * n]

    def reset(key: Array) -> tuple[GameState, Tokens]:
        return _start(jax.random.randint(key, (), 0, len(words), jnp.int32), table)

    def step(state: GameState, utterance: Tokens):
        text, length = normalize(*utterance_bytes(utterance, bytes_of, utterance_bytes_read))
        guess = match_phrase(text, length, phrases)
        pattern = feedback[jnp.maximum(guess, 0), state.secret]
        reply = jnp.where(guess < 0, INVALID, FIRST_PATTERN + pattern)
        solved = (guess >= 0) & (pattern == win)
        return _advance(state, solved, reply, table, max_turns)

    return TextEnv("word_game", reset, step, max_turns, table.ids.shape[1], texts)


GAMES = {
    "guess_my_number": make_guess_my_number,
    "twenty_questions": make_twenty_questions,
    "word_game": make_word_game,
}


# --- scripted players: the games' baselines, in host Python -----------------------------------


class BinarySearch:
    """Guess-my-number's optimal player: halve the interval the answers leave. With
    `plausible=True`, a weaker player that never contradicts an answer: a uniform guess in the
    interval."""

    def __init__(self, maximum: int, plausible: bool = False) -> None:
        self.maximum, self.plausible = maximum, plausible

    def speak(self, heard: str, rng: np.random.Generator) -> str:
        if heard.startswith("I am thinking"):
            self.low, self.high = 1, self.maximum
        elif heard == "Higher.":
            self.low = self.guess + 1
        elif heard == "Lower.":
            self.high = self.guess - 1
        if self.plausible:
            self.guess = int(rng.integers(self.low, self.high + 1))
        else:
            self.guess = (self.low + self.high) // 2
        return f"{self.guess}"


class GreedyQuestioner:
    """Twenty questions: ask the property that splits the objects still possible most evenly;
    guess when one is left. With `plausible=True`, a weaker player: any property that splits
    them, at random."""

    def __init__(self, plausible: bool = False) -> None:
        self.plausible = plausible

    def speak(self, heard: str, rng: np.random.Generator) -> str:
        if heard.startswith("I am thinking"):
            self.candidates = list(OBJECTS)
        elif heard in ("Yes.", "No."):
            members, yes = PROPERTIES.get(self.asked, (self.asked,)), heard == "Yes."
            self.candidates = [c for c in self.candidates if (c in members) == yes]
        if len(self.candidates) == 1:
            self.asked = self.candidates[0]
            return f"Is it a {self.asked}?"

        def larger_side(members: Sequence[str]) -> int:
            inside = sum(c in members for c in self.candidates)
            return max(inside, len(self.candidates) - inside)

        if self.plausible:
            splits = [n for n, m in PROPERTIES.items() if larger_side(m) < len(self.candidates)]
            self.asked = splits[rng.integers(len(splits))]
        else:
            self.asked = min(PROPERTIES, key=lambda name: larger_side(PROPERTIES[name]))
        return f"Is it {self.asked}?"


class MinimaxWordGuesser:
    """The word game: guess the word (any on the list) whose worst-case pattern leaves the
    fewest words possible, preferring words still possible; guess the last one left. With
    `plausible=True`, a weaker player: any word still possible, at random."""

    def __init__(self, words: Sequence[str] = WORDS, plausible: bool = False) -> None:
        self.words, self.plausible = tuple(words), plausible

    def speak(self, heard: str, rng: np.random.Generator) -> str:
        if heard.startswith("I am thinking"):
            self.candidates = list(self.words)
        elif heard.startswith(tuple(PATTERN_SYMBOLS)):
            self.candidates = [
                c for c in self.candidates if pattern_text(word_feedback(self.guess, c)) == heard
            ]

        def worst_case(guess: str) -> tuple[int, bool]:
            sizes: dict[tuple[int, ...], int] = {}
            for c in self.candidates:
                pattern = word_feedback(guess, c)
                sizes[pattern] = sizes.get(pattern, 0) + 1
            return max(sizes.values()), guess not in self.candidates

        if self.plausible:
            self.guess = self.candidates[rng.integers(len(self.candidates))]
        else:
            pool = self.candidates if len(self.candidates) <= 2 else self.words
            self.guess = min(pool, key=worst_case)
        return self.guess


class RandomSpeaker:
    """The random baseline: a valid utterance drawn uniformly each turn."""

    def __init__(self, utterances: Sequence[str]) -> None:
        self.utterances = tuple(utterances)

    def speak(self, heard: str, rng: np.random.Generator) -> str:
        return self.utterances[rng.integers(len(self.utterances))]


def scripted_players(name: str, **game: Any) -> dict[str, Any]:
    """The baselines of a game of GAMES, given the game's keyword arguments (its `maximum`,
    `words`): "scripted", the near-optimal player; "plausible", one that never contradicts an
    answer but chooses at random among what is still possible (a teacher whose imitation leaves
    room to improve); "random", a valid utterance drawn uniformly each turn."""
    if name == "guess_my_number":
        maximum = game.get("maximum", 32)
        numbers = [str(n) for n in range(1, maximum + 1)]
        return {
            "scripted": BinarySearch(maximum),
            "plausible": BinarySearch(maximum, plausible=True),
            "random": RandomSpeaker(numbers),
        }
    if name == "twenty_questions":
        questions, guesses = question_phrases()
        return {
            "scripted": GreedyQuestioner(),
            "plausible": GreedyQuestioner(plausible=True),
            "random": RandomSpeaker(questions + guesses),
        }
    words = game.get("words", WORDS)
    return {
        "scripted": MinimaxWordGuesser(words),
        "plausible": MinimaxWordGuesser(words, plausible=True),
        "random": RandomSpeaker(words),
    }


def play(
    env: TextEnv,
    players: Sequence[Any],
    tokenizer: Any,
    key: Array,
    max_utterance_tokens: int = 32,
    seed: int = 0,
) -> dict[str, Any]:
    """Host players against the environment, one episode each, the environment's steps jitted
    and vmapped: each turn every player hears its episode's last message (unrendered) and
    speaks; its words are tokenised and the environment answers. Returns each episode's return,
    turns and transcript (a list of (speaker, text))."""
    reset, step = jax.jit(jax.vmap(env.reset)), jax.jit(jax.vmap(env.step))
    rng = np.random.default_rng(seed)
    states, _ = reset(jax.random.split(key, len(players)))
    returns = np.zeros(len(players))
    transcripts: list[list[tuple[str, str]]] = [[] for _ in players]
    for _ in range(env.max_turns):
        said, done = np.asarray(states.said), np.asarray(states.done)
        ids = np.full((len(players), max_utterance_tokens), tokenizer.pad_id, np.int32)
        lengths = np.zeros(len(players), np.int32)
        for i, player in enumerate(players):
            if done[i]:
                continue
            transcripts[i].append(("env", env.messages[said[i]]))
            text = player.speak(env.messages[said[i]], rng)
            transcripts[i].append(("policy", text))
            tokens = tokenizer.encode(text)[:max_utterance_tokens]
            ids[i, : len(tokens)], lengths[i] = tokens, len(tokens)
        states, _, rewards, _ = step(states, Tokens(jnp.asarray(ids), jnp.asarray(lengths)))
        returns += np.asarray(rewards)
    for i, said in enumerate(np.asarray(states.said)):
        transcripts[i].append(("env", env.messages[said]))
    return {"returns": returns, "turns": np.asarray(states.turn), "transcripts": transcripts}


def conversation_batch(
    transcripts: Sequence[Sequence[tuple[str, str]]],
    tokenizer: Any,
    end_of_turn: int,
    width: int,
    render: Callable[[str, bool], str] = plain_render,
) -> dict[str, np.ndarray]:
    """Transcripts (`play`'s) as supervised fine-tuning rows laid out as `converse` lays out a
    conversation: the rendered opening, then each policy turn followed by `end_of_turn` (the
    loss is on these) and each answer rendered (context); the answer after the last turn is
    left out, as the sampler never feeds it. Rows right-padded to `width` (an error if longer):
    `algos.sft`'s tokens, attention_mask and loss_mask [N, width]."""
    rows = len(transcripts)
    batch = {
        "tokens": np.full((rows, width), tokenizer.pad_id, np.int32),
        "attention_mask": np.zeros((rows, width), bool),
        "loss_mask": np.zeros((rows, width), bool),
    }
    for row, transcript in enumerate(transcripts):
        tokens, loss = tokenizer.encode(render(transcript[0][1], True)), []
        loss = [False] * len(tokens)
        spoken = [i for i, (speaker, _) in enumerate(transcript) if speaker == "policy"]
        for i in spoken:
            said = [*tokenizer.encode(transcript[i][1]), end_of_turn]
            tokens += said
            loss += [True] * len(said)
            if i != spoken[-1]:
                answer = tokenizer.encode(render(transcript[i + 1][1], False))
                tokens += answer
                loss += [False] * len(answer)
        if len(tokens) > width:
            raise ValueError(
                f"conversation_batch: a conversation of {len(tokens)} tokens > {width}"
            )
        batch["tokens"][row, : len(tokens)] = tokens
        batch["attention_mask"][row, : len(tokens)] = True
        batch["loss_mask"][row, : len(tokens)] = loss
    return batch
