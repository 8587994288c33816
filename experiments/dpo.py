"""DPO (or IPO / conservative DPO / SimPO) of an SFT model on preference pairs.

    python experiments/sft.py --workdir=runs/sft
    python experiments/dpo.py --config.init_from=runs/sft --workdir=runs/dpo
    python experiments/dpo.py --config.init_from=runs/sft --config.loss_type=ipo

Pairs are your own JSONL files (--config.task.train_jsonl, and --config.task.eval_jsonl or
config.task.num_eval of its rows held out) with `prompt`, `chosen`, `rejected` as strings or, as
TRL's conversational format, chat messages (the prompt's conversation; chosen / rejected with the
assistant's reply), rendered with the checkpoint's chat template. Without files the pairs are the
task's, synthetic: chosen is the right answer, rejected a plausibly wrong one. They are checked
and tokenised before anything is written, to lengths that are the config's or, with 0, the
pairs' (config.task.length_percentile; pairs cut are counted and reported as `cut_rows`), and the
run directory keeps them as a tensorflow-datasets dataset (array_record). The reference model is
the SFT model.

Training runs on `jaxrl.runner` (compiled chunks, checkpoints, resumption). `summary.json` reports
held-out `eval_reward_accuracy` (the policy's implicit reward ranks chosen above rejected) and
`eval_task_accuracy` (greedy generations exactly right), next to the SFT model's
`sft_eval_task_accuracy`.
"""

from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402

import envs.text  # noqa: E402, F401  (the tasks: imported at start, as a run needs them)
from algos import dpo  # noqa: E402
from jaxrl import extras, runner, sharding  # noqa: E402
from jaxrl.data.step_batches import dataset_batches  # noqa: E402
from jaxrl.lm import training  # noqa: E402
from jaxrl.trainers import lm_runs  # noqa: E402
from jaxrl.trainers.preference_data import (  # noqa: E402
    checked_pairs,
    data_name,
    pair_summary_fields,
    record_dataset,
)

# A missing optional extra is one error line, before flags are parsed or anything compiles.
extras.require("lm", "experiments/dpo.py")

FLAGS = runner.define_flags("dpo.py", seeds=False)


