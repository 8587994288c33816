"""Sampling from the language model with a KV cache, at fixed shapes, inside one compiled program.

The prompt batch is left-padded to a fixed length, so every row's last prompt token sits in the
same column and one prefill call fills the cache for all rows. Decoding then writes one token per
step into the cache inside `lax.while_loop`, which stops early once every row has produced EOS.
Shapes never depend on the data, so the sampler jit-compiles once, shards like the model, and can
sit in the same XLA program as a policy update (GRPO does exactly that).
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from jaxrl.config import require, require_in_range
from jaxrl.lm.model import ModelConfig, Transformer, init_cache, positions_from_mask

Array = jax.Array


@dataclasses.dataclass(frozen=True)
class SamplingConfig:
    """How to sample completions; validated on construction."""

    max_new_tokens: int  # completion length N; decoding stops earlier once every row hit EOS
    eos_id: int  # the token that ends a completion
    pad_id: int  # written after EOS
    temperature: float = 1.0  # 0 means greedy (argmax)
    top_k: int = 0  # 0 keeps every token
    top_p: float = 1.0  # 1 keeps every token

    def __post_init__(self) -> None:
        require(
            self.max_new_tokens >= 1, "max_new_tokens", f"got {self.max_new_tokens}", "set it >= 1"
        )
        require(
            self.temperature >= 0, "temperature", f"got {self.temperature}", "use 0 (greedy) or > 0"
        )
        require(self.top_k >= 0, "top_k", f"got {self.top_k}", "use 0 (off) or a positive count")
        require_in_range(self, "top_p", 0.0, 1.0)
        require(self.top_p > 0, "top_p", "got 0", "use a value in (0, 1]; 1 turns it off")


class Completion(NamedTuple):
    """Sampled completions of a prompt batch, fixed length N = max_new_tokens."""

    tokens: Array  # [B, N] sampled ids, pad after EOS
    log_probs: Array  # [B, N] log-prob of each token under the model at the sampling temperature
    mask: Array  # [B, N] True for generated tokens up to and including EOS
    lengths: Array  # [B] number of True entries in mask
    # Prompt positions the prefill ran (rows x prompt length): a group shares its prompt's.
    prefilled_tokens: Array | int = 0


def _filter_logits(logits: Array, top_k: int, top_p: float) -> Array:
    """Set every token outside the top-k / nucleus (top-p) set to -inf."""
    neg_inf = jnp.finfo(logits.dtype).min
    if top_k > 0 and top_k < logits.shape[-1]:
        kth_largest = jax.lax.top_k(logits, top_k)[0][..., -1:]
        logits = jnp.where(logits < kth_largest, neg_inf, logits)
    if top_p < 1.0:
        sorted_logits = jnp.sort(logits, axis=-1)[..., ::-1]
        sorted_probs = jax.nn.softmax(sorted_logits, axis=-1)
        # Keep a token if the probability mass strictly before it is below top_p, so the most
        # likely token always survives.
        mass_before = jnp.cumsum(sorted_probs, axis=-1) - sorted_probs
        kept = jnp.where(mass_before < top_p, sorted_logits, jnp.inf)
        threshold = jnp.min(kept, axis=-1, keepdims=True)
        logits = jnp.where(logits < threshold, neg_inf, logits)
    return logits


def sample_token(logits: Array, key: Array, config: SamplingConfig) -> tuple[Array, Array]:
    """Pick one token per row from [B, V] logits; return it and its log-prob under the model at
    the sampling temperature (before top-k/top-p truncation: the policy the update sees).

    Sampling inverts the cumulative distribution with one uniform draw per row: the token is
    the first whose running mass reaches u * total. That is the same distribution as the
    Gumbel-max trick (`jax.random.categorical`), which draws a number per row *and vocabulary
    entry*: on this 2-core CPU those draws took 32-57 ms per step at batch 32 over SmolLM2's
    vocabulary (the CDF inversion 4.3 ms), on a machine under load. Greedy decoding takes the
    first index of the maximum with two plain reductions rather than XLA's fused argmax."""
    scaled = logits if config.temperature == 0 else logits / config.temperature
    vocab = scaled.shape[-1]
    peak = jnp.max(scaled, axis=-1, keepdims=True)
    log_total = jnp.log(jnp.sum(jnp.exp(scaled - peak), axis=-1))
    if config.temperature == 0:
        columns = jnp.arange(vocab, dtype=jnp.int32)
        token = jnp.min(jnp.where(scaled == peak, columns, vocab), axis=-1)
    else:
        kept = _filter_logits(scaled, config.top_k, config.top_p)
        mass = jnp.cumsum(jnp.exp(kept - peak), axis=-1)
        # 1 - u lies in (0, 1], so the target is positive and the chosen token has mass.
        target = (1.0 - jax.random.uniform(key, (scaled.shape[0], 1))) * mass[:, -1:]
        token = jnp.minimum(jnp.sum(mass < target, axis=-1), vocab - 1)
    picked = jnp.take_along_axis(scaled, token[:, None], axis=-1)[:, 0]
    return token.astype(jnp.int32), picked - peak[:, 0] - log_total


