"""Multi-host runs on CPU: the LM scripts run as two processes of JAX's multi-controller runtime
(4 CPU devices each, CPU collectives through gloo, `JAXRL_DISTRIBUTED=1`), and reach the result
the same mesh reaches in one process with 8 devices. This is the path a TPU pod takes, with one
process per host."""

import json
import os
import socket
import subprocess
import sys

import numpy as np
import pytest

from tests.script_runs import xla_flags

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
QUIET = ["--config.run.progress=False", "--config.run.tensorboard=False"]
MESH = "--config.mesh_shape=(4,2,1)"  # data 4 x fsdp 2 spans both processes' devices


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def command(script, workdir, args):
    path = os.path.join(REPO, "experiments", script)
    return [sys.executable, path, f"--workdir={workdir}", MESH, *args, *QUIET]


def run_single(script, workdir, *args):
    env = dict(os.environ, XLA_FLAGS=xla_flags(8))
    env.pop("JAXRL_DISTRIBUTED", None)
    result = subprocess.run(
        command(script, workdir, args), env=env, capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stderr[-3000:]


def run_two_processes(script, workdir, *args):
    port = free_port()
    processes = []
    for process_id in range(2):
        env = dict(
            os.environ,
            XLA_FLAGS=xla_flags(4),
            JAXRL_DISTRIBUTED="1",
            JAX_COORDINATOR_ADDRESS=f"localhost:{port}",
            JAXRL_NUM_PROCESSES="2",
            JAXRL_PROCESS_ID=str(process_id),
        )
        processes.append(
            subprocess.Popen(
                command(script, workdir, args),
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    outputs = []
    try:
        for process in processes:
            outputs.append(process.communicate(timeout=600))
    finally:
        for process in processes:
            process.kill()
    for process, (_, stderr) in zip(processes, outputs, strict=True):
        # A fatal error's message comes first, before the dump of loaded modules.
        assert process.returncode == 0, stderr[:2000] + "\n...\n" + stderr[-1500:]
    return [stdout for stdout, _ in outputs]


def read(workdir):
    with open(os.path.join(workdir, "summary.json")) as f:
        summary = json.load(f)
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        rows = [json.loads(line) for line in f]
    return summary, rows


def assert_same_run(multi, single, keys):
    (multi_summary, multi_rows), (single_summary, single_rows) = read(multi), read(single)
    for key in keys:
        assert multi_summary[key] == pytest.approx(single_summary[key], abs=1e-6), key
    assert [r["step"] for r in multi_rows] == [r["step"] for r in single_rows]
    for name in ("loss", "reward_accuracy", "mean_reward"):
        if name in single_rows[0]:
            np.testing.assert_allclose(
                [r[name] for r in multi_rows], [r[name] for r in single_rows], atol=1e-5
            )


def test_dpo_on_two_processes_matches_one_process(tmp_path):
    # The SFT model comes from a one-process run: the two-process DPO restores it onto a mesh that
    # spans both processes. Process 0 builds the preference dataset that the other one reads.
    run_single("sft.py", tmp_path / "sft", "--config.num_steps=10", "--config.task.num_eval=64")
    dpo = [f"--config.init_from={tmp_path / 'sft'}", "--config.num_steps=4"]
    run_single("dpo.py", tmp_path / "one", *dpo, "--config.task.num_eval=64")
    stdouts = run_two_processes("dpo.py", tmp_path / "two", *dpo, "--config.task.num_eval=64")
    # Both processes computed the result; only process 0 wrote the run directory's files.
    assert all("eval_reward_accuracy" in out for out in stdouts)
    assert_same_run(
        tmp_path / "two", tmp_path / "one", ["eval_reward_accuracy", "eval_task_accuracy"]
    )


def test_grpo_on_two_processes_matches_one_process(tmp_path):
    args = [
        "--config.num_steps=4",
        "--config.batch_size=16",
        "--config.group_size=4",
        "--config.run.num_chunks=2",
        "--config.eval_batch_size=64",
    ]
    run_single("grpo.py", tmp_path / "one", *args)
    run_two_processes("grpo.py", tmp_path / "two", *args)
    assert_same_run(tmp_path / "two", tmp_path / "one", ["final_mean_reward", "eval_task_accuracy"])
