"""What the RL scripts on prompts share (`grpo.py`, `ppo_lm.py`): the prompts a run samples (a
built-in digit task, or a user's prompt file or TFDS dataset) with their reward functions, every
problem with them one error line before anything compiles; and the held-out evaluation (greedy
completions scored by the task or the reward functions) with its intervals and plot."""

from __future__ import annotations

import functools
import inspect
import json
import os
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import ml_collections
import numpy as np

from algos import grpo
from envs.text import TextTask
from envs.text.prompt_dataset import prompt_dataset_task
from jaxrl import distributed, host, runner, statistics
from jaxrl.config import ConfigError
from jaxrl.data.chat import ChatDataError
from jaxrl.data.prompts import (
    PromptRow,
    PromptTable,
    read_prompt_jsonl,
    read_prompt_tfds,
    split_rows,
    tokenize_prompts,
)
from jaxrl.lm.model import ModelConfig
from jaxrl.lm.sampler import SamplingConfig
from jaxrl.logging import RunDirectory
from jaxrl.trainers import lm_runs

# Task settings that only the built-in digit tasks read (a prompt file brings its own prompts).
DIGIT_TASK_FIELDS = ("name", "num_digits", "num_train", "held_out")
INITIAL_EVAL_FILE = "initial_eval.json"  # the starting model's held-out result, kept for resumes
FINAL_WINDOW = 10  # updates averaged into final_mean_reward


def reward_functions(section: ml_collections.ConfigDict) -> list[tuple[str, Callable, float]]:
    """(name, function, weight) of each host reward in config.rewards.host ("module:function",
    comma-separated) with its weight from config.rewards.host_weights ("" weighs each 1)."""
    specs = [spec.strip() for spec in section.host.split(",") if spec.strip()]
    weights = [1.0] * len(specs)
    if section.host_weights:
        try:
            weights = [float(w) for w in section.host_weights.split(",")]
        except ValueError:
            runner.fail(
                f"config.rewards.host_weights: {section.host_weights!r} is not comma-separated "
                "numbers; give one weight per reward function, e.g. '1.0,0.5'"
            )
        if len(weights) != len(specs) or not all(np.isfinite(weights)):
            runner.fail(
                f"config.rewards.host_weights: {len(weights)} weights for {len(specs)} reward "
                "functions in config.rewards.host; give one finite weight per function"
            )
    functions = []
    for spec, weight in zip(specs, weights, strict=True):
        function_name = spec.rpartition(":")[2]
        try:
            function = runner.load_named(spec)
        except (ImportError, AttributeError, ValueError) as error:
            runner.fail(
                f"config.rewards.host: cannot load {spec!r} ({error}); give "
                "'module.path:function' importable from the working directory, or "
                "'path/to/file.py:function'"
            )
        if not callable(function):
            runner.fail(f"config.rewards.host: {spec!r} is not a function; name a function")
        functions.append((function_name, function, weight))
    names = [name for name, _, _ in functions]
    if len(set(names)) != len(names):
        runner.fail(
            f"config.rewards.host: two reward functions share a name ({', '.join(names)}), so "
            "their metrics would too; give each its own function"
        )
    return functions


