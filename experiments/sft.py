"""Supervised fine-tuning of a language model on a text task (the starting point of DPO and GRPO).

    python experiments/sft.py --workdir=runs/sft
    python experiments/sft.py --config.num_steps=400 --config.mesh_shape="(1,2,1)"

Trains on (prompt, answer) pairs of the task, in compiled chunks of optimizer steps on
`jaxrl.runner`, with a checkpoint after each; restarted on an existing --workdir it resumes and
ends exactly where an uninterrupted run would. The run directory ends with `params/` (the trained
parameters, which `experiments/dpo.py --config.init_from=<this workdir>` starts from) and
`summary.json`, whose `eval_task_accuracy` is the exact-match accuracy of greedy generations on
held-out problems.
"""

from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


import envs.text  # noqa: E402, F401  (the tasks: imported at start, as a run needs them)
from algos import sft  # noqa: E402
from experiments import _lm  # noqa: E402
from jaxrl import runner  # noqa: E402
from jaxrl.config import ConfigError  # noqa: E402
from jaxrl.data import tokenize_sft  # noqa: E402
from jaxrl.data.step_batches import dataset_batches  # noqa: E402

FLAGS = runner.define_flags("sft.py", seeds=False)


def main(argv: list[str]) -> None:
    run = _lm.setup(FLAGS, sft.Config, "sft")
    flat, config, mesh, task = run.flat, run.config, run.mesh, run.task
    train_problems, eval_problems = _lm.split_problems(task, flat.task)
    max_new_tokens = flat.task.max_length - flat.task.max_prompt_length

    def tokenize(problems: list[str]) -> dict:
        prompts, answers = [task.prompt(p) for p in problems], [task.answer(p) for p in problems]
        lengths = (flat.task.max_prompt_length, flat.task.max_length)
        # A cut prompt is another question: too short a length is an error, not a silent cut.
        return tokenize_sft(prompts, answers, run.tokenizer, *lengths, truncate=False)

    try:
        train, held_out = tokenize(train_problems), tokenize(eval_problems)
    except ConfigError as error:
        runner.fail(f"config.task.{error}")
    if config.batch_size > len(train_problems):
        runner.fail(
            f"config.batch_size: {config.batch_size} exceeds "
            f"config.task.num_train={len(train_problems)}"
        )
    params, model, source = _lm.initial_params(run)
    run_dir = _lm.open_run(run)

    algorithm = sft.make(config, model, params, mesh)
    train_arrays = {k: train[k] for k in ("tokens", "attention_mask", "loss_mask")}
    job = _lm.job(
        run,
        algorithm,
        f"SFT {task.name}",
        scan_inputs=True,
        inputs_for=dataset_batches(train_arrays, config, flat.seed, mesh),
        units_name="sequences",
        units_per_step=config.batch_size,
    )
    result = runner.train(job, flat.run, run_dir, FLAGS["kill_after_chunk"].value)
    params = result.states.params
    _lm.save_params(run_dir, params)

    t0 = time.time()
    accuracy, mean_score, completions = _lm.task_accuracy(
        model, params, task, run.tokenizer, eval_problems,
        held_out["prompt_tokens"], held_out["prompt_mask"], max_new_tokens, mesh,
    )  # fmt: skip
    summary = runner.summary_fields(job, result, time.time() - t0)
    tokens_per_step = config.batch_size * flat.task.max_length  # padded sequence tokens
    summary |= {
        "task": task.name,
        "init_from": source,
        "tokens": config.num_steps * tokens_per_step,
        "tokens_per_second": round(summary["steps_per_second"] * tokens_per_step),
        "eval_task_accuracy": accuracy,
        "eval_task_score": mean_score,
        "eval_examples": _lm.eval_examples(task, eval_problems, completions),
        "mesh_shape": list(config.mesh_shape),
    }
    run_dir.write_summary(summary)
    run_dir.write_learning_curve(x="step", y="loss", title=f"SFT {task.name}")
    print(
        f"SFT {task.name}: eval_task_accuracy {accuracy:.3f} (mean score {mean_score:.3f}) after "
        f"{config.num_steps} steps in {summary['wall_seconds']:.0f}s (compile "
        f"{summary['compile_seconds']:.0f}s). Run directory: {run_dir.path}"
    )


if __name__ == "__main__":
    runner.main(main)
