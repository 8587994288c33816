"""PPO training throughput: our `algos.ppo` against rejax's PPO, cell by cell (README.md)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

# The repository root, for `algos` and the harness. The rejax worker runs this file from its own
# venv: at module level nothing but the standard library and the harness is imported.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from experiments.benchmarks import harness  # noqa: E402

# Fixed on both sides and named alike by both libraries, passed to both as they are.
SHARED = dict(
    num_epochs=4,
    num_minibatches=4,
    gamma=0.99,
    gae_lambda=0.95,
    clip_eps=0.2,
    ent_coef=0.01,
    vf_coef=0.5,
    max_grad_norm=0.5,
    normalize_observations=False,
    normalize_rewards=False,
)
ROLLOUT_LENGTH = 128  # env steps per env per update: our rollout_length, rejax's num_steps
LEARNING_RATE = 2.5e-4  # annealed linearly to zero on both sides
HIDDEN_SIZES, ACTIVATION = (64, 64), "tanh"
EVAL_EPISODES = 128  # rejax always evaluates 128 episodes, so with --eval final ours does too


def timesteps(params: dict[str, Any]) -> int:
    return params["updates"] * params["num_envs"] * ROLLOUT_LENGTH


def build_step(params: dict[str, Any]) -> harness.Step:
    """Our side: one whole training run per call. The only place that calls into algos/jaxrl."""
    from algos import ppo
    from jaxrl import hparams, loop

    config = ppo.Config(
        env_name=params["env"],
        total_timesteps=timesteps(params),
        num_envs=params["num_envs"],
        rollout_length=ROLLOUT_LENGTH,
        learning_rate=LEARNING_RATE,
        anneal_lr=True,
        clip_value=True,
        **SHARED,
        hidden_sizes=HIDDEN_SIZES,
        activation=ACTIVATION,
        eval_episodes=EVAL_EPISODES,
    )
    run = loop.make_train(ppo.make(config), config.num_steps, params["eval"] == "final")
    hp = hparams.hparams(config)
    return harness.train_run_step(lambda key: run(key, hp), params["seeds"], counts(params))


def build_rejax_step(params: dict[str, Any]) -> harness.Step:
    """rejax's PPO with our settings (what cannot be made identical: README.md). Its learning
    rate is a linear schedule over all gradient steps, which is exactly our annealing; it
    evaluates once, at the end, and not at all without --eval final."""
    import optax
    from rejax import PPO

    total = timesteps(params)
    gradient_steps = params["updates"] * SHARED["num_epochs"] * SHARED["num_minibatches"]
    algo = PPO.create(
        env=params["env"],
        num_envs=params["num_envs"],
        total_timesteps=total,
        eval_freq=total,
        skip_initial_evaluation=True,
        learning_rate=optax.linear_schedule(LEARNING_RATE, 0.0, gradient_steps),
        num_steps=ROLLOUT_LENGTH,
        **SHARED,
        agent_kwargs={"hidden_layer_sizes": HIDDEN_SIZES, "activation": ACTIVATION},
    )
    algo = harness.rejax_without_eval(algo, params["eval"] == "final")
    return harness.train_run_step(algo.train, params["seeds"], counts(params))


def counts(params: dict[str, Any]) -> dict[str, float]:
    return {"env_steps": params["seeds"] * timesteps(params)}


def variants(args: argparse.Namespace) -> list[harness.Variant]:
    """A cell per environment x num_envs x seeds, ours then rejax's. Every cell does the same
    work (--env_steps summed over seeds, at least one update) unless --updates fixes it."""
    rows = []
    for env in args.envs:
        for num_envs in args.num_envs:
            for seeds in args.seeds:
                per_update = seeds * num_envs * ROLLOUT_LENGTH
                updates = args.updates or max(1, args.env_steps // per_update)
                params = dict(env=env, num_envs=num_envs, seeds=seeds, updates=updates)
                params["eval"] = args.eval
                group = f"{env} envs={num_envs} seeds={seeds} updates={updates}"
                rows.append(harness.Variant(group, "ours", "ours", params))
                if args.rejax_python:
                    python, env_vars = args.rejax_python, harness.rejax_env()
                    rows.append(
                        harness.Variant(group, "rejax", "rejax", params, python, env=env_vars)
                    )
    return rows


def add_flags(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add("--envs", type=harness.comma_list(str), default="CartPole-v1,Breakout-MinAtar", help="envs")
    add("--num_envs", type=harness.comma_list(int), default="4,64,512", help="parallel envs")
    add("--seeds", type=harness.comma_list(int), default="1,8", help="seeds vmapped in a program")
    add("--updates", type=harness.positive(int), default=None, help="updates per run, every cell")
    # 2**19 is one update of the largest default cell, a few seconds per run on a 2-core CPU.
    add("--env_steps", type=harness.positive(int), default=524_288, help="per run, all seeds")
    add("--eval", choices=("none", "final"), default="none", help="final: end with an evaluation")


WORKLOAD = harness.Workload(
    module=globals(),
    builders={"ours": build_step, "rejax": build_rejax_step},
    variants=variants,
    columns=[harness.Column("env steps/s", "env_steps_per_s", ",.0f")],
    peers={"rejax": None},
    # A step is a whole training run; the first call of a compiled function is slower (buffer
    # allocation, cold caches), so it is left out. A stuck worker is killed after the timeout.
    defaults=dict(steps=2, warmup=1, timeout=150.0, steps_help="training runs per worker"),
    add_flags=add_flags,
)

if __name__ == "__main__":
    harness.main(WORKLOAD)
