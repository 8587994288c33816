"""SAC training throughput: our `algos.sac` against rejax's SAC, with the same hyper-parameters.

The setting is the one rejax's own SAC benchmark uses (/work/shared/peers/rejax_sac_bench.py):
Pendulum-v1, 20,000 environment steps per seed, 1 environment, the first 1,000 steps filling the
replay buffer, then 1 gradient step per environment step (19,000 in all) on batches of 256 from a
buffer of 20,000; Adam with learning rate 3e-4 for actor, critics and temperature, gamma 0.99,
target critics Polyak-averaged with tau 0.01 (rejax's polyak 0.99) after every step, an actor and
2 critics that are 64x64 ReLU MLPs, initial temperature 1, target entropy -1 (-action_dim), no
gradient clipping, no observation or reward normalisation.

Rows of the table (seeds x evaluation), each measured for both sides:

* seeds:       1 seed is `jax.jit(train)(key)`; N > 1 seeds are one program,
               `jax.jit(jax.vmap(train))(keys)` (`--seeds`, default 1 and 4).
* evaluation:  `final`: the run ends with one evaluation of 128 episodes on both sides; the
               final eval return is ours' `metrics["eval_return"]` (deterministic policy,
               tanh of the mean) and the mean of rejax's 128 returns (rejax's `act` samples from
               the policy). rejax is told `skip_initial_evaluation=True` and
               `eval_freq=total_timesteps`, so it evaluates once, at the end, like us; rejax's
               own benchmark script keeps its initial evaluation too (two evaluations of 128
               x 200 steps, a few hundred milliseconds more). `none`: training only, ours with
               `final_evaluation=False` and rejax with its evaluation callback replaced by one
               that returns zeros (rejax's `train` always calls it once per `eval_freq`); this
               is the row that compares training speed alone.

What is measured, per row and side, in a fresh worker process (this script re-invoked with a
hidden `--worker` flag; ours with this interpreter, rejax with `--rejax_python`, one after the
other, never at once; `--runs` such pairs per row, the table shows medians):

* compile s:   wall time of `jax.jit(fn).lower(args).compile()` (tracing + XLA); building the
               config / algorithm object beforehand is not counted. The persistent compilation
               cache is off in the workers.
* steps/s:     seeds * 20,000 env steps (the 1,000 fill steps included) / run seconds, where run
               seconds is the best of `--repeats` calls of the compiled function, each followed
               by `jax.block_until_ready`. A call takes 13-75 s here and a second call was
               within 2% of the first, so one call (the default) is enough.
* peak RSS:    `ru_maxrss` of the worker process.
* load:        the 1-minute load average when the worker started and ended, and the worker's CPU
               seconds per wall second over the timed calls: above 2 load on 2 cores, someone
               else was using the cores too.

Each side runs as its users would run it: ours with the XLA_FLAGS that importing `jaxrl` sets
(the concurrency-optimised scheduler off), rejax with XLA's defaults (`--rejax_xla_flags ours`
gives rejax our flags).

What cannot be made identical (rejax's code, version 0.1.3):

* buffer fill: rejax fills its buffer with the untrained actor's sampled actions (its training
  iterations run from step 0 and skip the update until `fill_buffer` steps are stored); ours with
  uniformly random actions in a separate warm-up scan before the learning loop.
* the fill phase under vmap: rejax skips updates with `lax.cond(global_step > fill_buffer, ...)`.
  With several seeds `global_step` is batched, so `vmap` turns the cond into a select that
  computes both branches: rejax's vmapped runs compute 20,000 gradient steps (the first 1,000
  thrown away), ours 19,000. With one seed the cond really skips them (19,000 on both sides).
  Its target update goes through the same kind of cond.
* batch sampling: rejax draws each batch without replacement, `jax.random.choice(..., p=...,
  replace=False)` over all 20,000 buffer rows (a Gumbel top-k over the whole buffer per gradient
  step); ours draws 256 indices with replacement from the filled part.
* time limits: gymnax's Pendulum (0.0.9) reports the 200-step time limit as `done`, and rejax
  uses `done` as termination in its TD target (no bootstrap at the time limit); ours bootstraps
  from the final observation of a truncated episode and stores only terminations as terminal.
* losses: rejax's critic loss is optax's `l2_loss` (half the squared error), ours the squared
  error; rejax's temperature loss is -alpha * (log pi + target), ours -log(alpha) * (...); rejax
  updates the actor first, then the critics (with the new actor's next actions), then the
  temperature; ours the critics, then the actor against the updated critics, then the
  temperature. rejax chains `optax.clip(inf)` before Adam (a no-op). Same amount of work.
* networks: the same layer shapes on both sides (4,546 actor and 9,090 critic parameters,
  recorded in the JSON), but rejax initialises with Flax's default (LeCun normal), ours with
  orthogonal weights; rejax clips the actor's log-std to [-10, 2], ours to [-5, 2]; rejax
  evaluates its twin critics with `jax.vmap` over stacked parameters, ours with `nn.vmap`
  (the same batched matmuls).
* evaluation (row `final` only): rejax samples actions, ours takes tanh(mean); Pendulum episodes
  are always 200 steps, so both evaluate 128 x 200 steps, but returns are not of the same policy
  kind (stochastic vs deterministic) and come from different training runs.

Set up the rejax environment once (rejax 0.1.3 needs gymnax 0.0.9; we need gymnax 1.x):

    python -m venv /tmp/rejax && /tmp/rejax/bin/pip install rejax gymnax==0.0.9

Then, from the repository root:

    python experiments/benchmarks/sac_throughput.py --rejax_python /tmp/rejax/bin/python \\
        --json_out sac_throughput.json
    python experiments/benchmarks/sac_throughput.py --seeds 1 --evals none --runs 1 \\
        --rejax_python /tmp/rejax/bin/python                              # a quick check
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
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
# Run directly, the script's own folder is on sys.path, not the repository root. At module level
# only the standard-library helpers in `_shared` are imported from the repository, so the rejax
# worker (another venv) never loads jaxrl.
sys.path.insert(0, str(REPO_ROOT))

from experiments.benchmarks._shared import (  # noqa: E402
    comma_list,
    fmt,
    log,
    marked_json,
    median_of,
)

# rejax's benchmark settings, the same on both sides.
ENV_NAME = "Pendulum-v1"
TOTAL_TIMESTEPS = 20_000
FILL_STEPS = 1_000
BUFFER_SIZE = 20_000
BATCH_SIZE = 256
LEARNING_RATE = 3e-4
GAMMA = 0.99
TAU = 0.01  # rejax: polyak = 1 - tau = 0.99
HIDDEN_SIZES = (64, 64)
ACTIVATION = "relu"
NUM_CRITICS = 2
INIT_ALPHA = 1.0
TARGET_ENTROPY = -1.0  # -action_dim; rejax's fixed choice for box actions
EVAL_EPISODES = 128  # rejax always evaluates 128 episodes

DEFAULT_SEEDS = "1,4"
DEFAULT_EVALS = "final,none"
DEFAULT_REPEATS = 1
DEFAULT_RUNS = 1
DEFAULT_TIMEOUT_S = 300

COMPILED_MARKER = "SAC_THROUGHPUT_COMPILED "
RESULT_MARKER = "SAC_THROUGHPUT_RESULT "


# --------------------------------------------------------------------------------------------
# Worker side: build one train function, compile it, time it, print one JSON line.


def _ours(evaluate: bool) -> tuple[Any, dict[str, int]]:
    """Our train function and the parameter counts of its networks."""
    import jax

    from algos import sac

    config = sac.Config(
        env_name=ENV_NAME,
        total_timesteps=TOTAL_TIMESTEPS,
        num_envs=1,
        learning_starts=FILL_STEPS,
        buffer_size=BUFFER_SIZE,
        batch_size=BATCH_SIZE,
        utd_ratio=1.0,
        gamma=GAMMA,
        tau=TAU,
        actor_lr=LEARNING_RATE,
        critic_lr=LEARNING_RATE,
        alpha_lr=LEARNING_RATE,
        init_alpha=INIT_ALPHA,
        autotune_alpha=True,
        target_entropy=TARGET_ENTROPY,
        num_critics=NUM_CRITICS,
        hidden_sizes=HIDDEN_SIZES,
        activation=ACTIVATION,
        eval_episodes=EVAL_EPISODES,
    )
    shapes = jax.eval_shape(lambda key: sac.init(config, key), jax.random.PRNGKey(0))
    params = {
        "actor": _count(shapes.actor_params),
        "critics": _count(shapes.critic_params),
    }
    return sac.make_train(config, final_evaluation=evaluate), params


def _rejax(evaluate: bool) -> tuple[Any, dict[str, int]]:
    """rejax's train function with the same settings (differences: the module docstring)."""
    import jax
    import jax.numpy as jnp
    from rejax import SAC

    algo = SAC.create(
        env=ENV_NAME,
        total_timesteps=TOTAL_TIMESTEPS,
        eval_freq=TOTAL_TIMESTEPS,  # a single evaluation, at the end
        skip_initial_evaluation=True,
        num_envs=1,
        fill_buffer=FILL_STEPS,
        buffer_size=BUFFER_SIZE,
        batch_size=BATCH_SIZE,
        num_epochs=1,  # gradient steps per environment step
        learning_rate=LEARNING_RATE,
        gamma=GAMMA,
        polyak=1.0 - TAU,
        target_update_freq=1,
        num_critics=NUM_CRITICS,
        hidden_layer_sizes=HIDDEN_SIZES,
        agent_kwargs={"activation": ACTIVATION},
    )
    if not evaluate:
        # rejax's train calls the callback once per eval_freq steps; it returns (lengths, returns).
        algo = algo.replace(eval_callback=lambda algo, ts, rng: (jnp.zeros(1), jnp.zeros(1)))
    shapes = jax.eval_shape(algo.init_state, jax.random.PRNGKey(0))
    params = {
        "actor": _count(shapes.actor_ts.params),
        "critics": _count(shapes.critic_ts.params),
    }
    return algo.train, params


