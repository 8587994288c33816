"""Multi-turn text games (envs/text/multiturn.py): each JAX environment equals a plain-Python
reference written from the rules on random episodes (valid, garbled and invalid turns), with
byte tokens, a small SentencePiece-style BPE and SmolLM2's byte-level BPE; the scripted players
always win and the random ones win as often as chance says; the byte reading (normalising, the
last integer) against regular expressions."""

import math
import re
from collections import Counter

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from envs.text import multiturn as mt
from jaxrl.lm.tokenizer import ByteTokenizer, load_tokenizer

BYTES = ByteTokenizer()
READ = 64  # the bytes of an utterance the games read (their default)


def bpe():
    return load_tokenizer("tests/fixtures/hf/tokenizer")


def tokenizer_named(name):
    if name == "smollm2":  # the real model's byte-level BPE, 49,152 tokens
        from jaxrl.lm.gguf import smollm2_hf_dir

        return load_tokenizer(smollm2_hf_dir())
    return BYTES if name == "bytes" else bpe()


# --- the references: the rules, on Python bytes ------------------------------------------------


def words_of(data: bytes) -> str:
    return " ".join(w.decode() for w in re.findall(rb"[A-Za-z0-9]+", data)).lower()


def last_number(data: bytes):
    runs = re.findall(rb"[0-9]+", data)
    return int(runs[-1]) if runs and len(runs[-1]) <= 9 else None


class Reference:
    """One game's rules: reply(secret, utterance bytes) -> (message, solved)."""

    def __init__(self, name):
        self.name = name
        questions, guesses = mt.question_phrases()
        self.phrases = [words_of(p.encode()) for p in questions + guesses]

    def reply(self, secret, data):
        if self.name == "guess_my_number":
            guess = last_number(data)
            if guess is None:
                return "Please guess a whole number.", False
            if guess == secret:
                return "Correct!", True
            return ("Higher." if guess < secret else "Lower."), False
        said = words_of(data)
        if self.name == "twenty_questions":
            if said not in self.phrases:
                return "I can only answer the listed kinds of question.", False
            index = self.phrases.index(said)
            names = list(mt.PROPERTIES)
            if index >= len(names):
                hit = mt.OBJECTS[index - len(names)] == mt.OBJECTS[secret]
                return ("Yes, it is!" if hit else "No."), hit
            return ("Yes." if mt.OBJECTS[secret] in mt.PROPERTIES[names[index]] else "No."), False
        if said not in mt.WORDS:
            return "Not a word from the list.", False
        guess, word = said, mt.WORDS[secret]
        marks, left = ["_"] * len(word), Counter(word)
        for i, (g, s) in enumerate(zip(guess, word, strict=True)):
            if g == s:
                marks[i], left[g] = "G", left[g] - 1
        for i, g in enumerate(guess):
            if marks[i] == "_" and left[g] > 0:
                marks[i], left[g] = "Y", left[g] - 1
        return " ".join(marks), guess == word


def random_utterance(name, rng):
    """A turn as a policy might say it: valid, garbled (case, punctuation, spaces) or invalid."""
    garble = lambda text: (
        "".join(  # noqa: E731
            c.upper() if rng.random() < 0.3 else c for c in text
        )
        + rng.choice(["", "?", "!!", " .", "  "])
    )
    kind = rng.integers(5)
    if name == "guess_my_number":
        n = int(rng.integers(0, 40))
        return [
            str(n), f"My guess is {n}.", f"{rng.integers(50)} or maybe {n}", garble("no idea"),
            rng.choice(["", "-7", "12345678901", "7x", "number 99999"]),
        ][kind]  # fmt: skip
    if name == "twenty_questions":
        questions, guesses = mt.question_phrases()
        phrase = rng.choice(questions + guesses)
        return [
            phrase, garble(phrase), "  " + phrase.replace(" ", "   "), phrase + " please",
            rng.choice(["Is it", "", "is it a cat dog", "cat", "Is it a unicorn?"]),
        ][kind]  # fmt: skip
    word = rng.choice(mt.WORDS)
    return [
        word, garble(word), f" {word}.", f"{word} {word}",
        rng.choice(["", "beak", "bakes", "b a k e"]),
    ][kind]  # fmt: skip


