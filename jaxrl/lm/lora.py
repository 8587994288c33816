"""Low-rank adapters (LoRA, Hu et al., 2021) for the decoder of `jaxrl.lm.model`, as pure functions.

A targeted weight W stays frozen; training learns two small factors A and B and the model runs with
the effective weight

    W' = W + scale * A @ B,        scale = alpha / rank,

where A maps W's input dimensions to `rank` features and B maps those to W's output dimensions
(for the attention output kernel [heads, head_dim, hidden], A is [heads, head_dim, rank] and B is
[rank, hidden]). B starts at zero, so a fresh adapter leaves the model unchanged.

The design is functional: the adapters are their own pytree, shaped like the parameter tree but
holding an `Adapter(a, b)` only where a target is, and `apply(params, adapters, scale)` returns
the effective parameters. The loss calls the unchanged model on them, so nothing in `model.py`
knows about LoRA, the gradient reaches only the adapters, and only they are in the optimizer state.
`merge` is the same sum cast back to the base's dtypes: what export, generation and a later run's
`init_from` read are plain parameters.

Why not qwix (Google's quantisation/LoRA library that Tunix uses): it adds the adapters by
intercepting `einsum`/`dot_general` inside the modules and recognising the weight operand as a
module parameter. Our model casts each kernel to the compute dtype before the matmul, which hides
it from that lookup under bf16 compute, and qwix puts the adapters inside the model's parameter
tree, where the optimizer, checkpoints and exports would have to filter them out again. The
functional form here is a few dozen lines and needs no model change.

Two costs of that form, against adapters applied to the activations (x @ W + scale * x @ A @ B):
the effective weights of the targets are materialised in each step, and so are their full-size
gradients (as intermediates of the backward pass, never in the optimizer state). And dropout
cannot act on each token's adapter input without a model change, so `dropout` here drops input
features of A (rows of A, rescaled by 1 / (1 - p)), one mask per adapter per optimizer step: the
same regulariser with the mask shared by every token of the batch instead of drawn per token.

Sharding: A carries the logical axis names of W's input dimensions and B those of W's output
dimensions (the rank dimension is replicated), so each adapter lives where its base weight does.
Mixed precision: the adapters are float32 master weights whatever the base's `param_dtype`;
`apply` forms the effective weights in float32 and the model casts them to its compute `dtype`,
so `dtype="bfloat16"` with `param_dtype="float32"` is bf16 compute over fp32 weights.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from jaxrl import sharding
from jaxrl.config import require
from jaxrl.lm.model import LAYERS

Array = jax.Array

# Hugging Face (PEFT) module names -> this model's parameter names.
HF_NAMES = {
    "q_proj": "q_kernel",
    "k_proj": "k_kernel",
    "v_proj": "v_kernel",
    "o_proj": "o_kernel",
    "gate_proj": "gate_kernel",
    "up_proj": "up_kernel",
    "down_proj": "down_kernel",
    "lm_head": "lm_head",
}
# How many leading dimensions of each weight are its input (contracted with the activations):
# the attention output kernel [heads, head_dim, hidden] takes two, every other weight one.
INPUT_DIMS = {
    "q_kernel": 1,
    "k_kernel": 1,
    "v_kernel": 1,
    "o_kernel": 2,
    "gate_kernel": 1,
    "up_kernel": 1,
    "down_kernel": 1,
    "lm_head": 1,
}
# Every linear map of the decoder blocks, as QLoRA recommends (the output head is opt-in).
DEFAULT_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")

_VALID = f"{', '.join(HF_NAMES)} (or this model's names {', '.join(INPUT_DIMS)})"


class Adapter(NamedTuple):
    """The two factors of one adapter: a [*input dims, rank], b [rank, *output dims]."""

    a: Array
    b: Array


def parameter_name(target: str) -> str:
    """The model's parameter name for a target given as an HF module name or as our own."""
    return HF_NAMES.get(target, target)


