"""Train SAC on a continuous-control JAX environment, several seeds vmapped into one program.

    python experiments/sac.py --workdir=runs/pendulum
    python experiments/sac.py --config=experiments/configs/sac.py:pendulum_small --num_seeds=8
    python experiments/sac.py --config=experiments/configs/sac.py:halfcheetah   # needs [mujoco]

Environment steps, the replay buffer and the updates run inside compiled chunks on `jaxrl.runner`,
checkpointed (buffer included) between chunks; restarted on an existing --workdir it resumes and
ends exactly where an uninterrupted run would. `summary.json`'s `final_eval_return` is the mean over
seeds of the deterministic policy's return.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import time  # noqa: E402

import jax  # noqa: E402
import numpy as np  # noqa: E402

from algos import sac  # noqa: E402
from jaxrl import runner  # noqa: E402

FLAGS = runner.define_flags("sac.py:pendulum")


def main(argv: list[str]) -> None:
    flat = FLAGS["config"].value
    config = runner.build_config(sac.Config, flat)
    seeds = runner.seeds(FLAGS, flat.run)
    workdir = runner.workdir(FLAGS, f"sac-{config.env_name}")
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
    run_dir = runner.open_run(workdir, seeds.record(flat))
    result = runner.train(job, flat.run, run_dir, FLAGS["kill_after_chunk"].value)

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
    print(
        f"SAC {config.env_name}: final_eval_return {summary['final_eval_return']:.1f} "
        f"(per seed {np.round(eval_returns, 1).tolist()}) after {config.total_timesteps:,} env "
        f"steps x {seeds.count} seeds in {summary['wall_seconds']:.0f}s "
        f"(compile {summary['compile_seconds']:.0f}s). Run directory: {run_dir.path}"
    )


if __name__ == "__main__":
    runner.main(main)