def encode_turn(tokenizer, text, width=48):
    ids = tokenizer.encode(text)
    assert len(ids) <= width, text
    padded = np.full(width, tokenizer.pad_id, np.int32)
    padded[: len(ids)] = ids
    return padded, len(ids)


@pytest.mark.parametrize(
    "tokenizer_name", ["bytes", "bpe", pytest.param("smollm2", marks=pytest.mark.smollm2)]
)
@pytest.mark.parametrize("name", list(mt.GAMES))
def test_game_equals_the_reference_on_random_episodes(name, tokenizer_name):
    """64 episodes of random turns, stepped in one vmapped call per turn: every reply (its text
    and its tokens), reward, turn count and end equals the reference; finished episodes say
    nothing and stay as they are."""
    tokenizer = tokenizer_named(tokenizer_name)
    if tokenizer_name == "bpe" and name == "guess_my_number":
        pytest.skip("the fixture BPE vocabulary has no digits")
    env, reference, rng = mt.GAMES[name](tokenizer), Reference(name), np.random.default_rng(1)
    episodes = 64
    reset, step = jax.jit(jax.vmap(env.reset)), jax.jit(jax.vmap(env.step))
    states, opening = reset(jax.random.split(jax.random.key(3), episodes))
    first = tokenizer.encode(mt.plain_render(env.messages[0], True))
    assert np.asarray(opening.ids[0, : len(first)]).tolist() == first
    secrets = np.asarray(states.secret)
    turns, done = np.zeros(episodes, int), np.zeros(episodes, bool)
    for _ in range(env.max_turns + 1):  # one turn past the end
        texts = [random_utterance(name, rng) for _ in range(episodes)]
        ids, lengths = zip(*(encode_turn(tokenizer, t) for t in texts), strict=True)
        turn = mt.Tokens(jnp.asarray(np.stack(ids)), jnp.asarray(lengths, jnp.int32))
        states, replies, rewards, ended = jax.device_get(step(states, turn))
        for i, text in enumerate(texts):
            if done[i]:
                assert replies.length[i] == 0 and rewards[i] == 0 and ended[i], i
                assert states.turn[i] == turns[i]
                continue
            heard = tokenizer.decode(tokenizer.encode(text)).encode()  # what the tokens say
            expected, solved = reference.reply(secrets[i], heard)
            turns[i] += 1
            done[i] = solved or turns[i] >= env.max_turns
            assert env.messages[states.said[i]] == expected, (text, expected)
            tokens = tokenizer.encode(mt.plain_render(expected, False))
            assert replies.ids[i, : replies.length[i]].tolist() == tokens
            assert (
                rewards[i] == float(solved) and ended[i] == done[i] and states.turn[i] == turns[i]
            )
    assert done.all()


# Chance of a random player: a uniform draw among `choices` valid turns, `right` of which win,
# each turn, for max_turns turns.
CHANCE = {
    "guess_my_number": (32, 1, 6),
    "twenty_questions": (len(mt.PROPERTIES) + len(mt.OBJECTS), 1, 8),
    "word_game": (len(mt.WORDS), 1, 6),
}
SCRIPTED_TURNS = {"guess_my_number": 6, "twenty_questions": 6, "word_game": 4}


@pytest.mark.parametrize("name", list(mt.GAMES))
def test_scripted_players_always_win_and_random_ones_as_chance_says(name):
    """256 episodes each. The scripted player wins every one within its designed number of
    turns (binary search: ceil(log2 33) = 6; the greedy questioner: 5 questions and a guess;
    minimax on 40 words: 4); the random one wins 1 - (1 - 1/choices)^turns of them."""
    env, episodes = mt.GAMES[name](BYTES), 256
    results = {}
    for kind in ("scripted", "random"):
        players = [mt.scripted_players(name)[kind] for _ in range(episodes)]
        results[kind] = mt.play(env, players, BYTES, jax.random.key(0), max_utterance_tokens=40)
    scripted, random = results["scripted"], results["random"]
    assert scripted["returns"].min() == 1.0
    assert scripted["turns"].max() <= SCRIPTED_TURNS[name]
    choices, right, turns = CHANCE[name]
    chance = 1 - (1 - right / choices) ** turns
    spread = 4 * math.sqrt(chance * (1 - chance) / episodes)
    assert abs(random["returns"].mean() - chance) < spread, (random["returns"].mean(), chance)
    transcript = scripted["transcripts"][0]
    assert transcript[0] == ("env", env.messages[0]) and transcript[-1][0] == "env"


