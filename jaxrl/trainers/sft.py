"""Supervised fine-tuning of a language model on a task, a JSONL file of rows or a game's
demonstrations: what `experiments/sft.py` runs (`jaxrl.trainers.base` describes the trainers'
shape).

    from jaxrl.trainers import sft
    rows = [{"prompt": "2+2=", "completion": "4"}, ...]   # or "messages"
    result = sft.train(sft.config(), "runs/sft", model="smollm2", train_data=rows)
    result.summary["eval_loss"]
"""

from __future__ import annotations

import functools
import time
from typing import Any, NamedTuple

import jax
import numpy as np

from algos import sft
from envs.text import protocol  # the tasks: imported at start, as a run needs them
from jaxrl import runner, sharding
from jaxrl.config import ConfigError, fail
from jaxrl.data.chat import (
    ASSISTANT_TURNS,
    ChatDataError,
    check_cuts,
    encode_sft_rows,
    example_lengths,
    fit_lengths,
    jsonl_exists,
    pack,
    read_sft_jsonl,
    require_chat_template,
    source_name,
)
from jaxrl.data.step_batches import dataset_batches
from jaxrl.lm import checkpoints
from jaxrl.lm.completions import batch_for_mesh, eval_examples, task_accuracy
from jaxrl.lm.model import ModelConfig, Transformer
from jaxrl.trainers import base, data_sizes, game_play, lm_runs

config = functools.partial(base.load_config, "sft")
TRAIN_KEYS = ("tokens", "attention_mask", "loss_mask")
EVAL_BATCH_SIZE = 64
ROWS_NAMES = {"train": "training rows", "eval": "held-out rows"}


class SftData(NamedTuple):
    """What SFT trains and evaluates on, tokenised to fixed shapes before anything is written."""

    name: str  # the task's name, or the training file's
    train: dict[str, np.ndarray]
    held_out: dict[str, np.ndarray]
    max_prompt_length: int
    max_length: int
    cut_rows: dict[str, int]  # rows cut by the lengths, per split
    eval_problems: list[str]  # the task's held-out problems; [] for a file (no task to score)


def check_task_settings(section: Any) -> None:
    """The task section's data settings on their own, each problem one error line."""
    lm_runs.check_length_section(section)
    if section.assistant_turns not in ASSISTANT_TURNS:
        fail(
            f"config.task.assistant_turns: got {section.assistant_turns!r}; use one of "
            f"{', '.join(ASSISTANT_TURNS)}"
        )
    if section.eval_jsonl and not section.train_jsonl:
        fail(
            "config.task.eval_jsonl: held-out rows without training rows; set "
            "config.task.train_jsonl too (or neither, to train on the task)"
        )


def task_data(run: lm_runs.Setup) -> SftData:
    """The task's (prompt, answer) pairs, drawn by config.task.data_seed."""
    task, section = run.task, run.flat.task
    train_problems, eval_problems = lm_runs.split_problems(task, section)
    try:
        rows = {
            split: protocol.sft_rows(task, problems)
            for split, problems in (("train", train_problems), ("eval", eval_problems))
        }
    except ConfigError as error:
        fail(f"config.task.{error}")
    pairs = {
        split: ([row["prompt"] for row in rows], [row["completion"] for row in rows])
        for split, rows in rows.items()
    }
    from jaxrl.data.preferences import tokenize_sft  # here, not at the top: start-up time (tfds)

    lengths = lm_runs.task_lengths(section)
    try:
        # A cut prompt is another question (e.g. "rev 123=" cut to "23="): too short a length is
        # an error, not a silent cut.
        arrays = {
            split: tokenize_sft(prompts, answers, run.tokenizer, *lengths, truncate=False)
            for split, (prompts, answers) in pairs.items()
        }
    except ConfigError as error:
        fail(f"config.task.{error}")
    return SftData(
        task.name, arrays["train"], arrays["eval"], *lengths, {"train": 0, "eval": 0}, eval_problems
    )


def read_rows(run: lm_runs.Setup, field: str) -> list:
    """The checked rows of config.task.<field> (one error line for any problem)."""
    path = run.data(field)
    if not jsonl_exists(path):
        fail(f"config.task.{field}: {path}: no such file; pass the path of a JSONL file")
    try:
        rows = read_sft_jsonl(path)
        if any(row.conversational for row in rows):
            require_chat_template(run.tokenizer, field, source_name(path))
    except ChatDataError as error:
        fail(str(error))
    except ConfigError as error:
        fail(f"config.task.{error}")
    return rows


