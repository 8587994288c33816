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

import json
import os
import sys
import time
from typing import NamedTuple

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
from jaxrl.data.chat import (  # noqa: E402
    ChatDataError,
    check_cuts,
    check_length_settings,
    fit_lengths,
    hold_out,
    require_chat_template,
)
from jaxrl.data.preferences import (  # noqa: E402
    PreferenceDataError,
    build_preference_dataset,
    encode_preference_rows,
    numbered_preference_rows,
    pack_pairs,
    pair_lengths,
)
from jaxrl.data.step_batches import dataset_batches  # noqa: E402
from jaxrl.lm import training  # noqa: E402
from jaxrl.logging import RunDirectory  # noqa: E402

FLAGS = runner.define_flags("dpo.py", seeds=False)
SPLITS = ("train", "eval")
ROWS_NAMES = {"train": "training pairs", "eval": "held-out pairs"}


class Pairs(NamedTuple):
    """Preference rows per split, where each came from, and the task's held-out problems."""

    rows: dict[str, list[dict]]  # split -> {"prompt", "chosen", "rejected"} rows
    wheres: dict[str, list[str]]  # split -> "file:line" (or "train pair 3") of each row
    fields: dict[str, str]  # split -> the setting its rows came from, for error lines
    eval_problems: list[str]  # the task's held-out problems; [] for the user's files


class PairArrays(NamedTuple):
    """The pairs tokenised to fixed shapes, and the lengths and cuts that made them."""

    arrays: dict[str, dict[str, np.ndarray]]
    max_prompt_length: int
    max_length: int
    cut_rows: dict[str, int]


def read_pairs(flat, field: str) -> tuple[list[dict], list[str]]:
    """The checked rows of config.task.<field> and their file:line (one error line otherwise)."""
    path = flat.task[field]
    if not os.path.isfile(path):
        runner.fail(f"config.task.{field}: {path}: no such file; pass the path of a JSONL file")
    try:
        numbered = list(numbered_preference_rows(path))
    except PreferenceDataError as error:
        runner.fail(str(error))
    if not numbered:
        runner.fail(
            f"config.task.{field}: {path}: no rows (the file is empty); write one JSON object "
            "with prompt, chosen and rejected a line"
        )
    return [row for _, row in numbered], [where for where, _ in numbered]


def preference_pairs(task, flat) -> Pairs:
    """The user's pairs (config.task.train_jsonl, and eval_jsonl or num_eval of its rows held
    out by data_seed), or synthetic pairs of the task's problems; nothing written yet."""
    section = flat.task
    if section.eval_jsonl and not section.train_jsonl:
        runner.fail(
            "config.task.eval_jsonl: held-out pairs without training pairs; set "
            "config.task.train_jsonl too (or neither, for the task's synthetic pairs)"
        )
    if section.train_jsonl:
        rows, wheres = read_pairs(flat, "train_jsonl")
        if section.eval_jsonl:
            eval_rows, eval_wheres = read_pairs(flat, "eval_jsonl")
            fields = {"train": "train_jsonl", "eval": "eval_jsonl"}
        else:
            try:
                numbered = list(zip(wheres, rows, strict=True))
                train, held_out = hold_out(numbered, section.num_eval, section.data_seed)
            except ConfigError as error:
                runner.fail(f"config.task.{error}")
            (wheres, rows), (eval_wheres, eval_rows) = (
                ([w for w, _ in part], [r for _, r in part]) for part in (train, held_out)
            )
            fields = {"train": "train_jsonl", "eval": "train_jsonl"}
        return Pairs(
            {"train": rows, "eval": eval_rows}, {"train": wheres, "eval": eval_wheres}, fields, []
        )
    train_problems, eval_problems = _lm.split_problems(task, section)
    rng = np.random.default_rng(section.data_seed + 1)
    rows = {
        split: list(task.preference_rows(problems, rng))
        for split, problems in zip(SPLITS, (train_problems, eval_problems), strict=True)
    }
    wheres = {split: [f"{split} pair {i}" for i in range(len(rows[split]))] for split in SPLITS}
    return Pairs(rows, wheres, {split: "name" for split in SPLITS}, eval_problems)


def preference_arrays(pairs: Pairs, run) -> PairArrays:
    """Every split's pairs tokenised (chat rows rendered by the tokenizer's chat template) to
    lengths that are the config's or, where 0, the pairs' (config.task.length_percentile; the
    task's: _lm.TASK_LENGTHS), with the pairs they cut counted and checked: any problem one error
    line, before anything is written."""
    section = run.flat.task
    encoded = {}
    try:
        for split in SPLITS:
            field = pairs.fields[split]
            if any(isinstance(row["prompt"], list) for row in pairs.rows[split]):
                require_chat_template(run.tokenizer, field, section[field])
            encoded[split] = encode_preference_rows(
                pairs.rows[split], run.tokenizer, pairs.wheres[split]
            )
        # One shape for both splits: lengths from all the pairs, so the held-out ones fit too.
        prompt, rest = pair_lengths(
            encoded["train"][0] + encoded["eval"][0], encoded["train"][1] + encoded["eval"][1]
        )
        settings = (section.max_prompt_length, section.max_length)
        if not section.train_jsonl:  # the task's pairs
            settings = _lm.task_lengths(section)
        lengths = fit_lengths(prompt, rest, *settings, section.length_percentile)
        given = (bool(settings[0]), bool(settings[1]))  # not taken from the data
        cut_rows = {
            split: check_cuts(
                *pair_lengths(*encoded[split]),
                *lengths,
                section.max_cut_fraction,
                ROWS_NAMES[split],
                given,
            )
            for split in SPLITS
        }
        arrays = {split: pack_pairs(*encoded[split], run.tokenizer, *lengths) for split in SPLITS}
    except ChatDataError as error:
        runner.fail(str(error))
    except ConfigError as error:
        runner.fail(f"config.task.{error}")
    return PairArrays(arrays, *lengths, cut_rows)