def _count(tree: Any) -> int:
    import math

    import jax

    return sum(math.prod(leaf.shape) for leaf in jax.tree.leaves(tree))


def _final_return(side: str, output: Any) -> float | None:
    """Mean final evaluation return over seeds (and rejax's 128 episodes)."""
    _, metrics = output
    if side == "ours":
        return float(metrics["eval_return"].mean()) if "eval_return" in metrics else None
    _, returns = metrics  # rejax: (lengths, returns), returns [..., num_evals, 128]
    return float(returns[..., -1, :].mean())


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def run_worker(side: str, num_seeds: int, evaluate: bool, repeats: int) -> dict[str, Any]:
    """Compile and time one side of one row in this process; returns the measurements."""
    load_start = os.getloadavg()[0]
    import jax

    # A persistent cache hit would make compile time meaningless.
    jax.config.update("jax_enable_compilation_cache", False)

    train, params = _ours(evaluate) if side == "ours" else _rejax(evaluate)
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
    cpu_start = cpu_seconds()
    for _ in range(repeats):
        start = time.perf_counter()
        output = jax.block_until_ready(compiled(args))
        run_times.append(time.perf_counter() - start)
    cpu_per_wall = (cpu_seconds() - cpu_start) / sum(run_times)
    run_s = min(run_times)

    env_steps = num_seeds * TOTAL_TIMESTEPS
    return {
        "side": side,
        "seeds": num_seeds,
        "eval": "final" if evaluate else "none",
        "env_steps": env_steps,
        "compile_s": compile_s,
        "run_s": run_s,
        "run_s_all": run_times,
        "steps_per_s": env_steps / run_s,
        "eval_return": _final_return(side, output) if evaluate else None,
        # Linux reports ru_maxrss in KiB.
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "params": params,
        "cpu_per_wall": cpu_per_wall,
        "loadavg_start": load_start,
        "loadavg_end": os.getloadavg()[0],
        "backend": jax.default_backend(),
        "jax_version": jax.__version__,
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
    }


