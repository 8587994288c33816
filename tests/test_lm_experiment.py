"""SFT, DPO and GRPO as a user runs them: DPO learns on reverse-digits, DPO and GRPO runs killed
right after a checkpoint or at a random moment resume to the same result, and bad settings or data
fail in one line before anything compiles. (GRPO's learning test is in test_grpo.py.)"""

import json
import os
import random
import shutil
import subprocess
import sys
import time

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
QUIET = ["--config.run.progress=False", "--config.run.tensorboard=False"]


def command(script, *args):
    return [sys.executable, os.path.join(REPO, "experiments", script), *args, *QUIET]


def run(script, *args, check=True):
    result = subprocess.run(
        command(script, *args),
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
    steps = [row["step"] for row in rows]
    assert steps == sorted(set(steps)), f"duplicate or unordered steps: {steps}"
    return rows


def read_params(workdir):
    with ocp.StandardCheckpointer() as checkpointer:
        return jax.device_get(checkpointer.restore(os.path.join(workdir, "params")))


def assert_same_params(a, b):
    for x, y in zip(jax.tree.leaves(read_params(a)), jax.tree.leaves(read_params(b)), strict=True):
        np.testing.assert_array_equal(x, y)


def wait_for_first_row(process, workdir):
    """Block until the run has logged its first metrics row (training has started)."""
    path = os.path.join(workdir, "metrics.jsonl")
    deadline = time.time() + 600
    while not (os.path.exists(path) and os.path.getsize(path) > 0):
        assert process.poll() is None, f"exited with {process.returncode} before logging"
        assert time.time() < deadline, "no metrics row after 600s"
        time.sleep(0.02)


def timed_run(script, workdir, *args):
    """Run to completion; seconds from the first metrics row to the end (training, the final
    evaluation and the summary), the window a random kill is drawn from."""
    with open(os.path.join(os.path.dirname(workdir), "stderr.txt"), "w") as stderr:
        process = subprocess.Popen(
            command(script, *args, f"--workdir={workdir}"),
            cwd=REPO,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
        )
        wait_for_first_row(process, workdir)
        start = time.time()
        assert process.wait(timeout=600) == 0, f"{script} failed; see {stderr.name}"
    return time.time() - start


def kill_at_random_moment(script, workdir, window, seed, *args):
    """Start the run, wait for its first metrics row, then SIGKILL it after a delay drawn from
    `window` seconds with a fixed seed: mid-chunk, mid-checkpoint, in the final evaluation...
    A run that ends before its kill (a faster start than the timed one) is started afresh with
    half the delay. Returns the killed run's exit status."""
    delay = random.Random(seed).uniform(0.0, 0.9 * window)
    for _ in range(4):
        shutil.rmtree(workdir, ignore_errors=True)
        process = subprocess.Popen(
            command(script, *args, f"--workdir={workdir}"),
            cwd=REPO,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_for_first_row(process, workdir)
        time.sleep(delay)
        if process.poll() is None:
            process.kill()  # SIGKILL: no handler runs, nothing is flushed or saved
            return process.wait()
        delay /= 2
    raise AssertionError(f"{script} always finished within {delay * 2:.2f}s of its first row")


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


DPO_SMALL = [
    "--config.num_steps=60",
    "--config.run.num_chunks=3",
    "--config.run.log_every=5",
    "--config.mesh_shape=(2,1,1)",  # sharded over 2 of the 8 simulated devices
]
DPO_HEADLINES = ("eval_reward_accuracy", "eval_reward_margin", "eval_loss", "eval_task_accuracy")


@pytest.fixture(scope="module")
def dpo_whole(sft_run, tmp_path_factory):
    """An uninterrupted small DPO run, and its seconds from first metrics row to exit."""
    workdir = str(tmp_path_factory.mktemp("dpo") / "whole")
    seconds = timed_run("dpo.py", workdir, f"--config.init_from={sft_run}", *DPO_SMALL)
    return workdir, seconds


def test_killed_dpo_run_resumes_to_the_same_result(sft_run, dpo_whole, tmp_path):
    flags = [f"--config.init_from={sft_run}", *DPO_SMALL]
    whole, parts = dpo_whole[0], str(tmp_path / "parts")
    killed = run("dpo.py", *flags, f"--workdir={parts}", "--kill_after_chunk=2", check=False)
    assert killed.returncode == -9
    assert not os.path.exists(os.path.join(parts, "summary.json"))
    resumed = run("dpo.py", *flags, f"--workdir={parts}")
    assert "Resuming" in resumed.stdout
    assert read_metrics(parts) == read_metrics(whole)
    a, b = read_json(whole), read_json(parts)
    assert b["resumed_from_step"] == 40
    for key in DPO_HEADLINES:
        assert a[key] == b[key], key


def test_dpo_killed_at_a_random_moment_resumes_to_the_same_result(sft_run, dpo_whole, tmp_path):
    flags = [f"--config.init_from={sft_run}", *DPO_SMALL]
    (whole, window), parts = dpo_whole, str(tmp_path / "parts")
    assert kill_at_random_moment("dpo.py", parts, window, 0, *flags) == -9
    run("dpo.py", *flags, f"--workdir={parts}")
    assert read_metrics(parts) == read_metrics(whole)
    a, b = read_json(whole), read_json(parts)
    for key in DPO_HEADLINES:
        assert a[key] == b[key], key
    assert_same_params(whole, parts)


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
    "--config.run.num_chunks=3",
    "--config.run.log_every=2",
    "--config.rewards.format_weight=0.5",
    "--config.mesh_shape=(2,1,1)",
]
GRPO_HEADLINES = ("final_mean_reward", "eval_task_accuracy", "initial_eval_task_accuracy")


@pytest.fixture(scope="module")
def grpo_whole(tmp_path_factory):
    """An uninterrupted small GRPO run, and its seconds from first metrics row to exit."""
    workdir = str(tmp_path_factory.mktemp("grpo") / "whole")
    return workdir, timed_run("grpo.py", workdir, *GRPO_SMALL)


def test_killed_grpo_run_resumes_to_the_same_result(grpo_whole, tmp_path):
    whole, parts = grpo_whole[0], str(tmp_path / "parts")
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
    for key in GRPO_HEADLINES:
        assert a[key] == b[key], key
    for name in ("config.json", "metrics.jsonl", "learning_curve.png", "params"):
        assert os.path.exists(os.path.join(whole, name)), name


def test_grpo_killed_at_a_random_moment_resumes_to_the_same_result(grpo_whole, tmp_path):
    (whole, window), parts = grpo_whole, str(tmp_path / "parts")
    assert kill_at_random_moment("grpo.py", parts, window, 1, *GRPO_SMALL) == -9
    run("grpo.py", *GRPO_SMALL, f"--workdir={parts}")
    assert read_metrics(parts) == read_metrics(whole)
    a, b = read_json(whole), read_json(parts)
    for key in GRPO_HEADLINES:
        assert a[key] == b[key], key
    assert_same_params(whole, parts)


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
