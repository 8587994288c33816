"""The decoder's architecture as a config (`ModelConfig`: the fields of a Llama / Qwen2 / Qwen3
config.json, validated), with the names of what its fields choose among: rotary-embedding variants
(`ROPE_TYPES`) and what each layer keeps for the backward pass (`REMAT_POLICIES`). The model
that reads it is `jaxrl.lm.model`."""

from __future__ import annotations

import dataclasses

import jax

from jaxrl.config import is_finite_number, require, require_positive

ROPE_TYPES = ("default", "llama3", "yarn")
ATTENTION_IMPLEMENTATIONS = ("auto", "xla", "cudnn")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """The transformer's architecture and dtypes (the fields of a Llama / Qwen2 / Qwen3
    config.json).

    RoPE scaling is spelled out as flat `rope_*` fields (not a nested dict) so that the config
    stays hashable and builds from a flat ml_collections section. Which of them apply depends on
    `rope_type`; the others must keep their defaults, so that a field set by mistake is an error
    rather than silently ignored.
    """

    vocab_size: int
    hidden_size: int  # width of the residual stream ("embed")
    intermediate_size: int  # hidden width of the SwiGLU MLP ("mlp")
    num_layers: int
    num_heads: int  # query heads
    num_kv_heads: int  # key/value heads, shared by num_heads // num_kv_heads query heads each
    head_dim: int | None = None  # None: hidden_size // num_heads
    max_position_embeddings: int = 2048  # longest sequence the model is meant for (not enforced)
    rope_theta: float = 10_000.0  # base of the rotary embedding's frequencies
    rms_norm_eps: float = 1e-6
    tie_embeddings: bool = False  # the output projection reuses the embedding table
    qkv_bias: bool = False  # Qwen2 has biases on q, k and v (not on the output projection)
    dtype: str = "float32"  # compute dtype of the matmuls; norms, softmax and logits stay fp32
    param_dtype: str = "float32"  # storage dtype of the parameters
    # What each layer keeps for the backward pass (REMAT_POLICIES): "none" keeps everything,
    # "save_dots" the matmul outputs, "full" only the layer's input, recomputing the rest.
    # True and False (the older boolean field) mean "full" and "none".
    remat: str = "none"
    # (Newer families; after the original fields so positional construction keeps working.)
    qk_norm: bool = False  # Qwen3 RMS-normalises each query and key head before the rotation
    # Frequency scaling of the rotary embedding: "default" (none), "llama3" (Llama 3.1+) or
    # "yarn" (Qwen2.5 / Qwen3 long context), with the parameters of Hugging Face's rope_scaling.
    rope_type: str = "default"
    rope_factor: float = 1.0  # llama3, yarn: how many times longer than the original context
    rope_original_max_position_embeddings: int | None = None  # llama3, yarn: pretraining length
    rope_low_freq_factor: float = 1.0  # llama3: wavelengths > original/low are divided by factor
    rope_high_freq_factor: float = 4.0  # llama3: wavelengths < original/high are kept
    rope_beta_fast: float = 32.0  # yarn: rotations bounding the extrapolated (kept) band
    rope_beta_slow: float = 1.0  # yarn: rotations bounding the interpolated (scaled) band
    rope_truncate: bool = True  # yarn: round the band edges outwards to whole dimensions
    rope_attention_factor: float | None = None  # yarn: cos/sin scale; None: 0.1 ln(factor) + 1
    # The attention of a pass without a cache (training, scoring): "cudnn" (cuDNN's fused
    # attention, GPU and 16-bit compute only), "xla" (XLA's, which writes each layer's scores
    # to memory), or "auto": cuDNN where it runs (`jaxrl.lm.model.packed_attention`).
    attention: str = "auto"
    # Layers per iteration of the layer scan in a decode step (one new token per row against a
    # cache): num_layers unrolls the step whole, so that each layer's weights are a fixed slice
    # of the stack, taken once per rollout rather than copied out in every layer of every step;
    # 0 ("auto"): num_layers on a GPU, 1 elsewhere (`jaxrl.lm.model.decode_unroll`).
    decode_unroll: int = 0

    def __post_init__(self) -> None:
        # The older boolean field, as Python or as a command-line string.
        legacy = {"true": "full", "false": "none"}
        if isinstance(self.remat, bool):
            object.__setattr__(self, "remat", "full" if self.remat else "none")
        elif isinstance(self.remat, str) and self.remat.lower() in legacy:
            object.__setattr__(self, "remat", legacy[self.remat.lower()])
        require(
            self.remat in REMAT_POLICIES,
            "remat",
            f"unknown policy {self.remat!r}",
            f"use one of {', '.join(REMAT_POLICIES)}",
        )
        require_positive(
            self,
            "vocab_size",
            "hidden_size",
            "intermediate_size",
            "num_layers",
            "num_heads",
            "num_kv_heads",
            "max_position_embeddings",
        )
        require(
            isinstance(self.decode_unroll, int)
            and 0 <= self.decode_unroll <= max(self.num_layers, 1),
            "decode_unroll",
            f"got {self.decode_unroll!r}",
            f"use 0 (auto), 1 (a scan over the layers) or up to num_layers = {self.num_layers}",
        )
        require(
            self.num_heads % self.num_kv_heads == 0,
            "num_kv_heads",
            f"{self.num_kv_heads} does not divide num_heads={self.num_heads}",
            "grouped-query attention shares each key/value head among num_heads/num_kv_heads "
            "query heads; choose num_kv_heads dividing num_heads",
        )
        if self.head_dim is None:
            require(
                self.hidden_size % self.num_heads == 0,
                "hidden_size",
                f"{self.hidden_size} is not divisible by num_heads={self.num_heads}",
                "set head_dim explicitly or choose hidden_size = num_heads * head_dim",
            )
        require(
            self.dims_per_head % 2 == 0,
            "head_dim",
            "must be even for rotary",
            "use an even head_dim",
        )
        self._validate_rope()
        require(
            self.attention in ATTENTION_IMPLEMENTATIONS,
            "attention",
            f"unknown implementation {self.attention!r}",
            f"use one of {', '.join(ATTENTION_IMPLEMENTATIONS)}",
        )
        for field in ("dtype", "param_dtype"):
            value = getattr(self, field)
            require(
                value in ("float32", "bfloat16", "float16"),
                field,
                f"unknown dtype {value!r}",
                "use float32, bfloat16 or float16",
            )

    def _validate_rope(self) -> None:
        require(
            self.rope_type in ROPE_TYPES,
            "rope_type",
            f"unknown rope_type {self.rope_type!r}",
            f"use one of {', '.join(ROPE_TYPES)}",
        )
        require_positive(self, "rope_theta")
        # Each variant's own fields; every other rope_* field must keep its default.
        used = {
            "default": (),
            "llama3": (
                "rope_factor",
                "rope_original_max_position_embeddings",
                "rope_low_freq_factor",
                "rope_high_freq_factor",
            ),
            "yarn": (
                "rope_factor",
                "rope_original_max_position_embeddings",
                "rope_beta_fast",
                "rope_beta_slow",
                "rope_truncate",
                "rope_attention_factor",
            ),
        }[self.rope_type]
        for field in dataclasses.fields(self):
            if field.name.startswith("rope_") and field.name not in (
                *used,
                "rope_type",
                "rope_theta",
            ):
                require(
                    getattr(self, field.name) == field.default,
                    field.name,
                    f"is not used by rope_type {self.rope_type!r}",
                    f"leave it at its default ({field.default!r}) or choose the rope_type that "
                    "uses it",
                )
        if self.rope_type == "default":
            return
        original = self.rope_original_max_position_embeddings
        require(
            isinstance(original, int) and original > 0,
            "rope_original_max_position_embeddings",
            f"must be a positive int for rope_type {self.rope_type!r}, got {original!r}",
            "give the context length the model was pretrained with",
        )
        require_positive(self, "rope_factor")
        if self.rope_type == "llama3":
            require_positive(self, "rope_low_freq_factor", "rope_high_freq_factor")
            require(
                self.rope_high_freq_factor > self.rope_low_freq_factor,
                "rope_high_freq_factor",
                f"({self.rope_high_freq_factor}) must exceed rope_low_freq_factor "
                f"({self.rope_low_freq_factor})",
                "the band between them is interpolated; Llama 3.1 uses 4.0 and 1.0",
            )
        else:
            require_positive(self, "rope_beta_fast", "rope_beta_slow")
            attention = self.rope_attention_factor
            require(
                attention is None or (is_finite_number(attention) and attention > 0),
                "rope_attention_factor",
                f"must be None or a positive number, got {attention!r}",
                "leave it None for YaRN's 0.1 * ln(rope_factor) + 1",
            )

    @property
    def dims_per_head(self) -> int:
        """Features per attention head: head_dim, or hidden_size // num_heads when unset."""
        return self.head_dim if self.head_dim is not None else self.hidden_size // self.num_heads

    def num_params(self) -> int:
        """Number of parameters the model has (embeddings, layers and final norm)."""
        d, h, kv, hd = self.hidden_size, self.num_heads, self.num_kv_heads, self.dims_per_head
        attention = d * h * hd * 2 + d * kv * hd * 2
        if self.qkv_bias:
            attention += h * hd + 2 * kv * hd
        if self.qk_norm:
            attention += 2 * hd
        mlp = 3 * d * self.intermediate_size
        per_layer = attention + mlp + 2 * d
        embeddings = self.vocab_size * d * (1 if self.tie_embeddings else 2)
        return self.num_layers * per_layer + embeddings + d

    def flops_per_token(self, context_length: int) -> float:
        """Forward-pass FLOPs per token: 2 per weight use plus attention score/value matmuls."""
        d, h, kv, hd = self.hidden_size, self.num_heads, self.num_kv_heads, self.dims_per_head
        matmul_params = self.num_layers * (d * h * hd * 2 + d * kv * hd * 2)
        matmul_params += self.num_layers * 3 * d * self.intermediate_size + self.vocab_size * d
        attention = self.num_layers * 2 * 2 * h * hd * context_length
        return 2.0 * matmul_params + attention