# --------------------------------------------------------------------------------------------
# Parent side: every row, ours then rejax's in fresh processes, then the table.

# XLA_FLAGS as the user set them, before anything of ours touched them.
USER_XLA_FLAGS = os.environ.get("XLA_FLAGS", "")


def jaxrl_xla_flags() -> str:
    """XLA_FLAGS as importing jaxrl sets them: the user's plus its CPU runtime workaround."""
    from jaxrl import with_cpu_workarounds

    return with_cpu_workarounds(USER_XLA_FLAGS)


def measure(python: str, side: str, seeds: int, evaluation: str, args: argparse.Namespace):
    """One worker process for one side of one row: its result with status "ok", or status
    "timeout" (with the compile time if compilation had finished) or "error"."""
    command = [python, str(Path(__file__).resolve()), "--worker", side, "--seeds", str(seeds)]
    command += ["--evals", evaluation, "--repeats", str(args.repeats)]
    env = dict(os.environ)
    if side == "rejax" and args.rejax_xla_flags == "default":
        env["XLA_FLAGS"] = USER_XLA_FLAGS
    else:
        env["XLA_FLAGS"] = jaxrl_xla_flags()
    start = time.perf_counter()
    try:
        done = subprocess.run(
            command,
            capture_output=True,
            text=True,
            cwd=REPO_ROOT,  # so that our worker can import `algos`
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
    return {"status": "ok", **result, "process_wall_s": time.perf_counter() - start}


def describe(result: dict[str, Any]) -> str:
    if result["status"] == "ok":
        ret = result["eval_return"]
        return (
            f"{result['steps_per_s']:,.0f} steps/s (run {result['run_s']:.2f} s), compile "
            f"{result['compile_s']:.1f} s, peak RSS {result['peak_rss_mib']:.0f} MiB, eval return "
            f"{'-' if ret is None else f'{ret:.1f}'}, load {result['loadavg_start']:.1f}"
            f"->{result['loadavg_end']:.1f}, cpu/wall {result['cpu_per_wall']:.2f}"
        )
    if result["status"] == "timeout":
        compiled = f"compiled in {result['compile_s']:.1f} s, " if "compile_s" in result else ""
        return f"TIMEOUT ({compiled}killed after {result['timeout_s']} s)"
    return f"ERROR (exit {result['returncode']}):\n{result['stderr']}"


KEYS = ("steps_per_s", "compile_s", "peak_rss_mib", "eval_return", "run_s", "loadavg_start")


def summarise(row: dict[str, Any], sides: list[str]) -> None:
    """Medians over the row's ok runs, per side, and the ratios ours/rejax of the medians."""
    row["median"] = {}
    for side in sides:
        ok = [r for r in row[side] if r["status"] == "ok"]
        row["median"][side] = {key: median_of(ok, key) for key in KEYS}
        row["median"][side]["ok_runs"] = len(ok)
    if "rejax" in sides:
        ours, rejax = row["median"]["ours"], row["median"]["rejax"]
        row["ratio"] = {
            key: ours[key] / rejax[key] if ours[key] and rejax[key] else None
            for key in ("steps_per_s", "compile_s", "peak_rss_mib")
        }


def format_table(rows: list[dict[str, Any]], sides: list[str]) -> str:
    header = ["seeds", "eval"]
    for side in sides:
        header += [f"{side} steps/s", f"{side} compile s", f"{side} RSS MiB", f"{side} return"]
    if "rejax" in sides:
        header += ["steps/s ours/rejax", "compile ours/rejax", "RSS ours/rejax"]
    header += ["load"]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    for row in rows:
        cells = [str(row["seeds"]), row["eval"]]
        loads = []
        for side in sides:
            m = row["median"][side]
            if not m["ok_runs"]:
                cells += [row[side][-1]["status"], "-", "-", "-"]
                continue
            rates = [r["steps_per_s"] for r in row[side] if r["status"] == "ok"]
            spread = f" ({min(rates):,.0f}-{max(rates):,.0f})" if len(rates) > 1 else ""
            cells += [
                f"{m['steps_per_s']:,.0f}{spread}",
                fmt(m["compile_s"], ".1f"),
                fmt(m["peak_rss_mib"], ".0f"),
                fmt(m["eval_return"], ".1f"),
            ]
            loads += [r["loadavg_start"] for r in row[side] if r["status"] == "ok"]
        if "rejax" in sides:
            ratio = row["ratio"]
            cells += [fmt(ratio[k], ".2f") for k in ("steps_per_s", "compile_s", "peak_rss_mib")]
        cells.append(f"{min(loads):.1f}-{max(loads):.1f}" if loads else "-")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def run_benchmark(args: argparse.Namespace) -> None:
    """Every row, ours then rejax's (never both at once: they would compete for the cores)."""
    sides = [("ours", sys.executable)]
    if args.rejax_python:
        sides.append(("rejax", args.rejax_python))
    log(f"XLA_FLAGS ours: {jaxrl_xla_flags()!r}")
    if args.rejax_python:
        flags = USER_XLA_FLAGS if args.rejax_xla_flags == "default" else jaxrl_xla_flags()
        log(f"XLA_FLAGS rejax: {flags!r}")
    rows = [
        {"seeds": seeds, "eval": evaluation, **{side: [] for side, _ in sides}}
        for seeds in args.seeds
        for evaluation in args.evals
    ]
    for run in range(args.runs):
        for row in rows:
            for side, python in sides:
                result = measure(python, side, row["seeds"], row["eval"], args)
                row[side].append(result)
                log(
                    f"[{run + 1}/{args.runs}] seeds={row['seeds']} eval={row['eval']} {side}: "
                    f"{describe(result)}"
                )
    names = [side for side, _ in sides]
    for row in rows:
        summarise(row, names)
    print(format_table(rows, names))
    print(
        f"\nMedians over {args.runs} worker process(es) per cell (range of steps/s in brackets), "
        f"each the best of {args.repeats} calls; steps/s counts {TOTAL_TIMESTEPS:,} env steps "
        f"per seed, all seeds; load = 1-minute load average at worker start ({os.cpu_count()} "
        f"CPUs)."
    )
    if args.json_out:
        report = {
            "settings": {
                "env": ENV_NAME,
                "total_timesteps": TOTAL_TIMESTEPS,
                "fill_steps": FILL_STEPS,
                "buffer_size": BUFFER_SIZE,
                "batch_size": BATCH_SIZE,
                "learning_rate": LEARNING_RATE,
                "gamma": GAMMA,
                "tau": TAU,
                "hidden_sizes": HIDDEN_SIZES,
                "activation": ACTIVATION,
                "num_critics": NUM_CRITICS,
                "init_alpha": INIT_ALPHA,
                "target_entropy": TARGET_ENTROPY,
                "eval_episodes": EVAL_EPISODES,
                "repeats": args.repeats,
                "runs": args.runs,
                "xla_flags_ours": jaxrl_xla_flags(),
                "rejax_xla_flags": args.rejax_xla_flags,
            },
            "machine": {"platform": platform.platform(), "cpu_count": os.cpu_count()},
            "rejax_python": args.rejax_python,
            "rows": rows,
        }
        Path(args.json_out).write_text(json.dumps(report, indent=2) + "\n")
        log(f"wrote {args.json_out}")


# --------------------------------------------------------------------------------------------
# Command line


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n", 1)[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    add = parser.add_argument
    add(
        "--seeds",
        type=comma_list(int),
        default=DEFAULT_SEEDS,
        help="comma-separated numbers of seeds vmapped into one program",
    )
    add(
        "--evals",
        type=comma_list(str),
        default=DEFAULT_EVALS,
        help="comma-separated: 'final' (one 128-episode evaluation at the end), 'none' "
        "(training only)",
    )
    add(
        "--repeats",
        type=int,
        default=DEFAULT_REPEATS,
        help="calls of each compiled function in a worker; the fastest is reported",
    )
    add("--runs", type=int, default=DEFAULT_RUNS, help="worker processes per side and row")
    add(
        "--rejax_xla_flags",
        choices=("default", "ours"),
        default="default",
        help="'default': rejax runs with XLA's default CPU flags, as its users run it; 'ours': "
        "with the flags importing jaxrl sets",
    )
    add(
        "--timeout", type=float, default=DEFAULT_TIMEOUT_S, help="seconds before a worker is killed"
    )
    add(
        "--rejax_python",
        default=None,
        help="python of a venv with rejax 0.1.3 and gymnax 0.0.9; adds rejax's SAC to every row",
    )
    add("--json_out", default=None, help="also write every measurement to this JSON file")
    # Internal: measure one side of one row in this process.
    add("--worker", choices=("ours", "rejax"), default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if min(args.repeats, args.runs, args.timeout, *args.seeds) <= 0:
        parser.error("--seeds, --repeats, --runs and --timeout must be positive")
    if set(args.evals) - {"final", "none"} or not args.evals:
        parser.error("--evals takes 'final' and/or 'none'")
    if args.worker and not len(args.seeds) == len(args.evals) == 1:
        parser.error("--worker measures one row: give one --seeds and one --evals value")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.worker is None:
        run_benchmark(args)
        return
    result = run_worker(args.worker, args.seeds[0], args.evals[0] == "final", args.repeats)
    print(RESULT_MARKER + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
