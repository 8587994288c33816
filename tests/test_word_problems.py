"""Arithmetic word problems: the answer is the arithmetic of the numbers the text states, the
difficulty sets the operations, a seed fixes the set, and the files read back as prompt data."""

import json
import re

import pytest

from envs.text import word_problems
from envs.text.math_answers import math_answer_reward
from envs.text.word_problems import (
    DEFAULT_INSTRUCTION,
    evaluate,
    generate_problems,
    make_word_problems,
    worked_answer,
    write_jsonl,
)
from jaxrl.config import ConfigError
from jaxrl.data.prompts import read_prompt_jsonl


@pytest.mark.parametrize("difficulty", [1, 2, 3])
def test_answers_are_the_arithmetic_of_the_stated_numbers(difficulty):
    problems = generate_problems(300, difficulty, seed=difficulty)
    for problem in problems:
        # The text states exactly the problem's numbers, in the order they are used.
        stated = tuple(int(n) for n in re.findall(r"\d+", problem.text))
        assert stated == problem.numbers, problem.text
        answer = evaluate(stated, problem.operations)  # raises on an inexact division
        assert answer == problem.answer and answer >= 0, problem.text
        assert problem.text.endswith("?")


def test_difficulty_sets_the_operations():
    for difficulty, count in ((1, 1), (2, 2), (3, 3)):
        for problem in generate_problems(200, difficulty, seed=0):
            assert len(problem.operations) == count
            kinds = set(problem.operations)
            if difficulty < 3:
                assert kinds <= {"+", "-"}
            else:
                assert {"*", "/"} <= kinds and len(kinds & {"+", "-"}) == 1


def test_seeded_sets_are_repeatable_distinct_and_varied():
    first = make_word_problems(500, 2, seed=7)
    assert first == make_word_problems(500, 2, seed=7)
    assert first != make_word_problems(500, 2, seed=8)
    prompts = [row["prompt"] for row in first]
    assert len(set(prompts)) == len(prompts)
    # Varied wording: many different opening words and objects, not one template.
    assert len({p.split(".")[0].split()[1] for p in prompts}) >= 4
    assert len({re.search(r"\d+ (\w+)", p).group(1) for p in prompts}) >= 10
    assert all(row["prompt"].endswith("\n" + DEFAULT_INSTRUCTION) for row in first)
    assert all(row["difficulty"] == 2 and row["answer"].isdigit() for row in first)
    bare = make_word_problems(3, 1, seed=0, instruction="")
    assert all("\n" not in row["prompt"] for row in bare)


@pytest.mark.parametrize("difficulty", [1, 2, 3])
def test_worked_answers_do_each_operation_and_end_on_the_answer(difficulty):
    for problem in generate_problems(100, difficulty, seed=3):
        steps = worked_answer(problem).split(", ")
        assert len(steps) == len(problem.operations)
        value = problem.numbers[0]
        for step, operation, number in zip(
            steps, problem.operations, problem.numbers[1:], strict=True
        ):
            value = evaluate((value, number), (operation,))
            left, result = step.split(" = ")
            assert left.split(f" {operation} ")[1] == str(number) and int(result) == value
        assert steps[-1].endswith(f"= {problem.answer}")