# What "none" keeps of each layer for the backward pass (`jaxrl.lm.model` names them with
# `_saved`): every value a matmul's or attention's gradient reads that a matmul made -- the
# rotated queries and keys, the values, the attention output, the residual stream after attention
# and the MLP's two projections -- and, as every remat does, the layer's input. No matmul is
# recomputed; only the elementwise work between them is (the norms from the residual stream, SiLU
# and its product, the rotation, the weights' casts to the compute dtype). Keeping everything
# instead stored each norm's fp32 copy of its input, SiLU's intermediates, bf16 copies of every
# weight and, on XLA:CPU, fp32 copies of the MLP activations: the 135M GRPO update planned
# 21.5 GiB of temporaries against 5.9 GiB (`experiments/benchmarks/memory_plan.py`).
SAVED_NAMES = (
    "query",
    "key",
    "value",
    "attention_out",
    "after_attention",
    "mlp_gate",
    "mlp_up",
)

REMAT_POLICIES = {
    # What each layer keeps for the backward pass; the rest is recomputed there.
    "none": jax.checkpoint_policies.save_only_these_names(*SAVED_NAMES),  # no matmul recomputed
    "save_dots": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,  # the matmul outputs
    "full": jax.checkpoint_policies.nothing_saveable,  # only each layer's input
}
