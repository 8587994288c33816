"""How much memory a language-model update needs per device, estimated from shapes before
anything compiles, and the one-line refusal of a run that cannot fit.

The estimate adds what one update holds at its peak:

- the state: parameters, AdamW's two moments (over the adapters only with LoRA), donated to
  the update, so its outputs reuse their buffers;
- the larger of its two phases, which never overlap:
  - the rollout (GRPO): the sampler's generation copy of the weights in the compute dtype (or
    of their per-layer slices, with the decode step unrolled), the KV cache of every completion
    (prompt + new tokens), the prefill's cache before a group's samples share it, and the fp32
    logits of one decode step;
  - the optimisation step: the gradients (and AdamW's update of them), the activations each
    layer keeps for the backward pass under `ModelConfig.remat` (`model_config.SAVED_NAMES` for
    "none"; the matmul outputs for "save_dots"; the layer's input for "full"), one layer's
    working set while its backward pass runs (with XLA's attention, `model.packed_attention`,
    at least its [heads, T, T] scores, their softmax and their gradient), and the head's chunk
    of fp32 logits (`model.LOGITS_CHUNK_ELEMENTS`).

With partial rollouts (`algos.partial`) the sampler's slots -- rollout_groups x group_size
rows of KV cache, next-token logits and generated tokens -- are part of the state, held through
the optimisation step too (`partial_slots`; for SmolLM2 at 8 x 8 slots of 128 + 256 tokens,
budget 64, XLA's plan of the arguments grows by 0.540 GiB, the estimate by 0.539).

Divided over a mesh (data, fsdp, tensor): parameters and optimizer state over fsdp x tensor,
activations and caches over the batch shards (data x fsdp), their per-head and MLP widths
over tensor.

Calibrated against XLA's own plan (`compiled.memory_analysis()`, XLA:CPU, compile-only;
`experiments/benchmarks/memory_plan.py`, tests/test_memory.py): GRPO at SmolLM2-135M and a
1.7B shape (4 prompts x 8 x (128 + 256) tokens) and a 7B Llama shape with LoRA rank 16 (2 x 8),
bf16 over fp32, no remat. XLA:CPU's plan of remat="save_dots" and "full" is not calibrated here
(the estimate then counts what the policy keeps, which is what a GPU plan follows).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import numpy as np

from jaxrl.config import ConfigError
from jaxrl.lm.lora import DEFAULT_TARGETS, INPUT_DIMS, parameter_name
from jaxrl.lm.model import LOGITS_CHUNK_ELEMENTS, ModelConfig, decode_unroll, packed_attention

GIB = 1 << 30


@dataclasses.dataclass(frozen=True)
class Estimate:
    """Bytes per device: `parts` by name, `state` (the update's donated input and output),
    `temporaries` (the peak of everything else) and `total`."""

    parts: dict[str, float]
    state: float
    temporaries: float

    @property
    def total(self) -> float:
        return self.state + self.temporaries

    def summary(self) -> str:
        """The largest parts in GiB, for an error message."""
        top = sorted(self.parts.items(), key=lambda kv: -kv[1])[:4]
        return ", ".join(f"{name} {value / GIB:.1f}" for name, value in top)


def _bytes(dtype: str) -> int:
    return np.dtype(dtype if dtype != "bfloat16" else np.float16).itemsize


def layer_weight_shapes(model: ModelConfig) -> dict[str, tuple[int, ...]]:
    """One decoder layer's matrices by parameter name."""
    d, h, kv, hd, f = (
        model.hidden_size,
        model.num_heads,
        model.num_kv_heads,
        model.dims_per_head,
        model.intermediate_size,
    )
    return {
        "q_kernel": (d, h, hd),
        "k_kernel": (d, kv, hd),
        "v_kernel": (d, kv, hd),
        "o_kernel": (h, hd, d),
        "gate_kernel": (d, f),
        "up_kernel": (d, f),
        "down_kernel": (f, d),
    }


def lora_params(model: ModelConfig, rank: int, targets: tuple[str, ...] = DEFAULT_TARGETS) -> int:
    """Numbers in the adapters of rank `rank` on `targets`."""
    shapes = layer_weight_shapes(model)
    total = 0
    for target in targets:
        name = parameter_name(target)
        if name == "lm_head":
            total += rank * (model.hidden_size + model.vocab_size)
            continue
        shape = shapes[name]
        n = INPUT_DIMS[name]
        total += model.num_layers * rank * (math.prod(shape[:n]) + math.prod(shape[n:]))
    return total


def kept_per_token(model: ModelConfig) -> int:
    """Elements each layer keeps per token for the backward pass under model.remat."""
    d, h, kv, hd, f = (
        model.hidden_size,
        model.num_heads,
        model.num_kv_heads,
        model.dims_per_head,
        model.intermediate_size,
    )
    if model.remat == "full":
        return d  # the layer's input
    # The layer's input, the residual after attention, rotated q and k, v, attention output,
    # and the MLP's gate and up projections (model_config.SAVED_NAMES).
    kept = 2 * d + 2 * h * hd + 2 * kv * hd + 2 * f
    if model.remat == "save_dots":
        kept += d + d  # the output projections' results too (o and down)
    return kept


def update_estimate(
    model: ModelConfig,
    *,
    rows: int,
    length: int,
    scored: int,
    lora_rank: int = 0,
    lora_targets: tuple[str, ...] = DEFAULT_TARGETS,
    rollout_prompts: int = 0,
    group_size: int = 1,
    prompt_length: int = 0,
    new_tokens: int = 0,
    mesh_shape: tuple[int, int, int] = (1, 1, 1),
    attention_scores: bool = False,
) -> Estimate:
    """The peak of one update: an optimisation step over micro-batches of `rows` sequences of
    `length` tokens whose head runs on `scored` positions per row, and (when rollout_prompts >
    0) a rollout sampling `group_size` completions of `new_tokens` after each of
    `rollout_prompts` prompts of `prompt_length` tokens. Bytes per device of a
    (data, fsdp, tensor) mesh. `attention_scores`: count one layer's fp32 attention scores
    [rows, heads, length, length] in the step (the shared-prompt pass's packed sequences, where
    they grow with the square of the group's length)."""
    data, fsdp, tensor = mesh_shape
    batch_shards, param_shards = data * fsdp, fsdp * tensor
    pb, cb = _bytes(model.param_dtype), _bytes(model.dtype)
    n_params = model.num_params()
    layers, d, f, vocab = (
        model.num_layers,
        model.hidden_size,
        model.intermediate_size,
        model.vocab_size,
    )
    layer_params = sum(math.prod(s) for s in layer_weight_shapes(model).values())
    parts: dict[str, float] = {}

    # The state (donated): parameters and AdamW's moments (optax keeps them in the params'
    # dtype), over the adapters only with LoRA.
    if lora_rank:
        trained = lora_params(model, lora_rank, lora_targets) * 4  # fp32 adapters
        parts["params"] = n_params * pb / param_shards
        parts["adapters_and_adam"] = 3 * trained / param_shards
        state = parts["params"] + parts["adapters_and_adam"]
        gradients = 3 * trained / param_shards
    else:
        trained = n_params * pb
        parts["params"] = trained / param_shards
        parts["adam"] = 2 * trained / param_shards
        state = parts["params"] + parts["adam"]
        # The gradient, its accumulator and AdamW's update: XLA reuses one for another.
        gradients = GRADIENT_COPIES * trained / param_shards

    # The optimisation step.
    tokens = rows * length / batch_shards
    width_shards = tensor  # heads and the MLP's width split over the tensor axis
    kept = kept_per_token(model)
    activations = layers * tokens * kept * cb / width_shards
    # One layer's backward pass at a time: its recomputed intermediates and gradients in fp32
    # (the MLP's width dominates), and with LoRA its merged weights and their gradient.
    working = tokens * (WORKING_MLP * f + WORKING_EMBED * d) * 4 / width_shards
    if lora_rank:
        working += WORKING_LORA_WEIGHTS * layer_params * 4 / param_shards
    head_rows = rows / batch_shards
    chunk = min(head_rows * scored * vocab, max(LOGITS_CHUNK_ELEMENTS, head_rows * vocab))
    head = HEAD_COPIES * chunk * 4 + rows * scored * d * 4 / batch_shards
    step = gradients + activations + working + head
    parts["gradients"] = gradients
    parts["kept_activations"] = activations
    parts["layer_working_set"] = working
    parts["head_chunks"] = head
    scores = rows * model.num_heads * length * length * 4 / (batch_shards * width_shards)
    if attention_scores:
        parts["attention_scores"] = scores
        step += scores
    elif packed_attention(model) is None and ROW_SCORE_COPIES * scores > working:
        # XLA's attention of the per-row pass writes one layer's fp32 scores, their softmax and
        # in the backward pass their gradient (cuDNN's fused attention, `packed_attention`,
        # none of them). They are the layer's working set where they outgrow the MLP's: not at
        # a few hundred tokens, most of the step at 16k.
        parts["attention_scores"] = ROW_SCORE_COPIES * scores - working
        step += parts["attention_scores"]

    rollout = 0.0
    if rollout_prompts:
        completions = rollout_prompts * group_size
        slots = prompt_length + new_tokens
        kv_elems = model.num_kv_heads * model.dims_per_head
        cache = 2 * layers * completions * slots * kv_elems * cb / (batch_shards * tensor)
        prefill = 2 * layers * rollout_prompts * slots * kv_elems * cb / (batch_shards * tensor)
        prefill += rollout_prompts * prompt_length * f * 4 / (batch_shards * tensor)
        # The sampler's copy of the weights in the compute dtype (none when it is the params'),
        # or of each layer's slice of them, taken before the decoding loop when its step is
        # unrolled (`model.decode_unroll`).
        copied = cb != pb or lora_rank or decode_unroll(model) > 1
        copy = n_params * cb / param_shards if copied else 0.0
        logits = 2 * completions * vocab * 4 / batch_shards
        rollout = cache + prefill + copy + logits
        if lora_rank:
            # GRPO merges the adapters into the sampler's copy before the rollout; XLA's plan
            # (XLA:CPU, 7B LoRA) keeps that buffer's space through the optimisation step.
            step += copy
        parts["kv_cache"] = cache + prefill
        parts["generation_copy"] = copy
    temporaries = max(step, rollout) + FIXED_BYTES
    return Estimate(parts, state, temporaries)


def partial_slots(
    model: ModelConfig,
    *,
    slot_rows: int,
    slot_prompts: int,
    prompt_length: int,
    new_tokens: int,
    budget: int,
    mesh_shape: tuple[int, int, int] = (1, 1, 1),
) -> tuple[float, float]:
    """Partial rollouts' carried state (`algos.partial.Slots`) per device: the KV cache of
    `slot_rows` rows (rollout_groups x group_size) over the cache length partial mode uses
    (`algos.partial.geometry`: the prompt, the whole updates of tokens a row may carry, one
    budget), their next-token logits in fp32, and the generated tokens, log-probs, versions
    and mask; and what the rollout adds at its peak: the prefill of `slot_prompts` prompts into
    a fresh cache, shared out to `slot_rows` rows and merged with the carried one (one more
    cache). The slots are split over the batch shards by row (`algos.partial`)."""
    data, fsdp, _ = mesh_shape
    batch_shards = data * fsdp
    cb = _bytes(model.dtype)
    length = prompt_length + budget * ((new_tokens - 1) // budget) + budget
    kv_elems = model.num_kv_heads * model.dims_per_head
    per_row_cache = 2 * model.num_layers * length * kv_elems * cb
    carried = slot_rows * per_row_cache
    carried += slot_rows * model.vocab_size * 4  # logits
    carried += slot_rows * new_tokens * (3 * 4 + 1)  # tokens, log-probs, versions; mask
    carried += slot_rows * prompt_length * (4 + 1)  # the rows' prompts and their masks
    rollout = slot_rows * per_row_cache + slot_prompts * per_row_cache
    rollout += slot_prompts * prompt_length * model.intermediate_size * 4
    return carried / batch_shards, rollout / batch_shards


# The parts of `update_estimate` that make up its optimisation step.
STEP_PARTS = (
    "gradients",
    "kept_activations",
    "layer_working_set",
    "head_chunks",
    "attention_scores",  # XLA's attention (shared prompts; the per-row pass without cuDNN)
)

# Calibration against XLA's plans (module docstring); tests/test_memory.py holds it to 15%.
GRADIENT_COPIES = 2.0
WORKING_MLP = 6.0
WORKING_EMBED = 8.0
WORKING_LORA_WEIGHTS = 3.0
HEAD_COPIES = 3.0
# XLA's plans of Qwen3-0.6B's optimizer step at 16,384 tokens (one row, 16 heads: 16 GiB of
# fp32 scores a layer) exceed the estimate without scores by 2.5x them on an H200 (65.3 GiB
# against 25.9) and 3.5x on XLA:CPU (81.6); the GPU's is the one that runs out.
ROW_SCORE_COPIES = 2.5
FIXED_BYTES = 64 * (1 << 20)


def grpo_estimate(
    config: Any,
    model: ModelConfig,
    prompt_length: int,
    mesh_shape: Any = None,
    slot_groups: int = 0,
    budget: int = 0,
) -> Estimate:
    """`update_estimate` of one GRPO update (`algos.grpo.Config`) on prompts of
    `prompt_length` tokens (each group's prompt once with config.shared_prompt); with
    `slot_groups` > 0, partial rollouts' (`algos.partial`) of that many carried groups,
    decoding `budget` steps per update (0: max_new_tokens). The shared pass's attention
    scores, quadratic in prompt + group_size x max_new_tokens, are counted for one layer (XLA's
    plan, SmolLM2 at 4 x 8 x (128 + 256): 7.51 GiB, the estimate 7.22; 6.59 without them); the
    per-row pass's, a few hundred MB at that shape, are not."""
    new_tokens = config.sampling.max_new_tokens
    completions = config.batch_size * config.group_size
    steps = config.num_minibatches * config.grad_accum_steps
    rows, length, scored = completions // steps, prompt_length + new_tokens, new_tokens
    if config.shared_prompt:
        # Shared prompts (`jaxrl.lm.log_probs.LogProbPass`): the step runs each group as one
        # sequence, its prompt once and its completions after it; the head's positions are
        # the same rows x new_tokens.
        group = config.group_size
        rows, length, scored = rows // group, prompt_length + group * new_tokens, group * scored
    estimate = update_estimate(
        model,
        rows=rows,
        length=length,
        scored=scored,
        lora_rank=config.lora_rank,
        lora_targets=config.lora_targets,
        rollout_prompts=config.batch_size,
        group_size=config.group_size,
        prompt_length=prompt_length,
        new_tokens=new_tokens,
        mesh_shape=tuple(mesh_shape or config.mesh_shape),
        attention_scores=config.shared_prompt,
    )
    if slot_groups == 0:
        return estimate
    # Partial rollouts (`algos.partial`): the sampler's slots are part of the state, held
    # through the training phase too; its rollout decodes into them in place of a fresh cache.
    carried, rollout = partial_slots(
        model,
        slot_rows=slot_groups * config.group_size,
        slot_prompts=slot_groups,
        prompt_length=prompt_length,
        new_tokens=new_tokens,
        budget=budget or new_tokens,
        mesh_shape=tuple(mesh_shape or config.mesh_shape),
    )
    parts = dict(estimate.parts)
    del parts[
        "kv_cache"
    ]  # a synchronous rollout's fresh cache: partial mode decodes into its slots
    parts["carried_slots"] = carried
    parts["rollout_cache"] = rollout
    # The optimisation step is the synchronous update's (batch_size groups at the same shapes;
    # partial mode trains every parameter, so no LoRA merge is kept through it).
    step = sum(parts.get(name, 0.0) for name in STEP_PARTS)
    data, fsdp, _ = tuple(mesh_shape or config.mesh_shape)
    logits = 2 * slot_groups * config.group_size * model.vocab_size * 4 / (data * fsdp)
    temporaries = max(step, rollout + parts["generation_copy"] + logits) + FIXED_BYTES
    return Estimate(parts, estimate.state + carried, temporaries)


def device_memory() -> int | None:
    """Bytes the first device can hold (`memory_stats()["bytes_limit"]`), or None where the
    backend does not say (the CPU)."""
    try:
        stats = jax.devices()[0].memory_stats()
    except Exception:  # noqa: BLE001 - a backend without memory stats
        return None
    if not stats or "bytes_limit" not in stats:
        return None
    return int(stats["bytes_limit"])


# A run is refused when its estimate exceeds the device's memory by this factor: the estimate
# agrees with XLA's plan within 15%, so a run refused here would not have fitted.
HEADROOM = 1.15


def check_fits(estimate: Estimate, model: ModelConfig, what: str, limit: int | None = None) -> None:
    """Raise a one-line ConfigError naming the setting to change when `estimate` (per device)
    cannot fit the device's memory (`limit`, else `device_memory()`; no check without one)."""
    limit = device_memory() if limit is None else limit
    if limit is None or estimate.total <= HEADROOM * limit:
        return
    if model.remat != "full":
        field, fix = "model.remat", f"set model.remat to 'full' (now {model.remat!r})"
        fix += ", or raise grad_accum_steps (smaller micro-batches)"
    else:
        field, fix = "grad_accum_steps", "raise grad_accum_steps (smaller micro-batches)"
    fix += ", lower batch_size, or shard over a larger mesh"
    raise ConfigError(
        f"{field}: {what} needs about {estimate.total / GIB:.1f} GiB per device (largest: "
        f"{estimate.summary()} GiB) but the device holds {limit / GIB:.1f} GiB; {fix}"
    )
