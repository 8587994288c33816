"""SAC training throughput: our `algos.sac` against rejax's SAC, same settings (README.md)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

# The repository root, for `algos` and the harness. The rejax worker runs this file from its own
# venv: at module level nothing but the standard library and the harness is imported.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from experiments.benchmarks import harness  # noqa: E402

# rejax's own SAC benchmark settings (peers/rejax_sac_bench.py), the same on both sides.
ENV_NAME = "Pendulum-v1"
TOTAL_TIMESTEPS = 20_000  # per seed, the buffer fill included (--total_timesteps)
FILL_STEPS = 1_000
BUFFER_SIZE = 20_000
BATCH_SIZE = 256
LEARNING_RATE = 3e-4  # actor, critics and temperature
GAMMA = 0.99
TAU = 0.01  # rejax: polyak = 1 - tau
HIDDEN_SIZES, ACTIVATION = (64, 64), "relu"
NUM_CRITICS = 2
INIT_ALPHA = 1.0
TARGET_ENTROPY = -1.0  # -action_dim, rejax's fixed choice for box actions
EVAL_EPISODES = 128  # rejax always evaluates 128 episodes


def count(tree: Any) -> int:
    import math

    import jax

    return sum(math.prod(leaf.shape) for leaf in jax.tree.leaves(tree))


def build_step(params: dict[str, Any]) -> harness.Step:
    """Our side: one whole training run per call. The only place that calls into algos/jaxrl."""
    import jax

    from algos import sac
    from jaxrl import hparams, loop

    config = sac.Config(
        env_name=ENV_NAME,
        total_timesteps=params["total_timesteps"],
        num_envs=1,
        learning_starts=FILL_STEPS,
        buffer_size=BUFFER_SIZE,
        batch_size=BATCH_SIZE,
        utd_ratio=1.0,
        gamma=GAMMA,
        tau=TAU,
        actor_lr=LEARNING_RATE,
        critic_lr=LEARNING_RATE,
        alpha_lr=LEARNING_RATE,
        init_alpha=INIT_ALPHA,
        autotune_alpha=True,
        target_entropy=TARGET_ENTROPY,
        num_critics=NUM_CRITICS,
        hidden_sizes=HIDDEN_SIZES,
        activation=ACTIVATION,
        eval_episodes=EVAL_EPISODES,
    )
    algorithm, hp, evaluate = sac.make(config), hparams.hparams(config), params["eval"] == "final"
    run = loop.make_train(algorithm, config.num_steps, evaluate)
    # The final return of our deterministic policy, mean over episodes and seeds.
    read = lambda output: {"eval_return": float(output[1]["eval_return"].mean())}
    train = lambda key: run(key, hp)
    step = harness.train_run_step(
        train, params["seeds"], counts(params), read if evaluate else None
    )
    shapes = jax.eval_shape(lambda key: algorithm.init(key, hp), jax.random.PRNGKey(0)).learner
    actor, critics = shapes.actor_params, shapes.critic_params
    step.info["params"] = {"actor": count(actor), "critics": count(critics)}
    return step


def build_rejax_step(params: dict[str, Any]) -> harness.Step:
    """rejax's SAC with the same settings (what cannot be made identical: README.md). It
    evaluates once, at the end, and not at all without an evaluation."""
    import jax
    from rejax import SAC

    algo = SAC.create(
        env=ENV_NAME,
        total_timesteps=params["total_timesteps"],
        eval_freq=params["total_timesteps"],
        skip_initial_evaluation=True,
        num_envs=1,
        fill_buffer=FILL_STEPS,
        buffer_size=BUFFER_SIZE,
        batch_size=BATCH_SIZE,
        num_epochs=1,  # gradient steps per environment step
        learning_rate=LEARNING_RATE,
        gamma=GAMMA,
        polyak=1.0 - TAU,
        target_update_freq=1,
        num_critics=NUM_CRITICS,
        hidden_layer_sizes=HIDDEN_SIZES,
        agent_kwargs={"activation": ACTIVATION},
    )
    evaluate = params["eval"] == "final"
    algo = harness.rejax_without_eval(algo, evaluate)
    shapes = jax.eval_shape(algo.init_state, jax.random.PRNGKey(0))

    def read(output: Any) -> dict[str, float]:
        _, (lengths, returns) = output  # returns [..., num_evals, 128 episodes]: the last one's
        return {"eval_return": float(returns[..., -1, :].mean())}

    step = harness.train_run_step(
        algo.train, params["seeds"], counts(params), read if evaluate else None
    )
    actor, critics = shapes.actor_ts.params, shapes.critic_ts.params
    step.info["params"] = {"actor": count(actor), "critics": count(critics)}
    return step


def counts(params: dict[str, Any]) -> dict[str, float]:
    return {"env_steps": params["seeds"] * params["total_timesteps"]}


def variants(args: argparse.Namespace) -> list[harness.Variant]:
    """A group per seeds x evaluation, ours then rejax's."""
    rows = []
    for seeds in args.seeds:
        for evaluation in args.evals:
            params = {"seeds": seeds, "eval": evaluation, "total_timesteps": args.total_timesteps}
            group = f"seeds={seeds} eval={evaluation}"
            rows.append(harness.Variant(group, "ours", "ours", params))
            if args.rejax_python:
                python, env = args.rejax_python, harness.rejax_env()
                rows.append(harness.Variant(group, "rejax", "rejax", params, python, env=env))
    return rows


def add_flags(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add("--seeds", type=harness.comma_list(int), default="1,4", help="seeds vmapped in a program")
    add(
        "--evals",
        type=harness.comma_list(str, ("final", "none")),
        default="final,none",
        help="final: end with a 128-episode evaluation; none: training only",
    )
    add("--total_timesteps", type=harness.positive(int), default=TOTAL_TIMESTEPS, help="per seed")


WORKLOAD = harness.Workload(
    module=globals(),
    builders={"ours": build_step, "rejax": build_rejax_step},
    variants=variants,
    columns=[
        harness.Column("env steps/s", "env_steps_per_s", ",.0f"),
        harness.Column("eval return", "eval_return", ".1f"),
    ],
    ratios=[
        harness.Column("env steps/s", "env_steps_per_s"),
        harness.Column("compile", "compile_s"),
        harness.Column("RSS", "peak_rss_mib"),
    ],
    peers={"rejax": None},
    # A step is a whole training run (13-75 s here); a second call was within 2% of the first.
    defaults=dict(steps=1, warmup=0, timeout=300.0, steps_help="training runs per worker"),
    add_flags=add_flags,
)

if __name__ == "__main__":
    harness.main(WORKLOAD)
