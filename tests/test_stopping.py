"""Ctrl-C in every training script at its default `run.log_every`: the first SIGINT stops the
run after the update it is in (not at the end of the metrics row's block of updates, nor of the
compiled chunk) within 10 s, with a checkpoint and one line saying how to resume; the same
command again ends with the uninterrupted run's metric rows and results.

Each run is one compiled chunk (`run.num_chunks=1`), so before stopping was looked at after every
update, Ctrl-C ran to the end of the run; the rows are the defaults' (10 updates each where the
config keeps the runner's default), so a stop inside a row exercises the saved partial row.
"""

import json
import os
import shutil
import signal
import time

import pytest

from tests.script_runs import (
    read_rows,
    run_script,
    start_script,
    wait_for_first_row,
)

QUIET = ["--config.run.progress=False", "--config.run.tensorboard=False"]
ONE_CHUNK = ["--config.run.num_chunks=1", *QUIET]
LM = ["--config.batch_size=8", "--config.task.num_eval=16", *ONE_CHUNK]
CASES = {
    "ppo.py": ["--config.total_timesteps=204800", "--num_seeds=2", *ONE_CHUNK],
    "sac.py": [
        "--config=experiments/configs/sac.py:pendulum_small",
        "--config.total_timesteps=7000",
        "--config.hidden_sizes=(32, 32)",
        "--config.eval_episodes=2",
        "--num_seeds=2",
        *ONE_CHUNK,
    ],
    "cql.py": [
        "--config.num_steps=3000",
        "--config.hidden_sizes=(32, 32)",
        "--config.eval_episodes=2",
        "--config.bc.num_steps=100",
        "--num_seeds=2",
        *ONE_CHUNK,
    ],
    "sft.py": ["--config.num_steps=60", *LM],
    "dpo.py": ["--config.num_steps=60", *LM],
    "grpo.py": ["--config.num_steps=40", "--config.group_size=4", *LM],
    "ppo_lm.py": ["--config.num_steps=12", *LM],
    "online_dpo.py": ["--config.num_steps=12", "--config.num_minibatches=1", *LM],
    "multiturn.py": [
        "--config.num_steps=12",
        "--config.batch_size=2",
        "--config.group_size=4",
        "--config.task.max_turns=3",
        "--config.task.num_eval=8",
        "--config.max_new_tokens=3",
        *ONE_CHUNK,
    ],
}
# CI runs every script but cql.py (NOT_IN_CI; sac.py's run is the same offline loop).
TIMING_KEYS = ("second", "resumed_from_step")  # the summary keys a resumed run may differ in


@pytest.fixture(scope="module")
def pendulum_data(tmp_path_factory):
    """collect.py's random Pendulum data, with reference returns, for CQL."""
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
def sft_run(tmp_path_factory):
    """A small SFT run for DPO to start from."""
    workdir = str(tmp_path_factory.mktemp("sft") / "sft")
    run_script("sft.py", "--config.num_steps=20", *LM, f"--workdir={workdir}")
    return workdir


def results_of(workdir: str) -> dict:
    """summary.json without its timings, the run directory's own path written as WORKDIR."""
    with open(os.path.join(workdir, "summary.json")) as f:
        summary = json.loads(f.read().replace(workdir, "WORKDIR"))
    return {k: v for k, v in summary.items() if not any(t in k for t in TIMING_KEYS)}


