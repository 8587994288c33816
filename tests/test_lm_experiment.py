"""SFT, DPO and GRPO as a user runs them: DPO learns on reverse-digits, killed DPO and GRPO runs
resume to the same result, and bad settings or data fail in one line before anything compiles.
(GRPO's learning test is in test_grpo.py.)"""

import json
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
QUIET = ["--config.run.progress=False", "--config.run.tensorboard=False"]


def run(script, *args, check=True):
    result = subprocess.run(
        [sys.executable, os.path.join(REPO, "experiments", script), *args, *QUIET],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=REPO,
    )
    if check and result.returncode != 0:
        raise AssertionError(f"{script} failed ({result.returncode}):\n{result.stderr[-3000:]}")
    return result


def read_json(workdir, name="summary.json"):
    with open(os.path.join(workdir, name)) as f:
        return json.load(f)


def read_metrics(workdir):
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        rows = [json.loads(line) for line in f]
    for row in rows:
        row.pop("wall_seconds")
    return rows


@pytest.fixture(scope="module")
def sft_run(tmp_path_factory):
    workdir = str(tmp_path_factory.mktemp("runs") / "sft")
    run("sft.py", f"--workdir={workdir}")
    return workdir


def test_dpo_learns_reverse_digits_from_an_sft_model(sft_run, tmp_path):
    sft_summary = read_json(sft_run)
    assert sft_summary["algo"] == "sft" and 0.0 < sft_summary["eval_task_accuracy"] < 0.9
    workdir = str(tmp_path / "dpo")
    run("dpo.py", f"--config.init_from={sft_run}", f"--workdir={workdir}")
    summary = read_json(workdir)
    assert summary["eval_reward_accuracy"] >= 0.95
    assert summary["sft_eval_task_accuracy"] == sft_summary["eval_task_accuracy"]
    assert summary["eval_task_accuracy"] > summary["sft_eval_task_accuracy"]
    for name in ("config.json", "versions.json", "metrics.jsonl", "learning_curve.png", "params"):
        assert os.path.exists(os.path.join(workdir, name)), name


def test_killed_dpo_run_resumes_to_the_same_result(sft_run, tmp_path):
    flags = [
        f"--config.init_from={sft_run}",
        "--config.num_steps=60",
        "--config.run.steps_per_chunk=20",
        "--config.run.log_every=5",
        "--config.mesh_shape=(2,1,1)",  # sharded over 2 of the 8 simulated devices
    ]
    whole, parts = str(tmp_path / "whole"), str(tmp_path / "parts")
    run("dpo.py", *flags, f"--workdir={whole}")
    killed = run("dpo.py", *flags, f"--workdir={parts}", "--kill_after_chunk=2", check=False)
    assert killed.returncode == -9
    assert not os.path.exists(os.path.join(parts, "summary.json"))
    resumed = run("dpo.py", *flags, f"--workdir={parts}")
    assert "Resuming" in resumed.stdout
    assert read_metrics(parts) == read_metrics(whole)
    a, b = read_json(whole), read_json(parts)
    assert b["resumed_from_step"] == 40
    for key in ("eval_reward_accuracy", "eval_reward_margin", "eval_loss", "eval_task_accuracy"):
        assert a[key] == b[key], key


def test_bad_settings_fail_in_one_line_before_compiling(sft_run, tmp_path):
    cases = [
        ([], "config.init_from: DPO starts from an SFT model"),
        ([f"--config.init_from={sft_run}", "--config.loss_type=hinge"], "config.loss_type"),
        ([f"--config.init_from={sft_run}", "--config.mesh_shape=(3,1,1)"], "batch_size"),
        ([f"--config.init_from={tmp_path}"], "config.init_from"),
    ]
    for flags, message in cases:
        result = run("dpo.py", *flags, f"--workdir={tmp_path / 'bad'}", check=False)
        lines = result.stderr.strip().splitlines()
        assert result.returncode == 2, result.stderr[-2000:]
        assert len(lines) == 1 and message in lines[0], lines


def test_malformed_preference_row_names_file_and_line(sft_run, tmp_path):
    train = tmp_path / "train.jsonl"
    train.write_text(
        '{"prompt": "a", "chosen": "b", "rejected": "c"}\n{"prompt": "a", "chosen": "b"}\n'
    )
    result = run(
        "dpo.py",
        f"--config.init_from={sft_run}",
        f"--config.task.train_jsonl={train}",
        f"--config.task.eval_jsonl={train}",
        f"--workdir={tmp_path / 'bad'}",
        check=False,
    )
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1, result.stderr[-2000:]
    assert f"{train}:2" in lines[0] and "rejected" in lines[0]


GRPO_SMALL = [
    "--config.num_steps=12",
    "--config.batch_size=8",
    "--config.group_size=4",
    "--config.kl_beta=0.05",  # the reference model's pass inside the step
    "--config.run.steps_per_chunk=4",
    "--config.run.log_every=2",
    "--config.rewards.format_weight=0.5",
    "--config.mesh_shape=(2,1,1)",
]


def test_killed_grpo_run_resumes_to_the_same_result(tmp_path):
    whole, parts = str(tmp_path / "whole"), str(tmp_path / "parts")
    run("grpo.py", *GRPO_SMALL, f"--workdir={whole}")
    killed = run("grpo.py", *GRPO_SMALL, f"--workdir={parts}", "--kill_after_chunk=2", check=False)
    assert killed.returncode == -9
    resumed = run("grpo.py", *GRPO_SMALL, f"--workdir={parts}")
    assert "Resuming" in resumed.stdout
    rows = read_metrics(parts)
    assert rows == read_metrics(whole)
    for name in ("reward_task", "reward_format", "kl", "clip_fraction", "entropy"):
        assert name in rows[-1], name
    a, b = read_json(whole), read_json(parts)
    assert b["resumed_from_step"] == 8
    for key in ("final_mean_reward", "eval_task_accuracy", "initial_eval_task_accuracy"):
        assert a[key] == b[key], key
    for name in ("config.json", "metrics.jsonl", "learning_curve.png", "params"):
        assert os.path.exists(os.path.join(whole, name)), name


def test_bad_grpo_settings_fail_in_one_line(tmp_path):
    cases = [
        (["--config.variant=ppo"], "config.variant"),
        (["--config.rewards.host=no_such_module:f"], "config.rewards.host"),
        (["--config.mesh_shape=(3,1,1)"], "batch_size"),
        (["--config.max_new_tokens=100"], "config.max_new_tokens"),
        (["--config.task.name=multiply"], "config.task"),
    ]
    for flags, message in cases:
        result = run("grpo.py", *flags, f"--workdir={tmp_path / 'bad'}", check=False)
        lines = result.stderr.strip().splitlines()
        assert result.returncode == 2, result.stderr[-2000:]
        assert len(lines) == 1 and message in lines[0], lines