def record_dataset(pairs: Pairs, flat, run_dir: RunDirectory) -> str:
    """The pairs kept in the run directory as a tensorflow-datasets dataset (array_record, read
    with `jaxrl.data.load_preference_split`), built from the user's two files, or from JSONL
    files of the splits written here (the task's pairs, or a held-out split of the user's file).
    Returns its directory."""
    section = flat.task
    if section.train_jsonl and section.eval_jsonl:
        paths = {"train": section.train_jsonl, "eval": section.eval_jsonl}
    else:
        paths = {split: run_dir.file(f"{split}_pairs.jsonl") for split in SPLITS}
        if run_dir.writes:  # in a multi-host run, process 0 writes the files all processes read
            for split, path in paths.items():
                with open(path, "w", encoding="utf-8") as f:
                    for row in pairs.rows[split]:
                        f.write(json.dumps(row, ensure_ascii=False) + "\n")
        distributed.barrier("preference files")
    tfds.disable_progress_bar()
    logging.set_verbosity(logging.ERROR)  # tfds warns that our builder config is custom
    try:
        # Process 0 builds first; the other processes of a multi-host run then find it built.
        if run_dir.writes:
            built = build_preference_dataset(paths, run_dir.file("tfds"))
        distributed.barrier("preference dataset")
        if not run_dir.writes:
            built = build_preference_dataset(paths, run_dir.file("tfds"))
    finally:
        logging.set_verbosity(logging.WARNING)
    return built


def main(argv: list[str]) -> None:
    run = _lm.setup(FLAGS, dpo.Config, "dpo")
    flat, config, mesh, task = run.flat, run.config, run.mesh, run.task
    if not flat.init_from:
        runner.fail(
            "config.init_from: DPO starts from an SFT model; run `python experiments/sft.py "
            "--workdir=runs/sft` first and pass --config.init_from=runs/sft"
        )
    try:
        check_length_settings(
            flat.task.max_prompt_length,
            flat.task.max_length,
            flat.task.length_percentile,
            flat.task.max_cut_fraction,
        )
    except ConfigError as error:
        runner.fail(f"config.task.{error}")
    pairs = preference_pairs(task, flat)
    data = preference_arrays(pairs, run)
    arrays, eval_problems = data.arrays, pairs.eval_problems
    name = os.path.basename(flat.task.train_jsonl) if flat.task.train_jsonl else task.name
    num_pairs = len(arrays["train"]["chosen_tokens"])
    if config.batch_size > num_pairs:
        runner.fail(
            f"config.batch_size: {config.batch_size} exceeds the {num_pairs} training pairs; "
            "lower it or give more pairs"
        )
    print(
        f"DPO data: {num_pairs} training and {len(arrays['eval']['chosen_tokens'])} held-out "
        f"pairs of {name}, max_prompt_length={data.max_prompt_length}, max_length="
        f"{data.max_length} tokens; pairs cut: {data.cut_rows['train']} training, "
        f"{data.cut_rows['eval']} held-out"
    )
    # The SFT model: where DPO starts, and its reference.
    params, model, source = _lm.initial_params(run)
    run_dir = _lm.open_run(run)
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
    eval_batch = _lm.batch_for_mesh(min(flat.eval_batch_size, largest), mesh)
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
        return _lm.task_accuracy(
            model, params, task, run.tokenizer, eval_problems, *held_out_prompts,
            max_new_tokens, mesh,
        )  # fmt: skip

    sft_accuracy, _, _ = task_accuracy(params)

    algorithm = dpo.make(config, model, params, mesh, answer_window)
    batches_for = dataset_batches(train, config, flat.seed, mesh)
    in_step_reference = params if config.reference == "in_step" else None
    job = _lm.job(
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
    _lm.save_params(run_dir, params)

    t0 = time.time()
    pair_metrics = dpo.evaluate_pairs(
        score, params, eval_reference, arrays["eval"], config, eval_batch, place
    )
    accuracy, mean_score, completions = task_accuracy(params)
    summary = runner.summary_fields(job, result, time.time() - t0)
    tokens_per_step = config.batch_size * 2 * data.max_length  # padded chosen + rejected
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
        "max_prompt_length": data.max_prompt_length,
        "max_length": data.max_length,
        "cut_rows": data.cut_rows,
        "mesh_shape": list(config.mesh_shape),
    }
    run_dir.write_summary(summary)
    title = f"DPO ({config.loss_type}) {name}"
    run_dir.write_learning_curve(x="step", y="reward_accuracy", title=title)
    print(
        f"{title}: eval_reward_accuracy {pair_metrics['eval_reward_accuracy']:.3f}, "
        f"eval_task_accuracy {accuracy} (SFT model: {sft_accuracy}) after {config.num_steps} "
        f"steps in {summary['wall_seconds']:.0f}s (compile {summary['compile_seconds']:.0f}s). "
        f"Run directory: {run_dir.path}"
    )


if __name__ == "__main__":
    runner.main(main)
