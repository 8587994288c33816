"""Text tasks: the host (string) and JAX (token array) versions agree, splits never overlap, and
the rewards follow their definitions."""

import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from envs.text import TASKS, answer_reward, format_reward, is_held_out, make_task
from jaxrl.config import ConfigError
from jaxrl.lm.tokenizer import ByteTokenizer

TOKENIZER = ByteTokenizer()
SETTINGS = {name: dict(num_digits=2 if name == "addition" else 4) for name in TASKS}


def _digits_to_problems(digits) -> list[str]:
    return ["".join(map(str, row)) for row in np.asarray(digits)]


@pytest.mark.parametrize("name", sorted(TASKS))
def test_jax_prompts_and_answers_equal_the_host_strings(name):
    task = make_task(name, **SETTINGS[name])
    tokens = task.tokens(TOKENIZER)
    digits = task.sample_digits(jax.random.key(0), 64)
    batch = jax.device_get(task.encode_problems(digits, tokens))
    for i, problem in enumerate(_digits_to_problems(digits)):
        assert batch.tokens[i][0] == TOKENIZER.bos_id
        assert TOKENIZER.decode(batch.tokens[i]) == task.prompt(problem)
        answer = batch.answer_tokens[i][: batch.answer_length[i]]
        assert TOKENIZER.decode(answer) == task.answer(problem)


def test_answers_by_hand():
    assert make_task("reverse_digits").answer("482") == "284"
    assert make_task("sort_digits").answer("482") == "248"
    assert make_task("copy_digits").answer("482") == "482"
    count = make_task("count_digit", num_digits=5)
    assert count.prompt("717273") == "count 7 in 17273=" and count.answer("717273") == "2"
    add = make_task("addition", num_digits=2)
    assert add.prompt("4821") == "48+21=" and add.answer("4821") == "69"
    assert add.answer("9999") == "198"


@pytest.mark.parametrize("name", sorted(TASKS))
def test_in_program_sampler_never_draws_held_out_problems(name):
    task = make_task(name, **SETTINGS[name])
    train = np.asarray(task.sample_digits(jax.random.key(1), 2000, split="train"))
    held = np.asarray(task.sample_digits(jax.random.key(1), 200, split="eval"))
    assert not is_held_out(train, np).any() and is_held_out(held, np).all()
    lows = np.array(task.lowest_digits())
    assert (train >= lows).all() and (train <= 9).all()
    # The host's eval problems are exactly the hash's eval split (repeat_digit has only a
    # handful of problems, so small spaces give what they have).
    rng = np.random.default_rng(0)
    host_eval = task.sample_problems(rng, 50, split="eval", allow_fewer=True)
    assert host_eval and is_held_out(task.problem_digits(host_eval), np).all()


def test_small_split_is_exhausted_or_refused():
    task = make_task("reverse_digits", num_digits=2)
    rng = np.random.default_rng(0)
    everything = task.sample_problems(rng, 1000, split="eval", allow_fewer=True)
    assert 0 < len(everything) < 100 and len(set(everything)) == len(everything)
    with pytest.raises(ConfigError, match="count"):
        task.sample_problems(rng, 1000, split="eval")


def _completion_tokens(texts: list[str], width: int, eos: bool) -> tuple[np.ndarray, np.ndarray]:
    tokens = np.zeros((len(texts), width), np.int32)
    mask = np.zeros((len(texts), width), bool)
    for i, text in enumerate(texts):
        ids = TOKENIZER.encode(text) + ([TOKENIZER.eos_id] if eos else [])
        ids = ids[:width]
        tokens[i, : len(ids)] = ids
        mask[i, : len(ids)] = True
    return tokens, mask


@pytest.mark.parametrize("name", sorted(TASKS))
def test_answer_reward_equals_host_score(name):
    task = make_task(name, **SETTINGS[name])
    tokens = task.tokens(TOKENIZER)
    rng = np.random.default_rng(0)
    problems = task.sample_problems(rng, 40)
    answers = [task.answer(p) for p in problems]
    # Right answers, near misses, too long, too short, and non-digits.
    texts = answers + [task.corrupt(a, rng) for a in answers]
    texts += [a + "7" for a in answers[:10]] + [a[:-1] for a in answers[:10]] + ["x?"] * 5
    problems = (problems * 2) + problems[:10] + problems[:10] + problems[:5]
    batch = task.encode_problems(task.problem_digits(problems), tokens)
    completion, mask = _completion_tokens(texts, task.answer_width + 3, eos=True)
    rewards = answer_reward(
        jnp.asarray(completion), jnp.asarray(mask), batch.answer_tokens, batch.answer_length, 2
    )
    expected = [task.score(p, t) for p, t in zip(problems, texts, strict=True)]
    np.testing.assert_allclose(np.asarray(rewards), expected, rtol=1e-6)
    assert np.asarray(rewards)[: len(answers)].tolist() == [1.0] * len(answers)


