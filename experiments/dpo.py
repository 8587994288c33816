"""DPO (or IPO / conservative DPO / SimPO) of an SFT model on preference pairs.

    python experiments/sft.py --workdir=runs/sft
    python experiments/dpo.py --config.init_from=runs/sft --workdir=runs/dpo
    python experiments/dpo.py --config.init_from=runs/sft --config.loss_type=ipo

The preference data are written as JSONL, built into a tensorflow-datasets dataset (array_record)
and read back through it, so your own JSONL files with `prompt`, `chosen`, `rejected` go the same
way (--config.task.train_jsonl / eval_jsonl). With the reverse-digits task the pairs are synthetic:
chosen is the right answer, rejected a plausibly wrong one. The reference model is the SFT model.
`summary.json` reports held-out `eval_reward_accuracy` (the policy's implicit reward ranks chosen
above rejected) and `eval_task_accuracy` (greedy generations exactly right), next to the SFT
model's `sft_eval_task_accuracy`.
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
from absl import app, flags, logging  # noqa: E402
from ml_collections import config_flags  # noqa: E402

from algos import dpo  # noqa: E402
from experiments import _lm  # noqa: E402
from experiments._common import REPO_ROOT, build_config, check_resumable, fail  # noqa: E402
from jaxrl import distributed, sharding  # noqa: E402
from jaxrl.config import ConfigError  # noqa: E402
from jaxrl.data import (  # noqa: E402
    PreferenceDataError,
    build_preference_dataset,
    load_preference_split,
    tokenize_preferences,
)
from jaxrl.lm import training  # noqa: E402
from jaxrl.logging import RunDirectory, to_jsonable  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file(
    "config",
    os.path.join(REPO_ROOT, "experiments", "configs", "dpo.py"),
    "Config file and preset; override fields with --config.X=V.",
    lock_config=True,
)
_WORKDIR = flags.DEFINE_string("workdir", None, "Run directory; an existing one is resumed.")
_KILL_AFTER_CHUNK = flags.DEFINE_integer(
    "kill_after_chunk", None, "Testing aid: SIGKILL this process right after chunk K's checkpoint."
)


def preference_files(task, flat, run_dir: RunDirectory) -> tuple[dict[str, str], list[str]]:
    """The JSONL files to build from: the user's, or synthetic task pairs written to the run dir.
    Returns {split: path} and the held-out problems (empty for user files)."""
    section = flat.task
    if bool(section.train_jsonl) != bool(section.eval_jsonl):
        fail("config.task.train_jsonl / eval_jsonl: set both (train and held-out pairs) or neither")
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


def main(argv: list[str]) -> None:
    logging.set_verbosity(logging.WARNING)
    if len(argv) > 1:
        fail(f"unexpected arguments {argv[1:]}; settings are flags, e.g. --config.beta=0.2")
    flat = _CONFIG.value
    config = build_config(dpo.Config, flat)
    _lm.check_run_settings(flat.run)
    if not flat.init_from:
        fail(
            "config.init_from: DPO starts from an SFT model; run `python experiments/sft.py "
            "--workdir=runs/sft` first and pass --config.init_from=runs/sft"
        )
    mesh = _lm.make_mesh(config.mesh_shape)
    task, tokenizer = _lm.task_and_tokenizer(flat.task)
    model = _lm.model_config(flat.model)
    workdir = _WORKDIR.value or os.path.join(
        "runs", f"dpo-{task.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    )
    params, model, source = _lm.initial_params(model, flat.init_from, flat.seed, mesh)
    # The SFT model, copied: the training state's params are donated to each chunk call, and
    # the in-step reference must not share their buffers.
    reference_params = jax.tree.map(lambda x: x.copy(), params)
    run_dir = RunDirectory(workdir)
    check_resumable(run_dir.saved_config(), to_jsonable(flat.to_dict()), workdir)
    run_dir.write_config(to_jsonable(flat.to_dict()))

    # Preference data: JSONL -> tensorflow-datasets (array_record) -> fixed-shape arrays.
    paths, eval_problems = preference_files(task, flat, run_dir)
    try:
        tfds.disable_progress_bar()
        logging.set_verbosity(logging.ERROR)  # tfds warns that our builder config is custom
        # Process 0 builds first; the other processes of a multi-host run then find it built.
        if run_dir.writes:
            built = build_preference_dataset(paths, run_dir.file("tfds"))
        distributed.barrier("preference dataset")
        if not run_dir.writes:
            built = build_preference_dataset(paths, run_dir.file("tfds"))
        splits = {split: list(load_preference_split(built, split)) for split in paths}
        arrays = {
            split: tokenize_preferences(
                rows, tokenizer, flat.task.max_prompt_length, flat.task.max_length
            )
            for split, rows in splits.items()
        }
    except (PreferenceDataError, FileNotFoundError, ConfigError) as error:
        fail(str(error))
    if config.batch_size > len(splits["train"]):
        fail(
            f"config.batch_size: {config.batch_size} exceeds the "
            f"{len(splits['train'])} training pairs"
        )

    logging.set_verbosity(logging.WARNING)

    # The reference model's log-probs: once over the data here, or inside each step.
    # Replicated outputs: every process of a multi-host run reads all the scores.
    score = jax.jit(dpo.make_score(model, mesh), out_shardings=sharding.replicated(mesh))
    eval_batch = _lm.batch_for_mesh(flat.eval_batch_size, mesh)
    place = lambda batch: sharding.shard_batch(batch, mesh)
    t0 = time.time()
    eval_reference = dpo.reference_log_probs(
        score, reference_params, arrays["eval"], eval_batch, place
    )
    train = {k: v for k, v in arrays["train"].items() if k.startswith(("chosen_", "rejected_"))}
    if config.uses_reference and config.reference == "precomputed":
        train.update(
            dpo.reference_log_probs(score, reference_params, arrays["train"], eval_batch, place)
        )
    reference_seconds = time.time() - t0

    max_new_tokens = flat.task.max_length - flat.task.max_prompt_length
    held_out_prompts = (arrays["eval"]["prompt_tokens"], arrays["eval"]["prompt_mask"])
    sft_accuracy = None
    if eval_problems:
        sft_accuracy, _, _ = _lm.task_accuracy(
            model, params, task, tokenizer, eval_problems, *held_out_prompts, max_new_tokens, mesh
        )

    state = training.init_state(params, config.optimizer(), mesh)
    in_step_reference = reference_params if config.reference == "in_step" else None
    result = _lm.train_in_chunks(
        lambda sink: dpo.make_train_chunk(model, config, mesh, callback=sink),
        state,
        _lm.dataset_batches(train, config, flat.seed, mesh),
        config.num_steps,
        config.batch_size,
        flat.run,
        run_dir,
        mesh,
        f"DPO ({config.loss_type}) {task.name}",
        extra=in_step_reference,
        kill_after_chunk=_KILL_AFTER_CHUNK.value,
    )
    _lm.save_params(run_dir, result.state.params)

    t0 = time.time()
    pair_metrics = dpo.evaluate_pairs(
        score, result.state.params, eval_reference, arrays["eval"], config, eval_batch, place
    )
    accuracy = mean_score = None
    completions: list[str] = []
    if eval_problems:
        accuracy, mean_score, completions = _lm.task_accuracy(
            model,
            result.state.params,
            task,
            tokenizer,
            eval_problems,
            *held_out_prompts,
            max_new_tokens,
            mesh,
        )
    eval_seconds = time.time() - t0
    tokens_per_step = config.batch_size * 2 * flat.task.max_length
    summary = {
        "algo": "dpo",
        "loss_type": config.loss_type,
        "task": task.name if eval_problems else None,
        "dataset": built,
        "num_seeds": 1,
        "init_from": source,
        "wall_seconds": round(
            result.compile_seconds + result.train_seconds + eval_seconds + reference_seconds, 2
        ),
        "compile_seconds": round(result.compile_seconds, 2),
        "reference_seconds": round(reference_seconds, 2),
        "updates": config.num_steps,
        "tokens": config.num_steps * tokens_per_step,  # padded chosen + rejected sequence tokens
        "tokens_per_second": round(
            (config.num_steps - result.resumed_from_step)
            * tokens_per_step
            / max(result.train_seconds, 1e-9)
        ),
        "pairs_per_second": round(
            (config.num_steps - result.resumed_from_step)
            * config.batch_size
            / max(result.train_seconds, 1e-9),
            1,
        ),
        **pair_metrics,
        "eval_task_accuracy": accuracy,
        "eval_task_score": mean_score,
        "sft_eval_task_accuracy": sft_accuracy,
        "eval_examples": _lm.eval_examples(task, eval_problems, completions),
        "mesh_shape": list(config.mesh_shape),
        "resumed_from_step": result.resumed_from_step,
    }
    run_dir.write_summary(summary)
    run_dir.write_learning_curve(
        x="update",
        y="reward_accuracy",
        title=f"DPO ({config.loss_type}) {task.name}",
    )
    print(
        f"DPO ({config.loss_type}) {task.name}: eval_reward_accuracy "
        f"{pair_metrics['eval_reward_accuracy']:.3f}, eval_task_accuracy {accuracy} (SFT model: "
        f"{sft_accuracy}) after {config.num_steps} steps in {summary['wall_seconds']:.0f}s "
        f"(compile {result.compile_seconds:.0f}s). Run directory: {run_dir.path}"
    )


if __name__ == "__main__":
    app.run(main)