def test_normalize_and_last_integer_equal_regular_expressions():
    """On 300 random byte strings of letters, digits, spaces, punctuation and non-ASCII bytes."""
    rng = np.random.default_rng(0)
    alphabet = np.frombuffer(b"aZ09 ?!.,-x\n\t" + bytes([195, 169, 200]), np.uint8)
    normalize = jax.jit(mt.normalize)
    last_integer = jax.jit(mt.last_integer)
    for _ in range(300):
        length = int(rng.integers(0, 40))
        data = rng.choice(alphabet, size=length)
        padded = np.zeros(48, np.uint8)
        padded[:length] = data
        text, text_length = normalize(jnp.asarray(padded), jnp.int32(length))
        got = bytes(np.asarray(text)[: int(text_length)]).decode()
        assert got == words_of(data.tobytes()), data.tobytes()
        value, found = last_integer(jnp.asarray(padded), jnp.int32(length))
        expected = last_number(data.tobytes())
        assert bool(found) == (expected is not None) and (expected is None or value == expected)


def test_an_utterance_is_read_up_to_its_byte_budget():
    """Bytes past `utterance_bytes_read` are not read: a number written after them is not seen."""
    env = mt.make_guess_my_number(BYTES, utterance_bytes_read=READ)
    state, _ = env.reset(jax.random.key(0))
    secret = int(state.secret)
    for padding, heard in ((READ - 2, "Correct!"), (READ, "Please guess a whole number.")):
        ids, length = encode_turn(BYTES, "." * padding + f"{secret:02d}", width=READ + 8)
        after, _, reward, _ = env.step(state, mt.Tokens(jnp.asarray(ids), jnp.int32(length)))
        assert env.messages[int(after.said)] == heard, padding


def test_token_text_keeps_the_spaces_a_tokenizer_drops_alone():
    """A SentencePiece-style token read alone loses its leading space; in a sentence it has it."""
    tokenizer = bpe()
    read = mt.token_text(tokenizer)
    ids = tokenizer.encode("is it an animal")
    assert "".join(read(i) for i in ids).strip() == tokenizer.decode(ids)


@pytest.mark.parametrize(
    "template,end_of_turn",
    [("chatml_smollm2", "<|im_end|>"), ("qwen25", "<|im_end|>"), ("llama32", "<|eot_id|>")],
)
def test_chat_render_pieces_make_the_templates_conversation(tmp_path, template, end_of_turn):
    """The opening, then each policy turn with its end-of-turn token and each answer rendered,
    is the chat template's own rendering of the conversation (system, user, assistant, user,
    assistant), for three templates."""
    from tests.test_chat_template import REFERENCE, checkpoint_dir, template_text

    tokens = REFERENCE["tokenizer_config_tokens"][template]
    tokenizer = load_tokenizer(checkpoint_dir(tmp_path / template, template_text(template), tokens))
    render = mt.chat_render(tokenizer, end_of_turn, system="You play a game.")
    pieces = render("Guess my number.", True) + "12" + end_of_turn
    pieces += render("Higher.", False) + "15" + end_of_turn
    conversation = tokenizer.apply_chat_template(
        [
            {"role": "system", "content": "You play a game."},
            {"role": "user", "content": "Guess my number."},
            {"role": "assistant", "content": "12"},
            {"role": "user", "content": "Higher."},
            {"role": "assistant", "content": "15"},
        ]
    )
    assert conversation.startswith(pieces), (pieces, conversation)
    assert conversation[len(pieces) :].strip() == ""


def test_chat_render_refuses_a_wrong_end_of_turn(tmp_path):
    from tests.test_chat_template import REFERENCE, checkpoint_dir, template_text

    tokens = REFERENCE["tokenizer_config_tokens"]["qwen25"]
    tokenizer = load_tokenizer(checkpoint_dir(tmp_path / "q", template_text("qwen25"), tokens))
    with pytest.raises(ValueError, match="does not end an assistant turn with '<\\|eot_id\\|>'"):
        mt.chat_render(tokenizer, "<|eot_id|>")