def test_answer_reward_needs_the_eos():
    task = make_task("reverse_digits", num_digits=3)
    batch = task.encode_problems(task.problem_digits(["123"]), task.tokens(TOKENIZER))
    without_eos, mask = _completion_tokens(["321"], 6, eos=False)
    reward = answer_reward(
        jnp.asarray(without_eos), jnp.asarray(mask), batch.answer_tokens, batch.answer_length, 2
    )
    assert float(reward[0]) == pytest.approx(0.5 * 3 / 4)  # 3 digits right, no stop


def test_format_reward_by_hand():
    digit_ids = make_task("reverse_digits").tokens(TOKENIZER).digit_ids
    texts = ["123", "12a", "", "ab"]
    tokens, mask = _completion_tokens(texts, 5, eos=True)
    no_eos, no_eos_mask = _completion_tokens(["1234567"], 5, eos=False)
    tokens, mask = np.concatenate([tokens, no_eos]), np.concatenate([mask, no_eos_mask])
    reward = format_reward(jnp.asarray(tokens), jnp.asarray(mask), digit_ids, 2)
    # digits+EOS; 2/3 digits + EOS; EOS alone (no body: no stop credit); no digits + EOS;
    # 4/4 body digits but never stops.
    np.testing.assert_allclose(np.asarray(reward), [1.0, 0.5 * 2 / 3 + 0.5, 0.0, 0.5, 0.5])


def test_task_rejects_bad_settings():
    with pytest.raises(ConfigError, match="num_digits"):
        make_task("addition", num_digits=9)
    with pytest.raises(ConfigError, match="unknown task"):
        make_task("multiply")


def test_text_task_bundles_the_prompt_sampler_and_the_rewards():
    """What GRPO trains on: the task's prompts drawn in JAX, its answer reward, and the format
    reward at its weight (only when the weight is not 0)."""
    task = make_task("reverse_digits", num_digits=3)
    tokens = task.tokens(TOKENIZER)
    plain, shaped = task.text_task(TOKENIZER), task.text_task(TOKENIZER, format_weight=0.5)
    assert [t.name for t in plain.reward_terms] == ["task"]
    assert [(t.name, t.weight) for t in shaped.reward_terms] == [("task", 1.0), ("format", 0.5)]
    assert (shaped.eos_id, shaped.pad_id) == (TOKENIZER.eos_id, TOKENIZER.pad_id)
    prompts = shaped.sample_prompts(jax.random.key(3), 6, shaped.data)
    want = task.sample_prompts(jax.random.key(3), 6, tokens)
    for got, expected in zip(prompts, want, strict=True):
        np.testing.assert_array_equal(got, expected)
    problems = _digits_to_problems(task.sample_digits(jax.random.key(3), 6))
    texts = [task.answer(p) for p in problems[:3]] + ["12", "x", "999"]
    tokens_, mask = _completion_tokens(texts, 6, eos=True)
    # What the sampler returns, as far as rewards look.
    completion = types.SimpleNamespace(tokens=jnp.asarray(tokens_), mask=jnp.asarray(mask))
    answer, form = (term.fn(prompts, completion) for term in shaped.reward_terms)
    np.testing.assert_allclose(
        np.asarray(answer), [task.score(p, t) for p, t in zip(problems, texts, strict=True)]
    )
    np.testing.assert_allclose(
        np.asarray(form),
        format_reward(completion.tokens, completion.mask, tokens.digit_ids, TOKENIZER.eos_id),
    )
    more = shaped.with_reward(shaped.reward_terms[0]._replace(name="again"))
    assert [t.name for t in more.reward_terms] == ["task", "format", "again"]
    with pytest.raises(ConfigError, match="tokenizer"):
        task.text_task(type("OneTokenPerTwoChars", (), {"encode": lambda self, s: [1, 2]})())
