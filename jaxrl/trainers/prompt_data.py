"""What an RL run on prompts samples and is rewarded by (GRPO, PPO for language models, online
DPO): an in-program text task, or a user's prompt file or TFDS dataset, with its reward functions,
every problem with them one error line before anything compiles."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import numpy as np

from algos.asynchronous import Async
from envs.text import TextTask, protocol
from envs.text.prompt_dataset import prompt_dataset_task
from envs.text.reward_terms import host_reward
from jaxrl import host
from jaxrl.config import ConfigError, fail
from jaxrl.data.chat import ChatDataError, source_name
from jaxrl.data.prompts import (
    PromptRow,
    PromptTable,
    read_prompt_jsonl,
    read_prompt_tfds,
    tokenize_prompts,
)
from jaxrl.lm.model import ModelConfig
from jaxrl.trainers import data_sizes, lm_runs
from jaxrl.trainers.presets.lm import DIGIT_TASK_FIELDS


def reward_functions(run: lm_runs.Setup) -> list[tuple[str, Callable, float]]:
    """(name, function, weight) of each host reward the run was given (`lm_runs.Parts.rewards`,
    which config.rewards.host describes), with its weight from config.rewards.host_weights
    ("" weighs each 1)."""
    section = run.flat.rewards
    given = run.parts.rewards or []
    specs = [spec.strip() for spec in section.host.split(",") if spec.strip()]
    assert len(specs) == len(given), "config.rewards.host's functions are resolved by lm_parts"
    weights = [1.0] * len(given)
    if section.host_weights:
        try:
            weights = [float(w) for w in section.host_weights.split(",")]
        except ValueError:
            fail(
                f"config.rewards.host_weights: {section.host_weights!r} is not comma-separated "
                "numbers; give one weight per reward function, e.g. '1.0,0.5'"
            )
        if len(weights) != len(given) or not all(np.isfinite(weights)):
            fail(
                f"config.rewards.host_weights: {len(weights)} weights for {len(given)} reward "
                "functions in config.rewards.host; give one finite weight per function"
            )
    functions = []
    for spec, (name, function), weight in zip(specs, given, weights, strict=True):
        if not callable(function):
            fail(f"config.rewards.host: {spec!r} is not a function; name a function")
        functions.append((name, function, weight))
    names = [name for name, _, _ in functions]
    if len(set(names)) != len(names):
        fail(
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
        fail(
            f"config.rewards.host: {spec} needs column(s) {missing} that the prompt file lacks "
            f"(its columns: {', '.join(columns) or 'only prompt'}); add them to every row, or "
            "give the parameters defaults"
        )
    unexpected = [c for c in columns if c not in {p.name for p in named}]
    if unexpected and not takes_any:
        fail(
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
        fail(
            f"config.rewards.host: on the first {len(rows)} prompts with empty completions "
            f"(tried before training), {failure.summary()}{fix}"
        )


class PromptData(NamedTuple):
    """A user's prompt file as GRPO trains on it."""

    task: TextTask  # the train split's prompts, with the host reward terms
    train: PromptTable
    held_out: PromptTable
    functions: list[tuple[str, Callable, float]]


