"""Export a trained run as a Hugging Face checkpoint directory.

    python experiments/export.py --run=runs/grpo --out=exports/grpo
    python experiments/export.py --run=runs/sft --out=exports/sft --dtype=bfloat16 --overwrite

Works for any run of sft.py, dpo.py or grpo.py (its `params/` and what it recorded of its model
and tokenizer: `model.json`, `tokenizer/`). --out receives `config.json` and `model.safetensors`
(which `transformers.AutoModelForCausalLM.from_pretrained` and `jaxrl.lm.hf.load_hf_checkpoint`
load), `tokenizer.json` and `tokenizer_config.json` (the chat template and special tokens the run
used; a byte-tokenizer run gets an equivalent byte-level tokenizer.json) and
`generation_config.json` with the bos/eos/pad ids. The directory is built under a temporary name
beside --out and renamed into place, so it exists complete or not at all; an existing non-empty
--out is refused unless --overwrite.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from jaxrl import interrupts

interrupts.for_a_script()  # first: Ctrl-C during the imports below is one line too

from absl import flags

from jaxrl import cli, extras
from jaxrl.config import ConfigError, fail
from jaxrl.lm import ByteTokenizer, checkpoints, load_tokenizer
from jaxrl.lm.model import ModelConfig
from jaxrl.trainers import lm_runs

# A missing optional extra is one error line, before flags are parsed or anything compiles.
extras.require("lm", "experiments/export.py")

_RUN = flags.DEFINE_string("run", None, "Run directory of sft.py, dpo.py or grpo.py.")
_OUT = flags.DEFINE_string("out", None, "Hugging Face directory to write.")
_OVERWRITE = flags.DEFINE_bool("overwrite", False, "Replace an existing non-empty --out.")
_DTYPE = flags.DEFINE_enum(
    "dtype", None, ["float32", "bfloat16", "float16"], "Tensor dtype; default: the run's."
)


def byte_level_alphabet() -> list[str]:
    """The printable character byte-level BPE (GPT-2, `tokenizers.pre_tokenizers.ByteLevel`)
    writes for each byte 0..255: printable Latin-1 bytes stand for themselves, the others map in
    order to code points from 256 up."""
    printable = {*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)}
    alphabet, shifted = [], 0
    for b in range(256):
        if b in printable:
            alphabet.append(chr(b))
        else:
            alphabet.append(chr(256 + shifted))
            shifted += 1
    return alphabet


def byte_tokenizer_files(model: ModelConfig) -> tuple[dict, dict]:
    """tokenizer.json and tokenizer_config.json of a byte-level BPE tokenizer with no merges that
    encodes and decodes exactly as `ByteTokenizer` (<pad>=0, <bos>=1, <eos>=2, byte b = b + 3),
    so a byte-tokenizer run exports as a self-contained Hugging Face directory."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    byte = ByteTokenizer()
    vocab = {name: i for i, name in enumerate(ByteTokenizer.SPECIALS)}
    vocab |= {char: b + byte.OFFSET for b, char in enumerate(byte_level_alphabet())}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    # No regex split and no prefix space: every byte of the text is one token, as in ByteTokenizer.
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens(list(ByteTokenizer.SPECIALS))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<bos>",
        "eos_token": "<eos>",
        "pad_token": "<pad>",
        "model_max_length": model.max_position_embeddings,
        "clean_up_tokenization_spaces": False,
    }
    return json.loads(tokenizer.to_str()), config


def tokenizer_files(source: checkpoints.Checkpoint) -> dict[str, Any]:
    """{file name: JSON contents or text} of the run's tokenizer, tokenizer_config.json completed
    with what transformers needs (tokenizer class, special tokens, chat template)."""
    if source.tokenizer == checkpoints.BYTE:
        tokenizer_json, config = byte_tokenizer_files(source.model)
        return {"tokenizer.json": tokenizer_json, "tokenizer_config.json": config}
    tokenizer = load_tokenizer(source.tokenizer)  # checks the files before anything is written
    path = os.path.join(source.tokenizer, "tokenizer_config.json")
    config = checkpoints.read_json(path) if os.path.isfile(path) else {}
    config.setdefault("tokenizer_class", "PreTrainedTokenizerFast")
    for name, token in tokenizer.special_tokens.items():
        config.setdefault(name, token)
    if tokenizer.chat_template is not None and not os.path.isfile(
        os.path.join(source.tokenizer, "chat_template.jinja")
    ):
        template = tokenizer.chat_template
        if isinstance(template, dict):
            template = [{"name": k, "template": v} for k, v in template.items()]
        config.setdefault("chat_template", template)
    files: dict[str, Any] = {"tokenizer_config.json": config}
    for name in ("tokenizer.json", "chat_template.jinja"):
        if os.path.isfile(os.path.join(source.tokenizer, name)):
            files[name] = os.path.join(source.tokenizer, name)  # copied as is
    return files