def validate(rank: int, alpha: float, dropout: float, targets: tuple[str, ...]) -> None:
    """Check LoRA settings as the `lora_*` fields of a Config; `rank` 0 means LoRA is off, and
    then the other fields must keep their defaults (a value set for nothing is a mistake)."""
    require(
        isinstance(rank, int) and rank >= 0,
        "lora_rank",
        f"must be an int >= 0, got {rank!r}",
        "use 0 (off) or the adapters' rank, e.g. 8",
    )
    for field, value, default in (
        ("lora_alpha", alpha, 0.0),
        ("lora_dropout", dropout, 0.0),
        ("lora_targets", tuple(targets), DEFAULT_TARGETS),
    ):
        require(
            rank > 0 or value == default,
            field,
            f"is set ({value!r}) but LoRA is off (lora_rank={rank})",
            f"set lora_rank > 0 to train adapters, or leave {field} at {default!r}",
        )
    require(
        isinstance(alpha, int | float) and math.isfinite(alpha) and alpha >= 0,
        "lora_alpha",
        f"must be a finite number >= 0, got {alpha!r}",
        "use 0 (alpha = rank, scale 1) or a positive scale numerator such as 16",
    )
    require(
        isinstance(dropout, int | float) and 0 <= dropout < 1,
        "lora_dropout",
        f"must lie in [0, 1), got {dropout!r}",
        "use 0 (off) or a drop probability such as 0.05",
    )
    require(
        rank == 0 or len(targets) > 0,
        "lora_targets",
        "is empty",
        f"name the weights to adapt, from {_VALID}",
    )
    for target in targets:
        require(
            isinstance(target, str) and parameter_name(target) in INPUT_DIMS,
            "lora_targets",
            f"unknown target {target!r}",
            f"use names from {_VALID}",
        )


@dataclasses.dataclass(frozen=True)
class LoraConfig:
    """Rank, alpha (0: alpha = rank), dropout on the adapter input and the weights to adapt."""

    rank: int
    alpha: float = 0.0
    dropout: float = 0.0
    targets: tuple[str, ...] = DEFAULT_TARGETS

    def __post_init__(self) -> None:
        object.__setattr__(self, "targets", tuple(self.targets))
        validate(self.rank, self.alpha, self.dropout, self.targets)
        require(self.rank > 0, "lora_rank", "is 0", "a LoraConfig needs a rank > 0")

    @property
    def scale(self) -> float:
        """alpha / rank, the factor on A @ B."""
        return (self.alpha or self.rank) / self.rank

    @property
    def parameter_names(self) -> frozenset[str]:
        """The model's names of the targeted weights."""
        return frozenset(parameter_name(t) for t in self.targets)


# --- which weights, where ------------------------------------------------------------------


def _targeted(tree: dict, names: frozenset[str], path: tuple[str, ...] = ()) -> list:
    """(path, leaf) for every leaf of a nested dict whose own name is in `names`."""
    found = []
    for key, value in tree.items():
        if isinstance(value, dict):
            found += _targeted(value, names, (*path, key))
        elif key in names:
            found.append(((*path, key), value))
    return found


def _set(tree: dict, path: tuple[str, ...], value: Any) -> None:
    for key in path[:-1]:
        tree = tree.setdefault(key, {})
    tree[path[-1]] = value


def _get(tree: dict, path: tuple[str, ...]) -> Any:
    for key in path:
        tree = tree[key]
    return tree


def check_targets(params: dict, config: LoraConfig) -> None:
    """Raise a ConfigError naming `lora_targets` if a target matches no parameter of `params`
    (say `lm_head` of a model with tied embeddings), listing the names this model does have.
    Only the tree's names are read: `model.param_axes(config)` serves as well as the arrays."""
    present = {path[-1] for path, _ in _targeted(params, frozenset(INPUT_DIMS))}
    valid = [hf for hf, ours in HF_NAMES.items() if ours in present]
    for target in config.targets:
        require(
            parameter_name(target) in present,
            "lora_targets",
            f"{target!r} names no parameter of this model",
            f"choose from {', '.join(valid)}",
        )


def _split(shape: tuple, path: tuple[str, ...]) -> tuple[tuple, tuple, tuple]:
    """A weight's dimensions (or axis names) as (stacked, inputs, outputs): the decoder's layers
    are stacked on a leading axis (`model.LAYERS`), which an adapter keeps, one per layer."""
    lead = 1 if path[0] == LAYERS else 0
    n = INPUT_DIMS[path[-1]]
    return shape[:lead], shape[lead : lead + n], shape[lead + n :]


