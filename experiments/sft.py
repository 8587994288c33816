"""Supervised fine-tuning of a language model on a text task (the starting point of DPO and GRPO).

    python experiments/sft.py --workdir=runs/sft
    python experiments/sft.py --config.num_steps=400 --config.mesh_shape="(1,2,1)"

Trains on (prompt, answer) pairs of the task, in compiled chunks of optimizer steps with a
checkpoint after each; restarted on an existing --workdir it resumes from the newest checkpoint.
The run directory ends with `params/` (the trained parameters, which `experiments/dpo.py
--config.init_from=<this workdir>` starts from) and `summary.json`, whose `eval_task_accuracy` is
the exact-match accuracy of greedy generations on held-out problems.
"""

from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import app, flags, logging  # noqa: E402
from ml_collections import config_flags  # noqa: E402

from algos import sft  # noqa: E402
from experiments import _lm  # noqa: E402
from experiments._common import REPO_ROOT, build_config, check_resumable, fail  # noqa: E402
from jaxrl.config import ConfigError  # noqa: E402
from jaxrl.data import tokenize_sft  # noqa: E402
from jaxrl.lm import training  # noqa: E402
from jaxrl.logging import RunDirectory, to_jsonable  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file(
    "config",
    os.path.join(REPO_ROOT, "experiments", "configs", "sft.py"),
    "Config file and preset; override fields with --config.X=V.",
    lock_config=True,
)
_WORKDIR = flags.DEFINE_string("workdir", None, "Run directory; an existing one is resumed.")
_KILL_AFTER_CHUNK = flags.DEFINE_integer(
    "kill_after_chunk", None, "Testing aid: SIGKILL this process right after chunk K's checkpoint."
)


def main(argv: list[str]) -> None:
    logging.set_verbosity(logging.WARNING)
    if len(argv) > 1:
        fail(f"unexpected arguments {argv[1:]}; settings are flags, e.g. --config.num_steps=100")
    flat = _CONFIG.value
    config = build_config(sft.Config, flat)
    _lm.check_run_settings(flat.run)
    mesh = _lm.make_mesh(config.mesh_shape)
    task, tokenizer = _lm.task_and_tokenizer(flat.task)
    model = _lm.model_config(flat.model)
    workdir = _WORKDIR.value or os.path.join(
        "runs", f"sft-{task.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    )

    train_problems, eval_problems = _lm.split_problems(task, flat.task)

    def tokenize(problems: list[str]) -> dict:
        prompts, answers = [task.prompt(p) for p in problems], [task.answer(p) for p in problems]
        lengths = (flat.task.max_prompt_length, flat.task.max_length)
        return tokenize_sft(prompts, answers, tokenizer, *lengths)

    try:
        train, held_out = tokenize(train_problems), tokenize(eval_problems)
    except ConfigError as error:
        fail(f"config.task.{error}")
    if config.batch_size > len(train_problems):
        fail(
            f"config.batch_size: {config.batch_size} exceeds "
            f"config.task.num_train={len(train_problems)}"
        )

    params, model, source = _lm.initial_params(model, flat.init_from, flat.seed, mesh)
    run_dir = RunDirectory(workdir)
    check_resumable(run_dir.saved_config(), to_jsonable(flat.to_dict()), workdir)
    run_dir.write_config(to_jsonable(flat.to_dict()))

    state = training.init_state(params, config.optimizer(), mesh)
    train_arrays = {k: train[k] for k in ("tokens", "attention_mask", "loss_mask")}
    result = _lm.train_in_chunks(
        lambda sink: sft.make_train_chunk(model, config, mesh, callback=sink),
        state,
        _lm.dataset_batches(train_arrays, config, flat.seed, mesh),
        config.num_steps,
        config.batch_size,
        flat.run,
        run_dir,
        mesh,
        f"SFT {task.name}",
        kill_after_chunk=_KILL_AFTER_CHUNK.value,
    )
    _lm.save_params(run_dir, result.state.params)

    t0 = time.time()
    max_new_tokens = flat.task.max_length - flat.task.max_prompt_length
    accuracy, mean_score, completions = _lm.task_accuracy(
        model, result.state.params, task, tokenizer, eval_problems,
        held_out["prompt_tokens"], held_out["prompt_mask"], max_new_tokens, mesh,
    )  # fmt: skip
    eval_seconds = time.time() - t0
    tokens = config.num_steps * config.batch_size * flat.task.max_length
    summary = {
        "algo": "sft",
        "task": task.name,
        "num_seeds": 1,
        "init_from": source,
        "wall_seconds": round(result.compile_seconds + result.train_seconds + eval_seconds, 2),
        "compile_seconds": round(result.compile_seconds, 2),
        "updates": config.num_steps,
        "tokens": tokens,  # padded sequence tokens processed
        "tokens_per_second": round(
            (config.num_steps - result.resumed_from_step)
            * config.batch_size
            * flat.task.max_length
            / max(result.train_seconds, 1e-9)
        ),  # fmt: skip
        "eval_task_accuracy": accuracy,
        "eval_task_score": mean_score,
        "eval_examples": _lm.eval_examples(task, eval_problems, completions),
        "mesh_shape": list(config.mesh_shape),
        "resumed_from_step": result.resumed_from_step,
    }
    run_dir.write_summary(summary)
    run_dir.write_learning_curve(
        x="update",
        y="loss",
        title=f"SFT {task.name}",
    )
    print(
        f"SFT {task.name}: eval_task_accuracy {accuracy:.3f} (mean score {mean_score:.3f}) after "
        f"{config.num_steps} steps in {summary['wall_seconds']:.0f}s (compile "
        f"{result.compile_seconds:.0f}s). Run directory: {run_dir.path}"
    )


if __name__ == "__main__":
    app.run(main)
