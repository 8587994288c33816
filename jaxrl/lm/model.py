"""A decoder-only transformer of the Llama / Qwen2 / Qwen3 family, in Flax.

RMSNorm, rotary position embeddings, grouped-query attention and a SwiGLU MLP, with tied or untied
embeddings, (Qwen2) biases on the query/key/value projections, (Qwen3) RMSNorm of each query/key
head before the rotation, and the long-context RoPE variants of Llama 3.1+ ("llama3") and Qwen
("yarn"). Every parameter carries logical axis names ("vocab", "embed", "heads", "kv_heads", "kv",
"mlp") and the main activations are constrained with "act_*" names; `jaxrl/sharding.py` maps both
to a device mesh by rules, so the same model runs data-parallel, FSDP, tensor-parallel or any mix
by changing only the mesh shape.

One call signature serves training, scoring and generation:

    logits, cache = model.apply({"params": params}, tokens, positions, token_mask, cache)

With `cache=None` the sequence attends to itself (causal, padding masked). With a cache (see
`init_cache`), the new tokens are written into it at `cache["index"]` and attend to everything
written so far; prefill and single-token decoding are the same code path.

The architecture it is built from, `ModelConfig`, and the remat policies its `remat` field names
live in `jaxrl.lm.model_config` (and are importable from here too).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax.ad_checkpoint import checkpoint_name

from jaxrl import sharding
from jaxrl.config import ConfigError, require
from jaxrl.lm.model_config import REMAT_POLICIES, ModelConfig

Array = jax.Array
Cache = dict[str, Array]
Rules = Sequence[tuple[str, Any]]


# --- small pieces -------------------------------------------------------------------------------


def _constrain(x: Array, axes: tuple[str | None, ...], mesh: Any, rules: Rules | None) -> Array:
    """Pin an activation's sharding by logical names; a no-op when no mesh is given. Without
    explicit rules, the library's (`jaxrl.sharding.RULES`) apply."""
    if mesh is None:
        return x
    rules = sharding.RULES if rules is None else rules
    return nn.with_logical_constraint(x, axes, rules=rules, mesh=mesh)


def _param(module: nn.Module, name: str, shape: tuple[int, ...], axes, init, dtype) -> Array:
    value = module.param(name, nn.with_logical_partitioning(init, axes), shape, dtype)
    # A weight given with its LoRA adapter (`jaxrl.lm.lora.LoraWeight`) is merged here, inside
    # the layer scan, one layer at a time.
    return value.materialize() if hasattr(value, "materialize") else value


class RMSNorm(nn.Module):
    """Root-mean-square normalisation over the last axis (in fp32) with a learned scale."""

    eps: float
    param_dtype: Any
    axis_name: str = "embed"  # logical name of the normalised axis ("kv" for Qwen3's per-head)

    @nn.compact
    def __call__(self, x: Array) -> Array:
        scale = _param(
            self, "scale", (x.shape[-1],), (self.axis_name,), nn.initializers.ones, self.param_dtype
        )
        x32 = x.astype(jnp.float32)
        normed = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
        # Llama casts back to the activation dtype before scaling; keep that order for parity.
        return scale.astype(x.dtype) * normed.astype(x.dtype)