def init_adapters(key: Array, params: dict, config: LoraConfig) -> dict:
    """Fresh float32 adapters for the targeted weights of `params`: A ~ N(0, 1 / fan_in) (so
    x @ A keeps x's scale), B = 0 (so the model starts exactly as the base)."""
    adapters: dict = {}
    for index, (path, weight) in enumerate(_targeted(params, config.parameter_names)):
        stacked, inputs, outputs = _split(weight.shape, path)
        std = 1.0 / math.sqrt(math.prod(inputs))
        shape = (*stacked, *inputs, config.rank)
        a = std * jax.random.normal(jax.random.fold_in(key, index), shape)
        b = jnp.zeros((*stacked, config.rank, *outputs), jnp.float32)
        _set(adapters, path, Adapter(a.astype(jnp.float32), b))
    return adapters


def adapter_axes(axes: dict, adapters: dict) -> dict:
    """Logical axis names of each adapter from its base weight's (`model.param_axes`): A gets
    the input axes, B the output axes, the rank axis none (replicated)."""
    result: dict = {}
    for path, _ in _adapters(adapters):
        base = _get(axes, path)
        stacked, inputs, outputs = _split(base, path)
        _set(result, path, Adapter((*stacked, *inputs, None), (*stacked, None, *outputs)))
    return result


def adapter_shardings(axes: dict, adapters: dict, mesh: Any, rules: Any = None) -> dict:
    """A NamedSharding per adapter factor on `mesh`, following its base weight's axes."""
    rules = sharding.RULES if rules is None else rules
    by_name = adapter_axes(axes, adapters)
    return jax.tree.map(
        lambda names: jax.sharding.NamedSharding(mesh, sharding.spec(names, rules)),
        by_name,
        is_leaf=lambda x: isinstance(x, tuple) and not isinstance(x, Adapter),
    )


def _adapters(adapters: dict, path: tuple[str, ...] = ()) -> list:
    """(path, Adapter) for every adapter of the tree."""
    found = []
    for key, value in adapters.items():
        if isinstance(value, Adapter):
            found.append(((*path, key), value))
        else:
            found += _adapters(value, (*path, key))
    return found


def num_adapter_params(adapters: dict) -> int:
    """How many numbers the adapters hold."""
    return sum(x.size for x in jax.tree.leaves(adapters))


# --- the effective weights -----------------------------------------------------------------


def delta(adapter: Adapter, input_dims: int) -> Array:
    """A @ B contracted over the rank: the weight-shaped low-rank update (float32), for a weight
    whose first `input_dims` dimensions are its input. Leading dimensions that A and B share
    beyond the weight's own (a runs axis) are kept, so states with a runs axis merge too."""
    a, b = adapter
    lead = a.ndim - input_dims - 1
    outputs = b.ndim - lead - 1
    letters = iter("abcdefghijklmnopqrstuvwxy")
    runs = "".join(next(letters) for _ in range(lead))
    ins = "".join(next(letters) for _ in range(input_dims))
    outs = "".join(next(letters) for _ in range(outputs))
    spec = f"{runs}{ins}z,{runs}z{outs}->{runs}{ins}{outs}"
    # Full fp32 precision: accelerators would otherwise round this matmul (TF32 or bf16 passes)
    # and the merged weights would drift from the ones trained.
    return jnp.einsum(
        spec, a.astype(jnp.float32), b.astype(jnp.float32), precision=jax.lax.Precision.HIGHEST
    )


def apply(params: dict, adapters: dict, scale: float) -> dict:
    """The effective parameters W + scale * A @ B for every adapted weight, in float32 (the
    model casts them to its compute dtype); other parameters are returned as they are."""
    result = jax.tree.map(lambda x: x, params)  # a new tree: `params` is not modified
    for path, adapter in _adapters(adapters):
        weight = _get(params, path).astype(jnp.float32)
        _set(result, path, weight + scale * delta(adapter, INPUT_DIMS[path[-1]]))
    return result


