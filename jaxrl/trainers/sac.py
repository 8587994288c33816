"""SAC on a continuous-control JAX environment, several seeds vmapped into one program: what
`experiments/sac.py` runs (`jaxrl.trainers.base` describes the trainers' shape).

    from jaxrl.trainers import sac
    result = sac.train(sac.config("pendulum"), "runs/pendulum", num_seeds=4)
    result.summary["final_eval_return"]
"""

from __future__ import annotations

import functools
import time
from typing import Any

import jax
import numpy as np

from algos import sac
from jaxrl import retention, runner
from jaxrl.config import build_config
from jaxrl.trainers import base

config = functools.partial(base.load_config, "sac")


@base.control_trainer("sac")
def train(flat: Any, workdir: str | None, seeds: Any, kill_after_chunk: int | None) -> base.Result:
    """Train SAC (`config`: experiments/configs/sac.py's, default preset pendulum) for
    `num_seeds` seeds from PRNGKey(`seed`) in `workdir`; returns the final states and summary."""
    config = build_config(sac.Config, flat)
    workdir = base.workdir_or_default(workdir, f"sac-{config.env_name}")
    algorithm = sac.make(config)
    job = runner.seeded_job(
        "sac",
        f"SAC {config.env_name}",
        algorithm,
        config,
        seeds,
        units_per_step=config.num_envs,  # environment steps per update (the warm-up's aside)
        # An update is about a millisecond, and asking about Ctrl-C after each one costs a third
        # (Pendulum, 2 seeds, 2-core CPU: 896 vs 1283 updates/s): ask every 50.
        check_every=50,
    )
    finished = runner.finished_result(workdir, seeds.record(flat), job)
    if finished is not None:  # the run asked for had finished: its recorded result
        return base.Result(*finished)
    run_dir = runner.open_run(workdir, seeds.record(flat))
    result = runner.train(job, flat.run, run_dir, kill_after_chunk)

    t0 = time.time()
    returns = jax.jit(jax.vmap(algorithm.evaluate))(result.states, seeds.eval_keys)["eval_return"]
    eval_returns = np.asarray(returns.mean(axis=-1))
    summary = runner.summary_fields(job, result, time.time() - t0)
    summary |= {
        "env": config.env_name,
        "env_steps": config.total_timesteps,  # per seed, the random warm-up included
        "env_steps_per_second": round(summary["steps_per_second"] * config.num_envs),
        "gradient_steps": config.num_steps * config.gradient_steps_per_update,
        "final_eval_return": float(eval_returns.mean()),
        "final_eval_return_per_seed": eval_returns.tolist(),
        "median_eval_return": float(np.median(eval_returns)),
        "eval_episodes": config.eval_episodes,
    }
    run_dir.write_summary(summary)
    run_dir.write_learning_curve(title=f"SAC {config.env_name}")
    where = retention.finish(run_dir)  # summary.json is written: the final state may go
    print(
        f"SAC {config.env_name}: final_eval_return {summary['final_eval_return']:.1f} "
        f"(per seed {np.round(eval_returns, 1).tolist()}) after {config.total_timesteps:,} env "
        f"steps x {seeds.count} seeds in {summary['wall_seconds']:.0f}s "
        f"(compile {summary['compile_seconds']:.0f}s). {where}"
    )
    return base.Result(result.states, summary, run_dir.path)
