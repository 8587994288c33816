"""Running experiment scripts as a user does, for the script tests: one subprocess helper, the
run-directory readers, and SIGKILL at a random moment of training."""

import hashlib
import json
import os
import shutil
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


def xla_flags(devices: int | None = None) -> str:
    """The test run's XLA_FLAGS (conftest's compile settings) with `devices` simulated CPU
    devices in place of conftest's eight, or none (a process that sees the machine's own)."""
    flags = [f for f in os.environ.get("XLA_FLAGS", "").split() if "device_count" not in f]
    if devices is not None:
        flags.append(f"--xla_force_host_platform_device_count={devices}")
    return " ".join(flags)


def tree_digest(path: str) -> str:
    """One hash of every file's name and bytes under `path` (is a directory untouched?)."""
    digest = hashlib.sha256()
    for root, _, files in sorted(os.walk(path)):
        for name in sorted(files):
            with open(os.path.join(root, name), "rb") as f:
                digest.update(name.encode() + f.read())
    return digest.hexdigest()


def all_floats_finite(tree) -> bool:
    """Whether every floating-point leaf of a (restored) pytree is finite."""
    import jax

    leaves = [np.asarray(x) for x in jax.tree.leaves(tree)]
    return bool(leaves) and all(np.isfinite(x).all() for x in leaves if x.dtype.kind == "f")


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


def start_script(script: str, *args: str, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE):
    """`python experiments/<script> args...` started in the background (a `subprocess.Popen`)."""
    return subprocess.Popen(
        [sys.executable, os.path.join(REPO, "experiments", script), *args],
        stdout=stdout,
        stderr=stderr,
        text=True,
        cwd=REPO,
    )


def wait_for_first_row(process: subprocess.Popen, workdir: str, timeout: float = 600) -> None:
    """Block until the run has logged its first metrics row (training has started)."""
    path = os.path.join(workdir, "metrics.jsonl")
    deadline = time.time() + timeout
    while not (os.path.exists(path) and os.path.getsize(path) > 0):
        if process.poll() is not None:
            error = process.stderr.read()[-3000:] if process.stderr else ""
            raise AssertionError(f"exited with {process.returncode} before logging:\n{error}")
        if time.time() > deadline:
            process.kill()
            raise AssertionError(f"no metrics row after {timeout:.0f} s")
        time.sleep(0.02)


def workdir_of(args: tuple[str, ...] | list[str]) -> str:
    return next(a.split("=", 1)[1] for a in args if a.startswith("--workdir="))


def kill_at_random_moment(script: str, *args: str, seed: int, max_delay: float = 1.0) -> float:
    """Start the script, wait until it has logged its first metrics row (training has started),
    then SIGKILL it after a random delay in [0, max_delay) s drawn from `seed`: mid-chunk,
    mid-checkpoint, in the final evaluation... A run that ends before its kill (a faster start
    than expected) is started afresh with half the delay. Returns the delay used."""
    workdir = workdir_of(args)
    delay = float(np.random.default_rng(seed).uniform(0, max_delay))
    for _ in range(4):
        shutil.rmtree(workdir, ignore_errors=True)
        process = start_script(script, *args)
        wait_for_first_row(process, workdir)
        time.sleep(delay)
        if process.poll() is None:
            process.kill()  # SIGKILL: no handler runs, nothing is flushed or saved
            process.wait()
            process.stderr.close()
            return delay
        process.stderr.close()
        delay /= 2
    raise AssertionError(f"{script} always finished within {2 * delay:.2f} s of its first row")


def damage_checkpoint(checkpoint_dir: str, step: int) -> None:
    """Delete a checkpoint's array data and manifest, as the issue's reproduction does."""
    state = os.path.join(checkpoint_dir, str(step), "state")
    for name in os.listdir(state):
        if name == "d" or name.startswith("manifest"):
            path = os.path.join(state, name)
            shutil.rmtree(path) if os.path.isdir(path) else os.remove(path)


def checkpoint_steps(workdir: str) -> list[int]:
    directory = os.path.join(workdir, "checkpoints")
    return sorted(int(name) for name in os.listdir(directory) if name.isdigit())


def interrupt_in_every_way(script: str, whole: str, *args: str) -> None:
    """Take one run directory through the interruptions a user causes, each followed by the same
    command, checking after each that the rows logged so far are the uninterrupted run's (in
    `whole`), each once. The caller then compares the summaries. `args` must give `--workdir`
    and at least 3 chunks, each checkpointed, and keep at least 2 (the control scripts keep 3 by
    default, the language-model scripts 1: pass --config.run.keep_checkpoints=2 to those).

    1. Ctrl-C once training has logged its first row, before any scheduled checkpoint: the
       process exits (130) within 10 s, saying in its last line how to resume.
    2. The same command, SIGKILLed right after the second chunk's checkpoint: it resumed from
       the Ctrl-C checkpoint.
    3. The newest checkpoint damaged: the same command warns in one line, resumes from the newest
       intact checkpoint, and is killed after the second chunk again.
    4. `checkpoints/` deleted: the same command starts over (rows logged before are dropped)
       and runs to the end."""
    workdir = workdir_of(args)
    expected = read_rows(whole)

    def assert_rows_so_far_are_the_uninterrupted_runs():
        rows = read_rows(workdir)
        assert rows == expected[: len(rows)], (rows, expected)
        assert_no_duplicate_steps(workdir)

    process = start_script(script, *args)
    wait_for_first_row(process, workdir)
    signalled = time.time()
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=120)
    assert time.time() - signalled < 10, f"Ctrl-C took {time.time() - signalled:.1f} s"
    assert process.returncode == 130, stderr[-3000:]
    last = stderr.strip().splitlines()[-1]
    assert last.startswith("Stopped at step ") and "run the same command again" in last, last
    stopped_at = int(last.split("Stopped at step ")[1].split("/")[0])
    assert checkpoint_steps(workdir)[-1] == stopped_at
    assert_rows_so_far_are_the_uninterrupted_runs()

    killed = run_script(script, *args, "--kill_after_chunk=2", check=False)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    assert f"from step {stopped_at}/" in killed.stdout, killed.stdout
    assert_rows_so_far_are_the_uninterrupted_runs()

    steps = checkpoint_steps(workdir)
    assert len(steps) >= 2, steps
    damage_checkpoint(os.path.join(workdir, "checkpoints"), steps[-1])
    killed = run_script(script, *args, "--kill_after_chunk=2", check=False)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    lines = killed.stderr.splitlines()
    warnings = [line for line in lines if line.startswith("warning: checkpoint")]
    assert [w.split(" is damaged")[0] for w in warnings] == [f"warning: checkpoint {steps[-1]}"]
    assert f"from step {steps[-2]}/" in killed.stdout, killed.stdout
    assert_rows_so_far_are_the_uninterrupted_runs()

    shutil.rmtree(os.path.join(workdir, "checkpoints"))
    finished = run_script(script, *args)
    assert "Resuming" not in finished.stdout
    assert read_rows(workdir) == expected


def assert_no_duplicate_steps(workdir: str) -> None:
    """Every kind of row (training, evaluation: told apart by their columns) once per step, in
    order of step."""
    rows = read_rows(workdir)
    steps = [row["step"] for row in rows]
    kinds = [(row["step"], tuple(sorted(row))) for row in rows]
    assert steps == sorted(steps) and len(set(kinds)) == len(kinds), kinds