@pytest.mark.parametrize("script", list(CASES))
def test_ctrl_c_stops_after_the_running_update_and_the_rerun_ends_equal(script, tmp_path, request):
    args = list(CASES[script])
    if script == "cql.py":
        args.append(f"--config.dataset.path={request.getfixturevalue('pendulum_data')}")
    if script == "dpo.py":
        args.append(f"--config.init_from={request.getfixturevalue('sft_run')}")
    whole, parts = str(tmp_path / "whole"), str(tmp_path / "parts")

    # The uninterrupted run, and how long it trained from its first metrics row to its last.
    run_script(script, *args, f"--workdir={whole}")
    with open(os.path.join(whole, "metrics.jsonl")) as f:
        walls = [json.loads(line)["wall_seconds"] for line in f]
    training = walls[-1] - walls[0]

    # Ctrl-C about 5 s after the first row (earlier for a run that ends sooner): a retry with
    # half the delay if the run ended before the signal.
    delay = min(5.0, training / 3)
    for _ in range(4):
        shutil.rmtree(parts, ignore_errors=True)
        process = start_script(script, *args, f"--workdir={parts}")
        wait_for_first_row(process, parts)
        time.sleep(delay)
        if process.poll() is None:
            break
        process.stderr.close()
        delay /= 2
    signalled = time.time()
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=600)
    seconds = time.time() - signalled
    assert process.returncode == 130, stderr[-3000:]
    assert seconds < 10, f"Ctrl-C took {seconds:.1f} s"
    last = stderr.strip().splitlines()[-1]
    assert last.startswith("Stopped at step ") and "run the same command again" in last, last
    stopped_at = int(last.split("Stopped at step ")[1].split("/")[0])

    resumed = run_script(script, *args, f"--workdir={parts}")
    assert f"from step {stopped_at}/" in resumed.stdout, resumed.stdout
    assert read_rows(parts) == read_rows(whole)
    assert results_of(parts) == results_of(whole)


# --- Ctrl-C before training: importing, reading data, building the model, compiling. Python's
# own handler used to lose the signal there (raised inside jaxlib's gc callback) or crash the
# interpreter's teardown under a compile still running (SIGSEGV, exit 139); see jaxrl.interrupts.

START_MOMENTS = (0.5, 1.5, 3.0, 5.0, 8.0)  # seconds after start: imports, set-up, compile
# Runs long enough that no moment above finds them over (a whole sft.py run of CASES' 60 steps
# took 4.2 s with the compilation cache warm, and CI's Ctrl-C at 5 s came in its teardown), in
# chunks short enough that a moment that finds training running stops at its next safe point.
LONGER = {
    "sft.py": ["--config.num_steps=4000", "--config.run.num_chunks=40"],
    "ppo.py": ["--config.total_timesteps=1024000", "--config.run.num_chunks=25"],
}


# sft.py, where the crash was reported (its compile is the longest of the fast cases); ppo.py.
@pytest.mark.parametrize("script", ["sft.py", "ppo.py"])
def test_ctrl_c_before_training_ends_at_once_with_one_line_and_the_rerun_starts(script, tmp_path):
    args = [*CASES[script], *LONGER[script]]
    for moment in START_MOMENTS:
        workdir = str(tmp_path / f"at-{moment}")
        process = start_script(script, *args, f"--workdir={workdir}")
        time.sleep(moment)
        if process.poll() is not None:  # it reached the end before the signal: nothing to test
            continue
        signalled = time.time()
        process.send_signal(signal.SIGINT)
        _, stderr = process.communicate(timeout=120)
        seconds = time.time() - signalled
        lines = [line for line in stderr.splitlines() if line.strip()]
        assert process.returncode == 130, (moment, stderr[-3000:])
        assert "Fatal Python error" not in stderr and "Traceback" not in stderr, stderr[-3000:]
        assert seconds < 5, f"Ctrl-C at {moment} s took {seconds:.1f} s to end the run"
        assert lines[-1].startswith(("Interrupted", "Stopped")), (moment, lines[-1])
        assert "run the same command again" in lines[-1], lines[-1]
    # The last directory, left wherever the signal found it, is not in the way of the same
    # command: it starts (or resumes) and finishes.
    finished = run_script(script, *args, f"--workdir={workdir}")
    assert os.path.exists(os.path.join(workdir, "summary.json")), finished.stderr[-3000:]


