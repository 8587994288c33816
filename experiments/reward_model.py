"""A reward model trained on preference pairs (Bradley-Terry), for RL against it.

    python experiments/sft.py --workdir=runs/sft
    python experiments/reward_model.py --config.init_from=runs/sft --workdir=runs/rm
    python experiments/reward_model.py --config.init_from=<HF dir or .gguf> \
        --config.task.train_jsonl=pairs.jsonl --workdir=runs/rm

The pairs are those dpo.py reads, in the same formats: your JSONL files (`prompt`, `chosen`,
`rejected` as strings or chat messages) or the task's synthetic pairs, checked and tokenised
before anything is written and kept in the run directory as a tensorflow-datasets dataset. The
model is the transformer of init_from (or the config's, randomly initialised) with a scalar head
on its last token (`algos.reward_model`). Training runs on `jaxrl.runner` (compiled chunks,
checkpoints, resumption); `summary.json` reports held-out `eval_pair_accuracy` (the chosen
answer gets the higher reward) for the starting model and the trained one, and params/ holds
{"backbone", "score_kernel", "score_bias"}; model.json records the run as a reward model's, so
no language-model script mistakes it for a policy to start from.
"""

from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402

import envs.text  # noqa: E402, F401  (the tasks: imported at start, as a run needs them)
from algos import reward_model  # noqa: E402
from jaxrl import extras, runner, sharding  # noqa: E402
from jaxrl.data.step_batches import dataset_batches  # noqa: E402
from jaxrl.trainers import lm_runs  # noqa: E402
from jaxrl.trainers.preference_data import (  # noqa: E402
    checked_pairs,
    data_name,
    pair_summary_fields,
    record_dataset,
)

# A missing optional extra is one error line, before flags are parsed or anything compiles.
extras.require("lm", "experiments/reward_model.py")

FLAGS = runner.define_flags("reward_model.py", seeds=False)
PAIR_KEYS = tuple(
    f"{side}_{name}" for side in ("chosen", "rejected") for name in ("tokens", "attention_mask")
)


def main(argv: list[str]) -> None:
    run = lm_runs.setup(FLAGS, reward_model.Config, "reward_model")
    flat, config, mesh = run.flat, run.config, run.mesh
    pairs, data = checked_pairs(run, "Reward-model")
    arrays, name = data.arrays, data_name(run)
    lm_params, model, source = lm_runs.initial_params(run)
    # The new head is replicated over the mesh; the transformer keeps its placement.
    head_key = jax.random.fold_in(jax.random.PRNGKey(flat.seed), 1)
    params = reward_model.init_params(lm_params, model, head_key)
    params = {
        key: value if key == "backbone" else jax.device_put(value, sharding.replicated(mesh))
        for key, value in params.items()
    }
    run_dir = lm_runs.open_run(run, head=lm_runs.REWARD_HEAD)
    built = record_dataset(pairs, flat, run_dir)

    # Replicated outputs: every process of a multi-host run reads all the rewards.
    score = jax.jit(reward_model.make_score(model, mesh), out_shardings=sharding.replicated(mesh))
    eval_batch = lm_runs.batch_for_mesh(
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
    result = runner.train(job, flat.run, run_dir, FLAGS["kill_after_chunk"].value)
    params = result.states.params
    lm_runs.save_params(run_dir, params)

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
    print(
        f"{title}: eval_pair_accuracy {metrics['eval_pair_accuracy']:.3f} (at the start: "
        f"{start_metrics['eval_pair_accuracy']:.3f}) after {config.num_steps} steps in "
        f"{summary['wall_seconds']:.0f}s (compile {summary['compile_seconds']:.0f}s). "
        f"Run directory: {run_dir.path}"
    )


if __name__ == "__main__":
    runner.main(main)