def special_ids(source: checkpoints.Checkpoint) -> dict[str, int]:
    """bos/eos/pad ids the run recorded (model.json), else its tokenizer's."""
    record_path = os.path.join(source.path, checkpoints.MODEL_FILE)
    if os.path.isfile(record_path):
        ids = checkpoints.read_json(record_path).get("special_token_ids")
        if isinstance(ids, dict) and ids:
            return {k: int(v) for k, v in ids.items()}
    return checkpoints.special_token_ids(load_tokenizer(source.tokenizer))


def write_directory(staging: str, model: ModelConfig, params: Any, files: dict, ids: dict) -> None:
    """Everything --out receives, written into `staging`."""
    from jaxrl.lm.hf import save_hf_checkpoint

    save_hf_checkpoint(staging, model, params, extra_config=ids)
    for name, contents in files.items():
        target = os.path.join(staging, name)
        if isinstance(contents, str):
            shutil.copyfile(contents, target)
        else:
            checkpoints.write_json(target, contents)
    copied = files.get("tokenizer.json")
    if isinstance(copied, str):  # named templates beside a copied tokenizer.json go along
        extra = os.path.join(os.path.dirname(copied), checkpoints.CHAT_TEMPLATES_DIR)
        if os.path.isdir(extra):
            shutil.copytree(extra, os.path.join(staging, checkpoints.CHAT_TEMPLATES_DIR))
    checkpoints.write_json(os.path.join(staging, "generation_config.json"), dict(ids))


def replace_directory(staging: str, out: str, overwrite: bool) -> None:
    """Rename `staging` to `out`; with `overwrite`, an existing `out` is moved aside first and
    removed only once the new one is in place."""
    if overwrite and os.path.isdir(out) and os.listdir(out):
        aside = tempfile.mkdtemp(prefix=f".{os.path.basename(out)}.old-", dir=os.path.dirname(out))
        os.rename(out, os.path.join(aside, "previous"))
        os.rename(staging, out)
        shutil.rmtree(aside, ignore_errors=True)
        return
    if os.path.isdir(out):
        os.rmdir(out)  # empty (checked before); rename does not replace a directory everywhere
    os.rename(staging, out)


def main(argv: list[str]) -> None:
    if not _RUN.value:
        fail("--run: missing; pass the run directory to export, e.g. --run=runs/sft")
    if not _OUT.value:
        fail("--out: missing; pass the directory to write, e.g. --out=exports/sft")
    out = os.path.abspath(_OUT.value)
    if os.path.exists(out) and not os.path.isdir(out):
        fail(f"--out={_OUT.value}: is a file; pass a directory path")
    if os.path.isdir(out) and os.listdir(out) and not _OVERWRITE.value:
        fail(f"--out={_OUT.value}: exists and is not empty; pass a new directory or --overwrite")
    try:
        source = checkpoints.find_checkpoint(_RUN.value)
    except (ConfigError, ValueError, OSError) as error:
        fail(f"--run: {error}")
    if source.kind != "run":
        fail(
            f"--run={_RUN.value}: is a {'GGUF file' if source.kind == 'gguf' else 'Hugging Face'}"
            " checkpoint, not a run directory; pass a run of sft.py, dpo.py or grpo.py (to "
            "convert a GGUF file: python -m jaxrl.lm.gguf IN.gguf OUT_DIR)"
        )
    model = source.model
    if _DTYPE.value:  # a cast of the stored tensors; the architecture stays the run's
        model = dataclasses.replace(model, dtype=_DTYPE.value, param_dtype=_DTYPE.value)
    try:
        files = tokenizer_files(source)
        ids = special_ids(source)
    except (ConfigError, ValueError, OSError) as error:
        fail(f"--run={_RUN.value}: tokenizer: {error}")

    start = time.perf_counter()
    mesh = lm_runs.make_mesh((1, 1, 1))
    params = checkpoints.load_params(source, model, mesh)
    parent = os.path.dirname(out)
    os.makedirs(parent, exist_ok=True)
    staging = tempfile.mkdtemp(prefix=f".{os.path.basename(out)}.tmp-", dir=parent)
    try:
        os.chmod(staging, 0o755)  # mkdtemp makes it private
        write_directory(staging, model, params, files, ids)
        replace_directory(staging, out, _OVERWRITE.value)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    print(
        f"Exported {source.description} ({model.num_params() / 1e6:.2f}M parameters, "
        f"{model.param_dtype}) to {out} in {time.perf_counter() - start:.1f}s"
    )


if __name__ == "__main__":
    cli.main(main)
