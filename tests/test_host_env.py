"""Host environments (envs/text/host_env.py): a plain-Python game behind the JAX interface plays
inside `converse` exactly as its JAX twin does, and a game that raises, hangs or answers
malformed output stops the program with one failure naming the game, the episode and the
problem."""

import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from envs.text import multiturn as games
from envs.text.host_env import host_text_env
from envs.text.multiturn import Tokens
from jaxrl import host
from jaxrl.lm import dialogue
from jaxrl.lm.sampler import SamplingConfig
from tests.test_multiturn import BYTES, TINY, digits_model


class GuessGame:
    """Guess-my-number (1 to 8, 4 turns) written as a host game, from the same rules."""

    def reset(self, seed):
        env = games.make_guess_my_number(BYTES, maximum=8, max_turns=4)
        self.secret = int(np.random.default_rng(seed).integers(1, 9))
        return env.messages[0]

    def step(self, utterance):
        numbers = [int(n) for n in __import__("re").findall(r"[0-9]+", utterance) if len(n) <= 9]
        if not numbers:
            return "Please guess a whole number.", 0.0, False
        guess = numbers[-1]
        if guess == self.secret:
            return "Correct!", 1.0, True
        return ("Higher." if guess < self.secret else "Lower."), 0.0, False


def converse(env, episodes=16):
    params = digits_model(1)
    sampling = SamplingConfig(4, BYTES.eos_id, BYTES.pad_id, 1.0)
    reset_keys = jax.random.split(jax.random.key(1), episodes)
    sample_keys = jax.random.split(jax.random.key(101), episodes)
    run = jax.jit(lambda p: dialogue.converse(TINY, p, env, reset_keys, sample_keys, sampling))
    return jax.device_get(run(params))


def test_a_host_game_plays_inside_the_program_like_the_policy_says():
    """Each episode's policy turns, replayed through a fresh host game with the same seed, get
    the answers and rewards the program recorded; the answers are the tokens in the context."""
    env = host_text_env("guess", GuessGame, BYTES, max_turns=4, max_message_tokens=40)
    episodes, _ = converse(env)
    assert episodes.done.all() and episodes.rewards.sum() >= 1
    keys = jax.random.split(jax.random.key(1), 16)
    seeds = np.asarray(jax.vmap(lambda k: jax.random.bits(k, (), np.uint32))(keys))
    for row in range(16):
        game = GuessGame()
        opening = game.reset(int(seeds[row]))
        real = episodes.mask[row]
        tokens, policy = episodes.tokens[row][real], episodes.policy_mask[row][real]
        turn_ids = episodes.turn_index[row][real]
        expected = BYTES.encode(games.plain_render(opening, True))
        for turn in range(int(episodes.spoke[row].sum())):
            said = tokens[(turn_ids == turn) & policy].tolist()
            expected += said + ([] if said[-1] == BYTES.eos_id else [BYTES.eos_id])
            answer, reward, done = game.step(BYTES.decode(said))
            assert episodes.rewards[row, turn] == reward
            if not done and turn + 1 < 4:
                expected += BYTES.encode(games.plain_render(answer, False))
        assert tokens.tolist() == expected, row


def one_turn(env):
    """Reset two episodes and step them once with the turn "5", compiled (no model: the
    environment's calls alone)."""

    def run():
        state, _ = env.reset(jax.random.split(jax.random.key(0), 2))
        ids = jnp.zeros((2, 4), jnp.int32).at[:, 0].set(BYTES.encode("5")[0])
        return env.step(state, Tokens(ids, jnp.ones(2, jnp.int32)))

    return jax.block_until_ready(jax.jit(run)())


def test_host_game_callbacks_work_on_numpy_rows():
    """The game's callbacks turn their arguments into NumPy before reading them: indexing the
    jax.Arrays io_callback may hand them dispatches a JAX computation from inside the running
    program, which deadlocks a run pinned to one core (as GRPO's host rewards did)."""
    seen = []

    class Recording:
        def __getattr__(self, name):
            return getattr(BYTES, name)

        def decode(self, ids):
            seen.append(type(ids))
            return BYTES.decode(ids)

    env = host_text_env("guess", GuessGame, Recording(), max_turns=4, max_message_tokens=40)
    _, answers, _, _ = one_turn(env)
    assert (np.asarray(answers.length) > 0).all()
    assert seen and set(seen) == {np.ndarray}, set(seen)


class Broken(GuessGame):
    def __init__(self, how):
        self.how = how

    def step(self, utterance):
        if self.how == "raise":
            raise RuntimeError("the game's server is down")
        if self.how == "hang":
            time.sleep(3)
        if self.how == "nan":
            return "Higher.", float("nan"), False
        if self.how == "long":
            return "x" * 100, 0.0, False
        return 42  # not (answer, reward, done)


@pytest.mark.parametrize(
    "how,problem",
    [
        ("raise", "raised RuntimeError: the game's server is down"),
        ("hang", "step of episode 0 did not return within 0.5 s"),
        ("nan", "returned reward nan; return a finite float"),
        ("long", "said 102 tokens, more than the 40 it may (max_message_tokens)"),
        ("tuple", "returned 42; return (answer, reward, done)"),
    ],
)
def test_a_failing_host_game_is_one_failure_naming_the_problem(how, problem):
    host.take_failure()  # nothing left over from another test
    env = host_text_env(
        "guess", lambda: Broken(how), BYTES, max_turns=4, max_message_tokens=40, timeout_s=0.5
    )
    with pytest.raises(Exception):  # noqa: B017 (the runtime's wrapper of the callback's error)
        one_turn(env)
    failure = host.take_failure()
    assert failure is not None and failure.function == "host environment guess"
    assert problem in failure.summary(), failure.summary()