@pytest.mark.parametrize("chat", [False, True])
def test_few_shot_prompts_show_worked_examples_from_outside_the_set(chat):
    rows = make_word_problems(200, 1, seed=4, shots=2, chat=chat)
    texts = [p.text for p in generate_problems(200, 1, seed=4)]
    first = rows[0]["prompt"]
    if chat:
        assert [m["role"] for m in first] == ["user", "assistant", "user", "assistant", "user"]
        examples = [m["content"] for m in first[:-1:2]]
        answers = [m["content"] for m in first[1::2]]
        assert all(row["prompt"][-1]["content"] == t for row, t in zip(rows, texts, strict=True))
    else:
        assert first.endswith(f"Question: {texts[0]}\nAnswer:") and first.count("Question:") == 3
        examples = re.findall(r"Question: (.*)\n", first)[:2]
        answers = re.findall(r"Answer: (.*)\n", first)
    assert not set(examples) & set(texts)  # no example is one of the problems
    # one addition and one subtraction: two examples of one kind would teach "always add"
    assert {a.split()[1] for a in answers} == {"+", "-"}
    assert all(row["prompt"][: len(first) // 2] == first[: len(first) // 2] for row in rows)
    with pytest.raises(ConfigError, match="instruction"):
        make_word_problems(3, 1, seed=0, instruction="Answer:", shots=2)


def test_bad_arguments_name_the_setting():
    with pytest.raises(ConfigError, match="difficulty"):
        generate_problems(5, 4, seed=0)
    with pytest.raises(ConfigError, match="count"):
        generate_problems(-1, 1, seed=0)
    assert generate_problems(0, 1, seed=0) == []


def test_correct_completions_earn_the_math_reward():
    rows = make_word_problems(50, 3, seed=0)
    right = [f"Let me think.\nAnswer: {row['answer']}" for row in rows]
    wrong = [f"Answer: {int(row['answer']) + 1}" for row in rows]
    answers = [row["answer"] for row in rows]
    prompts = [row["prompt"] for row in rows]
    assert math_answer_reward(prompts, right, answer=answers) == [1.0] * 50
    assert math_answer_reward(prompts, wrong, answer=answers) == [0.0] * 50


@pytest.mark.parametrize("chat", [False, True])
def test_jsonl_round_trip(tmp_path, chat):
    rows = make_word_problems(20, 1, seed=3)
    path = tmp_path / "sub" / "train.jsonl"
    write_jsonl(rows, path, chat=chat)
    assert sorted(p.name for p in path.parent.iterdir()) == ["train.jsonl"]  # no temporary left
    read = read_prompt_jsonl(path)  # the GRPO prompt-file reader accepts it
    assert [r.conversational for r in read] == [chat] * 20
    for row, back in zip(rows, read, strict=True):
        expected = [{"role": "user", "content": row["prompt"]}] if chat else row["prompt"]
        assert back.prompt == expected
        assert back.columns["answer"] == row["answer"]
        assert back.columns["difficulty"] == row["difficulty"]


def test_command_line_writes_the_file(tmp_path, capsys):
    out = tmp_path / "problems.jsonl"
    word_problems.main([f"--out={out}", "--num=12", "--difficulty=3", "--seed=5", "--chat"])
    lines = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert len(lines) == 12 and lines[0]["prompt"][0]["role"] == "user"
    assert [row["answer"] for row in lines] == [
        row["answer"] for row in make_word_problems(12, 3, seed=5)
    ]
    assert "wrote 12 problems" in capsys.readouterr().err


@pytest.mark.parametrize(
    "args, line",
    [
        (["--num=5"], "error: --out: missing; pass the JSONL file to write"),
        (["--out=x.jsonl", "--num=0"], "error: --num: must be a whole number >= 1, got '0'"),
        (["--out=x.jsonl", "--num=ten"], "error: --num: must be a whole number >= 1, got 'ten'"),
        (["--out=x.jsonl", "--difficulty=4"], "error: --difficulty: must be a whole number betw"),
        (["--out=x.jsonl", "--seed=-1"], "error: --seed: must be a whole number >= 0"),
        (["--out=x.jsonl", "--difficulty"], "error: --difficulty: needs a value"),
        (["--out=x.jsonl", "--chat=yes"], "error: --chat: takes no value"),
        (["--out=x.jsonl", "--bogus=1"], "error: --bogus: unknown flag; the flags are --out,"),
        (["--out=x.jsonl", "extra"], "error: unexpected argument 'extra'; settings are flags"),
        (["--out=x.jsonl", "--dif=2"], "error: --dif: unknown flag"),  # no abbreviations
        (["--out=x.jsonl", "--shots=2", "--instruction=Go"], "error: --instruction: worked ex"),
        (["--out=x.jsonl", "--shots=-1"], "error: --shots: must be a whole number >= 0"),
    ],
)
def test_command_line_bad_flags(tmp_path, monkeypatch, capsys, args, line):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit_:
        word_problems.main(args)
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_.value.code == 2 and len(err) == 1 and err[0].startswith(line), err
    assert not list(tmp_path.iterdir())  # nothing written


def test_command_line_refuses_a_directory(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        word_problems.main([f"--out={tmp_path}"])
    assert exit_.value.code == 2
    assert capsys.readouterr().err == f"error: --out={tmp_path}: is a directory; pass a file path\n"
