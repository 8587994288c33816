"""Offline CQL gradient-step throughput on the CPU: our `algos.cql` against d3rlpy's CQL.

Both sides train on the same synthetic Pendulum-v1 dataset: `pendulum_arrays` of
`d3rlpy_cql_worker.py` (uniformly random torques, 500 episodes of 200 steps that end in a time
limit, 100,000 rows; a timed-out episode gives 199 transitions, so 99,500 transitions in all),
observations (cos, sin, theta_dot), actions the torques / 2 in [-1, 1], no terminals. We build
the `cql.Dataset` from those arrays in NumPy, so the data are identical row for row.

Hyper-parameters, the same on both sides: batch 256, 2 critics, actor and critics MLPs of
`--hidden` ReLU units (256x256, d3rlpy's default, and 64x64 as a second cell), 10 sampled actions
per proposal (uniform, pi(.|s), pi(.|s')), gamma 0.99, tau 0.005, Adam learning rates actor 1e-4,
critics 3e-4, temperature 1e-4 (initial temperature 1, target entropy -1), conservative weight 5.

The conservative weight is Lagrangian on both sides. d3rlpy's default (`alpha_learning_rate`
1e-4 > 0) adds alpha' * 5 * (gap_i - 10) for each critic i and takes an Adam step on log alpha'
(initially 0) every gradient step; we set `lagrangian=True, cql_alpha=5, target_action_gap=10,
cql_alpha_lr=1e-4`, which adds w * (gap_i - 10) (w starting at 5 = 5 * alpha') and takes an Adam
step on log w every gradient step. That is the same work; the other choice, d3rlpy without the
multiplier (`alpha_learning_rate=0`), would need a flag the d3rlpy worker does not have.

Rows, per `--hidden` cell (each in a fresh worker process, one at a time, `--runs` times; the
table shows medians over runs):

* ours, 1 seed:   `jax.jit(cql.make_train_chunk(config, n, callback=..., callback_every=k,
                  evaluate=False), donate_argnums=0)` as experiments/cql.py builds it (with a
                  no-op host callback receiving the block's metrics every k = `--callback_every`
                  steps, where a user logs), on a batch of 1 run. compile s is
                  `.lower(...).compile()` (the persistent cache off); grad steps/s is n / the best
                  of `--repeats` calls (each continuing from the previous call's states, followed
                  by `jax.block_until_ready`). n is the cell's `--steps`, rounded down to a
                  multiple of k.
* ours, N seeds:  the same with `--seeds` N runs vmapped in one program, n = steps / N per run
                  (so the row does about the same work as the 1-seed row); steps/s counts all
                  seeds.
* d3rlpy, 1 thread / default threads: `d3rlpy_cql_worker.py --modes loop` run with
  `--d3rlpy_python`, `--threads 1` and with torch's default thread count (the number of cores).
  Its `loop` mode is fit's inner loop (sample a batch with d3rlpy's sampler, `algo.update`)
  without logger, progress bar and saving; after building the model it runs one step and 20
  warm-up steps untimed, then times `--steps` steps once. With more than one torch thread it
  times at most `--multithread_steps` (50) steps after `--multithread_warmup` (5): on this shared
  machine, with other jobs running, torch's 2 threads managed about 1 step/s at 64x64 as at
  256x256. Its "compile / setup s" column shows its setup (building networks and optimizers);
  the first step's time is in the JSON (`first_step_s`).

Ratios: grad steps/s of an ours row over a d3rlpy row of the same cell. Peak RSS is `ru_maxrss`
of the worker. Every row also records the 1-minute load average at its start and its CPU seconds
per wall second: this 2-core machine is shared, and torch's two threads stall each other on an
oversubscribed machine far more than XLA's single-threaded small-matrix code does.

What differs between the two implementations (the work per gradient step is otherwise the same:
a critic step with the target backup and the 3 x 10 sampled-action penalty for both critics, an
actor step, a temperature step, a multiplier step, a Polyak update):

* batches: d3rlpy samples in Python (a loop over 256 transitions, then stacking, ~2-4 ms a
  batch), then copies the batch into torch; ours draws 256 indices on the device inside the
  compiled loop. This is part of what each library costs its user, and is counted on both sides.
* backup: d3rlpy's default CQL backup is deterministic (min of the target critics, no entropy
  term); ours subtracts alpha * log pi(a'|s') (SAC's soft backup): one more element-wise op.
* the log-sum-exp: ours subtracts log(30) (an estimate of log-integral-exp Q rather than of 30
  times it), d3rlpy does not: a constant offset in the gap, so the same target of 10 means a
  different constraint; the multiplier's gradient differs by a factor alpha' (d3rlpy
  differentiates alpha' * loss w.r.t. log alpha', we use the gap itself). Neither changes the
  work.
* clipping: d3rlpy clamps alpha' to [0, 1e6], ours log w to [-10, 10]; log-std ranges and
  parameter initialisation differ (ours orthogonal); d3rlpy's twin critics are two modules run
  one after the other, ours one batched network (`nn.vmap`).
* execution: ours is one XLA program for all n steps; d3rlpy runs eager PyTorch op by op
  (d3rlpy's `compile_graph` is CUDA-only).

From the repository root (the d3rlpy venv as in d3rlpy_cql_worker.py's docstring):

    python experiments/benchmarks/cql_throughput.py --d3rlpy_python /tmp/d3rlpy/bin/python \\
        --json_out cql_throughput.json
    python experiments/benchmarks/cql_throughput.py --hidden 64x64 --steps 500 --seeds 0 \\
        --d3rlpy_threads 1 --d3rlpy_python /tmp/d3rlpy/bin/python       # a quick check
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import sys
import time
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
# Run directly, the script's own folder is on sys.path, not the repository root.
sys.path.insert(0, str(REPO_ROOT))

from experiments.benchmarks._shared import (  # noqa: E402
    TRL_MARKER,
    comma_list,
    fmt,
    log,
    median_of,
    run_process,
)

D3RLPY_WORKER = Path(__file__).resolve().parent / "d3rlpy_cql_worker.py"
D3RLPY_MARKER = TRL_MARKER  # d3rlpy_cql_worker.py ends with "RESULT_JSON {...}" too

ENV_NAME = "Pendulum-v1"
ROWS = 100_000
EPISODE_LEN = 200
DATA_SEED = 0
BATCH_SIZE = 256
NUM_CRITICS = 2
NUM_ACTION_SAMPLES = 10
GAMMA = 0.99
TAU = 0.005
ACTOR_LR = 1e-4
CRITIC_LR = 3e-4
TEMPERATURE_LR = 1e-4
CONSERVATIVE_WEIGHT = 5.0
ACTION_GAP_THRESHOLD = 10.0
MULTIPLIER_LR = 1e-4

DEFAULT_HIDDEN = "256x256,64x64"
# CQL at 256x256 runs about 7-10 grad steps/s on a 2-core CPU on both sides: 200 steps keep the
# cell within a couple of minutes.
DEFAULT_STEPS = "200,2000"
DEFAULT_SEEDS = 4
DEFAULT_CALLBACK_EVERY = 50
DEFAULT_REPEATS = 2
DEFAULT_RUNS = 1
DEFAULT_D3RLPY_THREADS = "1,0"  # 0: torch's default
DEFAULT_D3RLPY_WARMUP = 20  # the d3rlpy worker's default
# torch with 2 threads on this shared 2-core machine, with other jobs running, managed about 1
# grad step/s at 64x64 as at 256x256 (its threads stall each other at every op): its rows time
# at most this many steps after this many warm-up steps, to keep a run within minutes.
DEFAULT_MULTITHREAD_STEPS = 50
DEFAULT_MULTITHREAD_WARMUP = 5
DEFAULT_TIMEOUT_S = 600

RESULT_MARKER = "CQL_THROUGHPUT_RESULT "


# --------------------------------------------------------------------------------------------
# Worker side (ours)


def pendulum_dataset() -> Any:
    """The d3rlpy worker's synthetic dataset as our `cql.Dataset`: transitions t -> t + 1 inside
    each episode (199 per episode of 200 rows), actions in [-1, 1]."""
    import jax.numpy as jnp
    import numpy as np

    from algos import cql
    from experiments.benchmarks.d3rlpy_cql_worker import pendulum_arrays

    arrays = pendulum_arrays(ROWS, EPISODE_LEN, DATA_SEED)
    episodes = ROWS // EPISODE_LEN

    def per_episode(name: str) -> np.ndarray:
        values = arrays[name]
        return values.reshape(episodes, EPISODE_LEN, *values.shape[1:])

    obs = per_episode("observations")
    actions = per_episode("torques")[:, :-1] / 2.0
    rewards = per_episode("rewards")[:, :-1]

    def flat(values: np.ndarray) -> jnp.ndarray:
        return jnp.asarray(values.reshape(-1, *values.shape[2:]), jnp.float32)

    return cql.Dataset(
        obs=flat(obs[:, :-1]),
        action=flat(actions),
        reward=flat(rewards),
        next_obs=flat(obs[:, 1:]),
        terminal=jnp.zeros(episodes * (EPISODE_LEN - 1), jnp.bool_),
    )


def updates_per_run(steps: int, seeds: int, callback_every: int) -> int:
    """Gradient steps per run: steps / seeds rounded down to whole callback blocks (at least
    one block)."""
    per_run = steps // seeds
    return max(callback_every, per_run // callback_every * callback_every)


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def run_ours(
    hidden: tuple[int, ...], steps: int, seeds: int, callback_every: int, repeats: int
) -> dict[str, Any]:
    load_start = os.getloadavg()[0]
    import jax

    from algos import cql

    jax.config.update("jax_enable_compilation_cache", False)
    config = cql.Config(
        env_name=ENV_NAME,
        batch_size=BATCH_SIZE,
        gamma=GAMMA,
        tau=TAU,
        actor_lr=ACTOR_LR,
        critic_lr=CRITIC_LR,
        alpha_lr=TEMPERATURE_LR,
        init_alpha=1.0,
        autotune_alpha=True,
        num_critics=NUM_CRITICS,
        hidden_sizes=hidden,
        activation="relu",
        cql_alpha=CONSERVATIVE_WEIGHT,
        num_action_samples=NUM_ACTION_SAMPLES,
        cql_temperature=1.0,
        lagrangian=True,
        target_action_gap=ACTION_GAP_THRESHOLD,
        cql_alpha_lr=MULTIPLIER_LR,
    )
    start = time.perf_counter()
    data = jax.block_until_ready(pendulum_dataset())
    dataset_s = time.perf_counter() - start

    num_updates = updates_per_run(steps, seeds, callback_every)
    keys = jax.random.split(jax.random.PRNGKey(0), seeds)
    hparams = jax.vmap(lambda _: config.hparams())(keys)
    states = jax.jit(jax.vmap(lambda key, hp: cql.init(config, key, hp)))(keys, hparams)
    eval_keys = jax.random.split(jax.random.PRNGKey(1), seeds)

    callbacks = [0]

    def callback(update_step: Any, metrics: Any) -> None:
        callbacks[0] += 1  # where a user would log; the metrics arrive on the host

    chunk = cql.make_train_chunk(
        config, num_updates, callback=callback, callback_every=callback_every, evaluate=False
    )
    start = time.perf_counter()
    compiled = jax.jit(chunk, donate_argnums=0).lower(states, hparams, data, eval_keys).compile()
    compile_s = time.perf_counter() - start

    run_times = []
    cpu_start = cpu_seconds()
    for _ in range(repeats):
        start = time.perf_counter()
        states, metrics = jax.block_until_ready(compiled(states, hparams, data, eval_keys))
        run_times.append(time.perf_counter() - start)
    cpu_per_wall = (cpu_seconds() - cpu_start) / sum(run_times)
    run_s = min(run_times)
    grad_steps = seeds * num_updates
    return {
        "side": "ours",
        "hidden": list(hidden),
        "seeds": seeds,
        "updates_per_run": num_updates,
        "grad_steps": grad_steps,
        "callback_every": callback_every,
        "host_callbacks": callbacks[0],
        "compile_s": compile_s,
        "dataset_s": dataset_s,
        "transitions": int(data.size),
        "run_s": run_s,
        "run_s_all": run_times,
        "grad_steps_per_s": grad_steps / run_s,
        "cpu_per_wall": cpu_per_wall,
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "last_metrics": {key: float(value.mean()) for key, value in metrics.items()},
        "loadavg_start": load_start,
        "loadavg_end": os.getloadavg()[0],
        "backend": jax.default_backend(),
        "jax_version": jax.__version__,
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
    }


# --------------------------------------------------------------------------------------------
# Parent side


def hidden_list(text: str) -> list[tuple[int, ...]]:
    """ "256x256,64x64" -> [(256, 256), (64, 64)]."""
    return [tuple(int(u) for u in item.split("x")) for item in text.split(",") if item.strip()]


def hidden_name(hidden: tuple[int, ...]) -> str:
    return "x".join(str(u) for u in hidden)


def variants(hidden: tuple[int, ...], steps: int, args: argparse.Namespace) -> list[dict]:
    """The rows of one cell, each with the command of its worker."""
    script = str(Path(__file__).resolve())
    ours = [sys.executable, script, "--hidden", hidden_name(hidden), "--steps", str(steps)]
    ours += ["--callback_every", str(args.callback_every), "--repeats", str(args.repeats)]
    rows = [{"name": "ours, 1 seed", "side": "ours", "command": [*ours, "--worker", "1"]}]
    if args.seeds > 1:
        rows.append(
            {
                "name": f"ours, {args.seeds} seeds vmapped",
                "side": "ours",
                "command": [*ours, "--worker", str(args.seeds)],
            }
        )
    if args.d3rlpy_python:
        peer = [args.d3rlpy_python, str(D3RLPY_WORKER), "--modes", "loop"]
        peer += ["--hidden", ",".join(str(u) for u in hidden)]
        peer += ["--batch_size", str(BATCH_SIZE), "--n_action_samples", str(NUM_ACTION_SAMPLES)]
        peer += ["--n_critics", str(NUM_CRITICS), "--transitions", str(ROWS)]
        peer += ["--episode_len", str(EPISODE_LEN), "--seed", str(DATA_SEED)]
        for threads in args.d3rlpy_threads:
            label = {0: "default threads", 1: "1 thread"}.get(threads, f"{threads} threads")
            # Several torch threads on a loaded machine can run ~1 step/s: fewer steps there.
            count = steps if threads == 1 else min(steps, args.multithread_steps)
            warmup = DEFAULT_D3RLPY_WARMUP if threads == 1 else args.multithread_warmup
            rows.append(
                {
                    "name": f"d3rlpy, {label}",
                    "side": "d3rlpy",
                    "threads": threads,
                    "steps": count,
                    "command": [*peer, "--steps", str(count), "--warmup", str(warmup)]
                    + ["--threads", str(threads)],
                }
            )
    for row in rows:
        row.setdefault("steps", steps)
        row.update(hidden=list(hidden), runs=[])
    return rows


def normalise(result: dict[str, Any], side: str) -> dict[str, Any]:
    """The d3rlpy worker's keys renamed to ours, for the table."""
    result = {"side": side, **result}
    if side == "d3rlpy" and result["status"] == "ok":
        result["compile_s"] = result["setup_s"]  # no compilation: its model setup
        result["cpu_per_wall"] = result.get("loop_cpu_per_wall")
        result["loadavg_start"] = result["machine"]["loadavg_start"]
        result["loadavg_end"] = result["machine"]["loadavg_end"]
        result["grad_steps"] = result["config"]["steps"]
    return result


