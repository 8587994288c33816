"""Running experiment scripts as a user does, for the script tests: one subprocess helper, the
run-directory readers, and SIGKILL at a random moment of training."""

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_script(script: str, *args: str, check: bool = True, timeout: int = 600):
    """`python experiments/<script> args...` from the repository root; output captured."""
    result = subprocess.run(
        [sys.executable, os.path.join(REPO, "experiments", script), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
    )
    if check and result.returncode != 0:
        raise AssertionError(f"{script} failed ({result.returncode}):\n{result.stderr[-3000:]}")
    return result


def read_json(workdir: str, name: str):
    with open(os.path.join(workdir, name)) as f:
        return json.load(f)


def read_rows(workdir: str) -> list[dict]:
    """metrics.jsonl without its wall-clock column (the only one that differs between runs)."""
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        rows = [json.loads(line) for line in f]
    for row in rows:
        row.pop("wall_seconds")
    return rows


def kill_at_random_moment(script: str, *args: str, seed: int, max_delay: float = 1.0) -> float:
    """Start the script, wait until it has logged its first metrics row (training has started),
    then SIGKILL it after a random delay in [0, max_delay) s drawn from `seed` (reproducible up to
    the machine's speed). Returns the delay; fails if the run finished before the kill."""
    workdir = next(a.split("=", 1)[1] for a in args if a.startswith("--workdir="))
    metrics = os.path.join(workdir, "metrics.jsonl")
    process = subprocess.Popen(
        [sys.executable, os.path.join(REPO, "experiments", script), *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        cwd=REPO,
    )
    deadline = time.time() + 600
    while not (os.path.exists(metrics) and os.path.getsize(metrics) > 0):
        if process.poll() is not None:
            raise AssertionError(
                f"{script} ended before training:\n{process.stderr.read()[-3000:]}"
            )
        if time.time() > deadline:
            process.kill()
            raise AssertionError(f"{script} logged nothing in 600 s")
        time.sleep(0.05)
    delay = float(np.random.default_rng(seed).uniform(0, max_delay))
    time.sleep(delay)
    process.send_signal(signal.SIGKILL)
    process.wait()
    process.stderr.close()
    assert process.returncode == -signal.SIGKILL, (
        f"{script} finished before the kill after {delay:.2f} s; lower max_delay"
    )
    return delay


def assert_no_duplicate_steps(workdir: str) -> None:
    steps = [row["step"] for row in read_rows(workdir)]
    assert steps == sorted(set(steps)), steps
