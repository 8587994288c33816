"""The one shape every trainer has, and what the trainers share.

    from jaxrl.trainers import grpo
    result = grpo.train(config, workdir, model=..., train_data=..., rewards=[...])
    result.summary["eval_task_accuracy"], result.state, result.run_dir

`train(config=None, workdir=None, *, <user parts>) -> Result`, for every algorithm:
- `config`: the algorithm's ml_collections config: None (the script's default preset), a preset
  name of `jaxrl.trainers.presets.<algo>` ("word_problems"), or a ConfigDict (`<algo>.config(
  preset)` returns one to edit: `config.num_steps = 4`). It is copied, never changed.
- `workdir`: the run directory (None: runs/<name>-<date>-<time>). An existing one is resumed from
  its newest checkpoint, with the same settings; a larger `num_steps` extends a finished run.
- user parts, where the algorithm has them, as Python objects: `model` (a Hugging Face
  directory, a GGUF file, a run directory, "smollm2", or parameters in memory: `ModelParams(
  params, model_config, tokenizer)`, or `ModelParams.load(path)`), `train_data` / `eval_data`
  (a JSONL path, or rows: a list of dicts or any iterable of them, e.g. a Hugging Face
  `datasets.Dataset`), `rewards` (host reward functions `f(prompts, completions, **columns) ->
  list[float]`), `game` (a text-game class: `reset(seed) -> opening`, `step(utterance) ->
  (answer, reward, done)`, as envs/text/host_env.py plays it); control trainers take
  `num_seeds` and `seed`. A model given (`model`) brings its architecture: a changed model
  field other than dtype, param_dtype, remat, attention and decode_unroll beside it is refused.

Everything the script does happens here, in the same order: validation, the run directory,
checkpoints and resume, metrics, evaluation, summary.json and plots. A bad setting, file or part
(or a user's function failing in the run) raises `jaxrl.config.InputError` (a `ConfigError`)
carrying one line `<field or file:line>: <problem>; <fix>`, before anything is written or
compiled; the script, the boundary, prints that line as `error: ...` and exits with status 2.
The script only parses flags into the config and calls `train`, so a run from Python and the
same run from the command line end with the same summary and parameters.
"""

from __future__ import annotations

import copy
import dataclasses
import importlib
import os
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, NamedTuple

import ml_collections

from jaxrl import cli
from jaxrl.config import InputError, Settings, fail, given_settings, mark_given


class Result(NamedTuple):
    """What a trainer returns: the final training state (with a leading seeds axis for the
    control algorithms), the summary.json it wrote, and the run directory's path."""

    state: Any
    summary: dict[str, Any]
    run_dir: str

    def model_params(self) -> ModelParams:
        """A language-model run's trained model as `ModelParams`, for the next trainer's
        `model=`: the final parameters in memory (`state.params`) with the architecture, the
        tokenizer and the starting point (`pretrained`) its run directory records, so the next
        run takes the defaults of what the model is (SmolLM2 fine-tuned: the pretrained ones).
        One error line for a run that holds no language model (a control or reward-model run)."""
        from jaxrl.config import ConfigError
        from jaxrl.lm import checkpoints

        if not os.path.isfile(os.path.join(self.run_dir, checkpoints.MODEL_FILE)):
            fail(
                f"model_params: {self.run_dir} holds no language model (no "
                f"{checkpoints.MODEL_FILE}); call it on a result of sft, dpo, grpo, ppo_lm, "
                "online_dpo or multiturn"
            )
        try:
            source = checkpoints.find_checkpoint(self.run_dir)
        except (ConfigError, ValueError, OSError) as error:
            fail(f"model_params: {error}")
        tokenizer = source.tokenizer or "byte"
        return ModelParams(self.state.params, source.model, tokenizer, source.pretrained)


def load_config(algo: str, preset: str | None = None) -> ml_collections.ConfigDict:
    """`jaxrl.trainers.presets.<algo>`'s config for `preset` (None: the file's default), locked
    like the scripts' --config (a mistyped field is an error, not a new setting), as `Settings`:
    a refused assignment is one InputError line."""
    module = importlib.import_module(f"jaxrl.trainers.presets.{algo}")
    config = module.get_config() if preset is None else module.get_config(preset)
    config.lock()
    return Settings.of(config)


