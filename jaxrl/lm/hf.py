"""Hugging Face checkpoints: load Llama / Qwen2 / Qwen3 weights into `Transformer` and write them
back.

A Hugging Face checkpoint directory holds `config.json` and either `model.safetensors` or a sharded
`model.safetensors.index.json` with the files it names. Reading and writing go through
`safetensors.numpy`, so neither PyTorch nor `transformers` is needed.

    config, params = load_hf_checkpoint("path/to/Qwen2.5-0.5B")
    logits, _ = Transformer(config).apply({"params": params}, tokens)
    save_hf_checkpoint("out/", config, params, model_type="qwen2")

Layouts. Hugging Face stores every linear layer as a torch `[out, in]` matrix; ours are `[in, ...]`
kernels with the head axes split out:

    model.embed_tokens.weight [V, d]                 -> embedding [V, d]
    lm_head.weight [V, d] (untied only)              -> lm_head [d, V]
    model.norm.weight [d]                            -> final_norm/scale
    model.layers.i.input_layernorm.weight [d]        -> layer_i/input_norm/scale
    model.layers.i.post_attention_layernorm.weight   -> layer_i/post_attention_norm/scale
    model.layers.i.self_attn.q_proj.weight [h*k, d]  -> layer_i/attention/q_kernel [d, h, k]
    model.layers.i.self_attn.{k,v}_proj.weight       -> layer_i/attention/{k,v}_kernel [d, kv, k]
    model.layers.i.self_attn.o_proj.weight [d, h*k]  -> layer_i/attention/o_kernel [h, k, d]
    model.layers.i.self_attn.{q,k,v}_proj.bias       -> layer_i/attention/{q,k,v}_bias [heads, k]
    model.layers.i.self_attn.{q,k}_norm.weight [k]   -> layer_i/attention/{q,k}_norm/scale (Qwen3)
    model.layers.i.mlp.{gate,up}_proj.weight [f, d]  -> layer_i/mlp/{gate,up}_kernel [d, f]
    model.layers.i.mlp.down_proj.weight [d, f]       -> layer_i/mlp/down_kernel [f, d]

Only what `Transformer` computes is accepted: RoPE without scaling or with Llama 3.1's ("llama3")
or YaRN ("yarn") frequency scaling, SiLU, no MLP bias, no output-projection bias, no sliding
window. Anything else raises `ConfigError` naming config.json and the field, rather than loading
weights into a model that would compute something different.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from jaxrl import extras
from jaxrl.config import ConfigError
from jaxrl.lm.model import ModelConfig, stack_layers, unstack_layers

__all__ = [
    "config_from_hf",
    "config_to_hf",
    "load_hf_checkpoint",
    "model_type_for",
    "save_hf_checkpoint",
]

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"

ARCHITECTURES = {
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
}
SUPPORTED = (
    "model_type 'llama' (LlamaForCausalLM), 'qwen2' (Qwen2ForCausalLM) or 'qwen3' "
    "(Qwen3ForCausalLM)"
)
# Qwen3Config's head_dim when config.json omits it (it is not hidden_size / num_heads there).
QWEN3_DEFAULT_HEAD_DIM = 128
DTYPES = ("float32", "bfloat16", "float16")

# Buffers some older checkpoints saved alongside the weights; they are recomputed, not loaded.
IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


def _safetensors():
    # PyTorch is not needed: safetensors reads and writes NumPy arrays.
    extras.import_module("safetensors.numpy", "lm", "Hugging Face checkpoints")
    import safetensors

    return safetensors


# --- config.json <-> ModelConfig -----------------------------------------------------------------


# The keys each supported rope_type may carry in rope_scaling / rope_parameters, and the
# ModelConfig field each becomes. Anything else is refused: an unknown key may change the model.
_ROPE_KEYS = {
    "default": {},
    "llama3": {
        "factor": "rope_factor",
        "original_max_position_embeddings": "rope_original_max_position_embeddings",
        "low_freq_factor": "rope_low_freq_factor",
        "high_freq_factor": "rope_high_freq_factor",
    },
    "yarn": {
        "factor": "rope_factor",
        "original_max_position_embeddings": "rope_original_max_position_embeddings",
        "beta_fast": "rope_beta_fast",
        "beta_slow": "rope_beta_slow",
        "truncate": "rope_truncate",
        "attention_factor": "rope_attention_factor",
    },
}
_ROPE_COMMON_KEYS = ("rope_type", "type", "rope_theta", "partial_rotary_factor")
_YARN_MSCALE_KEYS = ("mscale", "mscale_all_dim")
_YARN_REQUIRED = ("factor", "original_max_position_embeddings")


def _rope(hf_config: Mapping[str, Any], source: str) -> dict[str, Any]:
    """The ModelConfig `rope_*` fields from either spelling of the RoPE settings.

    transformers < 5 writes a top-level `rope_theta` and an optional `rope_scaling` dict;
    transformers >= 5 writes `rope_parameters: {"rope_theta": ..., "rope_type": ...}`. Defaults
    follow transformers' `standardize_rope_params` and `_compute_*_parameters`.
    """
    theta = hf_config.get("rope_theta")
    partial = hf_config.get("partial_rotary_factor", 1.0)
    if partial not in (None, 1.0):
        raise _unsupported(
            source,
            "partial_rotary_factor",
            partial,
            "jaxrl rotates every feature of each head (partial_rotary_factor 1.0)",
        )
    parsed: dict[str, tuple[str, dict[str, Any]]] = {}
    for field in ("rope_scaling", "rope_parameters"):
        rope = hf_config.get(field)
        if rope is None:
            continue
        if not isinstance(rope, Mapping):
            raise ConfigError(f"{source}: {field}: expected an object or null, got {rope!r}")
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        if rope_type not in _ROPE_KEYS:
            raise ConfigError(
                f"{source}: {field}.rope_type={rope_type!r} is not supported; jaxrl implements "
                f"rope_type {', '.join(map(repr, _ROPE_KEYS))} (no scaling, Llama 3.1+, YaRN), "
                "so variants such as 'linear', 'dynamic' or 'longrope' cannot be loaded"
            )
        partial = rope.get("partial_rotary_factor", 1.0)
        if partial != 1.0:
            raise ConfigError(
                f"{source}: {field}.partial_rotary_factor={partial!r} is not supported; jaxrl "
                "rotates every feature of each head (partial_rotary_factor 1.0)"
            )
        known = _ROPE_KEYS[rope_type]
        allowed = (*_ROPE_COMMON_KEYS, *known, *(_YARN_MSCALE_KEYS if rope_type == "yarn" else ()))
        for key in rope:
            if key not in allowed:
                raise ConfigError(
                    f"{source}: {field}.{key} is not supported for rope_type {rope_type!r}; "
                    f"jaxrl reads only {', '.join(allowed)}"
                )
        if "rope_theta" in rope:
            if theta is not None and float(theta) != float(rope["rope_theta"]):
                raise ConfigError(
                    f"{source}: rope_theta={theta!r} disagrees with "
                    f"{field}.rope_theta={rope['rope_theta']!r}; make them equal"
                )
            theta = rope["rope_theta"]
        parsed[field] = (rope_type, dict(rope))
    if theta is None:
        raise ConfigError(
            f"{source}: rope_theta: missing; give it at the top level or as "
            "rope_parameters.rope_theta"
        )

    if len(parsed) == 2:  # our own exports write both spellings; they must say the same
        (type_a, a), (type_b, b) = parsed["rope_scaling"], parsed["rope_parameters"]
        strip = ("rope_theta", "type", "rope_type")
        a = {k: v for k, v in a.items() if k not in strip}
        b = {k: v for k, v in b.items() if k not in strip}
        if type_a != type_b or a != b:
            raise ConfigError(
                f"{source}: rope_scaling={hf_config['rope_scaling']!r} disagrees with "
                f"rope_parameters={hf_config['rope_parameters']!r}; keep one of them"
            )
    rope_type, rope = parsed.get("rope_parameters", parsed.get("rope_scaling", ("default", {})))
    fields: dict[str, Any] = {"rope_theta": float(theta), "rope_type": rope_type}
    if rope_type == "default":
        return fields

    # Where the pretraining length lives: Phi-3 style top level, else in the dict, else the
    # model's max_position_embeddings (transformers' standardize_rope_params).
    original = hf_config.get("original_max_position_embeddings")
    if original is None:
        original = rope.get("original_max_position_embeddings")
    if original is None:
        original = hf_config.get("max_position_embeddings")
    field = "rope_parameters" if "rope_parameters" in parsed else "rope_scaling"

    def number(key: str, value: Any) -> Any:
        if value is None or isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(
                f"{source}: {field}.{key}: expected a number for rope_type {rope_type!r}, "
                f"got {value!r}"
            )
        return value

    original = number("original_max_position_embeddings", original)
    fields["rope_original_max_position_embeddings"] = int(original)
    factor = rope.get("factor")
    if factor is None and rope_type == "yarn":  # transformers infers it from the two lengths
        factor = hf_config.get("max_position_embeddings", original) / original
    fields["rope_factor"] = float(number("factor", factor))
    if rope_type == "llama3":
        for key in ("low_freq_factor", "high_freq_factor"):
            fields[f"rope_{key}"] = float(number(key, rope.get(key)))
        return fields

    # transformers treats a null or zero beta as its default ("or 32", "or 1").
    fields["rope_beta_fast"] = float(rope.get("beta_fast") or 32.0)
    fields["rope_beta_slow"] = float(rope.get("beta_slow") or 1.0)
    fields["rope_truncate"] = bool(rope.get("truncate", True))
    attention = rope.get("attention_factor")
    mscale, mscale_all_dim = rope.get("mscale"), rope.get("mscale_all_dim")
    if attention is None and mscale and mscale_all_dim:
        # DeepSeek-style: the ratio of two mscales; folded into an explicit attention factor.
        def get_mscale(scale: float, m: float) -> float:
            return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

        attention = get_mscale(fields["rope_factor"], float(mscale)) / get_mscale(
            fields["rope_factor"], float(mscale_all_dim)
        )
    if attention is not None:
        fields["rope_attention_factor"] = float(number("attention_factor", attention))
    return fields


def _rope_to_hf(config: ModelConfig) -> tuple[dict[str, Any] | None, dict[str, Any]]:
    """`rope_scaling` (transformers 4.x; None for default RoPE) and `rope_parameters` (5.x)."""
    scaling: dict[str, Any] = {"rope_type": config.rope_type}
    defaults = {f.name: f.default for f in dataclasses.fields(ModelConfig)}
    for key, field in _ROPE_KEYS[config.rope_type].items():
        value = getattr(config, field)
        # YaRN's optional keys are written only when they differ from transformers' defaults
        # (the same as ours), so an export of a Hub config reads like the original.
        optional = config.rope_type == "yarn" and key not in _YARN_REQUIRED
        if value is not None and not (optional and value == defaults[field]):
            scaling[key] = value
    parameters = {"rope_theta": config.rope_theta, **scaling}
    return (None if config.rope_type == "default" else scaling), parameters


def _unsupported(source: str, field: str, value: Any, supported: str) -> ConfigError:
    return ConfigError(f"{source}: {field}={value!r} is not supported; {supported}")


def config_from_hf(hf_config: Mapping[str, Any], source: str = CONFIG_FILE) -> ModelConfig:
    """A `ModelConfig` from the parsed `config.json` of a Llama, Qwen2 or Qwen3 causal LM.

    `source` (the file's path) only names the file in error messages. Raises `ConfigError` for
    any architecture or feature `Transformer` does not implement.
    """
    model_type = hf_config.get("model_type")
    if model_type not in ARCHITECTURES:
        raise _unsupported(source, "model_type", model_type, f"jaxrl loads {SUPPORTED}")
    architectures = hf_config.get("architectures")
    expected = ARCHITECTURES[model_type]
    if architectures is not None and list(architectures) != [expected]:
        raise _unsupported(
            source,
            "architectures",
            architectures,
            f"a {model_type!r} checkpoint must be [{expected!r}] (a causal LM with an LM head)",
        )

    def get(field: str, default: Any = None) -> Any:
        value = hf_config.get(field, default)
        if value is None:
            raise ConfigError(f"{source}: {field}: missing; a {expected} config.json sets it")
        return value

    hidden_act = hf_config.get("hidden_act", "silu")
    if hidden_act not in ("silu", "swish"):
        raise _unsupported(source, "hidden_act", hidden_act, "jaxrl's MLP is SwiGLU ('silu')")
    if hf_config.get("mlp_bias", False):
        raise _unsupported(source, "mlp_bias", True, "jaxrl's MLP has no biases (mlp_bias false)")
    if model_type in ("llama", "qwen3"):
        # Llama's and Qwen3's attention_bias puts a bias on q, k, v AND the output projection;
        # jaxrl's attention has no output-projection bias.
        if hf_config.get("attention_bias", False):
            raise _unsupported(
                source,
                "attention_bias",
                True,
                f"{model_type}'s attention_bias adds an o_proj bias, which jaxrl does not "
                "implement (q/k/v biases alone are the 'qwen2' model_type)",
            )
        qkv_bias = False
    else:
        qkv_bias = True  # Qwen2 always has q/k/v biases and never an o_proj bias
    if model_type in ("qwen2", "qwen3"):
        sliding = _sliding_window_layers(hf_config)
        if sliding:
            raise _unsupported(
                source,
                "use_sliding_window",
                True,
                f"layers {sliding} would use sliding-window attention, which jaxrl does not "
                "implement; set use_sliding_window false (full attention in every layer)",
            )

    num_heads = int(get("num_attention_heads"))
    num_kv_heads = hf_config.get("num_key_value_heads")
    head_dim = hf_config.get("head_dim")
    if head_dim is None and model_type == "qwen3":
        head_dim = QWEN3_DEFAULT_HEAD_DIM
    if head_dim is not None and int(head_dim) * num_heads == hf_config.get("hidden_size"):
        head_dim = None  # the default; keeps configs from different sources equal
    try:
        return ModelConfig(
            vocab_size=int(get("vocab_size")),
            hidden_size=int(get("hidden_size")),
            intermediate_size=int(get("intermediate_size")),
            num_layers=int(get("num_hidden_layers")),
            num_heads=num_heads,
            num_kv_heads=num_heads if num_kv_heads is None else int(num_kv_heads),
            head_dim=None if head_dim is None else int(head_dim),
            max_position_embeddings=int(get("max_position_embeddings", 2048)),
            rms_norm_eps=float(get("rms_norm_eps", 1e-6)),
            tie_embeddings=bool(hf_config.get("tie_word_embeddings", False)),
            qkv_bias=qkv_bias,
            qk_norm=model_type == "qwen3",
            **_rope(hf_config, source),
        )
    except ConfigError as error:
        if str(error).startswith(source):
            raise
        raise ConfigError(f"{source}: {error}") from None


def _sliding_window_layers(hf_config: Mapping[str, Any]) -> list[int]:
    """Indices of the Qwen2 / Qwen3 layers that would use sliding-window attention."""
    layer_types = hf_config.get("layer_types")
    if layer_types is not None:  # transformers >= 5 spells it out per layer
        return [i for i, kind in enumerate(layer_types) if kind != "full_attention"]
    if not hf_config.get("use_sliding_window", False) or hf_config.get("sliding_window") is None:
        return []
    first = int(hf_config.get("max_window_layers", 0))
    return list(range(first, int(hf_config.get("num_hidden_layers", 0))))


def model_type_for(config: ModelConfig) -> str:
    """The Hugging Face model_type that computes what `config` does: 'qwen3' with q/k norms,
    'qwen2' with q/k/v biases, else 'llama'."""
    if config.qk_norm:
        return "qwen3"
    return "qwen2" if config.qkv_bias else "llama"


def config_to_hf(
    config: ModelConfig, model_type: str | None = None, dtype: str = "float32"
) -> dict[str, Any]:
    """The `config.json` contents `transformers` needs to rebuild `config` as `model_type`
    (None: `model_type_for(config)`)."""
    model_type = model_type_for(config) if model_type is None else model_type
    if model_type not in ARCHITECTURES:
        raise ConfigError(
            f"model_type: {model_type!r} is not supported; use one of "
            f"{', '.join(map(repr, ARCHITECTURES))}"
        )
    needed = model_type_for(config)
    if model_type != needed:
        # Each family computes exactly one of: plain attention, q/k/v biases, q/k norms.
        has = {"llama": "neither", "qwen2": "q/k/v biases", "qwen3": "q/k norms"}
        raise ConfigError(
            f"model_type: {model_type!r} has {has[model_type]} but the config has "
            f"qkv_bias={config.qkv_bias}, qk_norm={config.qk_norm}; export it as "
            f"model_type={needed!r}"
        )
    rope_scaling, rope_parameters = _rope_to_hf(config)
    hf = {
        "architectures": [ARCHITECTURES[model_type]],
        "model_type": model_type,
        "vocab_size": config.vocab_size,
        "hidden_size": config.hidden_size,
        "intermediate_size": config.intermediate_size,
        "num_hidden_layers": config.num_layers,
        "num_attention_heads": config.num_heads,
        "num_key_value_heads": config.num_kv_heads,
        "head_dim": config.dims_per_head,
        "hidden_act": "silu",
        "max_position_embeddings": config.max_position_embeddings,
        "rms_norm_eps": config.rms_norm_eps,
        # Both spellings, so that transformers 4.x (rope_theta, rope_scaling) and 5.x
        # (rope_parameters) agree.
        "rope_theta": config.rope_theta,
        "rope_scaling": rope_scaling,
        "rope_parameters": rope_parameters,
        "tie_word_embeddings": config.tie_embeddings,
        "attention_dropout": 0.0,
        "initializer_range": 0.02,
        "use_cache": True,
        "torch_dtype": dtype,
        "dtype": dtype,
    }
    if model_type == "llama":
        hf.update(attention_bias=False, mlp_bias=False, pretraining_tp=1)
    else:
        if model_type == "qwen3":
            hf.update(attention_bias=False)
        hf.update(
            use_sliding_window=False,
            sliding_window=None,
            max_window_layers=config.num_layers,
            layer_types=["full_attention"] * config.num_layers,
        )
    return hf


# --- the name / layout table ---------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Tensor:
    """One checkpoint tensor: its Hugging Face name and shape, and where it lives in our params.

    A `transpose`d tensor is a torch `[out, in]` matrix: ours is its transpose, reshaped."""

    hf_name: str
    path: tuple[str, ...]
    hf_shape: tuple[int, ...]
    shape: tuple[int, ...]
    transpose: bool

    def to_ours(self, array: np.ndarray, dtype: Any) -> np.ndarray:
        array = array.T if self.transpose else array
        return np.array(array.reshape(self.shape), dtype=dtype, order="C")  # always a copy

    def to_hf(self, array: np.ndarray) -> np.ndarray:
        if self.transpose:
            return np.ascontiguousarray(array.reshape(self.hf_shape[::-1]).T)
        return np.ascontiguousarray(array.reshape(self.hf_shape))


def _tensors(config: ModelConfig) -> list[_Tensor]:
    d, f, v = config.hidden_size, config.intermediate_size, config.vocab_size
    h, kv, k = config.num_heads, config.num_kv_heads, config.dims_per_head
    out = [_Tensor("model.embed_tokens.weight", ("embedding",), (v, d), (v, d), False)]
    if not config.tie_embeddings:
        out.append(_Tensor("lm_head.weight", ("lm_head",), (v, d), (d, v), True))
    out.append(_Tensor("model.norm.weight", ("final_norm", "scale"), (d,), (d,), False))

    # One layer's tensors, named relative to the layer: (HF name, our path, HF shape, ours, T).
    layer = [
        ("input_layernorm.weight", ("input_norm", "scale"), (d,), (d,), False),
        ("post_attention_layernorm.weight", ("post_attention_norm", "scale"), (d,), (d,), False),
    ]
    for name, heads in (("q", h), ("k", kv), ("v", kv)):
        proj, kernel = f"self_attn.{name}_proj", ("attention", f"{name}_kernel")
        layer.append((f"{proj}.weight", kernel, (heads * k, d), (d, heads, k), True))
        if config.qkv_bias:
            bias = ("attention", f"{name}_bias")
            layer.append((f"{proj}.bias", bias, (heads * k,), (heads, k), False))
    if config.qk_norm:
        for name in ("q", "k"):
            norm = ("attention", f"{name}_norm", "scale")
            layer.append((f"self_attn.{name}_norm.weight", norm, (k,), (k,), False))
    layer += [
        ("self_attn.o_proj.weight", ("attention", "o_kernel"), (d, h * k), (h, k, d), True),
        ("mlp.gate_proj.weight", ("mlp", "gate_kernel"), (f, d), (d, f), True),
        ("mlp.up_proj.weight", ("mlp", "up_kernel"), (f, d), (d, f), True),
        ("mlp.down_proj.weight", ("mlp", "down_kernel"), (d, f), (f, d), True),
    ]
    for i in range(config.num_layers):
        for name, path, hf_shape, shape, transpose in layer:
            hf_name, our_path = f"model.layers.{i}.{name}", (f"layer_{i}", *path)
            out.append(_Tensor(hf_name, our_path, hf_shape, shape, transpose))
    return out


def _flatten(params: Mapping[str, Any], prefix: tuple[str, ...] = ()) -> Iterator[tuple]:
    for key, value in params.items():
        if isinstance(value, Mapping):
            yield from _flatten(value, (*prefix, key))
        else:
            yield (*prefix, key), value


def _set(tree: dict, path: tuple[str, ...], value: Any) -> None:
    for key in path[:-1]:
        tree = tree.setdefault(key, {})
    tree[path[-1]] = value


def _listing(names: list[str], limit: int = 20) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f", ... ({len(names) - limit} more)" if len(names) > limit else "")


def tensor_mismatches(
    missing: Sequence[str],
    unexpected: Sequence[str],
    wrong_shape: Sequence[str],
    duplicated: Sequence[str] = (),
) -> list[str]:
    """What is wrong with a checkpoint's tensors against the ones its config implies, one phrase
    per kind (shared by the safetensors and GGUF readers); empty when they match."""
    kinds = [
        ("missing tensors", missing),
        ("unexpected tensors", unexpected),
        ("tensors with the wrong shape", wrong_shape),
        ("tensors stored twice", duplicated),
    ]
    return [f"{kind}: {_listing(list(names))}" for kind, names in kinds if names]


# --- loading -------------------------------------------------------------------------------------


def _weight_files(directory: str) -> list[str]:
    single = os.path.join(directory, WEIGHTS_FILE)
    if os.path.isfile(single):
        return [single]
    index = os.path.join(directory, INDEX_FILE)
    if not os.path.isfile(index):
        raise FileNotFoundError(
            f"{directory}: no {WEIGHTS_FILE} or {INDEX_FILE}; a Hugging Face checkpoint saved with "
            "safe_serialization=True has one of them (PyTorch .bin weights are not read)"
        )
    with open(index) as f:
        weight_map = json.load(f).get("weight_map")
    if not isinstance(weight_map, Mapping) or not weight_map:
        raise ValueError(f"{index}: weight_map: missing or empty; expected {{tensor name: file}}")
    files = [os.path.join(directory, name) for name in sorted(set(weight_map.values()))]
    missing = [path for path in files if not os.path.isfile(path)]
    if missing:
        raise FileNotFoundError(
            f"{index}: names weight files that do not exist: {_listing(missing)}"
        )
    return files


def load_hf_checkpoint(
    directory: str | os.PathLike, dtype: str | None = None
) -> tuple[ModelConfig, dict]:
    """Reads a Llama / Qwen2 / Qwen3 checkpoint directory into `(ModelConfig, params)`.

    `params` is a nested dict of host NumPy arrays in `init_params`'s layout (place them with
    `jax.device_put(params, param_shardings(config, mesh))` to shard a large model). `dtype`
    ("float32", "bfloat16" or "float16") is the parameter dtype and the compute dtype the
    returned config asks for; None means float32, to which bf16/fp16 weights convert exactly.

    Raises FileNotFoundError for a missing file, `ConfigError` for an unsupported config.json and
    ValueError when the tensors do not match the config (missing, unexpected or wrong shape; all
    listed).
    """
    directory = os.fspath(directory)
    dtype = "float32" if dtype is None else dtype
    if dtype not in DTYPES:
        raise ConfigError(f"dtype: unknown dtype {dtype!r}; use one of {', '.join(DTYPES)}")
    config_path = os.path.join(directory, CONFIG_FILE)
    if not os.path.isfile(config_path):
        raise FileNotFoundError(
            f"{config_path}: no such file; pass the directory a Hugging Face model was saved to "
            "(it holds config.json and model.safetensors)"
        )
    with open(config_path) as f:
        hf_config = json.load(f)
    config = config_from_hf(hf_config, source=config_path)
    config = dataclasses.replace(config, dtype=dtype, param_dtype=dtype)
    numpy_dtype = _numpy_dtype(dtype)

    expected = {t.hf_name: t for t in _tensors(config)}
    safetensors = _safetensors()
    params: dict = {}
    seen: dict[str, str] = {}
    unexpected, wrong_shape, duplicated = [], [], []
    tied_head = None
    for path in _weight_files(directory):
        with safetensors.safe_open(path, framework="np") as f:
            for name in f.keys():  # noqa: SIM118 - safe_open is not a Mapping
                if name in seen:
                    duplicated.append(f"{name} (in {os.path.basename(seen[name])} and {path})")
                    continue
                seen[name] = path
                if name.endswith(IGNORED_SUFFIXES):
                    continue
                if name == "lm_head.weight" and config.tie_embeddings:
                    tied_head = f.get_tensor(name)  # must equal the embedding; checked below
                    continue
                spec = expected.get(name)
                if spec is None:
                    unexpected.append(name)
                    continue
                array = f.get_tensor(name)
                if tuple(array.shape) != spec.hf_shape:
                    wrong_shape.append(f"{name} {tuple(array.shape)} (expected {spec.hf_shape})")
                    continue
                _set(params, spec.path, spec.to_ours(array, numpy_dtype))

    missing = sorted(name for name in expected if name not in seen)
    problems = tensor_mismatches(missing, sorted(unexpected), wrong_shape, duplicated)
    if problems:
        raise ValueError(
            f"{directory}: the weights do not match {config_path} "
            f"({hf_config.get('model_type')}, {config.num_layers} layers): " + "; ".join(problems)
        )
    if tied_head is not None and not np.array_equal(
        tied_head.astype(np.float32), params["embedding"].astype(np.float32)
    ):
        raise ValueError(
            f"{directory}: lm_head.weight differs from model.embed_tokens.weight although "
            f"{config_path} sets tie_word_embeddings true; set it false to load both"
        )
    return config, stack_layers(params)


def _numpy_dtype(dtype: str) -> np.dtype:
    if dtype == "bfloat16":
        import ml_dtypes  # installed with jax

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(dtype)


# --- saving --------------------------------------------------------------------------------------


def save_hf_checkpoint(
    directory: str | os.PathLike,
    config: ModelConfig,
    params: Mapping[str, Any],
    model_type: str | None = None,
    extra_config: Mapping[str, Any] | None = None,
) -> None:
    """Writes `params` as a Hugging Face checkpoint: `config.json` and `model.safetensors`.

    `model_type` None picks the family that computes what `config` does (`model_type_for`).
    `transformers` loads the result with `AutoModelForCausalLM.from_pretrained(directory)`.
    Tensors keep the parameters' dtype (all must share one). `extra_config` entries (e.g.
    bos/eos/pad token ids) are added to config.json; they may not change the architecture fields.
    Each file is written to a temporary name and renamed, so a crash leaves no half-written file.
    """
    directory = os.fspath(directory)
    specs = _tensors(config)
    flat = {path: value for path, value in _flatten(unstack_layers(dict(params)))}
    expected_paths = {spec.path for spec in specs}
    missing = sorted("/".join(p) for p in expected_paths - flat.keys())
    extra = sorted("/".join(p) for p in flat.keys() - expected_paths)
    if missing or extra:
        problems = []
        if missing:
            problems.append(f"missing parameters: {_listing(missing)}")
        if extra:
            problems.append(f"unexpected parameters: {_listing(extra)}")
        raise ValueError("params do not match the config: " + "; ".join(problems))

    tensors, wrong_shape, dtypes = {}, [], set()
    for spec in specs:
        array = np.asarray(flat[spec.path])  # gathers a sharded jax.Array to the host
        if tuple(array.shape) != spec.shape:
            wrong_shape.append(
                f"{'/'.join(spec.path)} {tuple(array.shape)} (expected {spec.shape})"
            )
            continue
        dtypes.add(array.dtype.name)
        tensors[spec.hf_name] = spec.to_hf(array)
    if wrong_shape:
        raise ValueError(f"params with the wrong shape: {_listing(wrong_shape)}")
    if len(dtypes) != 1 or next(iter(dtypes)) not in DTYPES:
        raise ValueError(
            f"params have dtypes {sorted(dtypes)}; cast them all to one of {', '.join(DTYPES)}"
        )
    dtype = dtypes.pop()

    hf_config = config_to_hf(config, model_type, dtype)
    for key, value in (extra_config or {}).items():
        if key in hf_config and hf_config[key] != value:
            raise ConfigError(
                f"extra_config: {key}={value!r} contradicts the model's {key}={hf_config[key]!r}; "
                "architecture fields come from the ModelConfig"
            )
        hf_config[key] = value
    config_from_hf(hf_config, source="the config.json being written")  # must load back

    os.makedirs(directory, exist_ok=True)
    safetensors = _safetensors()
    _write_atomically(
        os.path.join(directory, WEIGHTS_FILE),
        lambda path: safetensors.numpy.save_file(tensors, path, metadata={"format": "pt"}),
    )

    def write_config(path: str) -> None:
        with open(path, "w") as f:
            json.dump(hf_config, f, indent=2, sort_keys=True)
            f.write("\n")

    _write_atomically(os.path.join(directory, CONFIG_FILE), write_config)


def _write_atomically(path: str, write) -> None:
    temporary = f"{path}.tmp-{os.getpid()}"
    try:
        write(temporary)
        os.chmod(temporary, 0o644)  # safetensors creates its files private (0600)
        os.replace(temporary, path)
    except BaseException:
        if os.path.exists(temporary):
            os.remove(temporary)
        raise
