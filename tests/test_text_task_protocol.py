"""A text task that is not a digit task (tests/fixtures/vowel_task.py: how many vowels a word
has) trains through the text-task protocol (`envs.text.protocol`): named by its file from
`experiments/grpo.py`, and registered in one line from `jaxrl.trainers.grpo.train`, the two runs
ending alike. Its reward inside the program is exactly its score on the host, its held-out
problems are never trained on, and a bad option is one error line."""

import json
import os
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from envs.text import TASKS, build_task, is_held_out, protocol, task_options
from jaxrl.cli import load_named
from jaxrl.config import ConfigError, InputError
from jaxrl.lm import ByteTokenizer
from tests.fixtures.vowel_task import PREFIX, VowelCount
from tests.script_runs import read_json, start_script

TOKENIZER = ByteTokenizer()
TASK_FILE = "tests/fixtures/vowel_task.py:VowelCount"
QUIET = {"run.progress": False, "run.tensorboard": False, "run.log_every": 1}
# A few updates of the tiny model: the run goes through every part a task touches (its options,
# the in-program sampler and reward, the held-out evaluation by its score, the summary).
SMALL = {
    "task.options": "letters=4",
    "num_steps": 2,
    "batch_size": 4,
    "group_size": 4,
    "max_new_tokens": 2,  # the count and EOS
    "kl_beta": 0.0,
    "task.num_eval": 5,  # every held-out problem is in summary.json's eval_examples
    "eval_samples": 0,
    "eval_batch_size": 8,
    "run.num_chunks": 1,
    **QUIET,
}
TIMINGS = ("seconds", "per_second")


def problem_of(prompt: str) -> str:
    return prompt.removeprefix(PREFIX).removesuffix("=")


def completions(texts: list[str], width: int) -> types.SimpleNamespace:
    """Completions as the sampler gives them: each text's tokens then EOS, padded."""
    tokens = np.full((len(texts), width), TOKENIZER.pad_id, np.int32)
    mask = np.zeros((len(texts), width), bool)
    for i, text in enumerate(texts):
        ids = [*TOKENIZER.encode(text), TOKENIZER.eos_id][:width]
        tokens[i, : len(ids)], mask[i, : len(ids)] = ids, True
    return types.SimpleNamespace(tokens=jnp.asarray(tokens), mask=jnp.asarray(mask))


def test_the_reward_in_the_program_is_the_task_score_on_the_host():
    task = VowelCount(letters=4)
    text = task.text_task(TOKENIZER)
    prompts = jax.device_get(text.sample_prompts(jax.random.key(0), 32, None))
    problems = [problem_of(TOKENIZER.decode(row)) for row in prompts.tokens]
    assert all(len(p) == 4 and p.isalpha() for p in problems)
    answers = [task.answer(p) for p in problems]
    # Right counts, wrong ones, one digit too many, nothing, and not a number at all.
    texts = answers + [str((int(a) + 1) % 10) for a in answers] + [a + "7" for a in answers]
    texts += ["", "x", "1x", "12"] * 8
    rows = np.arange(len(texts)) % len(problems)
    batch = jax.tree.map(lambda x: x[rows], prompts)
    [term] = text.reward_terms
    reward = np.asarray(term.fn(batch, completions(texts, 4)))
    expected = [task.score(problems[r], t) for r, t in zip(rows, texts, strict=True)]
    np.testing.assert_allclose(reward, expected, rtol=1e-6)
    assert reward[: len(answers)].tolist() == [1.0] * len(answers)
    assert 0 < reward[len(answers) :].max() < 1  # partial credit, exactly as the host gives it


def test_held_out_words_are_never_drawn_for_training_and_encode_as_their_prompts():
    task = VowelCount(letters=4)
    prompts = jax.device_get(task.text_task(TOKENIZER).sample_prompts(jax.random.key(1), 500, 0))
    codes = np.array(
        [[ord(c) - ord("a") for c in problem_of(TOKENIZER.decode(r))] for r in prompts.tokens]
    )
    assert not is_held_out(codes, np).any()
    held_out = task.sample_problems(np.random.default_rng(0), 50, split="eval")
    assert is_held_out(np.array([[ord(c) - ord("a") for c in w] for w in held_out]), np).all()
    batch = jax.device_get(task.encode_prompts(held_out, TOKENIZER))
    assert [TOKENIZER.decode(row) for row in batch.tokens] == [task.prompt(w) for w in held_out]
    assert [TOKENIZER.decode(a) for a in batch.answer_tokens] == [task.answer(w) for w in held_out]


