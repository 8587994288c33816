"""PPO on a JAX environment, several seeds vmapped into one compiled program: what
`experiments/ppo.py` runs (`jaxrl.trainers.base` describes the trainers' shape).

    from jaxrl.trainers import ppo
    config = ppo.config("cartpole")
    config.total_timesteps = 50_000
    result = ppo.train(config, "runs/cartpole", num_seeds=4)
    result.summary["final_eval_return"]   # the deterministic policy's return, mean over seeds
"""

from __future__ import annotations

import functools
import time
from typing import Any

import numpy as np

import envs
from algos import ppo
from jaxrl import retention, runner
from jaxrl.config import build_config
from jaxrl.trainers import base

config = functools.partial(base.load_config, "ppo")


@base.control_trainer("ppo")
def train(flat: Any, workdir: str | None, seeds: Any, kill_after_chunk: int | None) -> base.Result:
    """Train PPO (`config`: experiments/configs/ppo.py's, default preset cartpole) for `num_seeds`
    seeds from PRNGKey(`seed`) in `workdir`; returns the final states and the summary."""
    config = build_config(ppo.Config, flat)
    workdir = base.workdir_or_default(workdir, f"ppo-{config.env_name}")
    algorithm = ppo.make(config)
    job = runner.seeded_job(
        "ppo",
        f"PPO {config.env_name}",
        algorithm,
        config,
        seeds,
        units_per_step=config.batch_size,
        # An MLP's update is milliseconds: ask about Ctrl-C every 10 (tens of ms); a CNN's on
        # Atari frames is seconds: after each.
        check_every=1 if config.torso == "nature_cnn" else 10,
    )
    finished = runner.finished_result(workdir, seeds.record(flat), job)
    if finished is not None:  # the run asked for had finished: its recorded result
        return base.Result(*finished)
    run_dir = runner.open_run(workdir, seeds.record(flat))
    result = runner.train(job, flat.run, run_dir, kill_after_chunk)

    t0 = time.time()
    returns = runner.evaluate_seeds(
        algorithm.evaluate,
        result.states,
        seeds.eval_keys,
        host_env=envs.is_host_env(config.env_name),
    )["eval_return"]
    eval_returns = np.asarray(returns.mean(axis=-1))
    summary = runner.summary_fields(job, result, time.time() - t0)
    env_steps = config.num_steps * config.batch_size
    summary |= {
        "env": config.env_name,
        "env_steps": env_steps,  # per seed
        "env_steps_per_second": round(summary["steps_per_second"] * config.batch_size),
        "final_eval_return": float(eval_returns.mean()),
        "final_eval_return_per_seed": eval_returns.tolist(),
        "eval_episodes": config.eval_episodes,
    }
    run_dir.write_summary(summary)
    run_dir.write_learning_curve(title=f"PPO {config.env_name}")
    where = retention.finish(run_dir)  # summary.json is written: the final state may go
    print(
        f"PPO {config.env_name}: final_eval_return {summary['final_eval_return']:.1f} "
        f"(per seed {np.round(eval_returns, 1).tolist()}) after {env_steps:,} env steps x "
        f"{seeds.count} seeds in {summary['wall_seconds']:.0f}s "
        f"(compile {summary['compile_seconds']:.0f}s). {where}"
    )
    return base.Result(result.states, summary, run_dir.path)
