"""Train PPO on a JAX environment, several seeds vmapped into one compiled program.

    python experiments/ppo.py --workdir=runs/cartpole
    python experiments/ppo.py --config=experiments/configs/ppo.py:pendulum --num_seeds=4
    python experiments/ppo.py --config.learning_rate=1e-3 --config.total_timesteps=200000

The run is a host loop over compiled chunks of updates; between chunks it checkpoints. Restarted on
an existing --workdir, it resumes from the newest checkpoint and ends exactly where an
uninterrupted run would. Results land in the run directory (see ../shared/DESIGN.md), ending with
`summary.json`, whose `final_eval_return` is the mean over seeds of the deterministic policy's
return.
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

from algos import ppo  # noqa: E402
from experiments._common import (  # noqa: E402
    REPO_ROOT,
    build_config,
    check_resumable,
    check_run_settings,
    chunk_lengths,
    fail,
)  # noqa: E402
from jaxrl.checkpoint import Checkpointer  # noqa: E402
from jaxrl.logging import MetricsSink, RunDirectory, to_jsonable  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file(
    "config",
    os.path.join(REPO_ROOT, "experiments", "configs", "ppo.py:cartpole"),
    "Config file and preset (cartpole, pendulum, breakout); override fields with --config.X=V.",
    lock_config=True,
)
_WORKDIR = flags.DEFINE_string(
    "workdir", None, "Run directory; an existing one is resumed. Default: runs/ppo-<env>-<time>."
)
_NUM_SEEDS = flags.DEFINE_integer("num_seeds", 4, "Independent seeds, vmapped in one program.")
_SEED = flags.DEFINE_integer("seed", 0, "Base seed; run i uses fold i of PRNGKey(seed).")
_KILL_AFTER_CHUNK = flags.DEFINE_integer(
    "kill_after_chunk", None, "Testing aid: SIGKILL this process right after chunk K's checkpoint."
)


def validate_run_settings(run, num_seeds: int) -> None:
    """Settings of the experiment driver, checked before anything compiles."""
    if num_seeds < 1:
        fail(f"--num_seeds must be >= 1, got {num_seeds}")
    check_run_settings(run, ("num_chunks", "checkpoint_every", "keep_checkpoints", "log_every"))


def main(argv: list[str]) -> None:
    logging.set_verbosity(logging.WARNING)  # orbax narrates every save at INFO
    if len(argv) > 1:
        fail(f"unexpected arguments {argv[1:]}; settings are flags, e.g. --config.num_envs=8")
    flat = _CONFIG.value
    config = build_config(ppo.Config, flat)
    run = flat.run
    num_seeds = _NUM_SEEDS.value
    validate_run_settings(run, num_seeds)
    workdir = _WORKDIR.value or os.path.join(
        "runs", f"ppo-{config.env_name}-{time.strftime('%Y%m%d-%H%M%S')}"
    )

    run_dir = RunDirectory(workdir)
    resolved = to_jsonable({**flat.to_dict(), "num_seeds": num_seeds, "seed": _SEED.value})
    check_resumable(run_dir.saved_config(), resolved, workdir)
    run_dir.write_config(resolved)

    # Initial states for all seeds, and the hyper-parameters as per-seed pytree leaves.
    keys = jax.random.split(jax.random.PRNGKey(_SEED.value), num_seeds)
    init_keys, eval_keys = jax.vmap(jax.random.split, out_axes=1)(keys)
    hparams = jax.tree.map(lambda x: np.broadcast_to(x, (num_seeds,)), config.hparams())
    states = jax.jit(jax.vmap(lambda k, hp: ppo.init(config, k, hp)))(init_keys, hparams)

    checkpointer = Checkpointer(
        run_dir.checkpoint_dir, save_every=run.checkpoint_every, keep=run.keep_checkpoints
    )
    done_updates = 0
    if checkpointer.latest_step() is not None:
        states, meta = checkpointer.restore(states)
        done_updates = int(meta["updates"])
        run_dir.truncate_metrics(done_updates)
        print(f"Resuming {workdir} from update {done_updates}/{config.num_updates}.")

    lengths = chunk_lengths(config.num_updates, run.num_chunks)

    sink = MetricsSink(
        run_dir,
        total_updates=config.num_updates,
        steps_per_update=config.batch_size,
        num_runs=num_seeds,
        log_every=run.log_every,
        start_update=done_updates,
        tensorboard=run.tensorboard,
        progress=run.progress,
        description=f"PPO {config.env_name} x{num_seeds} seeds",
    )
    # Compile each distinct chunk length up front: compile time is reported on its own.
    t0 = time.time()
    compiled = {
        length: jax.jit(ppo.make_train_chunk(config, length, callback=sink), donate_argnums=0)
        .lower(states, hparams)
        .compile()
        for length in set(lengths)
    }
    compile_seconds = time.time() - t0

    start = time.time()
    updates = 0
    for chunk_index, length in enumerate(lengths):
        updates += length
        if updates <= done_updates:
            continue  # done before the interruption
        states, _ = compiled[length](states, hparams)
        is_last = chunk_index == len(lengths) - 1
        checkpointer.save(chunk_index + 1, states, {"updates": updates}, force=is_last)
        if _KILL_AFTER_CHUNK.value == chunk_index + 1:
            os.kill(os.getpid(), signal.SIGKILL)
    jax.block_until_ready(states)
    sink.close()
    checkpointer.close()
    train_seconds = time.time() - start

    t0 = time.time()
    evaluate = jax.jit(jax.vmap(ppo.make_evaluate(config)))
    eval_returns = np.asarray(evaluate(states, eval_keys).mean(axis=-1))
    eval_seconds = time.time() - t0

    env_steps = config.num_updates * config.batch_size
    summary = {
        "algo": "ppo",
        "env": config.env_name,
        "num_seeds": num_seeds,
        "wall_seconds": round(compile_seconds + train_seconds + eval_seconds, 2),
        "compile_seconds": round(compile_seconds, 2),
        "env_steps": env_steps,  # per seed
        "env_steps_per_second": round(
            (env_steps - done_updates * config.batch_size) * num_seeds / max(train_seconds, 1e-9)
        ),  # fmt: skip
        "updates": config.num_updates,
        "final_eval_return": float(eval_returns.mean()),
        "final_eval_return_per_seed": eval_returns.tolist(),
        "eval_episodes": config.eval_episodes,
        "resumed_from_update": done_updates,
    }
    run_dir.write_summary(summary)
    run_dir.write_learning_curve(title=f"PPO {config.env_name}")
    print(
        f"PPO {config.env_name}: final_eval_return {summary['final_eval_return']:.1f} "
        f"(per seed {np.round(eval_returns, 1).tolist()}) after {env_steps:,} env steps x "
        f"{num_seeds} seeds in {summary['wall_seconds']:.0f}s "
        f"(compile {compile_seconds:.0f}s). Run directory: {run_dir.path}"
    )


if __name__ == "__main__":
    app.run(main)
