"""The experiment script as a user runs it: run directory, bad flags, kill and resume."""

import json
import os
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

from algos import ppo
from jaxrl import hparams, loop
from jaxrl.checkpoint import Checkpointer
from tests.script_runs import assert_no_duplicate_steps, kill_at_random_moment

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(REPO, "experiments", "ppo.py")
SMALL_FLAGS = [
    "--config.total_timesteps=20480",  # 40 updates of 4 envs x 128 steps
    "--config.eval_episodes=4",
    "--config.run.num_chunks=4",
    "--config.run.log_every=5",
    "--config.run.progress=False",
    "--num_seeds=2",
]


def run_script(*args, check=True):
    result = subprocess.run(
        [sys.executable, SCRIPT, *args], capture_output=True, text=True, timeout=300, cwd=REPO
    )
    if check and result.returncode != 0:
        raise AssertionError(f"script failed ({result.returncode}):\n{result.stderr[-3000:]}")
    return result


def restore_final_params(workdir):
    config = ppo.Config(total_timesteps=20480, eval_episodes=4)
    hps = hparams.repeat(hparams.hparams(config), 2)
    like = jax.vmap(ppo.make(config).init)(loop.run_keys(0, 2)[0], hps)
    checkpointer = Checkpointer(os.path.join(workdir, "checkpoints"))
    state, meta = checkpointer.restore(like)
    checkpointer.close()
    return state, meta


def read_metrics(workdir):
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        rows = [json.loads(line) for line in f]
    for row in rows:
        row.pop("wall_seconds")
    return rows


def read_json(workdir, name):
    with open(os.path.join(workdir, name)) as f:
        return json.load(f)


def test_killed_run_resumes_to_identical_result(tmp_path):
    whole, interrupted = str(tmp_path / "whole"), str(tmp_path / "interrupted")
    run_script(f"--workdir={whole}", *SMALL_FLAGS)

    killed = run_script(
        f"--workdir={interrupted}", *SMALL_FLAGS, "--kill_after_chunk=2", check=False
    )
    assert killed.returncode == -9  # SIGKILL: no clean-up ran
    assert not os.path.exists(os.path.join(interrupted, "summary.json"))
    resumed = run_script(f"--workdir={interrupted}", *SMALL_FLAGS)
    assert "Resuming" in resumed.stdout and "from step 20/40" in resumed.stdout

    state_a, meta_a = restore_final_params(whole)
    state_b, meta_b = restore_final_params(interrupted)
    assert meta_a == meta_b == {"step": 40}
    for a, b in zip(jax.tree.leaves(state_a), jax.tree.leaves(state_b), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert read_metrics(whole) == read_metrics(interrupted)

    summary_a, summary_b = read_json(whole, "summary.json"), read_json(interrupted, "summary.json")
    assert summary_a["final_eval_return_per_seed"] == summary_b["final_eval_return_per_seed"]
    for key in ("algo", "env", "num_seeds", "wall_seconds", "compile_seconds", "env_steps",
                "env_steps_per_second", "final_eval_return"):  # fmt: skip
        assert key in summary_a, key
    assert summary_a["algo"] == "ppo" and summary_a["env"] == "CartPole-v1"
    assert os.path.exists(os.path.join(whole, "learning_curve.png"))
    assert os.listdir(os.path.join(whole, "tb"))
    versions = read_json(whole, "versions.json")
    assert versions["packages"]["jax"] == jax.__version__


@pytest.mark.parametrize("seed", [0, 1])
def test_sigkill_at_a_random_moment_then_rerun_equals_an_uninterrupted_run(tmp_path, seed):
    """SIGKILL at any moment (mid-chunk, mid-checkpoint, between chunks), not only after a
    checkpoint: the rerun's metrics have each step once and its summary equals an uninterrupted
    run's."""
    whole, killed = str(tmp_path / "whole"), str(tmp_path / "killed")
    run_script(f"--workdir={whole}", *SMALL_FLAGS)
    kill_at_random_moment("ppo.py", f"--workdir={killed}", *SMALL_FLAGS, seed=seed, max_delay=1.5)
    run_script(f"--workdir={killed}", *SMALL_FLAGS)
    assert_no_duplicate_steps(killed)
    assert read_metrics(whole) == read_metrics(killed)
    a, b = read_json(whole, "summary.json"), read_json(killed, "summary.json")
    assert a["final_eval_return_per_seed"] == b["final_eval_return_per_seed"]


@pytest.mark.parametrize(
    "flag, expected",
    [
        ("--config.num_minibatches=3", "error: config.num_minibatches: num_envs * "
                                       "rollout_length (512) must be divisible by "
                                       "num_minibatches (3)"),
        ("--config.num_envs=-2", "error: config.num_envs: must be positive, got -2"),
        ("--config.env_name=CartPol-v1", "error: config.env_name: Unknown environment 'CartPol"),
        ("--num_seeds=0", "error: --num_seeds must be >= 1, got 0"),
        ("--config.run.num_chunks=0", "error: config.run.num_chunks must be >= 1, got 0"),
    ],
)  # fmt: skip
def test_bad_settings_fail_with_one_clear_line(tmp_path, flag, expected):
    workdir = tmp_path / "run"
    result = run_script(f"--workdir={workdir}", flag, check=False)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(expected), lines[0]
    assert not workdir.exists()  # failed before writing anything, let alone compiling


def test_resuming_with_different_settings_is_refused(tmp_path):
    workdir = str(tmp_path / "run")
    run_script(f"--workdir={workdir}", *SMALL_FLAGS)
    result = run_script(
        f"--workdir={workdir}", *SMALL_FLAGS, "--config.learning_rate=0.1", check=False
    )
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"error: --workdir={workdir} holds a run with config.learning_rate=0.00025, not 0.1; "
        "resume with the same settings or pass a new --workdir"
    ]


def test_ctrl_c_stops_within_seconds_with_a_checkpoint_and_resumes_exactly(tmp_path):
    """SIGINT in the middle of one long compiled chunk: the run stops at the next block (not the
    chunk's end), saves a checkpoint, says how to resume in one line, and the resumed run ends
    equal to an uninterrupted one."""
    flags = [*SMALL_FLAGS, "--config.total_timesteps=204800", "--config.run.num_chunks=1"]
    whole, stopped = str(tmp_path / "whole"), str(tmp_path / "stopped")
    run_script(f"--workdir={whole}", *flags)

    metrics = os.path.join(stopped, "metrics.jsonl")
    process = subprocess.Popen(
        [sys.executable, SCRIPT, f"--workdir={stopped}", *flags],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )
    while not (os.path.exists(metrics) and os.path.getsize(metrics) > 0):
        assert process.poll() is None, process.stderr.read()
        time.sleep(0.05)
    signalled = time.time()
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=60)
    assert time.time() - signalled < 10
    assert process.returncode == 130, stderr
    last = stderr.strip().splitlines()[-1]
    assert last.startswith("Stopped at step ") and "run the same command again" in last, stderr
    step = int(last.split("Stopped at step ")[1].split("/")[0])
    assert 0 < step < 400  # within the one chunk
    checkpointer = Checkpointer(os.path.join(stopped, "checkpoints"))
    assert checkpointer.latest_step() == step
    checkpointer.close()

    resumed = run_script(f"--workdir={stopped}", *flags)
    assert f"from step {step}/400" in resumed.stdout
    assert_no_duplicate_steps(stopped)
    assert read_metrics(whole) == read_metrics(stopped)
    a, b = read_json(whole, "summary.json"), read_json(stopped, "summary.json")
    assert a["final_eval_return_per_seed"] == b["final_eval_return_per_seed"]