def check_columns(spec: str, function: Callable, columns: list[str]) -> None:
    """A reward function must take the columns it is given (`**kwargs` takes any) and find every
    column it requires: checked before anything compiles, rather than failing in the first
    update."""
    try:
        parameters = list(inspect.signature(function).parameters.values())
    except (TypeError, ValueError):
        return  # a builtin or C function: no signature to check
    takes_any = any(p.kind is p.VAR_KEYWORD for p in parameters)
    named = [p for p in parameters[2:] if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    required = [p.name for p in named if p.default is p.empty]
    missing = [name for name in required if name not in columns]
    if missing:
        runner.fail(
            f"config.rewards.host: {spec} needs column(s) {missing} that the prompt file lacks "
            f"(its columns: {', '.join(columns) or 'only prompt'}); add them to every row, or "
            "give the parameters defaults"
        )
    unexpected = [c for c in columns if c not in {p.name for p in named}]
    if unexpected and not takes_any:
        runner.fail(
            f"config.rewards.host: {spec} does not take column(s) {unexpected}, and every column "
            "reaches every reward function; add **kwargs to its parameters"
        )


def try_on_rows(function: Callable, table: PromptTable, count: int = 4) -> None:
    """Call a reward function on the first `count` rows with empty completions, before anything
    compiles: one that raises, or returns anything but one finite float per completion, is one
    error line now rather than after the first compile (a model may well complete with nothing,
    so a usable reward function takes an empty completion)."""
    rows = table.rows[:count]
    completions: list = [""] * len(rows)
    if table.conversational:
        completions = [[{"role": "assistant", "content": ""}] for _ in rows]
    columns = {name: [row.columns[name] for row in rows] for name in table.column_names()}
    label = f"reward function {function.__module__}:{function.__qualname__}"
    try:
        values = host.call(label, function, [row.prompt for row in rows], completions, **columns)
        host.check_rewards(label, values, len(rows))
    except Exception:
        failure = host.take_failure()
        fix = "" if isinstance(failure.error, host.HostFunctionError) else "; fix the function"
        runner.fail(
            f"config.rewards.host: on the first {len(rows)} prompts with empty completions "
            f"(tried before training), {failure.summary()}{fix}"
        )


class PromptData(NamedTuple):
    """A user's prompt file as GRPO trains on it."""

    task: TextTask  # the train split's prompts, with the host reward terms
    train: PromptTable
    held_out: PromptTable
    functions: list[tuple[str, Callable, float]]


def read_prompts(section: Any) -> tuple[list[PromptRow], list[PromptRow], str, str]:
    """(train rows, held-out rows, the data's name, the field naming its held-out split) from
    config.task.train_jsonl (and eval_jsonl) or a built TFDS dataset's splits (train_tfds,
    train_split and eval_split), with num_eval rows held out of the training rows where no
    held-out file or split is given. Raises ChatDataError / ConfigError."""
    tfds_only = dict(tfds_data_dir="", train_split="train", eval_split="")
    if section.train_tfds:
        if section.train_jsonl or section.eval_jsonl:
            field = "train_jsonl" if section.train_jsonl else "eval_jsonl"
            raise ConfigError(
                f"{field}: set together with train_tfds; give the prompts as one of the two "
                "(a JSONL file, or a built TFDS dataset)"
            )
        read = functools.partial(
            read_prompt_tfds,
            section.train_tfds,
            data_dir=section.tfds_data_dir or None,
            prompt_column=section.prompt_column,
        )
        name, held_out_field = f"{section.train_tfds}[{section.train_split}]", "eval_split"
        try:
            rows = read(section.train_split)
            held_out = read(section.eval_split) if section.eval_split else None
        except ChatDataError as error:  # the dataset's path and row follow the field
            raise ConfigError(f"train_tfds: {error}") from None
    else:
        for field, default in tfds_only.items():
            if section[field] != default:
                raise ConfigError(
                    f"{field}: {section[field]!r} is read only with a TFDS dataset "
                    "(train_tfds), which is not set; set train_tfds, or leave this at "
                    f"{default!r}"
                )
        read = functools.partial(read_prompt_jsonl, prompt_column=section.prompt_column)
        name, held_out_field = os.path.basename(section.train_jsonl), "eval_jsonl"
        rows = read(section.train_jsonl)
        held_out = read(section.eval_jsonl) if section.eval_jsonl else None
    if held_out is None:
        return *split_rows(rows, section.num_eval, section.data_seed), name, held_out_field
    if held_out[0].columns.keys() != rows[0].columns.keys():
        raise ConfigError(
            f"{held_out_field}: {held_out[0].where} has columns {sorted(held_out[0].columns)}, "
            f"the training rows {sorted(rows[0].columns)}; give both the same columns"
        )
    return rows, held_out, name, held_out_field


def prompt_data(run: lm_runs.Setup) -> PromptData:
    """Read, split and tokenise the user's prompts (config.task.train_jsonl and eval_jsonl, or
    train_tfds), and load the reward functions: every problem one error line, before anything is
    built."""
    section, rewards = run.flat.task, run.flat.rewards
    ignored = [f for f in lm_runs.overridden_fields("task") if f in DIGIT_TASK_FIELDS]
    if ignored:
        runner.fail(
            f"config.task.{ignored[0]}: a setting of the built-in digit tasks, which prompts "
            "from a file or dataset replace, so this flag would be ignored; drop it"
        )
    try:
        train, held_out, data_name, held_out_field = read_prompts(section)
        cut = dict(
            length_percentile=section.length_percentile,
            max_cut_fraction=section.max_cut_fraction,
        )
        train_field = "train_tfds" if section.train_tfds else "train_jsonl"
        train_table = tokenize_prompts(
            train, run.tokenizer, section.max_prompt_length, **cut, field=train_field
        )
        held_out_table = tokenize_prompts(
            held_out, run.tokenizer, train_table.max_prompt_length, **cut, field=held_out_field
        )
    except ChatDataError as error:
        runner.fail(str(error))
    except ConfigError as error:
        runner.fail(f"config.task.{error}")
    if rewards.format_weight:
        runner.fail(
            "config.rewards.format_weight: the format reward is the digit tasks', and a prompt "
            "file's rewards are its reward functions; set it to 0 and add a format reward to "
            "config.rewards.host (e.g. envs.text.math_answers:boxed_format_reward)"
        )
    functions = reward_functions(rewards)
    if not functions:
        runner.fail(
            "config.rewards.host: a prompt file needs at least one reward function; give "
            "'module.path:function' (e.g. envs.text.math_answers:math_answer_reward)"
        )
    for name, function, _ in functions:
        check_columns(name, function, train_table.column_names())
        try_on_rows(function, train_table)
    task = host_rewarded_task(run, data_name, train_table, functions)
    for cut_rows, table, field in (
        (train_table.cut, train, "train"),
        (held_out_table.cut, held_out, "held-out"),
    ):
        if cut_rows:
            print(
                f"{cut_rows} of {len(table)} {field} prompts are longer than "
                f"{train_table.max_prompt_length} tokens and lose their start"
            )
    return PromptData(task, train_table, held_out_table, functions)


def digit_problems_as_prompts(run: lm_runs.Setup) -> PromptData | None:
    """A digit task for a tokenizer without a token per digit (a real model's BPE, where "123"
    may be one token): its problems become a prompt table, tokenised as whole strings like a
    user's file, and the task's own score (1 for an exact answer, partial credit below 0.5) is
    the reward, on the host. None when the task's characters are single tokens: then prompts
    are drawn and scored in JAX, which needs no host call."""
    task, section = run.task, run.flat.task
    try:
        task.tokens(run.tokenizer)
        return None
    except ConfigError:
        pass
    # The task's hashed splits, as the JAX sampler keeps them; a small task gives all it has.
    rng = np.random.default_rng(section.data_seed)
    held_out = task.sample_problems(rng, section.num_eval, split="eval", allow_fewer=True)
    train = task.sample_problems(rng, section.num_train, split="train", allow_fewer=True)

    def rows(problems: list[str], split: str) -> list[PromptRow]:
        return [
            PromptRow(f"{task.name} {split} problem {problem}", {
                "prompt": task.prompt(problem), "problem": problem, "answer": task.answer(problem)
            })
            for problem in problems
        ]  # fmt: skip

    def task_score(prompts: list, completions: list, problem: list, **columns) -> list[float]:
        return [task.score(p, c) for p, c in zip(problem, completions, strict=True)]

    try:
        train_table = tokenize_prompts(rows(train, "train"), run.tokenizer)
        held_out_table = tokenize_prompts(
            rows(held_out, "eval"), run.tokenizer, train_table.max_prompt_length
        )
    except ConfigError as error:
        runner.fail(f"config.task.{error}")
    functions = [("task", task_score, 1.0), *reward_functions(run.flat.rewards)]
    return PromptData(
        host_rewarded_task(run, task.name, train_table, functions),
        train_table,
        held_out_table,
        functions,
    )


def rollout_mesh(run: lm_runs.Setup) -> Any:
    """The mesh the rollout (and so a host reward's per-shard callback) runs on: in async mode
    the generation mesh beside the training one, else the run's mesh."""
    if getattr(run.config, "rollout_mode", "sync") != "async":
        return run.mesh
    from algos import asynchronous

    return asynchronous.generation_mesh(run.config, run.mesh)


def host_rewarded_task(
    run: lm_runs.Setup, name: str, table: PromptTable, functions: list[tuple[str, Callable, float]]
) -> TextTask:
    """The task of sampling `table`'s prompts, rewarded by the host `functions`."""
    task = prompt_dataset_task(name, table, run.tokenizer)
    for function_name, function, weight in functions:
        term = grpo.host_reward(
            function, run.tokenizer, function_name, weight, rollout_mesh(run), table
        )
        task = task.with_reward(term)
    return task


def text_task(run: lm_runs.Setup) -> TextTask:
    """The digit task's prompt sampler and rewards, plus the host rewards of config.rewards.host
    (each called with the `answer` column)."""
    section = run.flat.rewards
    try:
        task = run.task.text_task(run.tokenizer, section.format_weight)
    except ConfigError as error:
        runner.fail(f"config.task.{error}")
    for name, function, weight in reward_functions(section):
        task = task.with_reward(
            grpo.host_reward(function, run.tokenizer, name, weight, rollout_mesh(run))
        )
    return task


def last_rows(run_dir: RunDirectory, updates: int, num_steps: int, log_every: int) -> list[dict]:
    """The metrics.jsonl rows (each the mean of a block of updates) of the last `updates` updates,
    at least one row. Read from the file rather than the last chunk's metrics, so that a finished
    run restarted for its summary (no chunk left to run) reports what the uninterrupted run did;
    the barrier waits for process 0 to have written them."""
    distributed.barrier("metrics written")
    with open(run_dir.metrics_path) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    rows = [row for row in rows if "loss" in row]  # training rows, not the evaluations
    block = runner.block_length(num_steps, log_every)  # updates per row
    return rows[-max(1, updates // block) :]


def trained_totals(run_dir: RunDirectory, num_steps: int, log_every: int) -> tuple[int, int, float]:
    """Partial rollouts' (`algos.partial`) groups and completion tokens trained on over the
    whole run, summed from metrics.jsonl's `trained_groups` and `trained_tokens` (each row the
    mean of a block of updates; the counts are whole numbers, so the sums are exact), and the
    mean decode steps per update."""
    rows = last_rows(run_dir, num_steps, num_steps, log_every)
    block = runner.block_length(num_steps, log_every)
    groups = sum(row["trained_groups"] for row in rows) * block
    tokens = sum(row["trained_tokens"] for row in rows) * block
    return round(groups), round(tokens), float(np.mean([row["decode_steps"] for row in rows]))


class HeldOut(NamedTuple):
    """Greedy completions of the held-out prompts, scored; and sampled ones, for pass@k."""

    accuracy: float  # mean of `correct`
    correct: np.ndarray  # [num_eval]: 1 for a right answer (a prompt file: its first reward)
    rewards: dict[str, float]  # summary fields: each reward function's mean, or the task score
    examples: list[dict[str, str]]  # a few prompts with their completions
    # [num_eval, eval_samples]: 1 for a right sampled answer (None: eval_samples is 0)
    samples: np.ndarray | None = None


def eval_samples(run: lm_runs.Setup) -> int:
    """Sampled completions per held-out prompt for pass@k (the `eval_samples` setting)."""
    value = run.flat.get("eval_samples", 0)
    if not isinstance(value, int) or value < 0:
        runner.fail(f"config.eval_samples: got {value!r}; give a whole number >= 0 (0: no pass@k)")
    return value


def sampling_for(run: lm_runs.Setup) -> SamplingConfig:
    """How the evaluation samples: as training does (temperature, top-k, top-p)."""
    config = run.config
    return SamplingConfig(
        max_new_tokens=config.max_new_tokens,
        eos_id=run.tokenizer.eos_id,
        pad_id=run.tokenizer.pad_id,
        temperature=getattr(config, "temperature", 1.0),
        top_k=getattr(config, "top_k", 0),
        top_p=getattr(config, "top_p", 1.0),
    )


def pass_at_ks(num_samples: int) -> list[int]:
    """The k reported for `num_samples` samples per prompt: 1, the powers of 2 between, and n."""
    ks = {1, num_samples}
    ks |= {2**i for i in range(1, num_samples.bit_length()) if 2**i < num_samples}
    return sorted(ks)


def pass_at_k_fields(held: HeldOut | np.ndarray | None, prefix: str = "eval_") -> dict[str, Any]:
    """`{prefix}pass_at_K` and its `_ci95` for every reported k of a held-out result (or its
    [problems, samples] correctness); nothing without samples."""
    samples = held.samples if isinstance(held, HeldOut) else held
    if samples is None or samples.size == 0:
        return {}
    fields: dict[str, Any] = {}
    estimates = statistics.pass_at_k_estimates(samples, pass_at_ks(samples.shape[1]))
    for k, (point, bounds) in estimates.items():
        fields[f"{prefix}pass_at_{k}"] = point
        fields[f"{prefix}pass_at_{k}_ci95"] = bounds
    return fields


def digit_evaluator(run: lm_runs.Setup, model: ModelConfig, held_out: Any, problems: list[str]):
    """evaluate(params) -> HeldOut on the digit task's held-out problems, scored by the task."""

    def evaluate(params: Any) -> HeldOut:
        _, mean_score, completions = lm_runs.task_accuracy(
            model, params, run.task, run.tokenizer, problems, held_out.tokens, held_out.mask,
            run.config.max_new_tokens, run.mesh, run.flat.eval_batch_size,
        )  # fmt: skip
        scores = [run.task.score(p, c) for p, c in zip(problems, completions, strict=True)]
        correct = np.array([s == 1.0 for s in scores], np.float64)
        examples = lm_runs.eval_examples(run.task, problems, completions)
        samples = None
        if eval_samples(run):
            sampled = sample(run, model, params, held_out.tokens, held_out.mask)
            samples = np.array(
                [
                    [run.task.score(p, c) == 1.0 for c in row]
                    for p, row in zip(problems, sampled, strict=True)
                ],
                np.float64,
            )
        return HeldOut(
            float(correct.mean()), correct, {"eval_task_score": mean_score}, examples, samples
        )

    return evaluate


def file_evaluator(run: lm_runs.Setup, model: ModelConfig, data: PromptData):
    """evaluate(params) -> HeldOut on a prompt file's held-out rows: greedy completions scored
    by the same reward functions as training, the first of which measures accuracy (1 for a
    right answer). A reward function failing here is one error line, as in training."""
    table = data.held_out
    prompts = [row.prompt for row in table.rows]
    columns = {name: [row.columns[name] for row in table.rows] for name in table.column_names()}

    def evaluate(params: Any) -> HeldOut:
        texts = lm_runs.greedy_completions(
            model, params, run.tokenizer, table.tokens, table.mask, run.config.max_new_tokens,
            run.mesh, run.flat.eval_batch_size,
        )  # fmt: skip
        completions: list = texts
        if table.conversational:
            completions = [[{"role": "assistant", "content": text}] for text in texts]
        means, first = {}, None
        for name, function, _ in data.functions:
            label = f"reward function {function.__module__}:{function.__qualname__}"
            try:
                values = host.call(label, function, prompts, completions, **columns)
                values = host.check_rewards(label, values, len(completions))
            except Exception:
                runner.report_host_failure(host.take_failure())
            means[f"eval_reward_{name}"] = float(values.mean())
            first = values if first is None else first
        examples = [
            {
                "prompt": lm_runs.shorten(p if isinstance(p, str) else p[-1]["content"]),
                "completion": t,
            }
            for p, t in zip(prompts[:5], texts[:5], strict=False)
        ]
        correct = (first >= 1.0).astype(np.float64)  # full marks: a right answer
        samples = None
        if eval_samples(run):  # the first reward function scores every sample
            n = eval_samples(run)
            sampled = sample(run, model, params, table.tokens, table.mask)
            flat_texts = [text for row in sampled for text in row]
            flat: list = flat_texts
            if table.conversational:
                flat = [[{"role": "assistant", "content": text}] for text in flat_texts]
            repeated = {
                name: [v for v in values for _ in range(n)] for name, values in columns.items()
            }
            name, function, _ = data.functions[0]
            label = f"reward function {function.__module__}:{function.__qualname__}"
            try:
                values = host.call(
                    label, function, [p for p in prompts for _ in range(n)], flat, **repeated
                )
                values = host.check_rewards(label, values, len(flat))
            except Exception:
                runner.report_host_failure(host.take_failure())
            samples = (np.asarray(values).reshape(len(prompts), n) >= 1.0).astype(np.float64)
        return HeldOut(float(correct.mean()), correct, means, examples, samples)

    return evaluate


def sample(
    run: lm_runs.Setup, model: ModelConfig, params: Any, tokens: np.ndarray, mask: np.ndarray
) -> list[list[str]]:
    """`eval_samples` completions of every held-out prompt, sampled as training samples, with a
    key fixed by the run's seed (the same params give the same samples)."""
    return lm_runs.sampled_completions(
        model, params, run.tokenizer, tokens, mask, sampling_for(run), eval_samples(run),
        jax.random.fold_in(jax.random.key(run.flat.seed), 1), run.mesh,
        run.flat.eval_batch_size,
    )  # fmt: skip


def interval(values: np.ndarray, seed: int = 0) -> list[float]:
    """The bootstrap 95% interval of the mean of per-problem `values` (problems resampled)."""
    _, bounds = statistics.interval_estimates(
        {"x": values[:, None]}, statistics.aggregate_mean, reps=10_000, seed=seed
    )
    return [float(b) for b in bounds["x"]]


def plot_held_out_accuracy(
    run_dir: Any, initial: HeldOut, final: HeldOut, num_steps: int, title: str
) -> None:
    """`held_out_accuracy.png`: greedy held-out accuracy at the start, at every `eval_every`
    evaluation (metrics.jsonl) and at the end, each with its bootstrap 95% interval."""
    if not run_dir.writes:
        return
    with open(run_dir.metrics_path) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    middle = [r for r in rows if "eval_task_accuracy_low" in r and r["step"] < num_steps]
    steps = [0, *(r["step"] for r in middle), num_steps]
    points = [initial.accuracy, *(r["eval_task_accuracy"] for r in middle), final.accuracy]
    bounds = [
        interval(initial.correct),
        *([r["eval_task_accuracy_low"], r["eval_task_accuracy_high"]] for r in middle),
        interval(final.correct),
    ]
    name = f"greedy, {len(final.correct)} problems"
    xs, ys, bands = {name: steps}, {name: np.array(points)}, {name: np.array(bounds).T}
    if final.samples is not None and initial.samples is not None:
        n = final.samples.shape[1]
        for k in sorted({1, n}):  # the sampled accuracy, and the chance one of n is right
            key = f"eval_pass_at_{k}"
            at = [r for r in middle if key in r]
            first = pass_at_k_fields(initial)
            last = pass_at_k_fields(final)
            label = f"pass@{k} of {n} samples"
            xs[label] = [0, *(r["step"] for r in at), num_steps]
            ys[label] = np.array([first[key], *(r[key] for r in at), last[key]])
            bands[label] = np.array(
                [first[f"{key}_ci95"], *([r[f"{key}_low"], r[f"{key}_high"]] for r in at),
                 last[f"{key}_ci95"]]
            ).T  # fmt: skip
    statistics.plot_sample_efficiency_curves(
        xs,
        ys,
        bands,
        run_dir.file("held_out_accuracy.png"),
        xlabel="update",
        ylabel="held-out accuracy (95% CI)",
        title=title,
    )


def initial_evaluation(run: lm_runs.Setup, evaluate: Callable, params: Any) -> HeldOut:
    """The starting model's held-out result, computed once: a resumed run reads it back from
    the run directory instead of spending another evaluation on it. Evaluated before the run
    directory is written, so a reward function that fails on it leaves nothing behind."""
    path = os.path.join(run.workdir, INITIAL_EVAL_FILE)
    if os.path.isfile(path):
        saved = lm_runs.read_json(path)
        samples = saved.get("samples")
        return HeldOut(
            saved["accuracy"],
            np.array(saved["correct"]),
            saved["rewards"],
            saved["examples"],
            None if samples is None else np.array(samples, np.float64),
        )
    return evaluate(params)


def reward_model_paths(run: lm_runs.Setup, defaults: Any) -> list[str]:
    """config.reward_model's run directories; an ensemble setting of the run's Config that
    differs from `defaults` (the algorithm's default Config) without an ensemble to combine is
    one error line. Reads no file: the scripts call it before anything else."""
    paths = [path.strip() for path in run.flat.reward_model.split(",") if path.strip()]
    for name in ("ensemble_rule", "ensemble_std_coefficient"):
        if len(paths) < 2 and getattr(run.config, name) != getattr(defaults, name):
            runner.fail(
                f"config.{name}: combines a reward-model ensemble's scores, and "
                "config.reward_model names no ensemble (several comma-separated runs), so it "
                "would be ignored; drop it, or give the ensemble's run directories"
            )
    return paths


def reward_models(
    run: lm_runs.Setup, prompt_length: int, defaults: Any
) -> tuple[Any, ModelConfig | None, list[str]]:
    """config.reward_model's runs as (parameters, stacked on a leading axis for an ensemble;
    their ModelConfig; their paths), or (None, None, []) for the task's reward. Every problem is
    one error line before anything compiles, an ensemble setting without an ensemble among
    them (`defaults`: the algorithm's default Config)."""
    paths = reward_model_paths(run, defaults)
    if not paths:
        return None, None, []
    loaded = [lm_runs.load_reward_model(path, run) for path in paths]
    models = {model for _, model in loaded}
    if len(models) > 1:
        runner.fail(
            "config.reward_model: the ensemble's reward models have different architectures; "
            "train every member from the same checkpoint"
        )
    (model,) = models
    limit = model.max_position_embeddings
    if prompt_length + run.config.max_new_tokens > limit:
        runner.fail(
            f"config.max_new_tokens: prompts of {prompt_length} tokens + "
            f"{run.config.max_new_tokens} new ones exceed the reward model's "
            f"max_position_embeddings={limit}; set max_new_tokens <= {limit - prompt_length}"
        )
    params = [p for p, _ in loaded]
    if len(params) == 1:
        return params[0], model, paths
    return jax.tree.map(lambda *members: jax.numpy.stack(members), *params), model, paths


# --- one RL run on prompts: data, evaluation, summary --------------------------------------


class Prompts(NamedTuple):
    """What an RL run on prompts samples and is judged by."""

    task: TextTask  # the prompt sampler with every reward term
    data: PromptData | None  # a prompt file's (or a digit task's on a BPE tokenizer), else None
    prompt_length: int  # the longest prompt, in tokens
    name: str  # the task's or the data's name
    reward_key: str  # the metric final_mean_reward averages
    num_eval: int  # held-out prompts
    problems: list[str]  # a built-in digit task's held-out problems (data None)


def read_task(run: lm_runs.Setup) -> Prompts:
    """The run's prompts and rewards, and its held-out problems: everything the user gave (data,
    reward functions) checked, one error line each, before any compile; then the check that
    prompt + max_new_tokens fits the model."""
    eval_samples(run)  # checked before anything is read or compiled
    flat, config = run.flat, run.config
    from_prompts = flat.task.train_jsonl or flat.task.train_tfds
    data = prompt_data(run) if from_prompts else digit_problems_as_prompts(run)
    if data is not None:
        prompts = Prompts(
            data.task, data, data.train.max_prompt_length, data.task.name, "reward",
            len(data.held_out.rows), [],
        )  # fmt: skip
    else:
        task = run.task
        # Held-out problems: the task's eval split, which the in-program sampler never draws.
        # Their prompts are encoded (a compiled JAX function) by `evaluator`, once every
        # setting is checked; here only their shape is traced.
        rng = np.random.default_rng(flat.task.data_seed)
        problems = task.sample_problems(rng, flat.task.num_eval, split="eval", allow_fewer=True)
        digits, tokens = task.problem_digits(problems), task.tokens(run.tokenizer)
        shape = jax.eval_shape(task.encode_problems, digits, tokens).tokens.shape
        prompts = Prompts(
            text_task(run), None, shape[1], task.name, "reward_task", len(problems), problems
        )
    # The model (init_from's architecture included) is known before any parameter is built.
    limit = run.model.max_position_embeddings
    if prompts.prompt_length + config.max_new_tokens > limit:
        runner.fail(
            f"config.max_new_tokens: prompts of {prompts.prompt_length} tokens + "
            f"{config.max_new_tokens} new ones exceed the model's max_position_embeddings="
            f"{limit}; set max_new_tokens <= {limit - prompts.prompt_length}"
            + (" or a shorter max_prompt_length" if data is not None else "")
        )
    return prompts


def evaluator(run: lm_runs.Setup, model: ModelConfig, prompts: Prompts) -> Callable[[Any], HeldOut]:
    """evaluate(policy params) -> HeldOut on the held-out prompts."""
    if prompts.data is not None:
        return file_evaluator(run, model, prompts.data)
    task = run.task
    digits = task.problem_digits(prompts.problems)
    held_out = jax.device_get(task.encode_problems(digits, task.tokens(run.tokenizer)))
    return digit_evaluator(run, model, held_out, prompts.problems)


def open_run_with_initial_evaluation(
    run: lm_runs.Setup, evaluate: Callable, params: Any
) -> tuple[RunDirectory, HeldOut]:
    """The starting model's held-out result (computed before anything is written, read back on a
    resume) and the opened run directory, which keeps it."""
    initial = initial_evaluation(run, evaluate, params)
    run_dir = lm_runs.open_run(run)
    if run_dir.writes:
        lm_runs.write_json(run_dir.file(INITIAL_EVAL_FILE), initial._asdict() | {
            "correct": initial.correct.tolist(),
            "samples": None if initial.samples is None else initial.samples.tolist(),
        })  # fmt: skip
    return run_dir, initial


def evaluate_every(
    run: lm_runs.Setup, evaluate: Callable, policy: Callable[[Any], Any]
) -> Callable[[Any, int, int], dict[str, float] | None]:
    """The runner's after_chunk: every config.eval_every chunks, the held-out accuracy (with
    its interval) of `policy(state)`. The last chunk's state is evaluated after training, for
    the summary."""

    def after_chunk(state: Any, step: int, index: int) -> dict[str, float] | None:
        every = run.flat.eval_every
        if not every or (index + 1) % every or step >= run.config.num_steps:
            return None
        held = evaluate(policy(state))
        low, high = interval(held.correct)
        return {
            "eval_task_accuracy": held.accuracy,
            "eval_task_accuracy_low": low,
            "eval_task_accuracy_high": high,
            **held.rewards,
            **{
                name: value
                for name, value in pass_at_k_fields(held).items()
                if not name.endswith("_ci95")
            },
            **{
                f"{name.removesuffix('_ci95')}_{side}": bound
                for name, value in pass_at_k_fields(held).items()
                if name.endswith("_ci95")
                for side, bound in zip(("low", "high"), value, strict=True)
            },
        }

    return after_chunk


def summary_fields(
    run: lm_runs.Setup,
    prompts: Prompts,
    run_dir: RunDirectory,
    initial: HeldOut,
    final: HeldOut,
    completions_per_update: int,
    source: str,
    steps_per_second: float,
) -> dict[str, Any]:
    """summary.json's fields about the prompts, the rewards, the throughput in tokens and the
    held-out evaluation."""
    config = run.config
    rows = last_rows(run_dir, FINAL_WINDOW, config.num_steps, run.flat.run.log_every)
    final_reward = float(np.mean([row[prompts.reward_key] for row in rows]))
    # Generated tokens as the peers count them: up to and including EOS (the final rows' mean).
    length = float(np.mean([row["completion_length"] for row in rows]))
    completions = config.num_steps * completions_per_update
    tokens = config.num_steps * completions_per_update * length  # generated tokens
    partial = {}
    if getattr(config, "rollout_mode", "sync") == "partial":
        # Partial rollouts train a varying number of groups per update, and decode tokens that
        # train later, or never (dropped for staleness): count what was trained on, every
        # update's, not a sync run's fixed batch.
        groups, tokens, steps = trained_totals(run_dir, config.num_steps, run.flat.run.log_every)
        completions = groups * config.group_size
        partial = {
            "rollout_mode": "partial",
            "trained_groups_per_update": groups / config.num_steps,
            "decode_steps_per_update": steps,
        }
    generated_per_update = tokens / config.num_steps
    # The training pass's tokens: every trained completion at its fixed shape (with
    # length_buckets > 0 the pass runs shorter buckets, so this is an upper bound).
    trained_per_update = (
        completions / config.num_steps * (prompts.prompt_length + config.max_new_tokens)
    )
    summary = {
        "task": prompts.name,
        "init_from": source,
        # Completions trained on and their tokens (up to and including EOS); in sync mode every
        # update trains completions_per_update, and the tokens are the final rows' mean length.
        "completions": completions,
        "tokens": round(tokens),
        "tokens_per_second": round(steps_per_second * generated_per_update),
        "trained_tokens_per_second": round(steps_per_second * trained_per_update),
        **partial,
        # The sampled completions' reward over the last updates: a digit task's answer reward
        # (reward_task), or, with a prompt file, the weighted sum of its reward functions.
        "final_mean_reward": final_reward,
        "final_mean_reward_metric": prompts.reward_key,
        "eval_task_accuracy": final.accuracy,
        "eval_task_accuracy_ci95": interval(final.correct),
        "initial_eval_task_accuracy": initial.accuracy,
        # Paired by problem: the change each held-out problem saw, and its interval.
        "eval_accuracy_change": final.accuracy - initial.accuracy,
        "eval_accuracy_change_ci95": interval(final.correct - initial.correct),
        **final.rewards,
        # pass@k of `eval_samples` sampled completions per held-out prompt (Chen et al. 2021's
        # unbiased estimator, problems resampled for the interval), before and after training.
        "eval_samples": final.samples.shape[1] if final.samples is not None else 0,
        **pass_at_k_fields(final),
        **pass_at_k_fields(initial, "initial_eval_"),
        "num_eval": prompts.num_eval,
        "eval_examples": final.examples,
        "mesh_shape": list(config.mesh_shape),
    }
    if prompts.data is None:
        summary["num_digits"] = run.task.num_digits
    else:
        data = prompts.data
        summary |= {"num_train": len(data.train.rows), "prompt_length": prompts.prompt_length}
        summary |= {"cut_prompts": data.train.cut + data.held_out.cut}
    return summary


def write_plots_and_report(
    run: lm_runs.Setup,
    prompts: Prompts,
    run_dir: RunDirectory,
    initial: HeldOut,
    final: HeldOut,
    summary: dict[str, Any],
    title: str,
) -> None:
    """The learning curve, the held-out accuracy plot and the closing line."""
    what = "answer reward" if prompts.data is None else "reward (weighted sum of the functions)"
    run_dir.write_learning_curve(
        x="step", y=prompts.reward_key, title=f"{title}: {what} of sampled completions"
    )
    plot_held_out_accuracy(run_dir, initial, final, run.config.num_steps, f"{title}: held-out")
    change = summary["eval_accuracy_change_ci95"]
    print(
        f"{title}: final_mean_reward {summary['final_mean_reward']:.3f}, eval_task_accuracy "
        f"{final.accuracy:.3f} (start: {initial.accuracy:.3f}; change 95% CI "
        f"[{change[0]:+.3f}, {change[1]:+.3f}]) after {run.config.num_steps} updates "
        f"in {summary['wall_seconds']:.0f}s ({runner.compile_note(summary)}). "
        f"Run directory: {run_dir.path}"
    )


def with_reward_models(run: lm_runs.Setup, config_cls: type) -> tuple[Prompts, Any, Any, list]:
    """The prompts of an RL run scored by reward models (PPO, online DPO), and the reward
    models (`reward_models`' parameters, config and paths): every setting checked first."""
    reward_model_paths(run, config_cls())  # its flags, before anything is read
    prompts = read_task(run)
    return prompts, *reward_models(run, prompts.prompt_length, config_cls())


def finish(
    run: lm_runs.Setup,
    prompts: Prompts,
    run_dir: RunDirectory,
    job: runner.Job,
    result: runner.RunResult,
    evaluation: tuple[Callable[[Any], HeldOut], HeldOut, Any],
    units_per_update: int,
    source: str,
    title: str,
    extra: Callable[[list[dict]], dict[str, Any]] = lambda rows: {},
) -> dict[str, Any]:
    """The end of an RL run on prompts (GRPO, PPO, online DPO): the final policy saved and
    evaluated on the held-out prompts (`evaluation`: the evaluator, the starting policy's
    result, the final policy's parameters), summary.json (the common fields, the prompts', and
    `extra(last metric rows)`), the plots and the closing line. Returns the summary."""
    evaluate, initial, policy = evaluation
    lm_runs.save_params(run_dir, policy)
    t0 = time.time()
    final = evaluate(policy)
    summary = runner.summary_fields(job, result, time.time() - t0)
    summary |= summary_fields(
        run, prompts, run_dir, initial, final, units_per_update, source,
        summary["steps_per_second"],
    )  # fmt: skip
    summary |= extra(last_rows(run_dir, FINAL_WINDOW, run.config.num_steps, run.flat.run.log_every))
    run_dir.write_summary(summary)
    if run_dir.writes:  # per-problem results beside initial_eval.json's: paired comparisons
        lm_runs.write_json(run_dir.file("final_eval.json"), {"correct": final.correct.tolist()})
    write_plots_and_report(run, prompts, run_dir, initial, final, summary, title)
    return summary