def test_options_come_from_the_config_and_a_bad_one_is_one_line():
    task = build_task(TASK_FILE, "letters=3", {"num_digits": 6}, load_named)
    # (the class loaded from its file, so not this module's VowelCount)
    assert type(task).__name__ == "VowelCount" and task_options(task) == {"letters": 3}
    default = build_task(TASK_FILE, "", {"num_digits": 6}, load_named)
    assert task_options(default) == {"letters": 5}  # num_digits is not its option
    for options, message in [
        ("leters=3", "options: the vowel_count task has no option 'leters' (its options: letters)"),
        ("letters=x", "options.letters: got 'x' (str) for the vowel_count task; give a whole"),
        ("letters=12", "options.letters: got 12 for vowel_count; choose between 1 and 9"),
        ("letters", "options: 'letters' is not name=value"),
    ]:
        with pytest.raises(ConfigError) as error:
            build_task(TASK_FILE, options, {}, load_named)
        assert str(error.value).startswith(message), error.value
    with pytest.raises(ConfigError, match="^name: cannot load 'tests/fixtures/nope.py:X'"):
        build_task("tests/fixtures/nope.py:X", "", {}, load_named)
    # What the supervised trainers take from it: SFT rows from its answers; no preference pairs.
    assert protocol.sft_rows(VowelCount(), ["banana"]) == [
        {"prompt": "vowels banana=", "completion": "3"}
    ]
    with pytest.raises(ConfigError, match="^name: the vowel_count task gives no preference pairs"):
        protocol.preference_rows(VowelCount(), ["banana"], np.random.default_rng(0))


def test_a_bad_option_from_python_raises_the_line_the_script_prints(tmp_path):
    from jaxrl.trainers import grpo

    config = grpo.config()
    config.task.name, config.task.options = TASK_FILE, "leters=4"
    with pytest.raises(InputError, match=r"^config\.task\.options: the vowel_count task has no"):
        grpo.train(config, tmp_path / "run")
    assert not os.path.exists(tmp_path / "run")


def comparable(summary: dict) -> dict:
    return {k: v for k, v in summary.items() if not any(t in k for t in TIMINGS)}


def test_a_task_of_ones_own_trains_from_the_script_and_from_python(tmp_path, monkeypatch):
    """By its file from the script; registered in one line and named from `train(...)`. Both
    runs end with the same summary; the held-out score is the task's score of the completions."""
    from jaxrl.trainers import grpo

    script_dir = str(tmp_path / "script")
    flags = [f"--config.{name}={value}" for name, value in SMALL.items()]
    # The script runs beside the run from Python (two cores: about half the wall time).
    with open(tmp_path / "script.err", "w") as stderr:
        script = start_script(
            "grpo.py", f"--config.task.name={TASK_FILE}", *flags, f"--workdir={script_dir}",
            stderr=stderr,
        )  # fmt: skip

    monkeypatch.setitem(TASKS, "vowel_count", VowelCount)  # the registry line
    config = grpo.config()
    config.task.name = "vowel_count"
    for name, value in SMALL.items():
        *sections, field = name.split(".")
        section = config
        for part in sections:
            section = section[part]
        section[field] = value
    result = grpo.train(config, tmp_path / "python")
    assert script.wait(timeout=600) == 0, (tmp_path / "script.err").read_text()[-3000:]

    summary = read_json(script_dir, "summary.json")
    assert comparable(result.summary) == comparable(summary)
    assert summary["task"] == "vowel_count" and summary["task_options"] == {"letters": 4}
    assert summary["final_mean_reward_metric"] == "reward_task"
    with open(os.path.join(script_dir, "metrics.jsonl")) as f:
        rows = [json.loads(line) for line in f if '"loss"' in line]
    assert len(rows) == SMALL["num_steps"] and all(np.isfinite(r["reward_task"]) for r in rows)
    # Every held-out problem is an example: the evaluation scored them with the task's score.
    examples = summary["eval_examples"]
    assert len(examples) == summary["num_eval"] == SMALL["task.num_eval"]
    task = VowelCount(letters=4)
    scores = [task.score(problem_of(e["prompt"]), e["completion"]) for e in examples]
    assert summary["eval_task_score"] == pytest.approx(np.mean(scores))
    assert summary["eval_task_accuracy"] == pytest.approx(np.mean([s == 1.0 for s in scores]))
