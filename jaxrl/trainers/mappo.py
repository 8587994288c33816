"""MAPPO / IPPO on a multi-agent JAX environment, several seeds vmapped into one program: what
`experiments/mappo.py` runs (`jaxrl.trainers.base` describes the trainers' shape; needs the
`marl` extra).

    from jaxrl.trainers import mappo
    result = mappo.train(mappo.config("mappo_spread"), "runs/spread", num_seeds=2)
"""

from __future__ import annotations

import functools
import time
from typing import Any

import jax
import numpy as np

from jaxrl import extras, retention, runner
from jaxrl.config import build_config
from jaxrl.trainers import base

config = functools.partial(base.load_config, "mappo")


@base.control_trainer("mappo")
def train(flat: Any, workdir: str | None, seeds: Any, kill_after_chunk: int | None) -> base.Result:
    """Train MAPPO or IPPO (config.critic; `config`: experiments/configs/mappo.py's) for
    `num_seeds` seeds from PRNGKey(`seed`) in `workdir`; returns the final states and summary."""
    extras.require("marl", "jaxrl.trainers.mappo")
    from algos import mappo

    config = build_config(mappo.Config, flat)
    name = {"independent": "IPPO", "centralised": "MAPPO"}[config.critic]
    workdir = base.workdir_or_default(workdir, f"{name.lower()}-{config.env_name.split(':')[-1]}")
    algorithm = mappo.make(config)
    job = runner.seeded_job(
        name.lower(),
        f"{name} {config.env_name}",
        algorithm,
        config,
        seeds,
        units_per_step=config.env_steps_per_update,
        check_every=10,  # an update is milliseconds: ask about Ctrl-C every 10 (tens of ms)
    )
    finished = runner.finished_result(workdir, seeds.record(flat), job)
    if finished is not None:  # the run asked for had finished: its recorded result
        return base.Result(*finished)
    run_dir = runner.open_run(workdir, seeds.record(flat))
    result = runner.train(job, flat.run, run_dir, kill_after_chunk)

    t0 = time.time()
    returns = jax.jit(jax.vmap(algorithm.evaluate))(result.states, seeds.eval_keys)["eval_return"]
    eval_returns = np.asarray(returns.mean(axis=-1))
    train_returns = np.asarray(result.states.env_state.last_return).sum(axis=-1).mean(axis=-1)
    summary = runner.summary_fields(job, result, time.time() - t0)
    env_steps = config.num_steps * config.env_steps_per_update
    summary |= {
        "env": config.env_name,
        "critic": config.critic,
        "env_steps": env_steps,  # per seed
        "env_steps_per_second": round(summary["steps_per_second"] * config.env_steps_per_update),
        "final_eval_return": float(eval_returns.mean()),
        "final_eval_return_per_seed": eval_returns.tolist(),
        "final_train_return": float(train_returns.mean()),
        "final_train_return_per_seed": train_returns.tolist(),
        "eval_episodes": config.eval_episodes,
    }
    run_dir.write_summary(summary)
    run_dir.write_learning_curve(title=f"{name} {config.env_name}")
    where = retention.finish(run_dir)  # summary.json is written: the final state may go
    print(
        f"{name} {config.env_name}: final_eval_return {summary['final_eval_return']:.1f} "
        f"(per seed {np.round(eval_returns, 1).tolist()}), training return "
        f"{summary['final_train_return']:.1f}, after {env_steps:,} env steps x {seeds.count} "
        f"seeds in {summary['wall_seconds']:.0f}s (compile {summary['compile_seconds']:.0f}s). "
        f"{where}"
    )
    return base.Result(result.states, summary, run_dir.path)
