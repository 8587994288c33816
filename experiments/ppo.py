"""Train PPO on a JAX environment, several seeds vmapped into one compiled program.

    python experiments/ppo.py --workdir=runs/cartpole
    python experiments/ppo.py --config=experiments/configs/ppo.py:pendulum --num_seeds=4
    python experiments/ppo.py --config.learning_rate=1e-3 --config.total_timesteps=200000

The run is compiled chunks of updates on `jaxrl.runner`, checkpointed between chunks; restarted on
an existing --workdir it resumes and ends exactly where an uninterrupted run would. `summary.json`'s
`final_eval_return` is the mean over seeds of the deterministic policy's return.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import time  # noqa: E402

import numpy as np  # noqa: E402

import envs  # noqa: E402
from algos import ppo  # noqa: E402
from jaxrl import runner  # noqa: E402

FLAGS = runner.define_flags("ppo.py:cartpole")


def main(argv: list[str]) -> None:
    flat = FLAGS["config"].value
    config = runner.build_config(ppo.Config, flat)
    seeds = runner.seeds(FLAGS, flat.run)
    workdir = runner.workdir(FLAGS, f"ppo-{config.env_name}")
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
    run_dir = runner.open_run(workdir, seeds.record(flat))
    result = runner.train(job, flat.run, run_dir, FLAGS["kill_after_chunk"].value)

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
    print(
        f"PPO {config.env_name}: final_eval_return {summary['final_eval_return']:.1f} "
        f"(per seed {np.round(eval_returns, 1).tolist()}) after {env_steps:,} env steps x "
        f"{seeds.count} seeds in {summary['wall_seconds']:.0f}s "
        f"(compile {summary['compile_seconds']:.0f}s). Run directory: {run_dir.path}"
    )


if __name__ == "__main__":
    runner.main(main)
