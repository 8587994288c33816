"""A Bradley-Terry reward model (a language model with a scalar head) on preference pairs: what
`experiments/reward_model.py` runs (`jaxrl.trainers.base` describes the trainers' shape).

    from jaxrl.trainers import reward_model
    pairs = [{"prompt": "2+2=", "chosen": "4", "rejected": "5"}, ...]
    result = reward_model.train(None, "runs/rm", model="runs/sft", train_data=pairs)
"""

from __future__ import annotations

import functools
import time
from typing import Any

import jax

import envs.text  # noqa: F401  (the tasks: imported at start, as a run needs them)
from algos import reward_model
from jaxrl import runner, sharding
from jaxrl.data.step_batches import dataset_batches
from jaxrl.lm import checkpoints
from jaxrl.lm.completions import batch_for_mesh
from jaxrl.trainers import base, lm_runs
from jaxrl.trainers.preference_data import (
    checked_pairs,
    data_name,
    pair_summary_fields,
    record_dataset,
)

config = functools.partial(base.load_config, "reward_model")
PAIR_KEYS = tuple(
    f"{side}_{name}" for side in ("chosen", "rejected") for name in ("tokens", "attention_mask")
)


@base.lm_trainer("reward_model")
def train(
    flat: Any, parts: lm_runs.Parts, workdir: str | None, kill_after_chunk: int | None
) -> base.Result:
    """A Bradley-Terry reward model (a language model with a scalar head) on preference pairs.
    Called as `train(config=None, workdir=None, *, model=None, train_data=None, eval_data=None,
    rewards=None, game=None)`: `config` is experiments/configs/reward_model.py's
    (`config(preset)`), the parts are `jaxrl.trainers.base`'s; returns Result(state, summary,
    run_dir)."""
    run = lm_runs.setup(flat, workdir, reward_model.Config, "reward_model", parts)
    flat, config, mesh = run.flat, run.config, run.mesh
    run, pairs, data = checked_pairs(run, "Reward-model")
    config = run.config  # its batch size fitted to the user's pairs
    arrays, name = data.arrays, data_name(run)
    lm_params, model, source = lm_runs.initial_params(run)
    # The new head is replicated over the mesh; the transformer keeps its placement.
    head_key = jax.random.fold_in(jax.random.PRNGKey(flat.seed), 1)
    params = reward_model.init_params(lm_params, model, head_key)
    params = {
        key: value if key == "backbone" else jax.device_put(value, sharding.replicated(mesh))
        for key, value in params.items()
    }
    run_dir = lm_runs.open_run(run, head=checkpoints.REWARD_HEAD)
    built = record_dataset(pairs, run, run_dir)

    # Replicated outputs: every process of a multi-host run reads all the rewards.
    score = jax.jit(reward_model.make_score(model, mesh), out_shardings=sharding.replicated(mesh))
    eval_batch = batch_for_mesh(
        min(flat.eval_batch_size, len(arrays["eval"]["chosen_tokens"])), mesh
    )
    place = lambda batch: sharding.shard_batch(batch, mesh)  # noqa: E731
    start_metrics = reward_model.evaluate_pairs(score, params, arrays["eval"], eval_batch, place)

    algorithm = reward_model.make(config, model, params, mesh)
    train = {key: arrays["train"][key] for key in PAIR_KEYS}
    job = lm_runs.job(
        run,
        algorithm,
        f"reward model {name}",
        scan_inputs=True,
        inputs_for=dataset_batches(train, config, flat.seed, mesh),
        units_name="pairs",
        units_per_step=config.batch_size,
    )
    result = runner.train(job, flat.run, run_dir, kill_after_chunk)
    params = result.states.params
    checkpoints.save_params(run_dir, params)

    t0 = time.time()
    metrics = reward_model.evaluate_pairs(score, params, arrays["eval"], eval_batch, place)
    summary = runner.summary_fields(job, result, time.time() - t0)
    summary |= {
        "task": run.task.name if pairs.eval_problems else None,
        "dataset": built,
        "init_from": source,
        **pair_summary_fields(summary, data, config),
        **metrics,
        "start_eval_pair_accuracy": start_metrics["eval_pair_accuracy"],
    }
    run_dir.write_summary(summary)
    title = f"reward model {name}"
    run_dir.write_learning_curve(x="step", y="pair_accuracy", title=title)
    where = lm_runs.finish(run, run_dir)  # summary.json is written: the final state may go
    print(
        f"{title}: eval_pair_accuracy {metrics['eval_pair_accuracy']:.3f} (at the start: "
        f"{start_metrics['eval_pair_accuracy']:.3f}) after {config.num_steps} steps in "
        f"{summary['wall_seconds']:.0f}s (compile {summary['compile_seconds']:.0f}s). "
        f"{where}"
    )
    return base.Result(result.states, summary, run_dir.path)