def file_data(run: lm_runs.Setup) -> SftData:
    """The rows of config.task.train_jsonl, and held-out rows (eval_jsonl, or num_eval rows of
    the training file drawn by data_seed), tokenised to lengths that are the config's or the
    rows' (length_percentile), with the rows they cut counted and checked."""
    section = run.flat.task
    rows = read_rows(run, "train_jsonl")
    try:
        if section.eval_jsonl:
            splits = {"train": rows, "eval": read_rows(run, "eval_jsonl")}
        else:
            train, held_out = data_sizes.held_out_split(run, rows)
            splits = {"train": train, "eval": held_out}
        encoded = {
            split: encode_sft_rows(split_rows, run.tokenizer, section.assistant_turns)
            for split, split_rows in splits.items()
        }
        # One shape for both splits: lengths from all the rows, so the held-out ones fit as well.
        prompt, rest = example_lengths(encoded["train"] + encoded["eval"])
        lengths = fit_lengths(
            prompt, rest, section.max_prompt_length, section.max_length, section.length_percentile
        )
        given = (bool(section.max_prompt_length), bool(section.max_length))
        cut_rows = {
            split: check_cuts(
                *example_lengths(examples),
                *lengths,
                section.max_cut_fraction,
                ROWS_NAMES[split],
                given,
            )
            for split, examples in encoded.items()
        }
        arrays = {split: pack(e, run.tokenizer, *lengths) for split, e in encoded.items()}
    except ChatDataError as error:
        fail(str(error))
    except ConfigError as error:
        fail(f"config.task.{error}")
    name = source_name(run.data("train_jsonl"))
    return SftData(name, arrays["train"], arrays["eval"], *lengths, cut_rows, [])


def held_out_loss(
    model: ModelConfig, params: Any, arrays: dict[str, np.ndarray], mesh: Any
) -> dict[str, float]:
    """The held-out rows' mean NLL and greedy next-token accuracy over all their loss tokens
    (the training loss, weighted by tokens across batches)."""
    loss_fn = jax.jit(
        sft.make_loss(Transformer(model, mesh=mesh)), out_shardings=sharding.replicated(mesh)
    )
    n = len(arrays["tokens"])
    batch_size = batch_for_mesh(min(EVAL_BATCH_SIZE, n), mesh)
    nll = correct = targets = 0.0
    for start in range(0, n, batch_size):
        index = np.arange(start, start + batch_size) % n
        batch = {key: arrays[key][index] for key in TRAIN_KEYS}
        batch["loss_mask"][n - start :] = False  # rows repeated to fill the last batch
        count = float(batch["loss_mask"].sum())
        loss, metrics = jax.device_get(loss_fn(params, sharding.shard_batch(batch, mesh)))
        nll += float(loss) * count
        correct += float(metrics["token_accuracy"]) * count
        targets += count
    targets = max(targets, 1.0)
    return {"eval_loss": nll / targets, "eval_token_accuracy": correct / targets}


def game_data(run: lm_runs.Setup) -> SftData:
    """A game's teacher episodes (config.task: `jaxrl/trainers/game_play.game_task`), num_train to
    train on and num_eval held out (other draws), in the layout the multi-turn sampler uses."""
    section = run.flat.task
    game = game_play.make_game(section, run.tokenizer, run.parts.game)
    seed = section.data_seed
    train, success, longest = game_play.demonstrations(
        section, game, run.tokenizer, section.num_train, seed
    )
    held_out, _, _ = game_play.demonstrations(
        section, game, run.tokenizer, section.num_eval, seed + 1
    )
    width = max(train["tokens"].shape[1], held_out["tokens"].shape[1])
    train, held_out = (
        {key: np.pad(value, ((0, 0), (0, width - value.shape[1]))) for key, value in rows.items()}
        for rows in (train, held_out)
    )
    print(
        f"Demonstrations of {section.game}: the teacher ({section.teacher}, "
        f"{section.scripted_fraction:g} of episodes scripted) wins {success:.3f}; its longest "
        f"turn is {longest} tokens (multiturn.py's max_new_tokens must hold it)"
    )
    return SftData(section.game, train, held_out, 0, width, {"train": 0, "eval": 0}, [])