def config_of(config: Any, algo: str, default_preset: str | None = None) -> Any:
    """The ConfigDict a trainer runs: `config` copied, a preset name's, or the default's."""
    if config is None:
        return load_config(algo, default_preset)
    if isinstance(config, str):
        return load_config(algo, config)
    if isinstance(config, ml_collections.ConfigDict):
        return copy.deepcopy(config)

    fail(
        f"config: expected an ml_collections.ConfigDict or a preset name, got "
        f"{type(config).__name__}; pass jaxrl.trainers.{algo}.config(PRESET)"
    )


def workdir_or_default(workdir: str | os.PathLike | None, name: str) -> str:
    """`workdir`, or runs/<name>-<date>-<time>."""
    if workdir is not None:
        return os.fspath(workdir)
    return os.path.join("runs", f"{name}-{time.strftime('%Y%m%d-%H%M%S')}")


def given_rows(rows: Any, part: str) -> Any:
    """A data part as the run reads it: a path as is; rows (a list of dicts, or any iterable of
    mappings, such as a Hugging Face `datasets.Dataset`, read with its `to_list()`) as
    `GivenRows`, read from memory where a file would be, and recorded by their digest (the same
    rows give the same config, so a run given them again resumes)."""
    from jaxrl.data.chat import GivenRows

    if isinstance(rows, str | os.PathLike):
        return os.fspath(rows)
    if isinstance(rows, Mapping):  # a datasets.DatasetDict, one row, or columns
        splits = [name for name, value in rows.items() if callable(getattr(value, "to_list", 0))]
        fix = f"pass one split, e.g. {part}=data[{splits[0]!r}]" if splits else ""
        fix = fix or "give a list of rows, e.g. [{'prompt': '...', 'answer': '...'}, ...]"
        fail(f"{part}: a mapping ({type(rows).__name__}), not a list of rows; {fix}")
    to_list = getattr(rows, "to_list", None)  # a datasets.Dataset: all rows at once
    if callable(to_list):
        rows = to_list()
    if not isinstance(rows, Iterable) or isinstance(rows, bytes):
        fail(
            f"{part}: expected a JSONL path or a list of dicts, got {type(rows).__name__}; "
            "pass e.g. [{'prompt': '...', 'answer': '...'}, ...]"
        )
    rows = list(rows)
    for index, row in enumerate(rows):
        if not isinstance(row, Mapping):
            fail(
                f"{part}: row {index} is a {type(row).__name__}, not a dict; give every row as "
                "a dict of columns"
            )
    try:
        return GivenRows.of(rows, part)
    except ValueError as error:
        fail(f"{part}: {error}; give JSON values (str, numbers, lists)")


# A `ModelParams` that does not say whether it is pretrained is taken as pretrained when its
# vocabulary is larger than this: the byte tokenizer's 259 tokens (the tiny model's) and any
# vocabulary up to 512 are a model trained from scratch, a real tokenizer's (SmolLM2's 49,152)
# a pretrained one, which the random model's learning rate would wreck.
SCRATCH_VOCAB_MAX = 512


