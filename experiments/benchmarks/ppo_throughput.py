"""PPO training throughput: our `algos.ppo` against rejax's PPO, cell by cell.

What is measured, per cell (environment x num_envs x num_seeds):

* compile s:   wall time of `jax.jit(train).lower(keys).compile()` (tracing + XLA compilation);
  building the config / algorithm object beforehand is not counted.
* steps/s:     num_seeds * num_updates * num_envs * num_steps / run seconds, where run seconds is
  the best of `--repeats` calls of the compiled function, each followed by
  `jax.block_until_ready` on everything it returns. Seeds run as one program:
  `jax.jit(jax.vmap(train))(keys)` (plain `jax.jit(train)(key)` for a single seed).
* evaluation:  by default (`--eval none`) a run is training only. With `--eval final` it also
  evaluates 128 episodes at the end on both sides, as `ppo.make_train` and rejax's `train` do;
  those steps are not counted, and since rejax samples actions while we take the mode, episode
  lengths differ: evaluation time depends on the two policies, not on the two implementations.
* peak RSS:    `resource.getrusage(RUSAGE_SELF).ru_maxrss` of the process that measured the cell.
* run length:  by default every cell does the same work, `--env_steps` (2**19) env steps summed
  over seeds, so cells differ in their number of updates (a column of the table); `--updates N`
  runs N updates in every cell instead.
* timeouts:    a worker still running after `--timeout` seconds is killed and its cell shows
  "timeout" (with the compile time, when compilation had finished); the sweep goes on.

Every measurement runs in a fresh worker process (this script re-invoked with a hidden `--worker`
flag), ours with this interpreter and rejax's with `--rejax_python`: rejax 0.1.3 needs gymnax
0.0.9 while we need gymnax 1.x, so the two cannot share a process. A fresh process per cell also
gives each cell its own peak RSS and keeps in-memory compilation caches from favouring either
side; the persistent compilation cache is switched off in the workers so compile times are real.
Ours and rejax's run one after the other for each cell, never concurrently. Each side runs as its
users would run it: ours with the XLA_FLAGS that importing `jaxrl` sets (XLA CPU's
concurrency-optimised scheduler off, since it can deadlock vmapped PPO programs; this costs us
about 10% on CartPole), rejax with XLA's defaults. `--rejax_xla_flags=ours` gives rejax our flags.

Hyper-parameters are the same on both sides: num_steps 128, num_epochs 4, num_minibatches 4,
learning rate 2.5e-4 annealed linearly to zero, gamma 0.99, GAE lambda 0.95, clip 0.2 (policy and
value), entropy coefficient 0.01, value coefficient 0.5, max grad norm 0.5, separate 64x64 tanh
actor and critic MLPs on flattened observations (also for MinAtar's 10x10x4 images), no
observation or reward normalisation. What cannot be made identical is listed in `_rejax_algo`.

Set up the rejax environment once:

    python -m venv /tmp/rejax && /tmp/rejax/bin/pip install rejax gymnax==0.0.9

Then, from the repository root:

    python experiments/benchmarks/ppo_throughput.py                        # ours only
    python experiments/benchmarks/ppo_throughput.py --rejax_python /tmp/rejax/bin/python \\
        --json_out ppo_throughput.json                                    # ours vs rejax
    python experiments/benchmarks/ppo_throughput.py --envs CartPole-v1 --num_envs 4 --seeds 1 \\
        --updates 8 --rejax_python /tmp/rejax/bin/python                  # a quick check

Throughput on a shared machine is noisy: use `--repeats 3` or more for numbers worth quoting.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
# Run directly, the script's own folder is on sys.path, not the repository root. At module level
# only the standard-library helpers in `_shared` are imported from the repository, so the rejax
# worker (another venv) never loads jaxrl.
sys.path.insert(0, str(REPO_ROOT))

from experiments.benchmarks._shared import comma_list, marked_json  # noqa: E402

# Fixed on both sides; the sweep is over environments, num_envs and seeds.
NUM_STEPS = 128
NUM_EPOCHS = 4
NUM_MINIBATCHES = 4
LEARNING_RATE = 2.5e-4
# Settings both libraries name alike, passed to both as they are.
SHARED_SETTINGS = dict(
    num_steps=NUM_STEPS,
    num_epochs=NUM_EPOCHS,
    num_minibatches=NUM_MINIBATCHES,
    gamma=0.99,
    gae_lambda=0.95,
    clip_eps=0.2,
    ent_coef=0.01,
    vf_coef=0.5,
    max_grad_norm=0.5,
    normalize_observations=False,
    normalize_rewards=False,
)
HIDDEN_SIZES = (64, 64)
ACTIVATION = "tanh"
# rejax always evaluates on 128 episodes, so with --eval final ours does too.
EVAL_EPISODES = 128

DEFAULT_ENVS = "CartPole-v1,Breakout-MinAtar"
DEFAULT_NUM_ENVS = "4,64,512"
DEFAULT_SEEDS = "1,8"
# Every cell does the same work, this many env steps summed over seeds, unless --updates fixes
# the number of updates instead: a fixed count (32 updates of 512 envs x 8 seeds is 16.8M steps)
# makes large cells take minutes on a small CPU and small ones a tenth of a second. 2**19 steps
# is one update of the largest cell (512 envs x 8 seeds x 128 steps), and a few seconds per run
# on a 2-core CPU (3-4 s for CartPole, 10-15 s for Breakout-MinAtar).
DEFAULT_ENV_STEPS = 524_288
# The first call of a compiled function is slower (buffer allocation, cold caches): up to twice as
# slow for sub-second runs. Reporting the best of two calls leaves that out.
DEFAULT_REPEATS = 2
# A worker that has not finished by then is killed and its cell reported as timed out, so that one
# stuck program does not stop the sweep.
DEFAULT_TIMEOUT_S = 150

# Lines a worker prints on stdout for the parent: after compiling, and the final result.
COMPILED_MARKER = "PPO_THROUGHPUT_COMPILED "
RESULT_MARKER = "PPO_THROUGHPUT_RESULT "


# --------------------------------------------------------------------------------------------
# Worker side: build one train function, compile it, time it, print one JSON line.


def _ours_train(
    env_name: str, num_envs: int, total_timesteps: int, evaluate: bool
) -> Callable[..., Any]:
    from algos import ppo

    config = ppo.Config(
        env_name=env_name,
        total_timesteps=total_timesteps,
        num_envs=num_envs,
        learning_rate=LEARNING_RATE,
        anneal_lr=True,
        clip_value=True,
        **SHARED_SETTINGS,
        hidden_sizes=HIDDEN_SIZES,
        activation=ACTIVATION,
        eval_episodes=EVAL_EPISODES,
    )
    return ppo.make_train(config, final_evaluation=evaluate)


def _rejax_algo(env_name: str, num_envs: int, total_timesteps: int, evaluate: bool) -> Any:
    """rejax's PPO with our settings. Differences that its options cannot remove (none of them
    changes the amount of work much, so none should move throughput by more than noise):

    * gradient clipping: rejax clips each gradient element to +-max_grad_norm (`optax.clip`), we
      clip the global norm; rejax also keeps separate Adam states for actor and critic and takes
      two backward passes per minibatch (actor loss, then critic loss), we take one on the sum;
    * Adam epsilon: rejax's is optax's default 1e-8, ours 1e-5;
    * initialisation: rejax uses Flax's default (LeCun normal), ours orthogonal;
    * bootstrapping: rejax treats time-limit truncation as termination; we bootstrap from the
      final observation, which costs an extra critic forward pass over every step's next
      observation;
    * evaluation (only with --eval final): rejax samples actions, we take the mode, so episode
      lengths, and the time the final evaluation takes, differ.

    Made identical on purpose: rejax does not anneal the learning rate by default, but it hands
    `learning_rate` straight to `optax.adam`, so a linear schedule over all gradient steps gives
    exactly our annealing; its initial evaluation is skipped because we only evaluate at the end,
    and without --eval final its evaluation callback is replaced by one that does nothing.
    """
    import jax.numpy as jnp
    import optax
    from rejax import PPO

    num_updates = total_timesteps // (num_envs * NUM_STEPS)
    gradient_steps = num_updates * NUM_EPOCHS * NUM_MINIBATCHES
    algo = PPO.create(
        env=env_name,
        num_envs=num_envs,
        total_timesteps=total_timesteps,
        eval_freq=total_timesteps,  # a single evaluation, at the end
        skip_initial_evaluation=True,
        learning_rate=optax.linear_schedule(LEARNING_RATE, 0.0, gradient_steps),
        **SHARED_SETTINGS,
        agent_kwargs={"hidden_layer_sizes": HIDDEN_SIZES, "activation": ACTIVATION},
    )
    if not evaluate:
        # rejax's `train` always calls the callback once per `eval_freq` steps; it returns
        # (episode lengths, returns).
        algo = algo.replace(eval_callback=lambda algo, ts, rng: (jnp.zeros(1), jnp.zeros(1)))
    return algo


def run_worker(
    side: str,
    env_name: str,
    num_envs: int,
    num_seeds: int,
    updates: int,
    repeats: int,
    evaluate: bool,
) -> dict[str, Any]:
    """Compile and time one cell in this process; returns the measurements."""
    import jax

    # A persistent cache hit would make compile time meaningless.
    jax.config.update("jax_enable_compilation_cache", False)

    total_timesteps = updates * num_envs * NUM_STEPS
    if side == "ours":
        train = _ours_train(env_name, num_envs, total_timesteps, evaluate)
    else:
        train = _rejax_algo(env_name, num_envs, total_timesteps, evaluate).train

    key = jax.random.PRNGKey(0)
    if num_seeds > 1:
        fn, args = jax.jit(jax.vmap(train)), jax.random.split(key, num_seeds)
    else:
        fn, args = jax.jit(train), key

    start = time.perf_counter()
    compiled = fn.lower(args).compile()
    compile_s = time.perf_counter() - start
    # Reported now, so that a run that never finishes still has its compile time.
    print(COMPILED_MARKER + json.dumps({"compile_s": compile_s}), flush=True)

    run_times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(compiled(args))
        run_times.append(time.perf_counter() - start)
    run_s = min(run_times)

    env_steps = num_seeds * total_timesteps
    return {
        "side": side,
        "env": env_name,
        "num_envs": num_envs,
        "seeds": num_seeds,
        "updates": updates,
        "env_steps": env_steps,
        "compile_s": compile_s,
        "run_s": run_s,
        "run_s_all": run_times,
        "steps_per_s": env_steps / run_s,
        # Linux reports ru_maxrss in KiB.
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "backend": jax.default_backend(),
        "jax_version": jax.__version__,
    }


# --------------------------------------------------------------------------------------------
# Parent side: the sweep, one worker process per side and cell, then the table.


def cell_updates(updates: int | None, env_steps: int, num_envs: int, num_seeds: int) -> int:
    """Updates per run for one cell: `updates` if given, else as many as fit in `env_steps` env
    steps over all seeds (at least one). Runs are whole numbers of updates, so total_timesteps is
    always a multiple of num_envs * num_steps."""
    if updates is not None:
        return updates
    return max(1, env_steps // (num_seeds * num_envs * NUM_STEPS))


def measure(
    python: str, side: str, cell: dict[str, Any], args: argparse.Namespace
) -> dict[str, Any]:
    """Measure one side of one cell in a worker process.

    Returns the worker's result with status "ok", or status "timeout" (with the compile time if
    compilation had finished) or "error" (with the end of the worker's stderr).
    """
    flags = {
        "--worker": side,
        "--envs": cell["env"],
        "--num_envs": cell["num_envs"],
        "--seeds": cell["seeds"],
        "--updates": cell["updates"],
        "--repeats": args.repeats,
        "--eval": args.eval,
    }
    env = dict(os.environ)
    if side == "rejax" and args.rejax_xla_flags == "default":
        env["XLA_FLAGS"] = USER_XLA_FLAGS
    elif side == "rejax":
        env["XLA_FLAGS"] = jaxrl_xla_flags()
    command = [python, str(Path(__file__).resolve())]
    command += [str(item) for flag_and_value in flags.items() for item in flag_and_value]
    try:
        # From the repository root, so that the worker for our side can import `algos`.
        done = subprocess.run(
            command,
            capture_output=True,
            text=True,
            cwd=REPO_ROOT,
            timeout=args.timeout,
            check=False,
            env=env,
        )
    except subprocess.TimeoutExpired as expired:
        compiled = marked_json(expired.stdout, COMPILED_MARKER) or {}
        return {"status": "timeout", "timeout_s": args.timeout, **compiled}
    result = marked_json(done.stdout, RESULT_MARKER)
    if result is None:
        return {"status": "error", "returncode": done.returncode, "stderr": done.stderr[-3000:]}
    return {"status": "ok", **result}


def _describe(result: dict[str, Any]) -> str:
    if result["status"] == "ok":
        return (
            f"{result['steps_per_s']:,.0f} steps/s, compile {result['compile_s']:.1f} s, "
            f"run {result['run_s']:.2f} s, peak RSS {result['peak_rss_mib']:.0f} MiB"
        )
    if result["status"] == "timeout":
        compiled = f"compiled in {result['compile_s']:.1f} s, " if "compile_s" in result else ""
        return f"TIMEOUT ({compiled}killed after {result['timeout_s']} s)"
    return f"ERROR (exit {result['returncode']}):\n{result['stderr']}"


def _side_columns(result: dict[str, Any]) -> list[str]:
    """steps/s, compile s and peak RSS for the table; a failed run shows its status instead."""
    compile_s = f"{result['compile_s']:.1f}" if "compile_s" in result else "-"
    if result["status"] != "ok":
        return [result["status"], compile_s, "-"]
    return [f"{result['steps_per_s']:,.0f}", compile_s, f"{result['peak_rss_mib']:.0f}"]


def format_table(rows: list[dict[str, Any]], with_rejax: bool) -> str:
    """A markdown table, one line per cell."""
    header = ["env", "num_envs", "seeds", "updates"]
    header += ["ours steps/s", "ours compile s", "ours RSS MiB"]
    if with_rejax:
        header += ["rejax steps/s", "rejax compile s", "rejax RSS MiB", "ratio (ours/rejax)"]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    for row in rows:
        cells = [row["env"], str(row["num_envs"]), str(row["seeds"]), str(row["updates"])]
        cells += _side_columns(row["ours"])
        if with_rejax:
            cells += _side_columns(row["rejax"])
            both_ok = row["ours"]["status"] == row["rejax"]["status"] == "ok"
            ratio = row["ours"]["steps_per_s"] / row["rejax"]["steps_per_s"] if both_ok else None
            cells.append("-" if ratio is None else f"{ratio:.2f}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


# XLA_FLAGS as the user set them, before anything of ours touched them.
USER_XLA_FLAGS = os.environ.get("XLA_FLAGS", "")


def jaxrl_xla_flags() -> str:
    """XLA_FLAGS as importing jaxrl sets them: the user's plus its CPU runtime workaround."""
    from jaxrl import with_cpu_workarounds

    return with_cpu_workarounds(USER_XLA_FLAGS)


def run_sweep(args: argparse.Namespace) -> None:
    """Every cell, ours then rejax's (never both at once: they would compete for the cores)."""
    print(f"XLA_FLAGS ours: {jaxrl_xla_flags()!r}", file=sys.stderr)
    if args.rejax_python:
        rejax_flags = USER_XLA_FLAGS if args.rejax_xla_flags == "default" else jaxrl_xla_flags()
        print(f"XLA_FLAGS rejax: {rejax_flags!r}", file=sys.stderr)
    sides = [("ours", sys.executable)]
    if args.rejax_python:
        sides.append(("rejax", args.rejax_python))
    rows = []
    for env_name in args.envs:
        for num_envs in args.num_envs:
            for num_seeds in args.seeds:
                updates = cell_updates(args.updates, args.env_steps, num_envs, num_seeds)
                row = {"env": env_name, "num_envs": num_envs, "seeds": num_seeds}
                row["updates"] = updates
                for side, python in sides:
                    row[side] = measure(python, side, row, args)
                    print(
                        f"{env_name} num_envs={num_envs} seeds={num_seeds} updates={updates} "
                        f"{side}: {_describe(row[side])}",
                        file=sys.stderr,
                        flush=True,
                    )
                rows.append(row)

    print(format_table(rows, with_rejax=args.rejax_python is not None))
    if args.json_out:
        report = {
            "settings": {
                "num_steps": NUM_STEPS,
                "num_epochs": NUM_EPOCHS,
                "num_minibatches": NUM_MINIBATCHES,
                "learning_rate": LEARNING_RATE,
                "hidden_sizes": HIDDEN_SIZES,
                "activation": ACTIVATION,
                "updates": args.updates,
                "env_steps": args.env_steps,
                "repeats": args.repeats,
                "eval": args.eval,
                "eval_episodes": EVAL_EPISODES if args.eval == "final" else 0,
                "xla_flags_ours": jaxrl_xla_flags(),
                "rejax_xla_flags": args.rejax_xla_flags,
            },
            "machine": {"platform": platform.platform(), "cpu_count": os.cpu_count()},
            "rejax_python": args.rejax_python,
            "cells": rows,
        }
        Path(args.json_out).write_text(json.dumps(report, indent=2) + "\n")
        print(f"wrote {args.json_out}", file=sys.stderr)


# --------------------------------------------------------------------------------------------
# Command line


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n", 1)[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    add = parser.add_argument
    add("--envs", type=comma_list(str), default=DEFAULT_ENVS, help="comma-separated env names")
    add(
        "--num_envs",
        type=comma_list(int),
        default=DEFAULT_NUM_ENVS,
        help="comma-separated numbers of parallel environments",
    )
    add(
        "--seeds",
        type=comma_list(int),
        default=DEFAULT_SEEDS,
        help="comma-separated numbers of seeds vmapped into one program",
    )
    add(
        "--updates",
        type=int,
        default=None,
        help="PPO updates per run in every cell; if not given, as many as fit in --env_steps",
    )
    add(
        "--env_steps",
        type=int,
        default=DEFAULT_ENV_STEPS,
        help="env steps per run, summed over seeds, when --updates is not given; a cell runs "
        "at least one update",
    )
    add(
        "--repeats",
        type=int,
        default=DEFAULT_REPEATS,
        help="calls of each compiled function; the fastest is reported",
    )
    add(
        "--rejax_xla_flags",
        choices=("default", "ours"),
        default="default",
        help="'default': rejax runs with XLA's default CPU flags, as its users run it; 'ours': "
        "with the flags importing jaxrl sets",
    )
    add(
        "--eval",
        choices=("none", "final"),
        default="none",
        help="'final': runs end with a 128-episode evaluation, as the train functions do",
    )
    add(
        "--timeout",
        type=float,
        default=DEFAULT_TIMEOUT_S,
        help="seconds before a worker (compile + runs) is killed and reported as timed out",
    )
    add(
        "--rejax_python",
        default=None,
        help="python of a venv with rejax and gymnax 0.0.9; adds rejax's PPO to every cell",
    )
    add("--json_out", default=None, help="also write every measurement to this JSON file")
    # Internal: measure one cell in this process (the sweep runs these as subprocesses).
    add("--worker", choices=("ours", "rejax"), default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if min(args.updates or 1, args.repeats, args.env_steps, args.timeout) <= 0:
        parser.error("--updates, --repeats, --env_steps and --timeout must be positive")
    if args.worker and not len(args.envs) == len(args.num_envs) == len(args.seeds) == 1:
        parser.error("--worker measures one cell: give one env, one num_envs, one seeds value")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.worker is None:
        run_sweep(args)
        return
    result = run_worker(
        args.worker,
        args.envs[0],
        args.num_envs[0],
        args.seeds[0],
        cell_updates(args.updates, args.env_steps, args.num_envs[0], args.seeds[0]),
        args.repeats,
        evaluate=args.eval == "final",
    )
    print(RESULT_MARKER + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