def describe(result: dict[str, Any]) -> str:
    if result["status"] != "ok":
        return f"FAILED ({result['status']}): {result.get('message') or result}"
    return (
        f"{result['grad_steps_per_s']:.1f} grad steps/s ({result['grad_steps']} steps), "
        f"{'compile' if result['side'] == 'ours' else 'setup'} {result['compile_s']:.1f} s, "
        f"peak RSS {result['peak_rss_mib']:.0f} MiB, cpu/wall {result['cpu_per_wall']:.2f}, "
        f"load {result['loadavg_start']:.1f}->{result['loadavg_end']:.1f}"
    )


KEYS = ("grad_steps_per_s", "compile_s", "peak_rss_mib", "cpu_per_wall", "loadavg_start")


def format_table(rows: list[dict[str, Any]]) -> str:
    peers = [row for row in rows if row["side"] == "d3rlpy"]
    header = ["hidden", "row", "grad steps", "grad steps/s", "compile / setup s", "RSS MiB"]
    header += ["cpu/wall", "load"]
    header += [f"ratio vs {row['name']}" for row in peers if row["hidden"] == rows[0]["hidden"]]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    for row in rows:
        ok = [r for r in row["runs"] if r["status"] == "ok"]
        m = row["median"]
        rates = [r["grad_steps_per_s"] for r in ok]
        spread = f" ({min(rates):.1f}-{max(rates):.1f})" if len(rates) > 1 else ""
        loads = [r["loadavg_start"] for r in ok]
        cells = [
            hidden_name(tuple(row["hidden"])),
            row["name"],
            str(ok[0]["grad_steps"]) if ok else "-",
            f"{m['grad_steps_per_s']:.1f}{spread}" if ok else row["runs"][-1]["status"],
            fmt(m["compile_s"], ".1f"),
            fmt(m["peak_rss_mib"], ".0f"),
            fmt(m["cpu_per_wall"], ".2f"),
            f"{min(loads):.1f}-{max(loads):.1f}" if loads else "-",
        ]
        for peer in (p for p in peers if p["hidden"] == row["hidden"]):
            ratio = None
            if (
                row["side"] == "ours"
                and m["grad_steps_per_s"]
                and peer["median"]["grad_steps_per_s"]
            ):
                ratio = m["grad_steps_per_s"] / peer["median"]["grad_steps_per_s"]
            cells.append(fmt(ratio, ".2f"))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def run_benchmark(args: argparse.Namespace) -> None:
    rows = [
        row
        for hidden, steps in zip(args.hidden, args.steps, strict=True)
        for row in variants(hidden, steps, args)
    ]
    for run in range(args.runs):
        for row in rows:
            result = normalise(run_process(row["command"], _marker(row), args.timeout), row["side"])
            row["runs"].append(result)
            log(
                f"[{run + 1}/{args.runs}] {hidden_name(tuple(row['hidden']))} {row['name']}: "
                f"{describe(result)}"
            )
    for row in rows:
        ok = [r for r in row["runs"] if r["status"] == "ok"]
        row["median"] = {key: median_of(ok, key) for key in KEYS}
    print(format_table(rows))
    print(
        f"\nMedians over {args.runs} worker process(es) per row (range of grad steps/s in "
        f"brackets); ours: best of {args.repeats} calls; d3rlpy: one timed loop after 21 "
        f"untimed steps; load = 1-minute load average at worker start ({os.cpu_count()} CPUs). "
        f"The ratio columns divide an ours row by a d3rlpy row of the same hidden size."
    )
    if args.json_out:
        report = {
            "settings": {
                "env": ENV_NAME,
                "rows": ROWS,
                "episode_len": EPISODE_LEN,
                "batch_size": BATCH_SIZE,
                "num_critics": NUM_CRITICS,
                "num_action_samples": NUM_ACTION_SAMPLES,
                "gamma": GAMMA,
                "tau": TAU,
                "actor_lr": ACTOR_LR,
                "critic_lr": CRITIC_LR,
                "temperature_lr": TEMPERATURE_LR,
                "conservative_weight": CONSERVATIVE_WEIGHT,
                "action_gap_threshold": ACTION_GAP_THRESHOLD,
                "multiplier_lr": MULTIPLIER_LR,
                "lagrangian": True,
                "hidden": [list(h) for h in args.hidden],
                "steps": args.steps,
                "seeds": args.seeds,
                "callback_every": args.callback_every,
                "repeats": args.repeats,
                "runs": args.runs,
            },
            "machine": {"platform": platform.platform(), "cpu_count": os.cpu_count()},
            "d3rlpy_python": args.d3rlpy_python,
            "rows": rows,
        }
        Path(args.json_out).write_text(json.dumps(report, indent=2) + "\n")
        log(f"wrote {args.json_out}")


