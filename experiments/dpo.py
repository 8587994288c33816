"""DPO (or IPO / conservative DPO / SimPO) of an SFT model on preference pairs.

    python experiments/sft.py --workdir=runs/sft
    python experiments/dpo.py --config.init_from=runs/sft --workdir=runs/dpo
    python experiments/dpo.py --config.init_from=runs/sft --config.loss_type=ipo

The preference data are written as JSONL, built into a tensorflow-datasets dataset (array_record)
and read back through it, so your own JSONL files with `prompt`, `chosen`, `rejected` go the same
way (--config.task.train_jsonl / eval_jsonl). With the reverse-digits task the pairs are synthetic:
chosen is the right answer, rejected a plausibly wrong one. The reference model is the SFT model.
Training runs on `jaxrl.runner` (compiled chunks, checkpoints, resumption). `summary.json` reports
held-out `eval_reward_accuracy` (the policy's implicit reward ranks chosen above rejected) and
`eval_task_accuracy` (greedy generations exactly right), next to the SFT model's
`sft_eval_task_accuracy`.
"""

from __future__ import annotations

import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow_datasets as tfds  # noqa: E402
from absl import logging  # noqa: E402

import envs.text  # noqa: E402, F401  (the tasks: imported at start, as a run needs them)
from algos import dpo  # noqa: E402
from experiments import _lm  # noqa: E402
from jaxrl import distributed, runner, sharding  # noqa: E402
from jaxrl.config import ConfigError  # noqa: E402
from jaxrl.data import (  # noqa: E402
    PreferenceDataError,
    build_preference_dataset,
    load_preference_split,
    tokenize_preferences,
)
from jaxrl.data.step_batches import dataset_batches  # noqa: E402
from jaxrl.lm import training  # noqa: E402
from jaxrl.logging import RunDirectory  # noqa: E402

FLAGS = runner.define_flags("dpo.py", seeds=False)


def preference_files(task, flat, run_dir: RunDirectory) -> tuple[dict[str, str], list[str]]:
    """The JSONL files to build from: the user's, or synthetic task pairs written to the run dir.
    Returns {split: path} and the held-out problems (empty for user files)."""
    section = flat.task
    if bool(section.train_jsonl) != bool(section.eval_jsonl):
        runner.fail(
            "config.task.train_jsonl / eval_jsonl: set both (train and held-out pairs) or neither"
        )
    if section.train_jsonl:
        return {"train": section.train_jsonl, "eval": section.eval_jsonl}, []
    train_problems, eval_problems = _lm.split_problems(task, section)
    rng = np.random.default_rng(section.data_seed + 1)
    paths = {}
    for split, problems in (("train", train_problems), ("eval", eval_problems)):
        paths[split] = run_dir.file(f"{split}_pairs.jsonl")
        if run_dir.writes:  # in a multi-host run, process 0 writes the files all processes read
            with open(paths[split], "w") as f:
                for row in task.preference_rows(problems, rng):
                    f.write(json.dumps(row) + "\n")
    distributed.barrier("preference files")
    return paths, eval_problems


def preference_arrays(paths: dict[str, str], run, run_dir: RunDirectory) -> tuple[str, dict]:
    """JSONL -> tensorflow-datasets (array_record) -> fixed-shape token arrays per split. Returns
    the built dataset's directory and the arrays."""
    try:
        tfds.disable_progress_bar()
        logging.set_verbosity(logging.ERROR)  # tfds warns that our builder config is custom
        # Process 0 builds first; the other processes of a multi-host run then find it built.
        if run_dir.writes:
            built = build_preference_dataset(paths, run_dir.file("tfds"))
        distributed.barrier("preference dataset")
        if not run_dir.writes:
            built = build_preference_dataset(paths, run_dir.file("tfds"))
        lengths = (run.flat.task.max_prompt_length, run.flat.task.max_length)
        arrays = {
            split: tokenize_preferences(
                list(load_preference_split(built, split)), run.tokenizer, *lengths
            )
            for split in paths
        }
    except (PreferenceDataError, FileNotFoundError, ConfigError) as error:
        runner.fail(str(error))
    finally:
        logging.set_verbosity(logging.WARNING)
    return built, arrays


