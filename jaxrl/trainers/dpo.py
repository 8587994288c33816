"""DPO (or IPO / conservative DPO / SimPO) of an SFT model on preference pairs: what
`experiments/dpo.py` runs (`jaxrl.trainers.base` describes the trainers' shape).

    from jaxrl.trainers import dpo
    pairs = [{"prompt": "2+2=", "chosen": "4", "rejected": "5"}, ...]
    result = dpo.train(dpo.config(), "runs/dpo", model="runs/sft", train_data=pairs)
    result.summary["eval_reward_accuracy"]
"""

from __future__ import annotations

import functools
import time
from typing import Any

import jax

import envs.text  # noqa: F401  (the tasks: imported at start, as a run needs them)
from algos import dpo
from jaxrl import runner, sharding
from jaxrl.config import fail
from jaxrl.data.step_batches import dataset_batches
from jaxrl.lm import checkpoints, training
from jaxrl.lm import completions as decoded
from jaxrl.lm.completions import batch_for_mesh, eval_examples
from jaxrl.trainers import base, lm_runs
from jaxrl.trainers.preference_data import (
    checked_pairs,
    data_name,
    pair_summary_fields,
    record_dataset,
)

config = functools.partial(base.load_config, "dpo")


def ties(pairs: dict[str, float]) -> str:
    """A held-out reward accuracy with its ties where there are any: "0.000, 1.000 tied" (a tie,
    equal implicit rewards, counts as wrong, as in TRL)."""
    accuracy, tied = pairs["eval_reward_accuracy"], pairs["eval_reward_ties"]
    return f"{accuracy:.3f}" + (f", {tied:.3f} tied" if tied else "")


@base.lm_trainer("dpo")
def train(
    flat: Any, parts: lm_runs.Parts, workdir: str | None, kill_after_chunk: int | None
) -> base.Result:
    """DPO (or IPO / conservative DPO / SimPO) of an SFT model on preference pairs. Called as
    `train(config=None, workdir=None, *, model=None, train_data=None, eval_data=None,
    rewards=None, game=None)`: `config` is experiments/configs/dpo.py's (`config(preset)`), the
    parts are `jaxrl.trainers.base`'s; returns Result(state, summary, run_dir)."""
    run = lm_runs.setup(flat, workdir, dpo.Config, "dpo", parts)
    flat, config, mesh, task = run.flat, run.config, run.mesh, run.task
    if not flat.init_from:
        fail(
            "config.init_from: DPO starts from an SFT model; run `python experiments/sft.py "
            "--workdir=runs/sft` first and pass --config.init_from=runs/sft"
        )
    run, pairs, data = checked_pairs(run, "DPO")
    config = run.config  # its batch size fitted to the user's pairs
    arrays, eval_problems = data.arrays, pairs.eval_problems
    name = data_name(run)
    # The SFT model: where DPO starts, and its reference.
    params, model, source = lm_runs.initial_params(run)
    run_dir = lm_runs.open_run(run)
    built = record_dataset(pairs, run, run_dir)

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
    eval_batch = batch_for_mesh(min(flat.eval_batch_size, largest), mesh)
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
        return decoded.task_accuracy(
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
    result = runner.train(job, flat.run, run_dir, kill_after_chunk)
    params = result.states.params
    checkpoints.save_params(run_dir, params)

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
        "eval_examples": eval_examples(task, eval_problems, completions),
    }
    run_dir.write_summary(summary)
    title = f"DPO ({config.loss_type}) {name}"
    run_dir.write_learning_curve(x="step", y="reward_accuracy", title=title)
    held_out = (
        f"eval_reward_accuracy {pair_metrics['eval_reward_accuracy']:.3f} (before training: "
        f"{ties(initial_pairs)}), eval_loss {pair_metrics['eval_loss']:.3f} "
        f"(before: {initial_pairs['eval_loss']:.3f}) on {len(arrays['eval']['chosen_tokens'])} "
        "held-out pairs"
    )
    if accuracy is not None:  # a digit task: greedy answers scored
        held_out += f", eval_task_accuracy {accuracy:.3f} (SFT model: {sft_accuracy:.3f})"
    where = lm_runs.finish(run, run_dir)  # summary.json is written: the final state may go
    print(
        f"{title}: {held_out} after {config.num_steps} steps in {summary['wall_seconds']:.0f}s "
        f"(compile {summary['compile_seconds']:.0f}s). {where}"
    )
    return base.Result(result.states, summary, run_dir.path)