def generation_copy(params: Any, model_config: ModelConfig) -> Any:
    """The parameters in the compute dtype, made once per rollout: every decode step then reads
    each weight once in the dtype its matmul uses (half the bytes of fp32 master weights under
    bf16 compute) instead of casting it again in every layer of every step. The model casts to
    the same dtype, so the logits are unchanged."""
    dtype = jnp.dtype(model_config.dtype)
    return jax.tree.map(
        lambda p: p.astype(dtype) if jnp.issubdtype(p.dtype, jnp.floating) else p, params
    )


def generate(
    model_config: ModelConfig,
    params: Any,
    prompt_tokens: Array,
    prompt_mask: Array,
    key: Array,
    config: SamplingConfig,
    mesh: Any = None,
    rules: Any = None,
    group_size: int = 1,
) -> Completion:
    """Sample `config.max_new_tokens` tokens after each left-padded prompt (pure; jit it).

    With `group_size` G > 1, each prompt gets G completions, rows p*G ... p*G + G - 1 of the
    result (the layout of `jnp.repeat(prompts, G, axis=0)`, and the same samples for the same
    key): the prompts are prefilled once and their KV cache repeated for the G samples, so a
    group's prompt is read and computed once rather than G times."""
    model = Transformer(model_config, mesh=mesh, rules=rules)
    params = generation_copy(params, model_config)
    prompts, prompt_length = prompt_tokens.shape
    batch = prompts * group_size
    steps = config.max_new_tokens
    cache = init_cache(model_config, prompts, prompt_length + steps)
    prompt_mask = prompt_mask.astype(bool)

    positions = positions_from_mask(prompt_mask)
    logits, cache = model.apply(
        {"params": params}, prompt_tokens, positions, prompt_mask, cache, logits_for_last=1
    )
    if group_size > 1:
        # The cache's batch axis is 1 for keys and values ([layers, B, ...]), 0 otherwise.
        def share(x: Array, axis: int = 0) -> Array:
            return jnp.repeat(x, group_size, axis=axis, total_repeat_length=batch)

        cache = {
            "k": share(cache["k"], 1),
            "v": share(cache["v"], 1),
            "mask": share(cache["mask"]),
            "index": cache["index"],
        }
        logits, positions = share(logits), share(positions)
    first = {
        "step": jnp.zeros((), jnp.int32),
        "cache": cache,
        "logits": logits[:, -1],
        "position": positions[:, -1] + 1,
        "done": jnp.zeros((batch,), bool),
        "tokens": jnp.full((batch, steps), config.pad_id, jnp.int32),
        "log_probs": jnp.zeros((batch, steps), jnp.float32),
        "mask": jnp.zeros((batch, steps), bool),
        "key": key,
    }

    def not_finished(state: dict) -> Array:
        return (state["step"] < steps) & ~jnp.all(state["done"])

    def decode_one(state: dict) -> dict:
        key, sample_key = jax.random.split(state["key"])
        token, log_prob = sample_token(state["logits"], sample_key, config)
        alive = ~state["done"]
        token = jnp.where(alive, token, config.pad_id)
        step = state["step"]
        new = dict(state, key=key, step=step + 1)
        new["tokens"] = state["tokens"].at[:, step].set(token)
        new["log_probs"] = state["log_probs"].at[:, step].set(jnp.where(alive, log_prob, 0.0))
        new["mask"] = state["mask"].at[:, step].set(alive)
        new["done"] = state["done"] | (token == config.eos_id)
        # Feed the token back; rows already finished write a masked-out slot.
        logits, new["cache"] = model.apply(
            {"params": params},
            token[:, None],
            state["position"][:, None],
            alive[:, None],
            state["cache"],
        )
        new["logits"] = logits[:, -1]
        new["position"] = state["position"] + 1
        return new

    final = jax.lax.while_loop(not_finished, decode_one, first)
    return Completion(
        tokens=final["tokens"],
        log_probs=final["log_probs"],
        mask=final["mask"],
        lengths=final["mask"].sum(axis=-1),
        prefilled_tokens=jnp.asarray(prompts * prompt_length, jnp.int32),
    )
