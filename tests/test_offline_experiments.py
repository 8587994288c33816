"""experiments/sac.py, experiments/collect.py and experiments/cql.py as a user runs them: kill
(after a chunk, or at any moment) and resume, the summaries, bad input."""

import os

import pytest

from tests.script_runs import (
    all_floats_finite,
    assert_no_duplicate_steps,
    interrupt_in_every_way,
    kill_at_random_moment,
    read_json,
    read_rows,
    run_script,
    tree_digest,
)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURE = os.path.join(REPO, "tests", "fixtures", "pendulum_medium.npz")
SAC_FLAGS = [
    "--config=experiments/configs/sac.py:pendulum_small",
    "--config.total_timesteps=1600",  # 1000 random + 600 updates
    "--config.hidden_sizes=(32, 32)",
    "--config.eval_episodes=2",
    "--config.run.num_chunks=3",
    "--config.run.log_every=100",
    "--config.run.progress=False",
    "--num_seeds=2",
]
CQL_FLAGS = [
    "--config.num_steps=300",
    "--config.hidden_sizes=(32, 32)",
    "--config.eval_episodes=2",
    "--config.bc.num_steps=100",
    "--config.run.num_chunks=3",
    "--config.run.log_every=50",  # two rows a chunk: Ctrl-C after the first lands in a chunk
    "--config.run.progress=False",
    "--num_seeds=2",
]
CQL_HEADLINES = (
    "final_eval_return",
    "final_eval_return_per_seed",
    "normalized_score",
    "behaviour_return",
    "behaviour_normalized_score",
    "bc_eval_return",
    "bc_eval_return_per_seed",
    "bc_normalized_score",
    "dataset_transitions",
)


@pytest.fixture(scope="module")
def sac_whole(tmp_path_factory):
    """An uninterrupted SAC run: what every interrupted one must end as."""
    workdir = str(tmp_path_factory.mktemp("sac") / "whole")
    run_script("sac.py", f"--workdir={workdir}", *SAC_FLAGS)
    return workdir


def assert_same_run(whole, resumed, headlines):
    """The resumed run logged every row once, exactly as the uninterrupted one, and reports the
    same headline values."""
    assert read_rows(resumed) == read_rows(whole)
    a, b = read_json(whole, "summary.json"), read_json(resumed, "summary.json")
    assert {k: a[k] for k in headlines} == {k: b[k] for k in headlines}


def test_sac_interrupted_in_every_way_ends_as_an_uninterrupted_run(sac_whole, tmp_path):
    """The replay buffer, environments and keys are in the checkpoint, so a run stopped by Ctrl-C,
    killed after a chunk, resumed past a damaged checkpoint or restarted without its checkpoints
    (tests/script_runs.py) reaches the same policy, evaluation and metrics as one never stopped."""
    interrupted = str(tmp_path / "interrupted")
    interrupt_in_every_way("sac.py", sac_whole, f"--workdir={interrupted}", *SAC_FLAGS)
    assert_same_run(sac_whole, interrupted, ("final_eval_return", "final_eval_return_per_seed"))
    a = read_json(sac_whole, "summary.json")
    for key in ("algo", "env", "num_seeds", "wall_seconds", "compile_seconds", "env_steps",
                "env_steps_per_second", "final_eval_return", "steps", "steps_per_second",
                "resumed_from_step", "gradient_steps", "median_eval_return"):  # fmt: skip
        assert key in a, key
    assert a["algo"] == "sac" and a["env"] == "Pendulum-v1" and a["env_steps"] == 1600
    assert (a["steps"], a["gradient_steps"], a["resumed_from_step"]) == (600, 600, 0)
    rows = read_rows(sac_whole)
    assert [r["step"] for r in rows] == [100, 200, 300, 400, 500, 600]
    assert [r["env_steps"] for r in rows] == [100, 200, 300, 400, 500, 600]  # one env


@pytest.mark.parametrize("seed", [0])
def test_sac_killed_at_any_moment_resumes_to_identical_result(sac_whole, tmp_path, seed):
    """SIGKILL at a random moment after training started (within a chunk, while checkpointing,
    evaluating or writing the summary), then the same command again: no metric row twice and
    the uninterrupted run's results."""
    killed = str(tmp_path / "killed")
    kill_at_random_moment("sac.py", f"--workdir={killed}", *SAC_FLAGS, seed=seed)
    run_script("sac.py", f"--workdir={killed}", *SAC_FLAGS)
    assert_no_duplicate_steps(killed)
    assert_same_run(sac_whole, killed, ("final_eval_return", "final_eval_return_per_seed"))


def test_a_nan_target_entropy_is_refused_in_one_line_keeping_the_run_and_its_checkpoint(
    sac_whole,
):
    """Given to an existing run, `target_entropy=nan` stops before anything runs: one line, the
    run directory byte-identical, its newest checkpoint loadable and finite."""
    import orbax.checkpoint as ocp

    before = tree_digest(sac_whole)
    flags = [*SAC_FLAGS, "--config.target_entropy=nan"]
    result = run_script("sac.py", f"--workdir={sac_whole}", *flags, check=False)
    assert result.returncode == 2
    [line] = result.stderr.strip().splitlines()
    assert line.startswith("error: config.target_entropy: must be a finite number, got nan"), line
    assert tree_digest(sac_whole) == before
    with ocp.StandardCheckpointer() as checkpointer:
        state = checkpointer.restore(os.path.join(sac_whole, "checkpoints", "600", "state"))
    assert all_floats_finite(state)


