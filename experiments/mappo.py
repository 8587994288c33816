"""Train IPPO or MAPPO on a JaxMARL environment, several seeds vmapped into one compiled program.

    python experiments/mappo.py --workdir=runs/mappo                     # MAPPO, MPE simple spread
    python experiments/mappo.py --config=experiments/configs/mappo.py:ippo_spread --num_seeds=3

The run is compiled chunks of updates on `jaxrl.runner`, checkpointed between chunks and resumed
exactly. `summary.json`'s `final_eval_return` is the mean over seeds of the deterministic policy's
team return (the sum over agents), `final_train_return` that of the training policy's last
episodes, on the scale JaxMARL logs.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import time  # noqa: E402

import jax  # noqa: E402
import numpy as np  # noqa: E402

from algos import mappo  # noqa: E402
from jaxrl import extras, runner  # noqa: E402

# A missing optional extra is one error line, before flags are parsed or anything compiles.
extras.require("marl", "experiments/mappo.py")

FLAGS = runner.define_flags("mappo.py:mappo_spread")


def main(argv: list[str]) -> None:
    flat = FLAGS["config"].value
    config = runner.build_config(mappo.Config, flat)
    seeds = runner.seeds(FLAGS, flat.run)
    name = {"independent": "IPPO", "centralised": "MAPPO"}[config.critic]
    workdir = runner.workdir(FLAGS, f"{name.lower()}-{config.env_name.split(':')[-1]}")
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
    run_dir = runner.open_run(workdir, seeds.record(flat))
    result = runner.train(job, flat.run, run_dir, FLAGS["kill_after_chunk"].value)

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
    print(
        f"{name} {config.env_name}: final_eval_return {summary['final_eval_return']:.1f} "
        f"(per seed {np.round(eval_returns, 1).tolist()}), training return "
        f"{summary['final_train_return']:.1f}, after {env_steps:,} env steps x {seeds.count} "
        f"seeds in {summary['wall_seconds']:.0f}s (compile {summary['compile_seconds']:.0f}s). "
        f"Run directory: {run_dir.path}"
    )


if __name__ == "__main__":
    runner.main(main)