def main(argv: list[str]) -> None:
    run = _lm.setup(FLAGS, dpo.Config, "dpo")
    flat, config, mesh, task = run.flat, run.config, run.mesh, run.task
    if not flat.init_from:
        runner.fail(
            "config.init_from: DPO starts from an SFT model; run `python experiments/sft.py "
            "--workdir=runs/sft` first and pass --config.init_from=runs/sft"
        )
    # The SFT model: where DPO starts, and its reference.
    params, model, source = _lm.initial_params(run)
    run_dir = _lm.open_run(run)
    paths, eval_problems = preference_files(task, flat, run_dir)
    built, arrays = preference_arrays(paths, run, run_dir)
    num_pairs = len(arrays["train"]["chosen_tokens"])
    if config.batch_size > num_pairs:
        runner.fail(
            f"config.batch_size: {config.batch_size} exceeds the {num_pairs} training pairs"
        )

    # The reference model's log-probs: once over the data here, or inside each step.
    # Replicated outputs: every process of a multi-host run reads all the scores.
    score = jax.jit(dpo.make_score(model, mesh), out_shardings=sharding.replicated(mesh))
    eval_batch = _lm.batch_for_mesh(flat.eval_batch_size, mesh)
    place = lambda batch: sharding.shard_batch(batch, mesh)  # noqa: E731
    t0 = time.time()
    eval_reference = dpo.reference_log_probs(score, params, arrays["eval"], eval_batch, place)
    train = {k: v for k, v in arrays["train"].items() if k.startswith(("chosen_", "rejected_"))}
    if config.uses_reference and config.reference == "precomputed":
        train |= dpo.reference_log_probs(score, params, arrays["train"], eval_batch, place)
    reference_seconds = time.time() - t0

    max_new_tokens = flat.task.max_length - flat.task.max_prompt_length
    held_out_prompts = (arrays["eval"]["prompt_tokens"], arrays["eval"]["prompt_mask"])

    def task_accuracy(params):
        if not eval_problems:  # the user's own pairs: no task to score generations
            return None, None, []
        return _lm.task_accuracy(
            model, params, task, run.tokenizer, eval_problems, *held_out_prompts,
            max_new_tokens, mesh,
        )  # fmt: skip

    sft_accuracy, _, _ = task_accuracy(params)

    algorithm = dpo.make(config, model, params, mesh)
    batches_for = dataset_batches(train, config, flat.seed, mesh)
    in_step_reference = params if config.reference == "in_step" else None
    job = _lm.job(
        run,
        algorithm,
        f"DPO ({config.loss_type}) {task.name}",
        chunk=training.make_batch_chunk,
        inputs_for=lambda first, count: (batches_for(first, count), in_step_reference),
        units_name="pairs",
        units_per_step=config.batch_size,
    )
    result = runner.train(job, flat.run, run_dir, FLAGS["kill_after_chunk"].value)
    params = result.states.params
    _lm.save_params(run_dir, params)

    t0 = time.time()
    pair_metrics = dpo.evaluate_pairs(
        score, params, eval_reference, arrays["eval"], config, eval_batch, place
    )
    accuracy, mean_score, completions = task_accuracy(params)
    summary = runner.summary_fields(job, result, time.time() - t0)
    tokens_per_step = config.batch_size * 2 * flat.task.max_length  # padded chosen + rejected
    summary |= {
        "loss_type": config.loss_type,
        "task": task.name if eval_problems else None,
        "dataset": built,
        "init_from": source,
        "wall_seconds": round(summary["wall_seconds"] + reference_seconds, 2),
        "reference_seconds": round(reference_seconds, 2),
        "tokens": config.num_steps * tokens_per_step,
        "tokens_per_second": round(summary["steps_per_second"] * tokens_per_step),
        "pairs_per_second": round(summary["steps_per_second"] * config.batch_size, 1),
        **pair_metrics,
        "eval_task_accuracy": accuracy,
        "eval_task_score": mean_score,
        "sft_eval_task_accuracy": sft_accuracy,
        "eval_examples": _lm.eval_examples(task, eval_problems, completions),
        "mesh_shape": list(config.mesh_shape),
    }
    run_dir.write_summary(summary)
    title = f"DPO ({config.loss_type}) {task.name}"
    run_dir.write_learning_curve(x="step", y="reward_accuracy", title=title)
    print(
        f"{title}: eval_reward_accuracy {pair_metrics['eval_reward_accuracy']:.3f}, "
        f"eval_task_accuracy {accuracy} (SFT model: {sft_accuracy}) after {config.num_steps} "
        f"steps in {summary['wall_seconds']:.0f}s (compile {summary['compile_seconds']:.0f}s). "
        f"Run directory: {run_dir.path}"
    )


if __name__ == "__main__":
    runner.main(main)