def _marker(row: dict[str, Any]) -> str:
    return D3RLPY_MARKER if row["side"] == "d3rlpy" else RESULT_MARKER


# --------------------------------------------------------------------------------------------
# Command line


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n", 1)[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    add = parser.add_argument
    add(
        "--hidden", type=hidden_list, default=DEFAULT_HIDDEN, help="cells: hidden sizes, e.g. 64x64"
    )
    add(
        "--steps",
        type=comma_list(int),
        default=DEFAULT_STEPS,
        help="timed gradient steps per row, one per --hidden cell (summed over seeds for ours)",
    )
    add(
        "--seeds",
        type=int,
        default=DEFAULT_SEEDS,
        help="vmapped seeds of the extra ours row; 0 or 1 leaves the row out",
    )
    add(
        "--callback_every",
        type=int,
        default=DEFAULT_CALLBACK_EVERY,
        help="ours: gradient steps between host callbacks (the logging hook)",
    )
    add("--repeats", type=int, default=DEFAULT_REPEATS, help="ours: timed calls, best reported")
    add("--runs", type=int, default=DEFAULT_RUNS, help="worker processes per row")
    add(
        "--d3rlpy_threads",
        type=comma_list(int),
        default=DEFAULT_D3RLPY_THREADS,
        help="torch intra-op threads of the d3rlpy rows; 0 is torch's default",
    )
    add(
        "--multithread_steps",
        type=int,
        default=DEFAULT_MULTITHREAD_STEPS,
        help="d3rlpy rows with more than 1 thread time at most this many steps",
    )
    add(
        "--multithread_warmup",
        type=int,
        default=DEFAULT_MULTITHREAD_WARMUP,
        help="untimed steps (after the first) of d3rlpy rows with more than 1 thread",
    )
    add("--d3rlpy_python", default=None, help="python of the d3rlpy venv; adds the d3rlpy rows")
    add(
        "--timeout", type=float, default=DEFAULT_TIMEOUT_S, help="seconds before a worker is killed"
    )
    add("--json_out", default=None, help="also write every measurement to this JSON file")
    # Internal: measure ours with this many seeds in this process (first --hidden/--steps).
    add("--worker", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if len(args.steps) == 1:
        args.steps = args.steps * len(args.hidden)
    if len(args.steps) != len(args.hidden):
        parser.error("give one --steps value, or one per --hidden cell")
    sizes = (*args.steps, args.callback_every, args.repeats, args.runs, args.timeout)
    if min(*sizes, args.multithread_steps) <= 0 or args.multithread_warmup < 0:
        parser.error(
            "--steps, --callback_every, --repeats, --runs, --timeout and --multithread_steps "
            "must be positive, --multithread_warmup not negative"
        )
    if args.seeds < 0 or min(args.d3rlpy_threads, default=0) < 0:
        parser.error("--seeds and --d3rlpy_threads must not be negative")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.worker is None:
        run_benchmark(args)
        return
    result = run_ours(args.hidden[0], args.steps[0], args.worker, args.callback_every, args.repeats)
    print(RESULT_MARKER + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
