"""What the preference-pair scripts (dpo.py, reward_model.py) share: the pairs read from the
user's JSONL files or made from the task's problems, checked and tokenised to fixed shapes before
anything is written, and kept in the run directory as a tensorflow-datasets dataset."""

from __future__ import annotations

import json
from typing import Any, NamedTuple

import numpy as np
import tensorflow_datasets as tfds
from absl import logging

from envs.text import protocol
from jaxrl import distributed
from jaxrl.config import ConfigError, fail
from jaxrl.data.chat import (
    ChatDataError,
    check_cuts,
    fit_lengths,
    jsonl_exists,
    require_chat_template,
    source_name,
)
from jaxrl.data.preferences import (
    PreferenceDataError,
    build_preference_dataset,
    encode_preference_rows,
    numbered_preference_rows,
    pack_pairs,
    pair_lengths,
)
from jaxrl.logging import RunDirectory
from jaxrl.trainers import data_sizes, lm_runs

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


def read_pairs(run, field: str) -> tuple[list[dict], list[str]]:
    """The checked rows of config.task.<field> and their file:line (one error line otherwise)."""
    path = run.data(field)
    if not jsonl_exists(path):
        fail(f"config.task.{field}: {path}: no such file; pass the path of a JSONL file")
    try:
        numbered = list(numbered_preference_rows(path))
    except PreferenceDataError as error:
        fail(str(error))
    if not numbered:
        fail(
            f"config.task.{field}: {source_name(path)}: no rows (the file is empty); write one "
            "JSON object "
            "with prompt, chosen and rejected a line"
        )
    return [row for _, row in numbered], [where for where, _ in numbered]


def preference_pairs(run) -> Pairs:
    """The user's pairs (config.task.train_jsonl, and eval_jsonl or num_eval of its rows held
    out by data_seed; or rows given in their place), or synthetic pairs of the task's problems;
    nothing written yet."""
    task, section = run.task, run.flat.task
    if section.eval_jsonl and not section.train_jsonl:
        fail(
            "config.task.eval_jsonl: held-out pairs without training pairs; set "
            "config.task.train_jsonl too (or neither, for the task's synthetic pairs)"
        )
    if section.train_jsonl:
        rows, wheres = read_pairs(run, "train_jsonl")
        if section.eval_jsonl:
            eval_rows, eval_wheres = read_pairs(run, "eval_jsonl")
            fields = {"train": "train_jsonl", "eval": "eval_jsonl"}
        else:
            try:
                numbered = list(zip(wheres, rows, strict=True))
                train, held_out = data_sizes.held_out_split(run, numbered, "pairs")
            except ConfigError as error:
                fail(f"config.task.{error}")
            (wheres, rows), (eval_wheres, eval_rows) = (
                ([w for w, _ in part], [r for _, r in part]) for part in (train, held_out)
            )
            fields = {"train": "train_jsonl", "eval": "train_jsonl"}
        return Pairs(
            {"train": rows, "eval": eval_rows}, {"train": wheres, "eval": eval_wheres}, fields, []
        )
    train_problems, eval_problems = lm_runs.split_problems(task, section)
    rng = np.random.default_rng(section.data_seed + 1)
    try:
        rows = {
            split: protocol.preference_rows(task, problems, rng)
            for split, problems in zip(SPLITS, (train_problems, eval_problems), strict=True)
        }
    except ConfigError as error:
        fail(f"config.task.{error}")
    wheres = {split: [f"{split} pair {i}" for i in range(len(rows[split]))] for split in SPLITS}
    return Pairs(rows, wheres, {split: "name" for split in SPLITS}, eval_problems)