@dataclasses.dataclass(frozen=True, eq=False)
class ModelParams:
    """A language model in memory, for a trainer's `model` part: `params`, the tree
    `jaxrl.lm.model.init_params(model, key)` makes (e.g. what `ModelParams.load` reads from a
    run); `model`, their `jaxrl.lm.model.ModelConfig`; `tokenizer`, "byte", a tokenizer.json
    (or its directory) or a loaded Hugging Face tokenizer; `pretrained`, whether the weights
    descend from a pretrained checkpoint (it picks the settings' defaults by starting point,
    docs/defaults.md). `pretrained` None (not said) takes the pretrained defaults for a
    vocabulary above SCRATCH_VOCAB_MAX (512) tokens, saying so in one line on stderr, and the
    from-scratch ones silently for a smaller one (the byte tokenizer's); `ModelParams.load`
    and `Result.model_params()` say it from the run or checkpoint. The run records it by a
    description (architecture, tokenizer, shapes and a fingerprint computed where the
    parameters are): the same parameters given again resume the run."""

    params: Any
    model: Any
    tokenizer: Any = "byte"
    pretrained: bool | None = None

    @classmethod
    def load(cls, path: str | os.PathLike) -> ModelParams:
        """The model a run directory, Hugging Face directory or GGUF file holds (or "smollm2"),
        read into memory as NumPy arrays in the dtype it records (one error line for a path
        that holds none)."""
        import jax
        import numpy as np

        from jaxrl import sharding
        from jaxrl.config import ConfigError
        from jaxrl.lm import checkpoints

        try:
            source = checkpoints.find_checkpoint(os.fspath(path))
        except (ConfigError, ValueError, OSError) as error:
            fail(f"model: {error}")
        mesh = sharding.make_mesh(1, 1, 1)
        params = checkpoints.load_params(source, source.model, mesh)
        params = jax.tree.map(np.asarray, params)
        return cls(params, source.model, source.tokenizer or "byte", source.pretrained)


def model_checkpoint(model: Any) -> Any:
    """A `model` part as the run starts from it: a path (HF directory, GGUF file, run directory)
    or "smollm2" as is, parameters in memory (`ModelParams`) as their `Checkpoint`."""
    from jaxrl.lm import checkpoints

    if isinstance(model, str | os.PathLike):
        return os.fspath(model)
    if isinstance(model, ModelParams):
        return checkpoints.given_checkpoint(
            model.params, model.model, model.tokenizer, taken_as_pretrained(model)
        )
    fail(
        f"model: expected a Hugging Face directory, a .gguf file, a run directory, 'smollm2' "
        f"or a jaxrl.trainers.base.ModelParams, got {type(model).__name__}; pass its path, or "
        "ModelParams(params, model_config, tokenizer)"
    )


def taken_as_pretrained(model: ModelParams) -> bool:
    """Whether a run starts `model` as pretrained: its `pretrained` where said, else whether its
    vocabulary is above SCRATCH_VOCAB_MAX tokens."""
    if model.pretrained is not None:
        return bool(model.pretrained)
    return getattr(model.model, "vocab_size", 0) > SCRATCH_VOCAB_MAX


def say_inferred_start(model: Any, flat: ml_collections.ConfigDict) -> None:
    """One line on stderr where a `ModelParams` that did not say `pretrained=` is taken as
    pretrained by its vocabulary: which defaults that gives this run (`flat`'s settings left
    to the starting point), and how to say otherwise."""
    from jaxrl.trainers.presets.lm import described_values, starting_point_defaults

    if not isinstance(model, ModelParams) or model.pretrained is not None:
        return
    if not taken_as_pretrained(model):
        return  # the byte or a tiny vocabulary: from scratch, as the tiny model always was
    chosen = starting_point_defaults(flat, pretrained=True)
    values = described_values(chosen)
    so = f"so the pretrained defaults ({values})" if values else "so taken as pretrained"
    print(
        f"model: ModelParams without pretrained=: a {model.model.vocab_size:,}-token "
        f"vocabulary, {so}; pass pretrained=False for weights trained from scratch "
        "(pretrained=True to say so)",
        file=sys.stderr,
        flush=True,
    )


def described(obj: Any, field: str) -> str:
    """What a run directory records of a Python object given to a trainer (a reward function, a
    game class): "module:qualified name", compared on resume, never looked up again."""
    if not callable(obj):
        fail(f"{field}: {obj!r} is not callable; pass a function or a class")
    name = getattr(obj, "__qualname__", None) or type(obj).__qualname__
    return f"{getattr(obj, '__module__', None) or 'python'}:{name}"


