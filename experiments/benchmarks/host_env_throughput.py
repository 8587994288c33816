"""Environment steps per second of host environments (Gymnasium's and EnvPool's) inside the compiled
loop, against the same task written in JAX (gymnax's CartPole), side by side in one run.

    python experiments/benchmarks/host_env_throughput.py --num_envs 4,16,64 --out host_env.json
    python experiments/benchmarks/host_env_throughput.py --envs envpool:Pong-v5 --num_envs 8

Two measurements per row, each the best of `--repeats` timed calls after a compiled warm-up:
  - `rollout`: a scan of `--steps` steps of uniformly random actions (the environment alone);
  - `ppo`: whole PPO updates (rollout of 128 steps, GAE, 4 epochs x 4 minibatches), the work a
    training run does per environment step.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def best_seconds(call, repeats: int) -> float:
    """The fastest of `repeats` calls of `call()` (which blocks until its result is ready)."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return min(times)


def measure(env_name: str, num_envs: int, steps: int, updates: int, repeats: int) -> dict:
    import jax

    import envs
    from algos import ppo
    from jaxrl.hparams import hparams as jaxrl_hparams

    env = envs.make_vec(env_name, num_envs)
    num_actions = env.action_space.n

    def rollout(key):
        obs, state = env.reset(key)

        def step(carry, step_key):
            state, total = carry
            action_key, env_key = jax.random.split(step_key)
            action = jax.random.randint(action_key, (num_envs,), 0, num_actions)
            result = env.step(env_key, state, action)
            return (result.state, total + result.reward.sum()), None

        return jax.lax.scan(step, (state, 0.0), jax.random.split(key, steps))[0][1]

    run_rollout = jax.jit(rollout)
    jax.block_until_ready(run_rollout(jax.random.key(0)))
    rollout_seconds = best_seconds(
        lambda: jax.block_until_ready(run_rollout(jax.random.key(1))), repeats
    )

    config = ppo.Config(env_name=env_name, num_envs=num_envs, total_timesteps=10**9)
    algorithm = ppo.make(config)
    hparams = jaxrl_hparams(config)
    state = jax.jit(algorithm.init)(jax.random.key(0), hparams)

    def train_updates(state):
        def body(state, _):
            return algorithm.update(state, None, hparams)[0], None

        return jax.lax.scan(body, state, None, length=updates)[0]

    run_updates = jax.jit(train_updates)
    state = jax.block_until_ready(run_updates(state))
    ppo_seconds = best_seconds(lambda: jax.block_until_ready(run_updates(state)), repeats)
    return {
        "env": env_name,
        "num_envs": num_envs,
        "rollout_env_steps_per_second": round(steps * num_envs / rollout_seconds),
        "ppo_env_steps_per_second": round(updates * config.batch_size / ppo_seconds),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num_envs", default="4,16,64")
    parser.add_argument(
        "--envs",
        default="CartPole-v1,gymnasium:CartPole-v1,envpool:CartPole-v1",
        help="comma-separated environment names; host CartPoles are compared with CartPole-v1",
    )
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--updates", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default="host_env_throughput.json")
    args = parser.parse_args()
    rows = []
    for num_envs in [int(n) for n in args.num_envs.split(",")]:
        for env_name in args.envs.split(","):
            rows.append(measure(env_name, num_envs, args.steps, args.updates, args.repeats))
            print(json.dumps(rows[-1]), flush=True)
    for row in rows:
        same_task = [
            r for r in rows if r["env"] == "CartPole-v1" and r["num_envs"] == row["num_envs"]
        ]
        if row["env"].endswith(":CartPole-v1") and same_task:
            jax_row = same_task[0]
            for key in ("rollout_env_steps_per_second", "ppo_env_steps_per_second"):
                row[key.replace("env_steps_per_second", "vs_jax")] = round(
                    row[key] / jax_row[key], 3
                )
    with open(args.out, "w") as f:
        json.dump({"rows": rows}, f, indent=2)
    print(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
