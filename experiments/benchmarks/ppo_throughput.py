"""PPO training throughput: our `algos.ppo` against rejax's PPO, cell by cell.

What is measured, per cell (environment x num_envs x num_seeds):

* compile s:   wall time of `jax.jit(train).lower(keys).compile()` (tracing + XLA compilation);
  building the config / algorithm object beforehand is not counted.
* steps/s:     num_seeds * num_updates * num_envs * num_steps / run seconds, where run seconds is
  the best of `--repeats` calls of the compiled function, each followed by
  `jax.block_until_ready` on everything it returns. Seeds run as one program:
  `jax.jit(jax.vmap(train))(keys)` (plain `jax.jit(train)(key)` for a single seed).
  A run is the whole training run plus one final evaluation of 128 episodes on both sides; the
  evaluation steps are not counted as env steps.
* peak RSS:    `resource.getrusage(RUSAGE_SELF).ru_maxrss` of the process that measured the cell.

Every measurement runs in a fresh worker process (this script re-invoked with a hidden `--worker`
flag), ours with this interpreter and rejax's with `--rejax_python`: rejax 0.1.3 needs gymnax
0.0.9 while we need gymnax 1.x, so the two cannot share a process. A fresh process per cell also
gives each cell its own peak RSS and keeps in-memory compilation caches from favouring either
side; the persistent compilation cache is switched off in the workers so compile times are real.
Ours and rejax's run one after the other for each cell, never concurrently.

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

Throughput on a shared machine is noisy: use `--repeats 3` for numbers worth quoting.
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
# Run directly, the script's own folder is on sys.path, not the repository root. Nothing is
# imported from the repository at module level, so the rejax worker (another venv) never loads it.
sys.path.insert(0, str(REPO_ROOT))

# Fixed on both sides; the sweep is over environments, num_envs and seeds.
NUM_STEPS = 128
NUM_EPOCHS = 4
NUM_MINIBATCHES = 4
LEARNING_RATE = 2.5e-4
HIDDEN_SIZES = (64, 64)
ACTIVATION = "tanh"
# rejax always evaluates on 128 episodes, so ours does too (one final evaluation each).
EVAL_EPISODES = 128

DEFAULT_ENVS = "CartPole-v1,Breakout-MinAtar"
DEFAULT_NUM_ENVS = "4,64,512"
DEFAULT_SEEDS = "1,8"
DEFAULT_UPDATES = 32
# 32 updates of 512 envs x 8 seeds would be 16.8M steps per run, minutes on a small CPU; capping
# each run's env steps keeps every cell to a few seconds (see `cell_updates`).
DEFAULT_MAX_ENV_STEPS = 2_097_152

WORKER_MARKER = "PPO_THROUGHPUT_RESULT "


# --------------------------------------------------------------------------------------------
# Worker side: build one train function, compile it, time it, print one JSON line.


def _ours_train(env_name: str, num_envs: int, total_timesteps: int) -> Callable[..., Any]:
    from algos import ppo

    config = ppo.Config(
        env_name=env_name,
        total_timesteps=total_timesteps,
        num_envs=num_envs,
        num_steps=NUM_STEPS,
        num_epochs=NUM_EPOCHS,
        num_minibatches=NUM_MINIBATCHES,
        learning_rate=LEARNING_RATE,
        anneal_lr=True,
        gamma=0.99,
        gae_lambda=0.95,
        clip_eps=0.2,
        clip_value=True,
        ent_coef=0.01,
        vf_coef=0.5,
        max_grad_norm=0.5,
        normalize_observations=False,
        normalize_rewards=False,
        hidden_sizes=HIDDEN_SIZES,
        activation=ACTIVATION,
        eval_episodes=EVAL_EPISODES,
    )
    return ppo.make_train(config)


def _rejax_algo(env_name: str, num_envs: int, total_timesteps: int) -> Any:
    """rejax's PPO with our settings. Differences that its options cannot remove (none of them
    changes the amount of work much, so none should move throughput by more than noise):

    * gradient clipping: rejax clips each gradient element to +-max_grad_norm (`optax.clip`), we
      clip the global norm; rejax also keeps separate Adam states for actor and critic and takes
      two backward passes per minibatch (actor loss, then critic loss), we take one on the sum;
    * Adam epsilon: rejax's is optax's default 1e-8, ours 1e-5;
    * initialisation: rejax uses Flax's default (LeCun normal), ours orthogonal;
    * bootstrapping: rejax treats time-limit truncation as termination; we bootstrap from the
      final observation, which costs one extra critic forward pass per environment step;
    * evaluation: rejax samples actions, we take the mode, so episode lengths (and the few
      milliseconds the final evaluation takes) differ.

    Made identical on purpose: rejax does not anneal the learning rate by default, but it hands
    `learning_rate` straight to `optax.adam`, so a linear schedule over all gradient steps gives
    exactly our annealing; its initial evaluation is skipped because we only evaluate at the end.
    """
    import optax
    from rejax import PPO

    num_updates = total_timesteps // (num_envs * NUM_STEPS)
    gradient_steps = num_updates * NUM_EPOCHS * NUM_MINIBATCHES
    return PPO.create(
        env=env_name,
        num_envs=num_envs,
        num_steps=NUM_STEPS,
        num_epochs=NUM_EPOCHS,
        num_minibatches=NUM_MINIBATCHES,
        total_timesteps=total_timesteps,
        eval_freq=total_timesteps,  # a single evaluation, at the end
        skip_initial_evaluation=True,
        learning_rate=optax.linear_schedule(LEARNING_RATE, 0.0, gradient_steps),
        gamma=0.99,
        gae_lambda=0.95,
        clip_eps=0.2,
        ent_coef=0.01,
        vf_coef=0.5,
        max_grad_norm=0.5,
        normalize_observations=False,
        normalize_rewards=False,
        agent_kwargs={"hidden_layer_sizes": HIDDEN_SIZES, "activation": ACTIVATION},
    )


def run_worker(
    side: str, env_name: str, num_envs: int, num_seeds: int, updates: int, repeats: int
) -> dict[str, Any]:
    """Compile and time one cell in this process; returns the measurements."""
    import jax

    # A persistent cache hit would make compile time meaningless.
    jax.config.update("jax_enable_compilation_cache", False)

    total_timesteps = updates * num_envs * NUM_STEPS
    if side == "ours":
        train = _ours_train(env_name, num_envs, total_timesteps)
    else:
        train = _rejax_algo(env_name, num_envs, total_timesteps).train

    key = jax.random.PRNGKey(0)
    if num_seeds > 1:
        fn, args = jax.jit(jax.vmap(train)), jax.random.split(key, num_seeds)
    else:
        fn, args = jax.jit(train), key

    start = time.perf_counter()
    compiled = fn.lower(args).compile()
    compile_s = time.perf_counter() - start

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


def cell_updates(updates: int, max_env_steps: int, num_envs: int, num_seeds: int) -> int:
    """Updates for one cell: `updates`, reduced so that a run takes at most `max_env_steps` env
    steps over all seeds (at least one update). Every run is a whole number of updates, so
    total_timesteps is always a multiple of num_envs * num_steps."""
    steps_per_update = num_seeds * num_envs * NUM_STEPS
    return max(1, min(updates, max_env_steps // steps_per_update))


def measure(
    python: str, side: str, env_name: str, num_envs: int, num_seeds: int, updates: int, repeats: int
) -> dict[str, Any]:
    """Run one worker process and return the result it printed."""
    command = [
        python,
        str(Path(__file__).resolve()),
        "--worker",
        side,
        "--envs",
        env_name,
        "--num_envs",
        str(num_envs),
        "--seeds",
        str(num_seeds),
        "--updates",
        str(updates),
        "--repeats",
        str(repeats),
    ]
    # Run from the repository root so that the worker for our side can import `algos`.
    done = subprocess.run(command, capture_output=True, text=True, cwd=REPO_ROOT, check=False)
    for line in reversed(done.stdout.splitlines()):
        if line.startswith(WORKER_MARKER):
            return json.loads(line[len(WORKER_MARKER) :])
    raise RuntimeError(
        f"{side} worker failed (exit {done.returncode}): {' '.join(command)}\n"
        f"--- stdout ---\n{done.stdout[-3000:]}\n--- stderr ---\n{done.stderr[-3000:]}"
    )


def format_table(rows: list[dict[str, Any]], with_rejax: bool) -> str:
    header = [
        "env",
        "num_envs",
        "seeds",
        "updates",
        "ours steps/s",
        "ours compile s",
        "ours RSS MiB",
    ]
    if with_rejax:
        header += ["rejax steps/s", "rejax compile s", "rejax RSS MiB", "ratio (ours/rejax)"]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    for row in rows:
        ours = row["ours"]
        cells = [
            row["env"],
            str(row["num_envs"]),
            str(row["seeds"]),
            str(row["updates"]),
            f"{ours['steps_per_s']:,.0f}",
            f"{ours['compile_s']:.1f}",
            f"{ours['peak_rss_mib']:.0f}",
        ]
        if with_rejax:
            rejax = row["rejax"]
            cells += [
                f"{rejax['steps_per_s']:,.0f}",
                f"{rejax['compile_s']:.1f}",
                f"{rejax['peak_rss_mib']:.0f}",
                f"{ours['steps_per_s'] / rejax['steps_per_s']:.2f}",
            ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def run_sweep(args: argparse.Namespace) -> None:
    with_rejax = args.rejax_python is not None
    rows = []
    for env_name in args.envs:
        for num_envs in args.num_envs:
            for num_seeds in args.seeds:
                updates = cell_updates(args.updates, args.max_env_steps, num_envs, num_seeds)
                row: dict[str, Any] = {
                    "env": env_name,
                    "num_envs": num_envs,
                    "seeds": num_seeds,
                    "updates": updates,
                }
                sides = [("ours", sys.executable)]
                if with_rejax:
                    sides.append(("rejax", args.rejax_python))
                for side, python in sides:
                    result = measure(
                        python, side, env_name, num_envs, num_seeds, updates, args.repeats
                    )
                    row[side] = result
                    print(
                        f"{env_name} num_envs={num_envs} seeds={num_seeds} updates={updates} "
                        f"{side}: {result['steps_per_s']:,.0f} steps/s, "
                        f"compile {result['compile_s']:.1f} s, run {result['run_s']:.2f} s",
                        file=sys.stderr,
                        flush=True,
                    )
                rows.append(row)

    print(format_table(rows, with_rejax))
    if args.json_out:
        report = {
            "settings": {
                "num_steps": NUM_STEPS,
                "num_epochs": NUM_EPOCHS,
                "num_minibatches": NUM_MINIBATCHES,
                "learning_rate": LEARNING_RATE,
                "hidden_sizes": HIDDEN_SIZES,
                "activation": ACTIVATION,
                "eval_episodes": EVAL_EPISODES,
                "updates": args.updates,
                "max_env_steps": args.max_env_steps,
                "repeats": args.repeats,
            },
            "machine": {"platform": platform.platform(), "cpu_count": os.cpu_count()},
            "rejax_python": args.rejax_python,
            "cells": rows,
        }
        Path(args.json_out).write_text(json.dumps(report, indent=2) + "\n")
        print(f"wrote {args.json_out}", file=sys.stderr)


# --------------------------------------------------------------------------------------------
# Command line


def _comma_list(cast: Callable[[str], Any]) -> Callable[[str], list[Any]]:
    return lambda text: [cast(item) for item in text.split(",") if item.strip()]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n", 1)[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument(
        "--envs",
        type=_comma_list(str),
        default=DEFAULT_ENVS,
        help="comma-separated environment names",
    )
    parser.add_argument(
        "--num_envs",
        type=_comma_list(int),
        default=DEFAULT_NUM_ENVS,
        help="comma-separated numbers of parallel environments",
    )
    parser.add_argument(
        "--seeds",
        type=_comma_list(int),
        default=DEFAULT_SEEDS,
        help="comma-separated numbers of seeds vmapped into one program",
    )
    parser.add_argument(
        "--updates",
        type=int,
        default=DEFAULT_UPDATES,
        help="PPO updates per run (before the --max_env_steps cap)",
    )
    parser.add_argument(
        "--max_env_steps",
        type=int,
        default=DEFAULT_MAX_ENV_STEPS,
        help="cap on env steps per run, summed over seeds; lowers --updates for "
        "large cells (at least one update is always run)",
    )
    parser.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="calls of each compiled function; the fastest is reported",
    )
    parser.add_argument(
        "--rejax_python",
        default=None,
        help="python of a venv with rejax + gymnax 0.0.9; enables the comparison",
    )
    parser.add_argument("--json_out", default=None, help="also write all results to this file")
    # Internal: measure a single cell in this process (used by the sweep's subprocesses).
    parser.add_argument("--worker", choices=("ours", "rejax"), default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.updates < 1 or args.repeats < 1 or args.max_env_steps < 1:
        parser.error("--updates, --repeats and --max_env_steps must be positive")
    if args.worker and not (len(args.envs) == len(args.num_envs) == len(args.seeds) == 1):
        parser.error("--worker measures one cell: give one env, one num_envs, one seeds value")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.worker:
        result = run_worker(
            args.worker, args.envs[0], args.num_envs[0], args.seeds[0], args.updates, args.repeats
        )
        print(WORKER_MARKER + json.dumps(result), flush=True)
    else:
        run_sweep(args)


if __name__ == "__main__":
    main()
