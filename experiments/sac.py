"""Train SAC on a continuous-control JAX environment, several seeds vmapped into one program.

    python experiments/sac.py --workdir=runs/pendulum
    python experiments/sac.py --config=experiments/configs/sac.py:pendulum_small --num_seeds=8
    python experiments/sac.py --config=experiments/configs/sac.py:halfcheetah   # needs [mujoco]

Environment steps, the replay buffer and the updates run inside compiled chunks; between chunks the
host loop checkpoints (buffer included), so a restarted script resumes from the newest checkpoint
and ends exactly where an uninterrupted run would. Results land in the run directory (see
../shared/DESIGN.md), ending with `summary.json`, whose `final_eval_return` is the mean over seeds
of the deterministic policy's return.
"""

from __future__ import annotations

import os
import signal
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import numpy as np  # noqa: E402
from absl import app, flags, logging  # noqa: E402
from ml_collections import config_flags  # noqa: E402

from algos import sac  # noqa: E402
from experiments._common import (  # noqa: E402
    REPO_ROOT,
    block_length,
    build_config,
    check_resumable,
    check_run_settings,
    chunk_lengths,
    fail,
)
from jaxrl.checkpoint import Checkpointer  # noqa: E402
from jaxrl.logging import MetricsSink, RunDirectory, to_jsonable  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file(
    "config",
    os.path.join(REPO_ROOT, "experiments", "configs", "sac.py:pendulum"),
    "Config file and preset (pendulum, pendulum_small, halfcheetah, hopper); override fields "
    "with --config.X=V.",
    lock_config=True,
)
_WORKDIR = flags.DEFINE_string(
    "workdir", None, "Run directory; an existing one is resumed. Default: runs/sac-<env>-<time>."
)
_NUM_SEEDS = flags.DEFINE_integer("num_seeds", 4, "Independent seeds, vmapped in one program.")
_SEED = flags.DEFINE_integer("seed", 0, "Base seed; run i uses fold i of PRNGKey(seed).")
_KILL_AFTER_CHUNK = flags.DEFINE_integer(
    "kill_after_chunk", None, "Testing aid: SIGKILL this process right after chunk K's checkpoint."
)


def main(argv: list[str]) -> None:
    logging.set_verbosity(logging.WARNING)  # orbax narrates every save at INFO
    if len(argv) > 1:
        fail(f"unexpected arguments {argv[1:]}; settings are flags, e.g. --config.batch_size=128")
    flat = _CONFIG.value
    config = build_config(sac.Config, flat)
    run = flat.run
    num_seeds = _NUM_SEEDS.value
    if num_seeds < 1:
        fail(f"--num_seeds must be >= 1, got {num_seeds}")
    check_run_settings(run, ("num_chunks", "checkpoint_every", "keep_checkpoints", "log_every"))
    workdir = _WORKDIR.value or os.path.join(
        "runs", f"sac-{config.env_name}-{time.strftime('%Y%m%d-%H%M%S')}"
    )

    run_dir = RunDirectory(workdir)
    resolved = to_jsonable({**flat.to_dict(), "num_seeds": num_seeds, "seed": _SEED.value})
    check_resumable(run_dir.saved_config(), resolved, workdir)
    run_dir.write_config(resolved)

    # Initial states (networks, optimisers and a buffer pre-filled with random actions) for all
    # seeds, and the hyper-parameters as per-seed pytree leaves.
    keys = jax.random.split(jax.random.PRNGKey(_SEED.value), num_seeds)
    init_keys, eval_keys = jax.vmap(jax.random.split, out_axes=1)(keys)
    hparams = jax.tree.map(lambda x: np.broadcast_to(x, (num_seeds,)), config.hparams())
    t0 = time.time()
    states = jax.jit(jax.vmap(lambda k, hp: sac.init(config, k, hp)))(init_keys, hparams)
    jax.block_until_ready(states)
    init_seconds = time.time() - t0

    checkpointer = Checkpointer(
        run_dir.checkpoint_dir, save_every=run.checkpoint_every, keep=run.keep_checkpoints
    )
    done = 0
    if checkpointer.latest_step() is not None:
        states, meta = checkpointer.restore(states)
        done = int(meta["iterations"])
        run_dir.truncate_metrics(done)
        print(f"Resuming {workdir} from iteration {done}/{config.num_iterations}.")

    block = block_length(config.num_iterations, run.log_every)
    lengths = chunk_lengths(config.num_iterations, run.num_chunks, block)
    sink = MetricsSink(
        run_dir,
        total_updates=config.num_iterations,
        steps_per_update=config.num_envs,
        num_runs=num_seeds,
        log_every=block,
        start_update=done,
        tensorboard=run.tensorboard,
        progress=run.progress,
        description=f"SAC {config.env_name} x{num_seeds} seeds",
    )
    t0 = time.time()
    compiled = {
        length: jax.jit(
            sac.make_train_chunk(config, length, callback=sink, callback_every=block),
            donate_argnums=0,
        )
        .lower(states, hparams)
        .compile()
        for length in set(lengths)
    }
    compile_seconds = time.time() - t0

    start = time.time()
    iterations = 0
    for chunk_index, length in enumerate(lengths):
        iterations += length
        if iterations <= done:
            continue  # done before the interruption
        states, _ = compiled[length](states, hparams)
        is_last = chunk_index == len(lengths) - 1
        checkpointer.save(chunk_index + 1, states, {"iterations": iterations}, force=is_last)
        if _KILL_AFTER_CHUNK.value == chunk_index + 1:
            os.kill(os.getpid(), signal.SIGKILL)
    jax.block_until_ready(states)
    sink.close()
    checkpointer.close()
    train_seconds = time.time() - start

    t0 = time.time()
    evaluate = jax.jit(jax.vmap(sac.make_evaluate(config)))
    eval_returns = np.asarray(evaluate(states, eval_keys).mean(axis=-1))
    eval_seconds = time.time() - t0

    trained_steps = (config.num_iterations - done) * config.num_envs
    summary = {
        "algo": "sac",
        "env": config.env_name,
        "num_seeds": num_seeds,
        "wall_seconds": round(init_seconds + compile_seconds + train_seconds + eval_seconds, 2),
        "compile_seconds": round(compile_seconds, 2),
        "env_steps": config.total_timesteps,  # per seed, random warm-up included
        "env_steps_per_second": round(trained_steps * num_seeds / max(train_seconds, 1e-9)),
        "gradient_steps": config.num_iterations * config.gradient_steps_per_iteration,
        "final_eval_return": float(eval_returns.mean()),
        "final_eval_return_per_seed": eval_returns.tolist(),
        "median_eval_return": float(np.median(eval_returns)),
        "eval_episodes": config.eval_episodes,
        "resumed_from_iteration": done,
    }
    run_dir.write_summary(summary)
    run_dir.write_learning_curve(title=f"SAC {config.env_name}")
    print(
        f"SAC {config.env_name}: final_eval_return {summary['final_eval_return']:.1f} "
        f"(per seed {np.round(eval_returns, 1).tolist()}) after {config.total_timesteps:,} env "
        f"steps x {num_seeds} seeds in {summary['wall_seconds']:.0f}s "
        f"(compile {compile_seconds:.0f}s). Run directory: {run_dir.path}"
    )


if __name__ == "__main__":
    app.run(main)