def preference_arrays(pairs: Pairs, run) -> PairArrays:
    """Every split's pairs tokenised (chat rows rendered by the tokenizer's chat template) to
    lengths that are the config's or, where 0, the pairs' (config.task.length_percentile; the
    task's: lm_runs.TASK_LENGTHS), with the pairs they cut counted and checked: any problem
    one error line, before anything is written."""
    section = run.flat.task
    encoded = {}
    try:
        for split in SPLITS:
            field = pairs.fields[split]
            if any(isinstance(row["prompt"], list) for row in pairs.rows[split]):
                require_chat_template(run.tokenizer, field, source_name(run.data(field)))
            encoded[split] = encode_preference_rows(
                pairs.rows[split], run.tokenizer, pairs.wheres[split]
            )
        # One shape for both splits: lengths from all the pairs, so the held-out ones fit too.
        prompt, rest = pair_lengths(
            encoded["train"][0] + encoded["eval"][0], encoded["train"][1] + encoded["eval"][1]
        )
        settings = (section.max_prompt_length, section.max_length)
        if not section.train_jsonl:  # the task's pairs
            settings = lm_runs.task_lengths(section)
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
        fail(str(error))
    except ConfigError as error:
        fail(f"config.task.{error}")
    return PairArrays(arrays, *lengths, cut_rows)


def record_dataset(pairs: Pairs, run, run_dir: RunDirectory) -> str:
    """The pairs kept in the run directory as a tensorflow-datasets dataset (array_record, read
    with `jaxrl.data.load_preference_split`), built from the user's two files, or from JSONL
    files of the splits written here (the task's pairs, or a held-out split of the user's file).
    Returns its directory."""
    paths = {"train": run.data("train_jsonl"), "eval": run.data("eval_jsonl")}
    if not all(isinstance(path, str) and path for path in paths.values()):
        paths = {split: run_dir.file(f"{split}preference_data.jsonl") for split in SPLITS}
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


def data_name(run) -> str:
    """What the pairs are called in messages and titles: the user's file, or the task."""
    return source_name(run.data("train_jsonl")) if run.flat.task.train_jsonl else run.task.name


def pair_summary_fields(summary: dict, data: PairArrays, config) -> dict:
    """What both pair scripts' summaries report of their data and speed: tokens (padded chosen +
    rejected) and pairs per second, the lengths, the rows cut and the mesh."""
    tokens_per_step = config.batch_size * 2 * data.max_length
    return {
        "tokens": config.num_steps * tokens_per_step,
        "tokens_per_second": round(summary["steps_per_second"] * tokens_per_step),
        "pairs_per_second": round(summary["steps_per_second"] * config.batch_size, 1),
        "max_prompt_length": data.max_prompt_length,
        "max_length": data.max_length,
        "cut_rows": data.cut_rows,
        "mesh_shape": list(config.mesh_shape),
    }


def checked_pairs(run, algorithm: str) -> tuple[Any, Pairs, PairArrays]:
    """The run (its batch size fitted to the user's pairs where the preset's is larger:
    `data_sizes.fitted_batch_size`), its pairs and their arrays, every setting and row checked
    (one error line otherwise, before anything is written), with a line saying what they
    are."""
    section = run.flat.task
    lm_runs.check_length_section(section)
    pairs = preference_pairs(run)
    data = preference_arrays(pairs, run)
    num_pairs = len(data.arrays["train"]["chosen_tokens"])
    if section.train_jsonl:
        run = data_sizes.fitted_batch_size(run, num_pairs, "pairs")
    config = run.config
    if config.batch_size > num_pairs:
        fail(
            f"config.batch_size: {config.batch_size} exceeds the {num_pairs} training pairs; "
            "lower it or give more pairs"
        )
    held_out = len(data.arrays["eval"]["chosen_tokens"])
    if section.train_jsonl and section.eval_jsonl:  # each split named after its own file
        where = (
            f"{num_pairs} training pairs of {source_name(run.data('train_jsonl'))} and "
            f"{held_out} held-out pairs of {source_name(run.data('eval_jsonl'))}"
        )
    else:
        where = f"{num_pairs} training and {held_out} held-out pairs of {data_name(run)}"
    print(
        f"{algorithm} data: {where}, max_prompt_length={data.max_prompt_length}, "
        f"max_length={data.max_length} tokens; pairs cut: {data.cut_rows['train']} training, "
        f"{data.cut_rows['eval']} held-out"
    )
    return run, pairs, data