def main(argv: list[str]) -> None:
    run = lm_runs.setup(FLAGS, dpo.Config, "dpo")
    flat, config, mesh, task = run.flat, run.config, run.mesh, run.task
    if not flat.init_from:
        runner.fail(
            "config.init_from: DPO starts from an SFT model; run `python experiments/sft.py "
            "--workdir=runs/sft` first and pass --config.init_from=runs/sft"
        )
    pairs, data = checked_pairs(run, "DPO")
    arrays, eval_problems = data.arrays, pairs.eval_problems
    name = data_name(run)
    # The SFT model: where DPO starts, and its reference.
    params, model, source = lm_runs.initial_params(run)
    run_dir = lm_runs.open_run(run)
    built = record_dataset(pairs, flat, run_dir)

    # The head runs on each row's answer window only: the widest one in the data.
    answer_window = training.scored_length(
        *(
            split[f"{side}_loss_mask"]
            for split in arrays.values()
            for side in ("chosen", "rejected")
        )
    )
    # The reference model's log-probs: once over the data here, or inside each step.
    # Replicated outputs: every process of a multi-host run reads all the scores.
    score = jax.jit(
        dpo.make_score(model, mesh, answer_window), out_shardings=sharding.replicated(mesh)
    )
    # No bigger than the largest split scored: a 32-pair split in batches of 256 would score
    # 224 padding pairs (on SmolLM2, minutes of the reference pass).
    scored = [arrays["eval"]]
    if config.uses_reference and config.reference == "precomputed":
        scored.append(arrays["train"])
    largest = max(len(split["chosen_tokens"]) for split in scored)
    eval_batch = lm_runs.batch_for_mesh(min(flat.eval_batch_size, largest), mesh)
    place = lambda batch: sharding.shard_batch(batch, mesh)  # noqa: E731
    t0 = time.time()
    eval_reference = dpo.reference_log_probs(score, params, arrays["eval"], eval_batch, place)
    train = {k: v for k, v in arrays["train"].items() if k.startswith(("chosen_", "rejected_"))}
    if config.uses_reference and config.reference == "precomputed":
        train |= dpo.reference_log_probs(score, params, arrays["train"], eval_batch, place)
    reference_seconds = time.time() - t0

    max_new_tokens = data.max_length - data.max_prompt_length
    held_out_prompts = (arrays["eval"]["prompt_tokens"], arrays["eval"]["prompt_mask"])

    def task_accuracy(params):
        if not eval_problems:  # the user's own pairs: no task to score generations
            return None, None, []
        return lm_runs.task_accuracy(
            model, params, task, run.tokenizer, eval_problems, *held_out_prompts,
            max_new_tokens, mesh,
        )  # fmt: skip

    sft_accuracy, _, _ = task_accuracy(params)
    # The held-out pair metrics before training: the baseline the headline compares with (the
    # SFT model is its own reference, so its margins are 0 and its loss log 2 for sigmoid DPO).
    initial_pairs = dpo.evaluate_pairs(
        score, params, eval_reference, arrays["eval"], config, eval_batch, place
    )

    algorithm = dpo.make(config, model, params, mesh, answer_window)
    batches_for = dataset_batches(train, config, flat.seed, mesh)
    in_step_reference = params if config.reference == "in_step" else None
    job = lm_runs.job(
        run,
        algorithm,
        f"DPO ({config.loss_type}) {name}",
        chunk=training.make_batch_chunk,
        inputs_for=lambda first, count: (batches_for(first, count), in_step_reference),
        units_name="pairs",
        units_per_step=config.batch_size,
    )
    result = runner.train(job, flat.run, run_dir, FLAGS["kill_after_chunk"].value)
    params = result.states.params
    lm_runs.save_params(run_dir, params)

    t0 = time.time()
    pair_metrics = dpo.evaluate_pairs(
        score, params, eval_reference, arrays["eval"], config, eval_batch, place
    )
    accuracy, mean_score, completions = task_accuracy(params)
    summary = runner.summary_fields(job, result, time.time() - t0)
    summary |= {
        "loss_type": config.loss_type,
        "task": task.name if eval_problems else None,
        "dataset": built,
        "init_from": source,
        "wall_seconds": round(summary["wall_seconds"] + reference_seconds, 2),
        "reference_seconds": round(reference_seconds, 2),
        **pair_summary_fields(summary, data, config),
        **pair_metrics,
        "eval_task_accuracy": accuracy,
        "eval_task_score": mean_score,
        "sft_eval_task_accuracy": sft_accuracy,
        **{f"initial_{name}": value for name, value in initial_pairs.items()},
        "eval_examples": lm_runs.eval_examples(task, eval_problems, completions),
    }
    run_dir.write_summary(summary)
    title = f"DPO ({config.loss_type}) {name}"
    run_dir.write_learning_curve(x="step", y="reward_accuracy", title=title)
    held_out = (
        f"eval_reward_accuracy {pair_metrics['eval_reward_accuracy']:.3f} (before training: "
        f"{initial_pairs['eval_reward_accuracy']:.3f}), eval_loss {pair_metrics['eval_loss']:.3f} "
        f"(before: {initial_pairs['eval_loss']:.3f}) on {len(arrays['eval']['chosen_tokens'])} "
        "held-out pairs"
    )
    if accuracy is not None:  # a digit task: greedy answers scored
        held_out += f", eval_task_accuracy {accuracy:.3f} (SFT model: {sft_accuracy:.3f})"
    print(
        f"{title}: {held_out} after {config.num_steps} steps in {summary['wall_seconds']:.0f}s "
        f"(compile {summary['compile_seconds']:.0f}s). Run directory: {run_dir.path}"
    )


if __name__ == "__main__":
    runner.main(main)
