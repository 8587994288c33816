"""The experiment script as a user runs it: run directory, bad flags, kill and resume."""

import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from algos import ppo
from jaxrl import hparams, loop
from jaxrl.checkpoint import Checkpointer
from tests.script_runs import (
    all_floats_finite,
    assert_no_duplicate_steps,
    interrupt_in_every_way,
    kill_at_random_moment,
    tree_digest,
)

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


def restore_final_params(workdir, total_timesteps):
    config = ppo.Config(total_timesteps=total_timesteps, eval_episodes=4)
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


# 400 updates in 3 chunks: long enough that Ctrl-C lands inside the first chunk.
INTERRUPTIBLE = [*SMALL_FLAGS, "--config.total_timesteps=204800", "--config.run.num_chunks=3"]


def test_interrupted_in_every_way_then_rerun_equals_an_uninterrupted_run(tmp_path):
    """Ctrl-C inside the first compiled chunk (the run stops at the next block, not the chunk's
    end, within 10 s, with a checkpoint and one line saying how to resume), SIGKILL right after a
    checkpoint, a damaged newest checkpoint, deleted checkpoints: each followed by the same
    command (tests/script_runs.py), the run ends with the uninterrupted run's rows, parameters
    and returns."""
    whole, interrupted = str(tmp_path / "whole"), str(tmp_path / "interrupted")
    run_script(f"--workdir={whole}", *INTERRUPTIBLE)
    interrupt_in_every_way("ppo.py", whole, f"--workdir={interrupted}", *INTERRUPTIBLE)

    state_a, meta_a = restore_final_params(whole, 204800)
    state_b, meta_b = restore_final_params(interrupted, 204800)
    assert meta_a == meta_b == {"step": 400}
    for a, b in zip(jax.tree.leaves(state_a), jax.tree.leaves(state_b), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))

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


@pytest.fixture(scope="module")
def small_whole(tmp_path_factory):
    """An uninterrupted run with SMALL_FLAGS: what every interrupted one must end as."""
    workdir = str(tmp_path_factory.mktemp("ppo") / "whole")
    run_script(f"--workdir={workdir}", *SMALL_FLAGS)
    return workdir


@pytest.mark.parametrize("seed", [0, 1])
def test_sigkill_at_a_random_moment_then_rerun_equals_an_uninterrupted_run(
    small_whole, tmp_path, seed
):
    """SIGKILL at any moment (mid-chunk, mid-checkpoint, between chunks), not only after a
    checkpoint: the rerun's metrics have each step once and its summary equals an uninterrupted
    run's."""
    whole, killed = small_whole, str(tmp_path / "killed")
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


def test_resuming_with_different_settings_is_refused(small_whole):
    workdir = small_whole  # the refusal writes nothing there
    result = run_script(
        f"--workdir={workdir}", *SMALL_FLAGS, "--config.learning_rate=0.1", check=False
    )
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"error: --workdir={workdir} holds a run with config.learning_rate=0.00025, not 0.1; "
        "resume with the same settings or pass a new --workdir"
    ]


def test_an_inf_learning_rate_is_refused_in_one_line_keeping_the_run_and_its_checkpoint(
    small_whole,
):
    """Given to an existing run, `learning_rate=inf` stops before anything runs: one line, the run
    directory byte-identical, its last checkpoint loadable and finite."""
    before = tree_digest(small_whole)
    result = run_script(
        f"--workdir={small_whole}", *SMALL_FLAGS, "--config.learning_rate=inf", check=False
    )
    assert result.returncode == 2
    [line] = result.stderr.strip().splitlines()
    assert line.startswith("error: config.learning_rate: must be a finite number, got inf"), line
    assert tree_digest(small_whole) == before
    state, meta = restore_final_params(small_whole, 20480)
    assert meta == {"step": 40} and all_floats_finite(state)


def test_a_host_environment_run_evaluates_every_seed(tmp_path):
    """The README's Gymnasium command: the final evaluation of a host environment cannot be
    vmapped over seeds (its episodes are a while loop of callbacks), so it runs seed by seed and
    every seed gets its own return (a vmapped one failed after training, losing the summary)."""
    workdir = str(tmp_path / "host")
    run_script(
        "--config.env_name=gymnasium:CartPole-v1",
        "--config.total_timesteps=5120",
        "--config.eval_episodes=4",
        "--config.run.progress=False",
        "--num_seeds=2",
        f"--workdir={workdir}",
    )
    per_seed = read_json(workdir, "summary.json")["final_eval_return_per_seed"]
    assert len(per_seed) == 2 and min(per_seed) >= 8, per_seed  # CartPole lasts >= 8 steps