def loaded(spec: str, field: str, what: str) -> Any:
    """The object a config's "module.path:name" (or "path/to/file.py:name") string names: the
    edge where a string from the command line becomes the object the run uses."""
    try:
        return cli.load_named(spec)
    except SyntaxError as error:  # the user's file does not parse
        fail(
            f"{field}: {error.filename}:{error.lineno}: {error.msg} (loading {spec!r}); fix the "
            "file"
        )
    except (ImportError, AttributeError, ValueError) as error:
        fail(
            f"{field}: cannot load {spec!r} ({error}); give 'module.path:{what}' importable from "
            f"the working directory, or 'path/to/file.py:{what}'"
        )
    except Exception as error:  # noqa: BLE001  (the user's module raised while it was imported)
        fail(
            f"{field}: loading {spec!r} raised {type(error).__name__}: {error} at "
            f"{raised_at(error)}; fix the module"
        )


def raised_at(error: BaseException) -> str:
    """ "file:line" of the innermost frame of `error`'s traceback outside the import machinery
    and this library: the user's line that raised (or the call of it into a library)."""
    import traceback

    frames = traceback.extract_tb(error.__traceback__)
    own = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    outside = [f for f in frames if not f.filename.startswith(("<frozen", own))]
    frame = (outside or frames)[-1]
    return f"{frame.filename}:{frame.lineno}"


def lm_parts(
    config: Any,
    algo: str,
    *,
    model: Any = None,
    train_data: Any = None,
    eval_data: Any = None,
    rewards: Any = None,
    game: Any = None,
) -> tuple[Any, Any]:
    """A language-model trainer's ConfigDict and its user parts as objects (`lm_runs.Parts`): the
    parts given, or what the config's strings name (a reward function's or game's
    "module:name", loaded here, once). The config records a description of each object given
    (`model` as init_from, rows as config.task.train_jsonl / eval_jsonl, reward functions as
    config.rewards.host, a game class as config.task.game), which a resumed run compares; the
    settings the user assigned (`jaxrl.config.given_settings`) are `Parts.given`. A part the
    algorithm does not take is one error line."""
    from jaxrl.data.chat import GivenRows
    from jaxrl.trainers import lm_runs

    flat = config_of(config, algo)
    given = given_settings(flat)  # before this function records the parts in it
    start = None
    if model is not None:
        source = model_checkpoint(model)
        if not isinstance(source, str):
            start, flat.init_from = source, source.description
            say_inferred_start(model, flat)
        else:
            flat.init_from = source
    data = {}
    for part, value, field in (
        ("train_data", train_data, "train_jsonl"),
        ("eval_data", eval_data, "eval_jsonl"),
    ):
        if value is None:
            continue
        if field not in flat.task:
            fail(f"{part}: {algo} trains on a game, not on rows; drop {part}")
        source = given_rows(value, part)
        data[field] = source
        flat.task[field] = source.description if isinstance(source, GivenRows) else source
    functions = None
    if rewards is not None:
        if "rewards" not in flat:
            fail(f"rewards: {algo} takes no reward functions; drop rewards")
        functions = list(rewards) if isinstance(rewards, list | tuple) else [rewards]
        flat.rewards.host = ",".join(described(f, "rewards") for f in functions)
        functions = [(getattr(f, "__name__", None) or type(f).__name__, f) for f in functions]
    elif "rewards" in flat and flat.rewards.host:
        specs = [spec.strip() for spec in flat.rewards.host.split(",") if spec.strip()]
        functions = [
            (spec.rpartition(":")[2], loaded(spec, "config.rewards.host", "function"))
            for spec in specs
        ]
    played = None
    if game is not None:
        if "game" not in flat.task:
            fail(f"game: {algo}'s config has no game; use the multiturn or sft trainer")
        played, flat.task.game = game, described(game, "game")
    elif "game" in flat.get("task", {}) and ":" in flat.task.game:
        played = loaded(flat.task.game, "config.task.game", "GameClass")
    task = None  # a text task's class of the user's, named by config.task.name
    if "name" in flat.get("task", {}) and ":" in flat.task.name:
        task = loaded(flat.task.name, "config.task.name", "Class")
    return flat, lm_runs.Parts(start, data, functions, played, task, given)