def read_prompts(run: lm_runs.Setup) -> tuple[list[PromptRow], list[PromptRow], str, str]:
    """(train rows, held-out rows, the data's name, the field naming its held-out split) from
    config.task.train_jsonl (and eval_jsonl), rows given in memory in their place, or a built
    TFDS dataset's splits (train_tfds,
    train_split and eval_split), with num_eval rows held out of the training rows where no
    held-out file or split is given. Raises ChatDataError / ConfigError."""
    section = run.flat.task
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
        name, held_out_field = source_name(run.data("train_jsonl")), "eval_jsonl"
        rows = read(run.data("train_jsonl"))
        held_out = read(run.data("eval_jsonl")) if section.eval_jsonl else None
    if held_out is None:
        return *data_sizes.held_out_split(run, rows), name, held_out_field
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
    section = run.flat.task
    preset = run.flat.get("defaults", {}).get("task", {})  # the preset's digit-task values
    ignored = [f for f in DIGIT_TASK_FIELDS if f in preset and section[f] != preset[f]]
    if ignored:
        fail(
            f"config.task.{ignored[0]}: a setting of the built-in digit tasks, which prompts "
            "from a file or dataset replace, so this flag would be ignored; drop it"
        )
    try:
        train, held_out, data_name, held_out_field = read_prompts(run)
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
        fail(str(error))
    except ConfigError as error:
        fail(f"config.task.{error}")
    if run.flat.rewards.format_weight:
        fail(
            "config.rewards.format_weight: the format reward is the digit tasks', and a prompt "
            "file's rewards are its reward functions; set it to 0 and add a format reward to "
            "config.rewards.host (e.g. envs.text.math_answers:boxed_format_reward)"
        )
    functions = reward_functions(run)
    if not functions:
        fail(
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


def task_problems_as_prompts(run: lm_runs.Setup) -> PromptData | None:
    """An in-program task whose prompts are not drawn in JAX (one without `text_task`, or a digit
    task on a tokenizer without a token per digit: a real model's BPE, where "123" may be one
    token): its problems become a prompt table, tokenised as whole strings like a user's file,
    and the task's own score is the reward, on the host. None when the task runs in the program
    (`envs.text.protocol.runs_in_program`), which needs no host call."""
    task, section = run.task, run.flat.task
    if protocol.runs_in_program(task, run.tokenizer):
        return None
    # The task's splits, as its JAX sampler keeps them; a small task gives all it has.
    rng = np.random.default_rng(section.data_seed)
    held_out = task.sample_problems(rng, section.num_eval, split="eval", allow_fewer=True)
    train = task.sample_problems(rng, section.num_train, split="train", allow_fewer=True)

    def row(problem: str, split: str) -> PromptRow:
        columns = {"prompt": task.prompt(problem), "problem": problem}
        answer = protocol.answer_of(task, problem)  # a column for config.rewards.host
        if answer is not None:
            columns["answer"] = answer
        return PromptRow(f"{task.name} {split} problem {problem}", columns)

    def rows(problems: list[str], split: str) -> list[PromptRow]:
        return [row(problem, split) for problem in problems]

    def task_score(prompts: list, completions: list, problem: list, **columns) -> list[float]:
        return [task.score(p, c) for p, c in zip(problem, completions, strict=True)]

    try:
        train_table = tokenize_prompts(rows(train, "train"), run.tokenizer)
        held_out_table = tokenize_prompts(
            rows(held_out, "eval"), run.tokenizer, train_table.max_prompt_length
        )
    except ConfigError as error:
        fail(f"config.task.{error}")
    functions = [("task", task_score, 1.0), *reward_functions(run)]
    return PromptData(
        host_rewarded_task(run, task.name, train_table, functions),
        train_table,
        held_out_table,
        functions,
    )


def rollout_mesh(run: lm_runs.Setup) -> Any:
    """The mesh the rollout (and so a host reward's per-shard callback) runs on: in async mode
    the generation mesh beside the training one, else the run's mesh."""
    if not isinstance(run.rollout, Async):
        return run.mesh
    return run.rollout.generation_mesh(run.config, run.mesh)


def host_rewarded_task(
    run: lm_runs.Setup, name: str, table: PromptTable, functions: list[tuple[str, Callable, float]]
) -> TextTask:
    """The task of sampling `table`'s prompts, rewarded by the host `functions`."""
    task = prompt_dataset_task(name, table, run.tokenizer)
    for function_name, function, weight in functions:
        term = host_reward(function, run.tokenizer, function_name, weight, rollout_mesh(run), table)
        task = task.with_reward(term)
    return task


def text_task(run: lm_runs.Setup) -> TextTask:
    """The in-program task's prompt sampler and rewards, plus the host rewards of
    config.rewards.host (each called with the `answer` column)."""
    section = run.flat.rewards
    try:
        task = run.task.text_task(run.tokenizer, section.format_weight)
    except ConfigError as error:  # format_weight is the rewards section's
        where = "rewards" if str(error).startswith("format_weight:") else "task"
        fail(f"config.{where}.{error}")
    for name, function, weight in reward_functions(run):
        task = task.with_reward(
            host_reward(function, run.tokenizer, name, weight, rollout_mesh(run))
        )
    return task


def eval_samples(run: lm_runs.Setup) -> int:
    """Sampled completions per held-out prompt for pass@k (the `eval_samples` setting)."""
    value = run.flat.get("eval_samples", 0)
    if not isinstance(value, int) or value < 0:
        fail(f"config.eval_samples: got {value!r}; give a whole number >= 0 (0: no pass@k)")
    return value


def reward_model_paths(run: lm_runs.Setup, defaults: Any) -> list[str]:
    """config.reward_model's run directories; an ensemble setting of the run's Config that
    differs from `defaults` (the algorithm's default Config) without an ensemble to combine is
    one error line. Reads no file: the scripts call it before anything else."""
    paths = [path.strip() for path in run.flat.reward_model.split(",") if path.strip()]
    for name in ("ensemble_rule", "ensemble_std_coefficient"):
        if len(paths) < 2 and getattr(run.config, name) != getattr(defaults, name):
            fail(
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
        fail(
            "config.reward_model: the ensemble's reward models have different architectures; "
            "train every member from the same checkpoint"
        )
    (model,) = models
    limit = model.max_position_embeddings
    if prompt_length + run.config.sampling.max_new_tokens > limit:
        fail(
            f"config.max_new_tokens: prompts of {prompt_length} tokens + "
            f"{run.config.sampling.max_new_tokens} new ones exceed the reward model's "
            f"max_position_embeddings={limit}; set max_new_tokens <= {limit - prompt_length}"
        )
    params = [p for p, _ in loaded]
    if len(params) == 1:
        return params[0], model, paths
    return jax.tree.map(lambda *members: jax.numpy.stack(members), *params), model, paths


class Prompts(NamedTuple):
    """What an RL run on prompts samples and is judged by."""

    task: TextTask  # the prompt sampler with every reward term
    data: PromptData | None  # a prompt file's (or a task's scored on the host), else None
    prompt_length: int  # the longest prompt, in tokens
    name: str  # the task's or the data's name
    reward_key: str  # the metric final_mean_reward averages
    num_eval: int  # held-out prompts
    problems: list[str]  # an in-program task's held-out problems (data None)


def read_task(run: lm_runs.Setup) -> Prompts:
    """The run's prompts and rewards, and its held-out problems: everything the user gave (data,
    reward functions) checked, one error line each, before any compile; then the check that
    prompt + max_new_tokens fits the model."""
    eval_samples(run)  # checked before anything is read or compiled
    flat, config = run.flat, run.config
    from_prompts = flat.task.train_jsonl or flat.task.train_tfds
    data = prompt_data(run) if from_prompts else task_problems_as_prompts(run)
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
        shape = jax.eval_shape(lambda: task.encode_prompts(problems, run.tokenizer)).tokens.shape
        sampler = text_task(run)
        reward_key = f"reward_{sampler.reward_terms[0].name}"  # the task's own score
        prompts = Prompts(sampler, None, shape[1], task.name, reward_key, len(problems), problems)
    # The model (init_from's architecture included) is known before any parameter is built.
    limit = run.model.max_position_embeddings
    if prompts.prompt_length + config.sampling.max_new_tokens > limit:
        fail(
            f"config.max_new_tokens: prompts of {prompts.prompt_length} tokens + "
            f"{config.sampling.max_new_tokens} new ones exceed the model's max_position_embeddings="
            f"{limit}; set max_new_tokens <= {limit - prompts.prompt_length}"
            + (" or a shorter max_prompt_length" if data is not None else "")
        )
    return prompts


def with_reward_models(run: lm_runs.Setup, config_cls: type) -> tuple[Prompts, Any, Any, list]:
    """The prompts of an RL run scored by reward models (PPO, online DPO), and the reward
    models (`reward_models`' parameters, config and paths): every setting checked first."""
    reward_model_paths(run, config_cls())  # its flags, before anything is read
    prompts = read_task(run)
    return prompts, *reward_models(run, prompts.prompt_length, config_cls())