@pytest.fixture(scope="module")
def random_dataset(tmp_path_factory):
    """collect.py's random Pendulum data, with reference returns in its metadata."""
    data_dir = str(tmp_path_factory.mktemp("data"))
    run_script(
        "collect.py",
        "--env=Pendulum-v1",
        "--policy=random",
        "--num_steps=2000",
        f"--data_dir={data_dir}",
        "--ref_min_return=-1200",
        "--ref_max_return=-150",
    )
    return os.path.join(data_dir, "pendulum_v1", "random", "1.0.0")


@pytest.fixture(scope="module")
def cql_whole(tmp_path_factory, random_dataset):
    """An uninterrupted CQL run (with its behaviour-cloning baseline) on the random data."""
    workdir = str(tmp_path_factory.mktemp("cql") / "whole")
    run_script("cql.py", f"--workdir={workdir}", f"--config.dataset.path={random_dataset}",
               *CQL_FLAGS)  # fmt: skip
    return workdir


def test_collect_then_cql_script_reports_scores(cql_whole):
    """collect.py's random Pendulum data -> cql.py: the summary carries the normalized score, the
    behaviour score and behaviour cloning's, computed from the dataset's reference returns, and
    metrics.jsonl an evaluation row after each chunk."""
    summary = read_json(cql_whole, "summary.json")
    assert summary["algo"] == "cql" and summary["dataset_transitions"] == 2000
    assert (summary["steps"], summary["resumed_from_step"]) == (300, 0)
    expected = 100 * (summary["final_eval_return"] + 1200) / 1050
    assert summary["normalized_score"] == pytest.approx(expected)
    for key in ("behaviour_return", "behaviour_normalized_score", "bc_eval_return"):
        assert summary[key] is not None, key
    rows = read_rows(cql_whole)
    evals = [row for row in rows if "eval_return" in row]
    assert [row["step"] for row in evals] == [100, 200, 300]
    assert all(len(row["eval_return_per_run"]) == 2 for row in evals)
    # The final evaluation scores the last chunk's episodes again.
    assert evals[-1]["eval_return"] == pytest.approx(summary["final_eval_return"])
    assert [row["step"] for row in rows if "critic_loss" in row] == [50, 100, 150, 200, 250, 300]


@pytest.mark.parametrize("seed", [1])
def test_cql_killed_at_any_moment_resumes_to_identical_result(
    cql_whole, random_dataset, tmp_path, seed
):
    """CQL (its per-chunk evaluation rows and the behaviour-cloning baseline included) killed
    at a random moment after training started, then rerun: every training and evaluation row
    once, and the uninterrupted run's scores."""
    killed = str(tmp_path / "killed")
    flags = [f"--workdir={killed}", f"--config.dataset.path={random_dataset}", *CQL_FLAGS]
    kill_at_random_moment("cql.py", *flags, seed=seed)
    run_script("cql.py", *flags)
    rows = read_rows(killed)
    for kind in ("critic_loss", "eval_return"):  # a training row and an evaluation row per step
        steps = [row["step"] for row in rows if kind in row]
        assert steps == sorted(set(steps)), (kind, steps)
    assert_same_run(cql_whole, killed, CQL_HEADLINES)


def test_cql_interrupted_in_every_way_ends_as_an_uninterrupted_run(
    cql_whole, random_dataset, tmp_path
):
    """Ctrl-C, SIGKILL after a checkpoint, a damaged newest checkpoint and deleted checkpoints,
    each followed by the same command (tests/script_runs.py): the training and evaluation rows
    and every headline (behaviour cloning's included) are the uninterrupted run's."""
    interrupted = str(tmp_path / "interrupted")
    flags = [f"--workdir={interrupted}", f"--config.dataset.path={random_dataset}", *CQL_FLAGS]
    interrupt_in_every_way("cql.py", cql_whole, *flags)
    assert_same_run(cql_whole, interrupted, CQL_HEADLINES)


@pytest.mark.parametrize(
    "flags, expected",
    [
        ([], "error: config.dataset.path is required"),
        (["--config.dataset.path=/nonexistent/pendulum"], "error: config.dataset.path: "),
        (["--config.cql_alpha=-1", "--config.dataset.path=x"], "error: config.cql_alpha: "),
        (["--config.bc.num_steps=0", "--config.dataset.path=x"], "error: config.bc.num_steps: "),
    ],
)
def test_cql_bad_input_fails_with_one_clear_line(tmp_path, flags, expected):
    workdir = tmp_path / "run"
    result = run_script("cql.py", f"--workdir={workdir}", *flags, check=False)
    assert result.returncode == 2, result.stderr[-2000:]
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(expected), result.stderr
    if "nonexistent" in " ".join(flags):
        assert "/nonexistent/pendulum" in lines[0]
    assert not workdir.exists()


def test_cql_refuses_a_dataset_from_another_environment(tmp_path):
    from jaxrl.data import build_episode_dataset

    path = build_episode_dataset(FIXTURE, str(tmp_path), "pendulum_medium", env_name="Pendulum-v1")
    result = run_script(
        "cql.py",
        f"--workdir={tmp_path / 'run'}",
        f"--config.dataset.path={path}",
        "--config.env_name=MountainCarContinuous-v0",
        check=False,
    )
    assert result.returncode == 2
    assert "set --config.env_name=Pendulum-v1" in result.stderr