def merge(params: dict, adapters: dict, config: LoraConfig | float, dtype: Any = None) -> dict:
    """Plain parameters with the adapters folded in, each in its base weight's dtype (then cast
    to `dtype`, if given: a sampler's compute dtype, the layers' 16-bit weights then held as
    `PackedWeight`s, which the model reads as plain ones): what export, generation and a later run's
    `init_from` read. `config` is the LoraConfig (or its scale).

    The stacked decoder layers' weights are merged one layer at a time (`lax.map`), so only one
    layer's fp32 A @ B exists at once: for a 7B model, merging every layer at once held 25 GiB
    of fp32 updates next to the merged copy."""
    scale = config if isinstance(config, int | float) else config.scale
    result = jax.tree.map(lambda x: x if dtype is None else _cast(x, dtype), params)
    for path, adapter in _adapters(adapters):
        weight = _get(params, path)
        out = weight.dtype if dtype is None else jnp.dtype(dtype)
        if path[0] == LAYERS:

            def one_layer(layer: tuple, path=path, weight=weight, out=out) -> Array:
                merged = LoraWeight(*layer, scale, INPUT_DIMS[path[-1]]).materialize()
                return _as_bits(merged.astype(weight.dtype).astype(out))

            merged = jax.lax.map(one_layer, (weight, *adapter))
            if merged.dtype == jnp.uint16:
                # For a sampler (dtype given) kept as bits until the model reads a layer.
                bits = jax.lax.bitcast_convert_type
                merged = PackedWeight(merged, out.name) if dtype else bits(merged, out)
        else:
            merged = LoraWeight(weight, *adapter, scale, INPUT_DIMS[path[-1]]).materialize()
            merged = merged.astype(weight.dtype).astype(out)
        _set(result, path, merged)
    return result


def _as_bits(x: Array) -> Array:
    # 16-bit floats are stacked as their bits: XLA:CPU has no bf16 dynamic-update-slice, and
    # stacking the merged layers in bf16 converted the whole stack to fp32 on every layer.
    return jax.lax.bitcast_convert_type(x, jnp.uint16) if x.dtype.itemsize == 2 else x


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class PackedWeight:
    """Stacked 16-bit weights held as their bits (uint16) and read as `dtype` one layer at a
    time (`materialize`, called by `model._param` inside the layer scan). XLA:CPU has no bf16
    dynamic-slice: slicing a layer out of bf16 stacked weights converted the whole stack to
    fp32, and XLA hoisted that conversion out of the decoding loop, so a bf16 generation copy
    of a 7B model also held a 25 GiB fp32 one."""

    bits: Array
    dtype: str = dataclasses.field(metadata=dict(static=True))

    @property
    def shape(self) -> tuple[int, ...]:
        return self.bits.shape

    def materialize(self) -> Array:
        return jax.lax.bitcast_convert_type(self.bits, jnp.dtype(self.dtype))


def _cast(x: Array, dtype: Any) -> Array:
    return x.astype(dtype) if jnp.issubdtype(x.dtype, jnp.floating) else x


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class LoraWeight:
    """A targeted weight with its adapter, merged only where the model reads it
    (`materialize`, called by `model._param`): inside the decoder's layer scan each layer's
    slice is merged on its own, and the backward pass recomputes that merge rather than keeping
    it. Merging every layer before the model (`apply`) made the effective weights of all layers
    and their full-size gradients exist at once (for a 7B model, 25 GiB each in fp32)."""

    weight: Array  # the frozen base
    a: Array
    b: Array
    scale: float = dataclasses.field(metadata=dict(static=True))
    input_dims: int = dataclasses.field(metadata=dict(static=True))

    @property
    def shape(self) -> tuple[int, ...]:
        return self.weight.shape

    def materialize(self) -> Array:
        """W + scale * A @ B in float32, exactly as `apply` forms it."""
        update = delta(Adapter(self.a, self.b), self.input_dims)
        return self.weight.astype(jnp.float32) + self.scale * update


def attach(params: dict, adapters: dict, scale: float) -> dict:
    """The parameters the model trains LoRA with: each adapted weight of the stacked decoder
    layers becomes a `LoraWeight` (base and adapter, merged per layer inside the model's layer
    scan); an adapted weight outside the layers (`lm_head`) is merged here as `apply` does. The
    model's outputs and the adapters' gradients are `apply`'s."""
    result = jax.tree.map(lambda x: x, params)
    for path, adapter in _adapters(adapters):
        weight = _get(params, path)
        lazy = LoraWeight(weight, *adapter, scale, INPUT_DIMS[path[-1]])
        _set(result, path, lazy if path[0] == LAYERS else lazy.materialize())
    return result


def drop_inputs(adapters: dict, key: Array, rate: float) -> dict:
    """Dropout on each adapter's input features: rows of A zeroed with probability `rate` and
    the rest scaled by 1 / (1 - rate), one mask per adapter (see the module docstring)."""
    if rate == 0:
        return adapters
    result: dict = {}
    for index, (path, (a, b)) in enumerate(_adapters(adapters)):
        keep = jax.random.bernoulli(jax.random.fold_in(key, index), 1.0 - rate, (*a.shape[:-1], 1))
        _set(result, path, Adapter(jnp.where(keep, a / (1.0 - rate), 0.0), b))
    return result
