"""The one shape every trainer has, and what the trainers share.

    from jaxrl.trainers import grpo
    result = grpo.train(config, workdir, model=..., train_data=..., rewards=[...])
    result.summary["eval_task_accuracy"], result.state, result.run_dir

`train(config=None, workdir=None, *, <user parts>) -> Result`, for every algorithm:
- `config`: the algorithm's ml_collections config: None (the script's default preset), a preset
  name of `experiments/configs/<algo>.py` ("word_problems"), or a ConfigDict (`<algo>.config(
  preset)` returns one to edit: `config.num_steps = 4`). It is copied, never changed.
- `workdir`: the run directory (None: runs/<name>-<date>-<time>). An existing one is resumed from
  its newest checkpoint, with the same settings; a larger `num_steps` extends a finished run.
- user parts, where the algorithm has them, as Python objects: `model` (a Hugging Face
  directory, a GGUF file, a run directory, or "smollm2"), `train_data` / `eval_data` (a JSONL
  path, or rows: a list of dicts or any iterable of them, e.g. a Hugging Face `datasets.Dataset`),
  `rewards` (host reward functions `f(prompts, completions, **columns) -> list[float]`), `game`
  (a text-game class: `reset(seed) -> opening`, `step(utterance) -> (answer, reward, done)`, as
  envs/text/host_env.py plays it); control trainers take `num_seeds` and `seed`.

Everything the script does happens here, in the same order: validation (a bad setting or file
is one `error: ...` line and exit status 2, before anything is written or compiled), the run
directory, checkpoints and resume, metrics, evaluation, summary.json and plots. The script only
parses flags into the config and calls `train`, so a run from Python and the same run from the
command line end with the same summary and parameters.
"""

from __future__ import annotations

import copy
import hashlib
import importlib
import json
import os
import tempfile
import time
from collections.abc import Callable, Iterable
from typing import Any, NamedTuple

import ml_collections


class Result(NamedTuple):
    """What a trainer returns: the final training state (with a leading seeds axis for the
    control algorithms), the summary.json it wrote, and the run directory's path."""

    state: Any
    summary: dict[str, Any]
    run_dir: str


def load_config(algo: str, preset: str | None = None) -> ml_collections.ConfigDict:
    """`experiments/configs/<algo>.py`'s config for `preset` (None: the file's default), locked
    like the scripts' --config (a mistyped field is an error, not a new setting)."""
    module = importlib.import_module(f"experiments.configs.{algo}")
    config = module.get_config() if preset is None else module.get_config(preset)
    config.lock()
    return config


def config_of(config: Any, algo: str, default_preset: str | None = None) -> Any:
    """The ConfigDict a trainer runs: `config` copied, a preset name's, or the default's."""
    if config is None:
        return load_config(algo, default_preset)
    if isinstance(config, str):
        return load_config(algo, config)
    if isinstance(config, ml_collections.ConfigDict):
        return copy.deepcopy(config)
    from jaxrl import runner

    runner.fail(
        f"config: expected an ml_collections.ConfigDict or a preset name, got "
        f"{type(config).__name__}; pass jaxrl.trainers.{algo}.config(PRESET)"
    )


def workdir_or_default(workdir: str | os.PathLike | None, name: str) -> str:
    """`workdir`, or runs/<name>-<date>-<time>."""
    if workdir is not None:
        return os.fspath(workdir)
    return os.path.join("runs", f"{name}-{time.strftime('%Y%m%d-%H%M%S')}")


def rows_file(rows: Any, field: str) -> str:
    """A path for data given as rows: a path as is; rows (a list of dicts, or any iterable of
    them such as a Hugging Face `datasets.Dataset`) written once as JSONL to a file named by
    their content, so the same rows give the same path (and a resumed run the same config)."""
    if isinstance(rows, str | os.PathLike):
        return os.fspath(rows)
    from jaxrl import runner

    if not isinstance(rows, Iterable) or isinstance(rows, dict):
        runner.fail(
            f"{field}: expected a JSONL path or a list of dicts, got {type(rows).__name__}; "
            "pass e.g. [{'prompt': '...', 'answer': '...'}, ...]"
        )
    lines = []
    for index, row in enumerate(rows):
        if not isinstance(row, dict):
            runner.fail(
                f"{field}: row {index} is a {type(row).__name__}, not a dict; give every row as "
                "a dict of columns"
            )
        try:
            lines.append(json.dumps(row))
        except TypeError as error:
            runner.fail(f"{field}: row {index}: {error}; give JSON values (str, numbers, lists)")
    text = "\n".join(lines) + "\n"
    digest = hashlib.sha256(text.encode()).hexdigest()[:16]
    directory = os.path.join(tempfile.gettempdir(), "jaxrl-rows")
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, f"{field.rsplit('.', 1)[-1]}-{digest}.jsonl")
    if not os.path.isfile(path):
        partial = f"{path}.{os.getpid()}"
        with open(partial, "w") as f:
            f.write(text)
        os.replace(partial, path)
    return path


