"""CQL offline on an RLDS dataset, several seeds vmapped into one program, compared with behaviour
cloning on the same data: what `experiments/cql.py` runs (`jaxrl.trainers.base` describes the
trainers' shape).

    from jaxrl.trainers import cql
    config = cql.config("pendulum")
    config.dataset.path = "data/pendulum_v1/medium/1.0.0"   # made by experiments/collect.py
    result = cql.train(config, "runs/cql", num_seeds=3)
    result.summary["normalized_score"], result.summary["bc_normalized_score"]
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from algos import bc, cql
from jaxrl import hparams, loop, retention, runner
from jaxrl.config import ConfigError, build_config, fail, is_finite_number
from jaxrl.trainers import base
from jaxrl.types import Transition

config = functools.partial(base.load_config, "cql")


def load_dataset(flat: Any, config: cql.Config) -> tuple[Transition, dict[str, Any]]:
    """The dataset on device and its metadata; every problem ends the script with one line."""
    section = flat.dataset
    if not section.path:
        fail(
            "config.dataset.path is required; pass a dataset directory printed by "
            "experiments/collect.py (e.g. --config.dataset.path=data/pendulum_v1/medium/1.0.0) "
            "or a TFDS name with --config.dataset.data_dir"
        )
    # Here, not at the top: jaxrl.data's readers import tensorflow-datasets (start-up time).
    from jaxrl.data import (
        CorruptDatasetError,
        DatasetNotFoundError,
        load_dataset_info,
        load_transitions,
    )

    path = os.path.expanduser(section.path)
    data_dir = os.path.expanduser(section.data_dir) if section.data_dir else None
    try:
        transitions = load_transitions(path, split=section.split, data_dir=data_dir)
        info = load_dataset_info(path, data_dir=data_dir)
    except (DatasetNotFoundError, CorruptDatasetError, ImportError) as error:
        fail(f"config.dataset.path: {error}")
    metadata = dict(info.get("metadata") or {})
    env_name = metadata.get("env_name")
    if env_name and env_name != config.env_name:
        fail(
            f"config.env_name: the dataset {path} was collected on {env_name!r}, not "
            f"{config.env_name!r}; set --config.env_name={env_name}"
        )
    try:
        data = cql.device_dataset(transitions, config)
    except ValueError as error:
        fail(f"config.dataset.path ({path}): {error}")
    return data, metadata


def reference_returns(flat: Any, metadata: dict[str, Any]) -> tuple[float | None, float | None]:
    """D4RL's random and expert returns: the config's, else the dataset's metadata, else none
    (then the summary has no normalized score)."""
    random_return = flat.reference.random_return
    expert_return = flat.reference.expert_return
    if (random_return is None) != (expert_return is None):
        fail(
            "config.reference: only one of random_return and expert_return is given; give "
            "both, or neither (the dataset's metadata then gives them, if it has them)"
        )
    if random_return is None:
        random_return = metadata.get("reference_min_return")
        expert_return = metadata.get("reference_max_return")
        if (random_return is None) != (expert_return is None):
            fail(
                "config.reference: the dataset's metadata has only one of reference_min_return "
                "and reference_max_return; give both --config.reference.random_return and "
                "--config.reference.expert_return"
            )
    if random_return is not None and random_return == expert_return:
        fail(
            f"config.reference: random_return and expert_return are both {random_return}, so "
            "no score can be normalized between them; give two different returns"
        )
    return random_return, expert_return


@base.control_trainer("cql", num_seeds=3)
def train(flat: Any, workdir: str | None, seeds: Any, kill_after_chunk: int | None) -> base.Result:
    """Train CQL (`config`: experiments/configs/cql.py's, default preset pendulum; its
    dataset.path names the RLDS dataset) for `num_seeds` seeds from PRNGKey(`seed`) in `workdir`,
    and behaviour cloning beside it; returns CQL's final states and the summary."""
    from jaxrl.data import normalized_score  # here, not at the top: start-up time (tfds)

    config = build_config(cql.Config, flat)
    num_seeds, init_keys, eval_keys = seeds.count, seeds.init_keys, seeds.eval_keys
    for name in ("random_return", "expert_return"):
        value = flat.reference[name]
        if value is not None and not is_finite_number(value):
            fail(f"config.reference.{name}: must be a finite number, got {value}; give one")
    if (flat.reference.random_return is None) != (flat.reference.expert_return is None):
        fail(
            "config.reference: only one of random_return and expert_return is given; give "
            "both, or neither (the dataset's metadata then gives them, if it has them)"
        )
    bc_config = None
    if flat.bc.enabled:
        try:
            bc_config = bc.Config(
                env_name=config.env_name,
                num_steps=flat.bc.num_steps,
                batch_size=config.batch_size,
                learning_rate=flat.bc.learning_rate,
                hidden_sizes=config.hidden_sizes,
                activation=config.activation,
                eval_episodes=config.eval_episodes,
            )
        except ConfigError as error:
            fail(f"config.bc.{error}")
    data, metadata = load_dataset(flat, config)
    random_return, expert_return = reference_returns(flat, metadata)
    references = (random_return, expert_return)

    def score(value: float | None) -> float | None:
        if random_return is None or value is None:
            return None
        return float(normalized_score(value, *references))

    workdir = base.workdir_or_default(workdir, f"cql-{config.env_name}")
    algorithm = cql.make(config)
    evaluate = jax.jit(jax.vmap(algorithm.evaluate))

    def mean_returns(evaluate: Callable, states: Any, step: int) -> np.ndarray:
        """Each run's mean return over the episodes of `step`: run i's evaluation key folded with
        `step`, so a resumed run, and behaviour cloning, score the very same episodes."""
        keys = jax.vmap(jax.random.fold_in, in_axes=(0, None))(eval_keys, step)
        return np.asarray(evaluate(states, keys)["eval_return"]).mean(axis=-1)

    def after_chunk(states: cql.TrainState, step: int, chunk_index: int) -> dict[str, Any]:
        row = {"eval_return": mean_returns(evaluate, states, step)}
        if random_return is not None:
            row["normalized_score"] = normalized_score(row["eval_return"], *references)
        return row

    job = runner.seeded_job(
        "cql",
        f"CQL {config.env_name} (gradient steps)",
        algorithm,
        config,
        seeds,
        units_name="gradient_steps",
        inputs_for=lambda first, count: data,  # every update draws from the whole dataset
        per_run=("eval_return",),
        after_chunk=after_chunk,
        check_every=50,  # a gradient step is about a millisecond: ask about Ctrl-C every 50
    )
    finished = runner.finished_result(workdir, seeds.record(flat), job)
    if finished is not None:  # the run asked for had finished: its recorded result
        return base.Result(*finished)
    run_dir = runner.open_run(workdir, seeds.record(flat))
    result = runner.train(job, flat.run, run_dir, kill_after_chunk)

    # The final evaluation scores the last chunk's episodes again, so a run resumed after its last
    # chunk reports the same figure.
    t0 = time.time()
    eval_returns = mean_returns(evaluate, result.states, config.num_steps)
    final_return = float(eval_returns.mean())
    behaviour_return = metadata.get("mean_episode_return")
    summary = runner.summary_fields(job, result, time.time() - t0)
    summary |= {
        "env": config.env_name,
        "dataset": os.path.expanduser(flat.dataset.path),
        "dataset_transitions": int(data.reward.shape[0]),
        "final_eval_return": final_return,
        "final_eval_return_per_seed": eval_returns.tolist(),
        "normalized_score": score(final_return),
        "behaviour_return": behaviour_return,
        "behaviour_normalized_score": score(behaviour_return),
        "reference_random_return": random_return,
        "reference_expert_return": expert_return,
        "eval_episodes": config.eval_episodes,
    }
    if bc_config is not None:
        # Behaviour cloning from the same init keys, evaluated on the same episodes as CQL.
        t0 = time.time()
        baseline = bc.make(bc_config)
        bc_hps = hparams.repeat(hparams.hparams(bc_config), num_seeds)
        states = jax.jit(jax.vmap(baseline.init))(init_keys, bc_hps)
        steps = bc_config.num_steps
        states, _ = jax.jit(loop.make_chunk(baseline.update, steps, log_every=steps))(
            states, data, bc_hps
        )
        bc_evaluate = jax.jit(jax.vmap(baseline.evaluate))
        bc_returns = mean_returns(bc_evaluate, states, config.num_steps)
        summary |= {
            "bc_eval_return": float(bc_returns.mean()),
            "bc_eval_return_per_seed": bc_returns.tolist(),
            "bc_normalized_score": score(float(bc_returns.mean())),
            "bc_seconds": round(time.time() - t0, 2),
        }
    run_dir.write_summary(summary)
    run_dir.write_learning_curve(x="step", y="eval_return", title=f"CQL {config.env_name}")

    def describe(name: str, value: float | None, normalized: float | None) -> str:
        if value is None:
            return f"{name} n/a"
        text = f"{name} {value:.1f}"
        return text + (f" (normalized {normalized:.1f})" if normalized is not None else "")

    where = retention.finish(run_dir)  # summary.json is written: the final state may go
    print(
        f"CQL {config.env_name}: "
        + ", ".join(
            [
                describe("final_eval_return", final_return, summary["normalized_score"]),
                describe("behaviour", behaviour_return, summary["behaviour_normalized_score"]),
                describe(
                    "behaviour cloning",
                    summary.get("bc_eval_return"),
                    summary.get("bc_normalized_score"),
                ),
            ]
        )
        + f"; {config.num_steps:,} gradient steps x {num_seeds} seeds in "
        f"{summary['wall_seconds']:.0f}s. {where}"
    )
    return base.Result(result.states, summary, run_dir.path)