@base.lm_trainer("sft")
def train(
    flat: Any, parts: lm_runs.Parts, workdir: str | None, kill_after_chunk: int | None
) -> base.Result:
    """Supervised fine-tuning of a language model on a task, a JSONL file of rows or a game's
    demonstrations. Called as `train(config=None, workdir=None, *, model=None, train_data=None,
    eval_data=None, rewards=None, game=None)`: `config` is experiments/configs/sft.py's
    (`config(preset)`), the parts are `jaxrl.trainers.base`'s; returns Result(state, summary,
    run_dir)."""
    run = lm_runs.setup(flat, workdir, sft.Config, "sft", parts)
    flat, mesh, task = run.flat, run.mesh, run.task
    on_game = "game" in flat.task
    if on_game:
        data = game_data(run)
    else:
        check_task_settings(flat.task)
        data = file_data(run) if flat.task.train_jsonl else task_data(run)
    # Without a task to score generations with (a file, a game's demonstrations), the held-out
    # loss is the measure.
    from_file = on_game or bool(flat.task.train_jsonl)
    num_train = len(data.train["tokens"])
    # The user's rows (a game's task section has none): a preset's batch larger than them is fitted.
    if not on_game and flat.task.train_jsonl:
        run = data_sizes.fitted_batch_size(run, num_train)
    config = run.config
    if config.batch_size > num_train:
        what = f"the {num_train} training rows" if from_file else f"num_train={num_train}"
        fail(
            f"config.batch_size: {config.batch_size} exceeds {what}; lower it or give more "
            "training data"
        )
    print(
        f"SFT data: {num_train} training and {len(data.held_out['tokens'])} held-out rows of "
        f"{data.name}, max_prompt_length={data.max_prompt_length}, max_length="
        f"{data.max_length} tokens; rows cut: {data.cut_rows['train']} training, "
        f"{data.cut_rows['eval']} held-out"
    )
    params, model, source = lm_runs.initial_params(run)
    # The starting point of the held-out loss (a forward pass; recomputed on a resume, from the
    # same starting parameters).
    initial_loss = held_out_loss(model, params, data.held_out, mesh) if from_file else None
    run_dir = lm_runs.open_run(run)

    algorithm = sft.make(config, model, params, mesh)
    job = lm_runs.job(
        run,
        algorithm,
        f"SFT {data.name}",
        scan_inputs=True,
        inputs_for=dataset_batches({k: data.train[k] for k in TRAIN_KEYS}, config, flat.seed, mesh),
        units_name="sequences",
        units_per_step=config.batch_size,
    )
    result = runner.train(job, flat.run, run_dir, kill_after_chunk)
    params = result.states.params
    checkpoints.save_params(run_dir, params)

    t0 = time.time()
    accuracy = mean_score = None
    completions: list[str] = []
    losses: dict[str, float | None] = {"eval_loss": None, "eval_token_accuracy": None}
    if not from_file:  # a task: score greedy generations
        accuracy, mean_score, completions = task_accuracy(
            model, params, task, run.tokenizer, data.eval_problems,
            data.held_out["prompt_tokens"], data.held_out["prompt_mask"],
            data.max_length - data.max_prompt_length, mesh,
        )  # fmt: skip
    else:  # a file: nothing to score generations with, so the held-out loss
        losses = held_out_loss(model, params, data.held_out, mesh)
    summary = runner.summary_fields(job, result, time.time() - t0)
    tokens_per_step = config.batch_size * data.max_length  # padded sequence tokens
    summary |= {
        "task": flat.task.game if on_game else None if from_file else task.name,
        "dataset": None if on_game else flat.task.train_jsonl or None,
        "init_from": source,
        "tokens": config.num_steps * tokens_per_step,
        "tokens_per_second": round(summary["steps_per_second"] * tokens_per_step),
        "eval_task_accuracy": accuracy,
        "eval_task_score": mean_score,
        **losses,
        "initial_eval_loss": initial_loss and initial_loss["eval_loss"],
        "eval_examples": eval_examples(task, data.eval_problems, completions),
        "max_prompt_length": data.max_prompt_length,
        "max_length": data.max_length,
        "cut_rows": data.cut_rows,
        "mesh_shape": list(config.mesh_shape),
    }
    run_dir.write_summary(summary)
    run_dir.write_learning_curve(x="step", y="loss", title=f"SFT {data.name}")
    if not from_file:
        headline = f"eval_task_accuracy {accuracy:.3f} (mean score {mean_score:.3f})"
    else:
        headline = f"eval_loss {initial_loss['eval_loss']:.4f} -> {losses['eval_loss']:.4f}"
    where = lm_runs.finish(run, run_dir)  # summary.json is written: the final state may go
    print(
        f"SFT {data.name}: {headline} after {config.num_steps} steps in "
        f"{summary['wall_seconds']:.0f}s (compile {summary['compile_seconds']:.0f}s). "
        f"{where}"
    )
    return base.Result(result.states, summary, run_dir.path)