def test_ctrl_c_from_python_before_training_raises_stopped_at_the_next_boundary(tmp_path):
    """From Python the process is the user's (a notebook's kernel): a signal while the trainer
    sets up or compiles is kept, never lost, and raised as `Stopped` (a KeyboardInterrupt) when
    the running step returns; the same call then trains."""
    import threading

    from jaxrl.interrupts import Stopped
    from jaxrl.trainers import ppo

    config = ppo.config("cartpole")
    config.total_timesteps = 8 * config.num_envs * config.rollout_length
    config.anneal_lr = False
    config.run.progress = False
    config.run.tensorboard = False
    workdir = str(tmp_path / "run")
    handler = signal.getsignal(signal.SIGINT)  # Python's default; ignored in an xdist worker
    timer = threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT))
    timer.start()
    with pytest.raises(KeyboardInterrupt) as stopped:
        ppo.train(config, workdir, num_seeds=1)
    timer.join()
    assert isinstance(stopped.value, Stopped) and "run the same command again" in str(stopped.value)
    # Nothing of the request carries into the next call, and the handler before it is back.
    assert signal.getsignal(signal.SIGINT) is handler
    result = ppo.train(config, workdir, num_seeds=1)
    assert "final_eval_return" in result.summary


def test_a_second_ctrl_c_in_a_notebook_kernel_raises_at_once_without_ending_it(monkeypatch):
    """In a kernel, ending the process would lose the user's session: a second request raises
    `StoppedAtOnce` in the main thread where it is, and the kernel (this process) lives on."""
    import threading
    import time

    from jaxrl import interrupts

    monkeypatch.setattr(interrupts, "_in_a_kernel", lambda: True)
    timers = [threading.Timer(t, os.kill, (os.getpid(), signal.SIGINT)) for t in (0.2, 0.5)]
    started = time.monotonic()
    with pytest.raises(interrupts.StoppedAtOnce) as stopped, interrupts.watching():
        for timer in timers:
            timer.start()
        while time.monotonic() - started < 30:  # a long evaluation that has no boundary
            sum(range(1000))
    assert time.monotonic() - started < 5 and isinstance(stopped.value, KeyboardInterrupt)
    assert "the same call resumes" in str(stopped.value)
    assert not interrupts.WATCH.requested  # nothing carries into the next call


def run_as_a_script(tmp_path, body: str):
    """`body` run as a script runs it: in a Python process of its own whose signals are the
    watcher's (`interrupts.for_a_script`), with os, signal and time imported."""
    import subprocess
    import sys

    program = tmp_path / "program.py"
    program.write_text(
        "import os, signal, time\nfrom jaxrl import interrupts\ninterrupts.for_a_script()\n" + body
    )
    return subprocess.run([sys.executable, str(program)], capture_output=True, text=True,
                          timeout=120)  # fmt: skip


def test_the_stop_line_is_said_while_a_checkpoint_read_silences_stderr(tmp_path):
    """A script reading a checkpoint silences file descriptor 2 (orbax's threads print after a
    failed read); a Ctrl-C then still ends it with its one stop line (exit 130)."""
    result = run_as_a_script(
        tmp_path,
        "from jaxrl.lm.checkpoints import quiet_orbax\n"
        "with quiet_orbax():\n"
        "    os.kill(os.getpid(), signal.SIGINT)\n"
        "    time.sleep(30)\n",
    )
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 130 and lines == [
        "Interrupted before any checkpoint; run the same command again to start."
    ], result.stderr


def test_a_signal_after_the_run_is_over_ends_it_with_its_own_status_or_says_it_had_finished(
    tmp_path,
):
    """After a script's run is over (`interrupts.finished`), a Ctrl-C in the interpreter's
    teardown is ignored: the process ends with the run's status, not by the signal with no line
    (CI's sft.py at 5 s, when the whole run took 4). Before that, once its summary is written,
    the stop line says the run had finished, not to resume it."""
    from jaxrl.logging import RunDirectory
    from jaxrl.runner import interrupted_line

    body = "interrupts.finished()\nos.kill(os.getpid(), signal.SIGINT)\ntime.sleep(0.5)\n"
    result = run_as_a_script(tmp_path, body)
    assert (result.returncode, result.stderr) == (0, "")
    run_dir = RunDirectory(str(tmp_path / "run"))
    run_dir.write_summary({"steps": 1})
    assert interrupted_line(run_dir) == (
        f"Interrupted after the run finished; its results are in {run_dir.path}."
    )
