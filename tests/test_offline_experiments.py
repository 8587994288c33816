"""experiments/sac.py and experiments/cql.py as a user runs them: kill and resume, bad input."""

import json
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURE = os.path.join(REPO, "tests", "fixtures", "pendulum_medium.npz")
SAC_FLAGS = [
    "--config=experiments/configs/sac.py:pendulum_small",
    "--config.total_timesteps=1600",  # 1000 random + 600 learning iterations
    "--config.hidden_sizes=(32, 32)",
    "--config.eval_episodes=2",
    "--config.run.num_chunks=3",
    "--config.run.log_every=100",
    "--config.run.progress=False",
    "--num_seeds=2",
]


def run(script, *args, check=True):
    result = subprocess.run(
        [sys.executable, os.path.join(REPO, "experiments", script), *args],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=REPO,
    )
    if check and result.returncode != 0:
        raise AssertionError(f"{script} failed ({result.returncode}):\n{result.stderr[-3000:]}")
    return result


def read(workdir, name):
    with open(os.path.join(workdir, name)) as f:
        if name.endswith(".jsonl"):
            rows = [json.loads(line) for line in f]
            for row in rows:
                row.pop("wall_seconds")
            return rows
        return json.load(f)


def test_sac_killed_run_resumes_to_identical_result(tmp_path):
    """The replay buffer, environments and keys are in the checkpoint, so a run killed after a
    chunk and restarted reaches the same policy, evaluation and metrics as one never stopped."""
    whole, interrupted = str(tmp_path / "whole"), str(tmp_path / "interrupted")
    run("sac.py", f"--workdir={whole}", *SAC_FLAGS)
    killed = run(
        "sac.py", f"--workdir={interrupted}", *SAC_FLAGS, "--kill_after_chunk=1", check=False
    )
    assert killed.returncode == -9
    resumed = run("sac.py", f"--workdir={interrupted}", *SAC_FLAGS)
    assert "Resuming" in resumed.stdout and "from iteration 200/600" in resumed.stdout
    a, b = read(whole, "summary.json"), read(interrupted, "summary.json")
    assert a["final_eval_return_per_seed"] == b["final_eval_return_per_seed"]
    assert read(whole, "metrics.jsonl") == read(interrupted, "metrics.jsonl")
    for key in ("algo", "env", "num_seeds", "wall_seconds", "compile_seconds", "env_steps",
                "env_steps_per_second", "final_eval_return"):  # fmt: skip
        assert key in a, key
    assert a["algo"] == "sac" and a["env"] == "Pendulum-v1" and a["env_steps"] == 1600


def test_collect_then_cql_script_reports_scores(tmp_path):
    """collect.py's random Pendulum data -> cql.py: the summary carries the normalized score, the
    behaviour score and behaviour cloning's, computed from the dataset's reference returns."""
    data_dir = str(tmp_path / "data")
    run(
        "collect.py",
        "--env=Pendulum-v1",
        "--policy=random",
        "--num_steps=2000",
        f"--data_dir={data_dir}",
        "--ref_min_return=-1200",
        "--ref_max_return=-150",
    )
    dataset = os.path.join(data_dir, "pendulum_v1", "random", "1.0.0")
    workdir = str(tmp_path / "cql")
    run(
        "cql.py",
        f"--workdir={workdir}",
        f"--config.dataset.path={dataset}",
        "--config.num_updates=200",
        "--config.hidden_sizes=(32, 32)",
        "--config.eval_episodes=2",
        "--config.bc.num_updates=100",
        "--config.run.num_chunks=2",
        "--config.run.progress=False",
        "--num_seeds=2",
    )
    summary = read(workdir, "summary.json")
    assert summary["algo"] == "cql" and summary["dataset_transitions"] == 2000
    expected = 100 * (summary["final_eval_return"] + 1200) / 1050
    assert summary["normalized_score"] == pytest.approx(expected)
    for key in ("behaviour_return", "behaviour_normalized_score", "bc_eval_return"):
        assert summary[key] is not None, key
    evals = [row for row in read(workdir, "metrics.jsonl") if "eval_return" in row]
    assert [row["update"] for row in evals] == [100, 200]


@pytest.mark.parametrize(
    "flags, expected",
    [
        ([], "error: config.dataset.path is required"),
        (["--config.dataset.path=/nonexistent/pendulum"], "error: config.dataset.path: "),
        (["--config.cql_alpha=-1", "--config.dataset.path=x"], "error: config.cql_alpha: "),
    ],
)
def test_cql_bad_input_fails_with_one_clear_line(tmp_path, flags, expected):
    workdir = tmp_path / "run"
    result = run("cql.py", f"--workdir={workdir}", *flags, check=False)
    assert result.returncode == 2, result.stderr[-2000:]
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(expected), result.stderr
    if "nonexistent" in " ".join(flags):
        assert "/nonexistent/pendulum" in lines[0]
    assert not workdir.exists()


def test_cql_refuses_a_dataset_from_another_environment(tmp_path):
    from jaxrl.data import build_episode_dataset

    path = build_episode_dataset(FIXTURE, str(tmp_path), "pendulum_medium", env_name="Pendulum-v1")
    result = run(
        "cql.py",
        f"--workdir={tmp_path / 'run'}",
        f"--config.dataset.path={path}",
        "--config.env_name=MountainCarContinuous-v0",
        check=False,
    )
    assert result.returncode == 2
    assert "set --config.env_name=Pendulum-v1" in result.stderr