def rope_frequencies(config: ModelConfig) -> tuple[np.ndarray, float]:
    """The rotary embedding's inverse frequencies (float32 [head_dim / 2]) and the factor its cos
    and sin are multiplied by, for `config.rope_type`.

    Computed on the host with transformers' formulas and float32 steps (modeling_rope_utils.py:
    `_compute_llama3_parameters`, `_compute_yarn_parameters`), so that the frequency bands fall
    exactly where Hugging Face's do: a dimension on the wrong side of a band edge would change the
    logits.
    """
    dim = config.dims_per_head
    base = float(config.rope_theta)
    exponents = np.arange(0, dim, 2, dtype=np.int64).astype(np.float32) / np.float32(dim)
    powers = np.float32(base) ** exponents  # float32 throughout, as torch computes it
    inverse = np.float32(1.0) / powers
    if config.rope_type == "default":
        return inverse, 1.0
    factor = np.float32(config.rope_factor)
    original = config.rope_original_max_position_embeddings
    if config.rope_type == "llama3":
        # Long wavelengths (low frequencies) are slowed down by `factor`, short ones kept, and the
        # band between original/low_freq_factor and original/high_freq_factor interpolated.
        low, high = config.rope_low_freq_factor, config.rope_high_freq_factor
        wavelength = np.float32(2 * np.pi) / inverse
        scaled = np.where(wavelength > np.float32(original / low), inverse / factor, inverse)
        smooth = (np.float32(original) / wavelength - np.float32(low)) / np.float32(high - low)
        smoothed = (np.float32(1.0) - smooth) * scaled / factor + smooth * scaled
        medium = ~(wavelength < np.float32(original / high)) & ~(
            wavelength > np.float32(original / low)
        )
        return np.where(medium, smoothed, scaled).astype(np.float32), 1.0

    # YaRN: dimensions that turn fewer than beta_slow times over the original context are
    # interpolated (divided by factor), those turning more than beta_fast times are kept, with a
    # linear ramp between; cos/sin are scaled by the attention factor (0.1 ln(factor) + 1).
    def correction_dim(rotations: float) -> float:
        return (dim * math.log(original / (rotations * 2 * math.pi))) / (2 * math.log(base))

    low = correction_dim(config.rope_beta_fast)
    high = correction_dim(config.rope_beta_slow)
    if config.rope_truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # transformers' guard against a zero-width ramp
    ramp = (np.arange(dim // 2, dtype=np.float32) - np.float32(low)) / np.float32(high - low)
    extrapolation = np.float32(1.0) - np.clip(ramp, 0, 1).astype(np.float32)
    interpolated = np.float32(1.0) / (factor * powers)
    frequencies = interpolated * (np.float32(1.0) - extrapolation) + inverse * extrapolation
    attention = config.rope_attention_factor
    if attention is None:
        attention = 1.0 if config.rope_factor <= 1 else 0.1 * math.log(config.rope_factor) + 1.0
    return frequencies.astype(np.float32), float(attention)


def rotary_embedding(
    x: Array,
    positions: Array,
    theta: float,
    inverse_frequency: Any = None,
    scale: float = 1.0,
) -> Array:
    """Rotate the two halves of each head's features by position-dependent angles (the
    "rotate_half" convention Llama and Qwen checkpoints are trained with). x: [B, T, H, D].

    `inverse_frequency` ([D / 2], from `rope_frequencies`) overrides the default frequencies of
    base `theta`; `scale` multiplies cos and sin (YaRN's attention factor), as transformers does.
    """
    half = x.shape[-1] // 2
    if inverse_frequency is None:
        inverse_frequency = 1.0 / (
            theta ** (jnp.arange(0, half, dtype=jnp.float32) * 2 / x.shape[-1])
        )
    inverse_frequency = jnp.asarray(inverse_frequency, jnp.float32)
    angles = positions.astype(jnp.float32)[..., None] * inverse_frequency  # [B, T, half]
    cos = jnp.cos(angles)[:, :, None, :]
    sin = jnp.sin(angles)[:, :, None, :]
    if scale != 1.0:
        cos, sin = cos * scale, sin * scale
    x1, x2 = x[..., :half].astype(jnp.float32), x[..., half:].astype(jnp.float32)
    rotated = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
    return rotated.astype(x.dtype)


# --- attention and MLP -------------------------------------------------------------------------


class Attention(nn.Module):
    """Grouped-query self-attention with rotary positions, optionally over a KV cache.

    `__call__(x, positions, token_mask, key_mask, index, cache, layer) -> (y, cache)`: x and y
    are [B, T, hidden_size]. Without a cache (None) the T tokens attend causally to each other
    (`key_mask` is then `token_mask`), or, where `key_mask` is [B, T, T], query t to the keys
    key_mask[:, t] marks (`segment_attention`). With one, `cache` holds every layer's keys
    [layers, B, kv_heads, head_dim, S] and values [layers, B, kv_heads, S, head_dim]; this layer
    (`layer`, traced) writes its new keys and values into its own slice at slot `index` and
    attends to every slot `key_mask` marks. The update is a `dynamic_update_slice` of the whole
    cache carried through the layer scan and the decoding loop, which XLA performs in place: a
    decode step writes one slot per layer instead of rewriting the cache.
    """

    config: ModelConfig
    mesh: Any = None
    rules: Rules | None = None

    @nn.compact
    def __call__(
        self,
        x: Array,
        positions: Array,
        token_mask: Array,
        key_mask: Array,
        index: Array,
        cache: Cache | None,
        layer: Array,
    ) -> tuple[Array, Cache | None]:
        cfg = self.config
        dtype, param_dtype = jnp.dtype(cfg.dtype), jnp.dtype(cfg.param_dtype)
        d, h, kv, hd = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.dims_per_head
        init = nn.initializers.normal(0.02)

        def project(name: str, heads: int, head_axis: str) -> Array:
            kernel = _param(
                self,
                f"{name}_kernel",
                (d, heads, hd),
                ("embed", head_axis, "kv"),
                init,
                param_dtype,
            )
            y = jnp.einsum("btd,dhk->bthk", x, kernel.astype(dtype))
            if cfg.qkv_bias:
                bias = _param(
                    self,
                    f"{name}_bias",
                    (heads, hd),
                    (head_axis, "kv"),
                    nn.initializers.zeros,
                    param_dtype,
                )
                y = y + bias.astype(dtype)
            return _constrain(
                y, ("act_batch", "act_length", f"act_{head_axis}", None), self.mesh, self.rules
            )

        q, k = project("q", h, "heads"), project("k", kv, "kv_heads")
        if cfg.qk_norm:  # Qwen3: RMSNorm over each head's features, before the rotation
            q = RMSNorm(cfg.rms_norm_eps, param_dtype, axis_name="kv", name="q_norm")(q)
            k = RMSNorm(cfg.rms_norm_eps, param_dtype, axis_name="kv", name="k_norm")(k)
        frequencies, scale = rope_frequencies(cfg)
        q = _saved(rotary_embedding(q, positions, cfg.rope_theta, frequencies, scale), "query")
        k = _saved(rotary_embedding(k, positions, cfg.rope_theta, frequencies, scale), "key")
        v = _saved(project("v", kv, "kv_heads"), "value")

        length = x.shape[1]
        if cache is None:
            keys, values = k, v
            query_slots = jnp.arange(length)
        else:
            # Slot order is time order, so causality is key slot <= query slot. The cache holds
            # keys as [layers, B, kv_heads, D, S] and values as [layers, B, kv_heads, S, D]: the
            # layouts of the right-hand operands of a decode step's two attention products
            # (q . k over D, p . v over S), so neither is transposed; stored as [B, S, kv_heads,
            # D] both were, a copy of every layer's keys and values in each decode step.
            new_keys = k.astype(cache["k"].dtype).transpose(0, 2, 3, 1)[None]
            new_values = v.astype(cache["v"].dtype).transpose(0, 2, 1, 3)[None]
            cache = {
                "k": jax.lax.dynamic_update_slice(cache["k"], new_keys, (layer, 0, 0, 0, index)),
                "v": jax.lax.dynamic_update_slice(cache["v"], new_values, (layer, 0, 0, index, 0)),
            }
            keys, values = (
                jax.lax.dynamic_index_in_dim(cache[name], layer, keepdims=False)
                for name in ("k", "v")
            )
            query_slots = index + jnp.arange(length)
        if key_mask.ndim == 1:  # packed (`Transformer`): the first key_mask[b] tokens are real
            implementation = packed_attention(cfg)
            out = attend_packed(
                q, keys.astype(dtype), values.astype(dtype), key_mask, implementation
            )
        else:
            if key_mask.ndim == 3:  # the keys each query reads, given whole (`segment_attention`)
                allowed = key_mask
            else:
                key_slots = jnp.arange(key_mask.shape[1])
                allowed = (key_slots[None, :] <= query_slots[:, None])[None] & key_mask[:, None, :]
            if cache is not None and length == 1:
                out = attend_one(q, keys, values, allowed[:, 0])
            else:
                if cache is not None:  # back to [B, S, kv_heads, D]
                    keys, values = keys.transpose(0, 3, 1, 2), values.transpose(0, 2, 1, 3)
                out = attend(q, keys.astype(dtype), values.astype(dtype), allowed)
        out = _constrain(out, ("act_batch", "act_length", "act_heads", None), self.mesh, self.rules)
        out = _saved(out, "attention_out")

        o_kernel = _param(self, "o_kernel", (h, hd, d), ("heads", "kv", "embed"), init, param_dtype)
        y = jnp.einsum("bthk,hkd->btd", out, o_kernel.astype(dtype))
        return y, cache


@jax.checkpoint
def attend(q: Array, keys: Array, values: Array, allowed: Array) -> Array:
    """Softmax attention of q [B, T, heads, D] over keys and values [B, S, kv_heads, D] where
    `allowed` [B, T, S] is True, through `jax.nn.dot_product_attention` (grouped-query heads
    without copying the keys; scores and softmax in fp32).

    Checkpointed: the [B, heads, T, S] scores and probabilities are recomputed in the backward
    pass rather than kept for it. Stored for every layer they were most of a long sequence's
    training memory (1.7B shape, 32 x 384 tokens: 0.6 GB per layer in fp32), and recomputing
    them costs one more attention forward, a small part of a layer's FLOPs."""
    return jax.nn.dot_product_attention(q, keys, values, mask=allowed[:, None])


def decode_unroll(config: ModelConfig) -> int:
    """Layers per iteration of a decode step's layer scan (`ModelConfig.decode_unroll`).

    On a GPU a scanned step copies each layer's weights out of the stacked parameters in every
    layer of every step and its matmuls read the copies: 37% of the 1.7B shape's step at batch
    32 on an H200 (docs/speed.md, "Language models on one GPU"). Unrolled, the slices are the
    same in every step, and XLA moves them out of the decoding loop, taking them once (seen in
    XLA:CPU's optimised program; not yet measured on a GPU): one more copy of the weights during
    a rollout, and a compile that grows with depth (14.6 s against 4.6 for the 1.7B sampler on
    XLA:CPU). Off a GPU the scan stays ("auto")."""
    if config.decode_unroll:
        return config.decode_unroll  # at most num_layers (ModelConfig checks)
    return config.num_layers if jax.default_backend() == "gpu" else 1


def packed_attention(config: ModelConfig) -> str | None:
    """The `jax.nn.dot_product_attention` implementation that runs a pass without a cache on
    its tokens packed (`Transformer`: each row's real tokens first, in order, so that causal
    attention over their count is the padding mask), or None for the masked path (`attend`).

    Packing is for cuDNN's fused (flash) attention, which never writes the [heads, T, S]
    scores to memory but takes masks only as causal + sequence lengths. XLA's attention writes
    them: 16 GiB in fp32 per layer for 16 heads at 16,384 tokens, most of a long sequence's
    step time and memory on a GPU (docs/speed.md, "Language models on one GPU").
    `ModelConfig.attention` "auto" packs where cuDNN runs it: an NVIDIA GPU (Ampere or later),
    16-bit compute and a head width it takes (a multiple of 8, at most 128)."""
    choice = config.attention
    if choice == "auto":
        dims = config.dims_per_head
        fits = config.dtype in ("bfloat16", "float16") and dims % 8 == 0 and dims <= 128
        choice = "cudnn" if fits and _cudnn_runs_here() else "xla"
    return "cudnn" if choice == "cudnn" else None


def check_attention(config: ModelConfig) -> None:
    """`ModelConfig.attention` "cudnn" where cuDNN's fused attention cannot run here: one
    ConfigError line, before anything compiles ("auto" falls back to XLA's by itself)."""
    if config.attention != "cudnn":
        return
    require(
        config.dtype in ("bfloat16", "float16"),
        "attention",
        f"cudnn takes bfloat16 or float16 compute, got dtype={config.dtype}",
        "set dtype=bfloat16, or attention=auto",
    )
    require(
        _cudnn_runs_here(),
        "attention",
        f"cudnn needs an NVIDIA GPU of compute capability 8.0 or later; this runs on "
        f"{jax.devices()[0].device_kind}",
        "use auto (cuDNN wherever it runs) or xla",
    )


def _cudnn_runs_here() -> bool:
    """An NVIDIA GPU of compute capability 8.0 or later (cuDNN's fused attention's)."""
    device = jax.devices()[0]
    try:
        major = int(str(getattr(device, "compute_capability", "")).split(".")[0])
    except ValueError:  # a CPU, TPU or ROCm device
        return False
    return device.platform == "gpu" and major >= 8


def attend_packed(
    q: Array, keys: Array, values: Array, lengths: Array, implementation: str
) -> Array:
    """Causal attention of q [B, T, heads, D] over keys and values [B, T, kv_heads, D] whose
    first `lengths` [B] tokens are real and the rest padding: the same as `attend` with the
    causal padding mask at every real query; a padding query's output is 0 (a kernel may leave
    those rows unwritten). Not checkpointed: the fused kernel keeps O(T) statistics, not
    scores."""
    out = jax.nn.dot_product_attention(
        q,
        keys,
        values,
        is_causal=True,
        query_seq_lengths=lengths,
        key_value_seq_lengths=lengths,
        implementation=implementation,
    )
    real = jnp.arange(q.shape[1])[None, :] < lengths[:, None]
    return jnp.where(real[:, :, None, None], out, jnp.zeros((), out.dtype))


def attend_one(q: Array, keys: Array, values: Array, allowed: Array) -> Array:
    """One new token's attention during decoding: q [B, 1, heads, D] over the cache's keys
    [B, kv_heads, D, S] and values [B, kv_heads, S, D] where `allowed` [B, S] is True. The same
    softmax attention as `attend` (query head n reads kv head n // (heads / kv_heads); scores
    and softmax in fp32, the probabilities in the values' dtype for their product).

    Its own function for the one-query case because of what XLA:CPU made of
    `jax.nn.dot_product_attention` there: it transposed each layer's keys and values into the
    layout of its batched products, a copy of the whole cache per step, and ran the product with
    the values as a slow generic dot. Here the two products take the cache as it is stored, the
    layouts of their right-hand operands. Profiled on one core of the 2-core CPU (SmolLM2's
    shape, fp32, batch 32, 160 slots), a step's attention went from 38 to 21 ms and the step's
    op time from 129 to 107 ms."""
    batch, _, heads, dims = q.shape
    kv_heads = keys.shape[1]
    grouped = q.reshape(batch, kv_heads, heads // kv_heads, dims)
    f32 = jnp.float32
    scores = jnp.einsum("bkgd,bkds->bkgs", grouped, keys, preferred_element_type=f32)
    scores = scores * (1.0 / math.sqrt(dims))  # as jax.nn.dot_product_attention scales
    scores = jnp.where(allowed[:, None, None], scores, -0.7 * jnp.finfo(f32).max)
    probs = jax.nn.softmax(scores, axis=-1)  # [B, kv_heads, group, S]
    out = jnp.einsum(
        "bkgs,bksd->bkgd", probs.astype(values.dtype), values, preferred_element_type=f32
    )
    return out.reshape(batch, 1, heads, dims).astype(q.dtype)


class MLP(nn.Module):
    """The SwiGLU feed-forward block: down(silu(x @ gate) * (x @ up)), [B, T, hidden_size]."""

    config: ModelConfig
    mesh: Any = None
    rules: Rules | None = None

    @nn.compact
    def __call__(self, x: Array) -> Array:
        cfg = self.config
        dtype, param_dtype = jnp.dtype(cfg.dtype), jnp.dtype(cfg.param_dtype)
        d, f = cfg.hidden_size, cfg.intermediate_size
        init = nn.initializers.normal(0.02)
        gate = _param(self, "gate_kernel", (d, f), ("embed", "mlp"), init, param_dtype)
        up = _param(self, "up_kernel", (d, f), ("embed", "mlp"), init, param_dtype)
        down = _param(self, "down_kernel", (f, d), ("mlp", "embed"), init, param_dtype)
        # The matmuls see the tokens as one [B*T, ...] axis: with [B, T, ...] operands XLA:CPU
        # transposes the fused SiLU gradient into the weight-gradient dot's layout with a
        # strided copy, and the block's forward + backward takes 1.43 times as long (SmolLM2's
        # sizes, 8 x 64 tokens: 66 ms against 46 ms).
        tokens = x.reshape(-1, d)
        gated = _saved(tokens @ gate.astype(dtype), "mlp_gate")
        hidden = jax.nn.silu(gated) * _saved(tokens @ up.astype(dtype), "mlp_up")
        hidden = _constrain(
            hidden.reshape(*x.shape[:-1], f),
            ("act_batch", "act_length", "act_mlp"),
            self.mesh,
            self.rules,
        )
        return (hidden.reshape(-1, f) @ down.astype(dtype)).reshape(x.shape)


class DecoderLayer(nn.Module):
    """One pre-norm block, x + attention(norm(x)), then + mlp(norm(x)), as the body of the layer
    scan: `(x, cache, layer) -> ((x, cache, layer + 1), None)`, the rest broadcast to every
    layer."""

    config: ModelConfig
    mesh: Any = None
    rules: Rules | None = None

    @nn.compact
    def __call__(self, carry, positions, token_mask, key_mask, index):
        x, cache, layer = carry
        cfg = self.config
        param_dtype = jnp.dtype(cfg.param_dtype)
        attention_in = RMSNorm(cfg.rms_norm_eps, param_dtype, name="input_norm")(x)
        attended, cache = Attention(cfg, self.mesh, self.rules, name="attention")(
            attention_in, positions, token_mask, key_mask, index, cache, layer
        )
        x = _saved(x + attended, "after_attention")
        mlp_in = RMSNorm(cfg.rms_norm_eps, param_dtype, name="post_attention_norm")(x)
        x = x + MLP(cfg, self.mesh, self.rules, name="mlp")(mlp_in)
        x = _constrain(x, ("act_batch", "act_length", "act_embed"), self.mesh, self.rules)
        return (x, cache, layer + 1), None


def _saved(x: Array, name: str) -> Array:
    """Name an activation the "none" policy keeps for the backward pass (`SAVED_NAMES`).

    A 16-bit float is kept as its bits (uint16) and read back through `_from_bits`, whose
    tangent is x's: XLA:CPU has no bf16 dynamic-slice or dynamic-update-slice, and storing each
    layer's slice into the kept stack (or reading it back in the backward loop) converted the
    whole stack to fp32, a conversion XLA then hoisted out of the backward loop, holding every
    layer's kept activations in fp32 (twice the bytes). Integers are stored as they are."""
    if jnp.dtype(x.dtype).itemsize != 2 or not jnp.issubdtype(x.dtype, jnp.floating):
        return checkpoint_name(x, name)
    bits = checkpoint_name(jax.lax.bitcast_convert_type(x, jnp.uint16), name)
    return _from_bits(x, bits)


@jax.custom_jvp
def _from_bits(x: Array, bits: Array) -> Array:
    """x, computed from its bits alone (so only the bits need keeping); the tangent is x's."""
    return jax.lax.bitcast_convert_type(bits, x.dtype)


@_from_bits.defjvp
def _from_bits_jvp(primals: tuple[Array, Array], tangents: tuple[Array, Array]):
    x, bits = primals
    return _from_bits(x, bits), tangents[0]


class Transformer(nn.Module):
    """The language model. `__call__` returns fp32 logits [B, T, vocab] and the updated cache."""

    config: ModelConfig
    mesh: Any = None
    rules: Rules | None = None

    @nn.compact
    def __call__(
        self,
        tokens: Array,
        positions: Array | None = None,
        token_mask: Array | None = None,
        cache: Cache | None = None,
        logits_for_last: int = 0,
        logit_positions: Array | None = None,
        hidden_only: bool = False,
        segment_ids: Array | None = None,
    ) -> tuple[Array, Cache | None]:
        """Logits [B, T, vocab] and the cache updated with this call's keys and values. With
        `hidden_only`, the final-normalised hidden states [B, T, hidden_size] instead of logits,
        and no cache: what a reward or value head reads from whole sequences.

        The head can run on fewer positions, which is all a caller may read: the last
        `logits_for_last` ([B, logits_for_last, vocab]; a sampler's prefill, a completion's
        log-probs), or `logit_positions` [B, K] chosen per row ([B, K, vocab]; the answer of a
        preference pair). Over a real vocabulary the head and its log-softmax are a large part of
        a training step, and [B, T, vocab] fp32 logits of a long prompt are gigabytes.

        `segment_ids` [B, T] (no cache) packs sequences that share a prefix into one row: segment
        0 is the prefix, which every token may read; a token of segment s > 0 reads segment 0
        and its own segment's earlier tokens, never another's (`segment_attention`). The caller
        passes each token's `positions` (a segment's continue its prefix's)."""
        cfg = self.config
        dtype, param_dtype = jnp.dtype(cfg.dtype), jnp.dtype(cfg.param_dtype)
        if token_mask is None:
            token_mask = jnp.ones(tokens.shape, bool)
        if positions is None:
            positions = positions_from_mask(token_mask)

        embedding = _param(
            self,
            "embedding",
            (cfg.vocab_size, cfg.hidden_size),
            ("vocab", "embed"),
            nn.initializers.normal(0.02),
            param_dtype,
        )
        x = jnp.take(embedding, tokens, axis=0).astype(dtype)
        x = _constrain(x, ("act_batch", "act_length", "act_embed"), self.mesh, self.rules)

        layer_type = nn.remat(DecoderLayer, policy=REMAT_POLICIES[cfg.remat], prevent_cse=False)
        # The layers are one scan over parameters stacked on a leading "layers" axis, so the
        # program (and its compile time) is one layer's, whatever the depth. A decode step may
        # unroll it (`ModelConfig.decode_unroll`).
        decoding = cache is not None and tokens.shape[1] == 1
        layers = nn.scan(
            layer_type,
            variable_axes={"params": 0},
            split_rngs={"params": True},
            in_axes=(nn.broadcast,) * 4,
            length=cfg.num_layers,
            unroll=decode_unroll(cfg) if decoding else 1,
            metadata_params={nn.PARTITION_NAME: "layers"},
        )(cfg, self.mesh, self.rules, name="layers")
        if segment_ids is not None and cache is not None:
            raise ValueError("Transformer: segment_ids are for a call without a cache")
        order = None
        if cache is None:
            kv, key_mask, index = None, token_mask, jnp.zeros((), jnp.int32)
            if segment_ids is not None:
                key_mask = segment_attention(token_mask, segment_ids)
            elif packed_attention(cfg) is not None:
                # Each row's real tokens first, in their order (positions travel with them), so
                # that attention is causal over their count (`packed_attention`); every other
                # part of a layer works token by token. Unpacked after the last layer.
                order = jnp.argsort(~token_mask, axis=-1, stable=True)
                x = _constrain(
                    jnp.take_along_axis(x, order[..., None], axis=1),
                    ("act_batch", "act_length", "act_embed"),
                    self.mesh,
                    self.rules,
                )
                positions = jnp.take_along_axis(positions, order, axis=1)
                token_mask = jnp.take_along_axis(token_mask, order, axis=1)
                key_mask = jnp.sum(token_mask, axis=-1, dtype=jnp.int32)
        else:
            index = cache["index"]
            kv = {"k": cache["k"], "v": cache["v"]}
            key_mask = jax.lax.dynamic_update_slice(cache["mask"], token_mask, (0, index))
        (x, kv, _), _ = layers(
            (x, kv, jnp.zeros((), jnp.int32)), positions, token_mask, key_mask, index
        )
        if order is not None:
            x = jnp.take_along_axis(x, jnp.argsort(order, axis=-1)[..., None], axis=1)

        if logits_for_last and logit_positions is not None:
            raise ValueError("Transformer: pass logits_for_last or logit_positions, not both")
        if logits_for_last:
            x = x[:, -logits_for_last:]
        elif logit_positions is not None:
            x = jnp.take_along_axis(x, logit_positions[..., None], axis=1)
        x = RMSNorm(cfg.rms_norm_eps, param_dtype, name="final_norm")(x)
        if hidden_only:
            return x, None
        if cfg.tie_embeddings:
            logits = x @ embedding.astype(dtype).T
        else:
            head = _param(
                self,
                "lm_head",
                (cfg.hidden_size, cfg.vocab_size),
                ("embed", "vocab"),
                nn.initializers.normal(0.02),
                param_dtype,
            )
            logits = x @ head.astype(dtype)
        logits = _constrain(
            logits.astype(jnp.float32),
            ("act_batch", "act_length", "act_vocab"),
            self.mesh,
            self.rules,
        )

        new_cache = None
        if cache is not None:
            new_cache = {
                "k": kv["k"],
                "v": kv["v"],
                "mask": key_mask,
                "index": index + tokens.shape[1],
            }
        return logits, new_cache


# --- helpers ------------------------------------------------------------------------------------


def head_logits(config: ModelConfig, params: dict, hidden: Array) -> Array:
    """The LM head on final-normalised hidden states (`Transformer(hidden_only=True)`), fp32
    logits as `Transformer` computes them: for a caller that reads both the hidden states (a
    value head) and the logits of one forward pass."""
    dtype = jnp.dtype(config.dtype)
    weight = params["embedding"].T if config.tie_embeddings else params["lm_head"]
    return (hidden @ weight.astype(dtype)).astype(jnp.float32)


# Elements of fp32 logits ([rows, positions, vocab]) one chunk of `head_log_probs` may hold:
# 2^26 is 256 MiB, e.g. 32 rows x 42 positions over a 49,152-token vocabulary.
LOGITS_CHUNK_ELEMENTS = 1 << 26


class TokenStatistics(NamedTuple):
    """What a training loss reads of the policy's distribution before each completion token, all
    [B, T]: the token's log-prob, the distribution's entropy, and KL(uniform over the vocabulary
    || the distribution), which is -log(vocab) - the mean log-prob over the vocabulary (GRPO's
    log-barrier regulariser, `algos.grpo.uniform_kl_penalty`)."""

    log_probs: Array
    entropy: Array
    uniform_kl: Array


def token_statistics(logits: Array, tokens: Array, temperature: float) -> TokenStatistics:
    """`TokenStatistics` from the logits [..., vocab] before each of `tokens` [...], at the
    sampling temperature."""
    log_softmax = jax.nn.log_softmax(logits / temperature, axis=-1)
    picked = jnp.take_along_axis(log_softmax, tokens[..., None], axis=-1)[..., 0]
    entropy = -jnp.sum(jnp.exp(log_softmax) * log_softmax, axis=-1)
    uniform_kl = -math.log(logits.shape[-1]) - jnp.mean(log_softmax, axis=-1)
    return TokenStatistics(picked, entropy, uniform_kl)


def head_log_probs(
    config: ModelConfig,
    params: dict,
    hidden: Array,
    targets: Array,
    temperature: float = 1.0,
    chunk_elements: int = LOGITS_CHUNK_ELEMENTS,
) -> TokenStatistics:
    """log p(targets[:, t]) at `temperature` and the entropy and uniform KL of that distribution
    (`TokenStatistics`, each [B, T]), from final-normalised hidden states [B, T, hidden_size]
    (`Transformer(hidden_only=True)`) that predict `targets` [B, T].

    The head runs over chunks of positions in a scan whose body is checkpointed, so the fp32
    logits [B, T, vocab] never exist whole, neither in the forward pass nor as residuals kept
    for the backward pass (which recomputes one chunk's logits at a time). Over a real
    vocabulary those logits, their log-softmax and its gradient were gigabytes per micro-batch.
    """
    batch, length = targets.shape
    step = max(1, min(length, chunk_elements // max(1, batch * config.vocab_size)))
    chunks = -(-length // step)
    pad = chunks * step - length
    hidden = jnp.pad(hidden, ((0, 0), (0, pad), (0, 0)))
    targets = jnp.pad(targets, ((0, 0), (0, pad)))
    # [chunks, B, step, ...]: the scan runs over the leading axis.
    hidden = hidden.reshape(batch, chunks, step, -1).swapaxes(0, 1)
    targets = targets.reshape(batch, chunks, step).swapaxes(0, 1)

    @jax.checkpoint
    def one_chunk(h: Array, tokens: Array) -> TokenStatistics:
        return token_statistics(head_logits(config, params, h), tokens, temperature)

    _, chunked = jax.lax.scan(lambda carry, xs: (carry, one_chunk(*xs)), None, (hidden, targets))

    def unchunk(x: Array) -> Array:
        return x.swapaxes(0, 1).reshape(batch, chunks * step)[:, :length]

    return TokenStatistics(*map(unchunk, chunked))


def segment_attention(token_mask: Array, segment_ids: Array) -> Array:
    """[B, T] token mask and segment ids -> [B, T, T], which keys each query attends to:
    earlier or the same slot, a real token, and of segment 0 (the shared prefix) or the query's
    own segment. With every id 0 it is the causal, padding-masked attention of a plain call."""
    slots = jnp.arange(token_mask.shape[1])
    causal = slots[None, :] <= slots[:, None]
    shared = segment_ids[:, None, :] == 0
    same = segment_ids[:, None, :] == segment_ids[:, :, None]
    return causal[None] & token_mask[:, None, :] & (shared | same)


def positions_from_mask(token_mask: Array) -> Array:
    """Position ids that skip padding: a left-padded row's first real token gets position 0."""
    return jnp.maximum(jnp.cumsum(token_mask.astype(jnp.int32), axis=-1) - 1, 0)


def init_cache(config: ModelConfig, batch_size: int, max_length: int, dtype: Any = None) -> Cache:
    """An empty KV cache with room for `max_length` tokens per row."""
    dtype = jnp.dtype(dtype or config.dtype)
    layers, heads, dims = config.num_layers, config.num_kv_heads, config.dims_per_head
    return {  # keys [layers, B, kv_heads, D, S], values [layers, B, kv_heads, S, D] (Attention)
        "k": jnp.zeros((layers, batch_size, heads, dims, max_length), dtype),
        "v": jnp.zeros((layers, batch_size, heads, max_length, dims), dtype),
        "mask": jnp.zeros((batch_size, max_length), bool),
        "index": jnp.zeros((), jnp.int32),
    }


LAYERS = "layers"  # the stacked decoder layers' entry in the parameter tree


def stack_layers(params: dict) -> dict:
    """Parameters with per-layer entries `layer_0` ... `layer_{L-1}` (the layout checkpoint
    files and older jaxrl runs use) in this model's layout: one `layers` entry whose arrays are
    the layers' stacked on a leading axis. Parameters already stacked are returned as they are.
    Works on NumPy and JAX arrays alike (and on ShapeDtypeStructs' shapes via `jax.eval_shape`)."""
    count = sum(1 for name in params if name.startswith("layer_"))
    if count == 0:
        return params
    names = [f"layer_{i}" for i in range(count)]
    if set(names) != {name for name in params if name.startswith("layer_")}:
        raise ValueError(f"layers are not numbered 0..{count - 1}: {sorted(params)}")
    per_layer = [params[name] for name in names]
    stack = np.stack if isinstance(jax.tree.leaves(per_layer[0])[0], np.ndarray) else jnp.stack
    rest = {name: value for name, value in params.items() if not name.startswith("layer_")}
    return {**rest, LAYERS: jax.tree.map(lambda *xs: stack(xs), *per_layer)}


def unstack_layers(params: dict) -> dict:
    """The inverse of `stack_layers`: `layers` split into `layer_0` ... entries, the layout
    Hugging Face and GGUF files name tensor by tensor."""
    if LAYERS not in params:
        return params
    stacked = params[LAYERS]
    count = jax.tree.leaves(stacked)[0].shape[0]
    rest = {name: value for name, value in params.items() if name != LAYERS}
    for i in range(count):
        rest[f"layer_{i}"] = jax.tree.map(lambda x, i=i: x[i], stacked)
    return rest


def init_params(config: ModelConfig, key: Array) -> dict:
    """Random parameters (plain arrays; the logical axis names live in `param_axes`)."""
    model = Transformer(config)
    tokens = jnp.zeros((1, 1), jnp.int32)
    return nn.meta.unbox(model.init(key, tokens)["params"])


def param_axes(config: ModelConfig) -> dict:
    """The logical axis names of every parameter, as a pytree of tuples matching `init_params`."""
    model = Transformer(config)
    abstract = jax.eval_shape(model.init, jax.random.key(0), jnp.zeros((1, 1), jnp.int32))["params"]
    return jax.tree.map(
        lambda p: tuple(p.names), abstract, is_leaf=lambda p: isinstance(p, nn.LogicallyPartitioned)
    )


def token_log_probs(logits: Array, tokens: Array) -> Array:
    """log p(tokens[t] | tokens[<t]) for t >= 1, from logits of the same sequence; position 0 (no
    prediction) gets 0. Shapes: logits [B, T, V], tokens [B, T] -> [B, T]."""
    log_probs = jax.nn.log_softmax(logits[:, :-1].astype(jnp.float32), axis=-1)
    picked = jnp.take_along_axis(log_probs, tokens[:, 1:, None], axis=-1)[..., 0]
    return jnp.pad(picked, ((0, 0), (1, 0)))


def validate_tokens(tokens: Any, config: ModelConfig, field: str = "tokens") -> None:
    """Reject token ids the embedding table does not have, before anything compiles."""
    import numpy as np

    array = np.asarray(tokens)
    if array.size and (array.min() < 0 or array.max() >= config.vocab_size):
        raise ConfigError(
            f"{field}: ids must lie in [0, {config.vocab_size}), got range "
            f"[{array.min()}, {array.max()}]; use a tokenizer whose vocabulary matches the model's "
            "vocab_size"
        )


def param_shardings(config: ModelConfig, mesh: Any, rules: Rules | None = None) -> dict:
    """A NamedSharding per parameter on `mesh`; raises ConfigError naming the parameter whose
    dimension the mesh does not divide (before anything compiles)."""
    rules = sharding.RULES if rules is None else rules
    axes = param_axes(config)
    shapes = jax.eval_shape(lambda: init_params(config, jax.random.key(0)))
    sharding.check_divisible(shapes, axes, mesh, rules, what="params")
    return sharding.shardings(axes, mesh, rules)