def alone(error: InputError) -> None:
    """Make `error` as `train` raises it: without the exceptions it was raised while handling
    and without the frames inside the library, so the traceback a user sees is their call, the
    trainer's frame and the one line that says what to fix."""
    error.__cause__ = error.__context__ = None
    error.__suppress_context__ = True
    error.__traceback__ = None


def stops(record: Any) -> Any:
    """Ctrl-C and SIGTERM during one trainer call (`jaxrl.interrupts`): never lost, never raised
    inside JAX; from Python they raise `Stopped` at the call's next boundary, with the line that
    says whether the run's checkpoints are kept."""
    from jaxrl import interrupts, runner

    cli.drop_orbax_waits()  # a trainer call's stderr is the script's
    return interrupts.watching(lambda: runner.interrupted_line(record.run_dir))


# The scripts' --kill_after_chunk (a testing aid: SIGKILL right after chunk K's checkpoint), set
# by `run_script` for the process; not an argument of the public `train` functions.
_KILL_AFTER_CHUNK: int | None = None


def _public(body: Callable) -> Callable[[Callable], Callable]:
    """Like functools.wraps, but keeping the wrapper's own signature (what users call)."""

    def name(train: Callable) -> Callable:
        for attribute in ("__module__", "__name__", "__qualname__", "__doc__"):
            setattr(train, attribute, getattr(body, attribute))
        return train

    return name


def lm_trainer(algo: str) -> Callable[[Callable], Callable[..., Result]]:
    """The public `train` of a language-model trainer, from `body(flat, parts, workdir,
    kill_after_chunk) -> Result`, which gets the config and the user parts as objects
    (`lm_parts`): one signature for every language-model algorithm."""

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
        ) -> Result:
            from jaxrl import runner
            from jaxrl.trainers import lm_runs

            try:
                with (
                    cli.quiet_callback_logs(),
                    runner.host_failures_as_input_errors() as record,
                    stops(record) as watch,
                ):
                    given = dict(model=model, train_data=train_data, eval_data=eval_data)
                    flat, parts = lm_parts(config, algo, rewards=rewards, game=game, **given)
                    where = None if workdir is None else os.fspath(workdir)
                    result = body(flat, parts, where, _KILL_AFTER_CHUNK)
                    watch.check(watch.stop_line)  # a request during the final evaluation
                    return result
            except lm_runs.Finished as finished:  # the run asked for had finished
                return Result(*finished.result)
            except InputError as error:
                alone(error)
                raise error

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
        ) -> Result:
            try:
                with runner.host_failures_as_input_errors() as record, stops(record) as watch:
                    flat = config_of(config, algo)
                    for name, value in (("num_seeds", num_seeds), ("seed", seed)):
                        if isinstance(value, bool) or not isinstance(value, int):
                            fail(
                                f"{name}: got {value!r}, a {type(value).__name__}; pass an "
                                f"int, e.g. {name}={1 if name == 'num_seeds' else 0}"
                            )
                    seeds = runner.make_seeds(num_seeds, seed, flat.run)
                    result = body(flat, workdir, seeds, _KILL_AFTER_CHUNK)
                    watch.check(watch.stop_line)  # a request during the final evaluation
                    return result
            except InputError as error:
                alone(error)
                raise error

        return train

    return wrap


def run_script(flags: dict[str, Any], train: Any) -> None:
    """A script's main: its flags into `train` (what every `experiments/<algo>.py` runs). The
    config's --config.X flags are recorded as given (`jaxrl.config.mark_given`), as assignments
    from Python are: a setting left to the preset may be fitted to the data, a given one not."""
    from absl import flags as absl_flags

    global _KILL_AFTER_CHUNK
    _KILL_AFTER_CHUNK = flags["kill_after_chunk"].value
    kwargs = {name: flags[name].value for name in ("num_seeds", "seed") if name in flags}
    config = flags["config"]
    overridden = absl_flags.FLAGS[config.name].override_values  # {"task.num_eval": 40, ...}
    train(mark_given(config.value, overridden), flags["workdir"].value, **kwargs)
