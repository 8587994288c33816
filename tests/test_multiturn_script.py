"""experiments/multiturn.py on a host game of the user's (`--config.task.game=module:Class`): a
game that fails in the middle of a run stops it with one line, keeps the last checkpoint, and
the same command run again resumes from it and finishes."""

import os

import orbax.checkpoint as ocp

from tests.script_runs import all_floats_finite, checkpoint_steps, read_json, run_script

SMALL = [
    "--config.task.max_turns=3",
    "--config.task.num_eval=8",
    "--config.batch_size=2",
    "--config.group_size=4",
    "--config.num_steps=8",
    "--config.run.num_chunks=2",
    "--config.max_new_tokens=3",
    "--config.eval_samples=0",  # the fixture counts games: no pass@k episodes in the count
]


def test_a_host_game_failing_mid_run_is_one_line_and_the_rerun_finishes(tmp_path, monkeypatch):
    workdir = str(tmp_path / "breaks")
    monkeypatch.setenv("BREAKS_ONCE_MARKER", str(tmp_path / "broke"))
    game = "tests.fixtures.host_games:BreaksInUpdateFive"
    args = [f"--config.task.game={game}", *SMALL, f"--workdir={workdir}"]
    result = run_script("multiturn.py", *args, check=False)
    assert result.returncode == 2, result.stderr[-3000:]
    lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    log = os.path.join(workdir, "error.log")
    assert lines == [
        f"error: host environment {game}: raised ConnectionError: the game server went away; "
        "fix the function and run the same command again to resume (in updates 5-8; the "
        f"checkpoint of step 4 is kept); traceback in {log}"
    ]
    assert "Traceback" not in result.stderr
    assert checkpoint_steps(workdir) == [4]
    with ocp.StandardCheckpointer() as checkpointer:
        state = checkpointer.restore(os.path.join(workdir, "checkpoints", "4", "state"))
    assert all_floats_finite(state)

    # The server is back: the same command resumes at update 5 and finishes.
    run_script("multiturn.py", *args)
    summary = read_json(workdir, "summary.json")
    assert summary["resumed_from_step"] == 4 and summary["steps"] == 8
    assert 0.0 <= summary["eval_success"] <= 1.0