def model_source(model: Any) -> str:
    """init_from for a `model` part: a path (HF directory, GGUF file, run directory) or
    "smollm2"."""
    if isinstance(model, str | os.PathLike):
        return os.fspath(model)
    from jaxrl import runner

    runner.fail(
        f"model: expected a Hugging Face directory, a .gguf file, a run directory or "
        f"'smollm2', got {type(model).__name__}; pass its path"
    )


def given_name(obj: Any, field: str) -> str:
    """The "module:name" a config records a Python object (a reward function, a game class) by;
    `jaxrl.runner.load_named` returns the object itself for it."""
    from jaxrl import runner

    if not callable(obj):
        runner.fail(f"{field}: {obj!r} is not callable; pass a function or a class")
    # The bare name (not a nested function's qualified one): it also names the reward's metric.
    name = getattr(obj, "__name__", None) or type(obj).__name__
    spec = f"{getattr(obj, '__module__', None) or 'python'}:{name}"
    runner.GIVEN_OBJECTS[spec] = obj
    return spec


def lm_config(
    config: Any,
    algo: str,
    *,
    model: Any = None,
    train_data: Any = None,
    eval_data: Any = None,
    rewards: Any = None,
    game: Any = None,
) -> Any:
    """A language-model trainer's ConfigDict with the user parts in it: `model` as init_from,
    the data as config.task.train_jsonl / eval_jsonl, reward functions as config.rewards.host,
    a game class as config.task.game. A part the algorithm does not take is one error line."""
    from jaxrl import runner

    flat = config_of(config, algo)
    if model is not None:
        flat.init_from = model_source(model)
    for part, value, field in (
        ("train_data", train_data, "train_jsonl"),
        ("eval_data", eval_data, "eval_jsonl"),
    ):
        if value is None:
            continue
        if field not in flat.task:
            runner.fail(f"{part}: {algo} trains on a game, not on rows; drop {part}")
        flat.task[field] = rows_file(value, part)
    if rewards is not None:
        if "rewards" not in flat:
            runner.fail(f"rewards: {algo} takes no reward functions; drop rewards")
        functions = list(rewards) if isinstance(rewards, list | tuple) else [rewards]
        flat.rewards.host = ",".join(given_name(f, "rewards") for f in functions)
    if game is not None:
        if "game" not in flat.task:
            runner.fail(f"game: {algo}'s config has no game; use the multiturn or sft trainer")
        flat.task.game = given_name(game, "game")
    return flat


def _public(body: Callable) -> Callable[[Callable], Callable]:
    """Like functools.wraps, but keeping the wrapper's own signature (what users call)."""

    def name(train: Callable) -> Callable:
        for attribute in ("__module__", "__name__", "__qualname__", "__doc__"):
            setattr(train, attribute, getattr(body, attribute))
        return train

    return name


def lm_trainer(algo: str) -> Callable[[Callable], Callable[..., Result]]:
    """The public `train` of a language-model trainer, from `body(flat, workdir,
    kill_after_chunk) -> Result`, which gets the config with the user parts in it
    (`lm_config`): one signature for every language-model algorithm."""

    def wrap(body: Callable) -> Callable[..., Result]:
        @_public(body)
        def train(
            config: Any = None,
            workdir: str | os.PathLike | None = None,
            *,
            model: Any = None,
            train_data: Any = None,
            eval_data: Any = None,
            rewards: Any = None,
            game: Any = None,
            kill_after_chunk: int | None = None,
        ) -> Result:
            parts = dict(model=model, train_data=train_data, eval_data=eval_data)
            flat = lm_config(config, algo, rewards=rewards, game=game, **parts)
            return body(flat, None if workdir is None else os.fspath(workdir), kill_after_chunk)

        return train

    return wrap


def control_trainer(algo: str, num_seeds: int = 4) -> Callable[[Callable], Callable[..., Result]]:
    """The public `train` of a control trainer, from `body(flat, workdir, seeds,
    kill_after_chunk) -> Result`, which gets the config and the checked seeds (`num_seeds` by
    default, from PRNGKey(`seed`)): one signature for every control algorithm."""
    from jaxrl import runner

    def wrap(body: Callable) -> Callable[..., Result]:
        @_public(body)
        def train(
            config: Any = None,
            workdir: str | os.PathLike | None = None,
            *,
            num_seeds: int = num_seeds,
            seed: int = 0,
            kill_after_chunk: int | None = None,
        ) -> Result:
            flat = config_of(config, algo)
            seeds = runner.make_seeds(num_seeds, seed, flat.run)
            return body(flat, workdir, seeds, kill_after_chunk)

        return train

    return wrap


def run_script(flags: dict[str, Any], train: Any) -> None:
    """A script's main: its flags into `train` (what every `experiments/<algo>.py` runs)."""
    kwargs = {name: flags[name].value for name in ("num_seeds", "seed") if name in flags}
    train(
        flags["config"].value,
        flags["workdir"].value,
        kill_after_chunk=flags["kill_after_chunk"].value,
        **kwargs,
    )
