"""Decoding speed against the hardware's roofline, measured in the same run.

For each batch size the sampler (`jaxrl.lm.sampler.generate`) runs twice on random weights: once
for one new token (the prefill and one step) and once for `--new_tokens`; the difference over the
extra steps is the time of one decode step. The roofline of a step is the larger of

- the time to read what a step must read once: the weights in the compute dtype and the KV cache
  (at its mean length over the timed steps), at the memory bandwidth measured here by streaming
  a buffer of the weights' size, and
- the time of the step's matrix products at the matmul peak measured here (a large `jnp.dot` in
  the compute dtype),

so `ratio = step / roofline` says how far decoding is from what this machine allows. Beside it,
the step's weight products alone (every projection, MLP and head product at the step's shapes,
nothing else) through XLA: how close this machine's compiled kernels get to that roofline, the
floor a decode step built from them cannot go below. EOS is an id outside the vocabulary, so every
row decodes every step.

    python experiments/benchmarks/generation.py --model smollm2 --batches 1,4,32,128
    python experiments/benchmarks/generation.py --model 1.7b --dtype bfloat16 --batches 1,32,128

Models: `smollm2` (SmolLM2-135M-Instruct's shape), `1.7b` (24 layers, hidden 2048, 32 heads,
vocab 49,152: the SmolLM2-1.7B shape) and `tiny` (the peers' 3.2M-parameter Llama).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

# Run from the repository root as `python3 experiments/benchmarks/generation.py`: the repository,
# not this folder, is where `experiments.benchmarks` and an uninstalled jaxrl are found.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from experiments.benchmarks.harness import Step, trace_call  # noqa: E402
from experiments.benchmarks.lm_shapes import MODEL_SHAPES  # noqa: E402
from jaxrl.lm.model import ModelConfig, decode_unroll, init_params  # noqa: E402
from jaxrl.lm.sampler import SamplingConfig, generate  # noqa: E402

SHAPES = {name: MODEL_SHAPES[name] for name in ("tiny", "smollm2", "1.7b")}


def _best_time(fn: Any, *args: Any, repeats: int) -> float:
    """The fastest of `repeats` timed calls after one warm-up call (seconds)."""
    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - start)
    return min(times)


def memory_bandwidth(num_bytes: int, repeats: int) -> float:
    """Bytes per second streamed by a reduction over a float32 buffer of `num_bytes`."""
    buffer = jnp.ones((num_bytes // 4,), jnp.float32)
    seconds = _best_time(jax.jit(jnp.sum), buffer, repeats=repeats)
    return num_bytes / seconds


def matmul_peak(dtype: Any, repeats: int, size: int = 2048) -> float:
    """FLOP/s of one size x size x size product of random matrices in `dtype` (a GPU needs a
    large size, e.g. 8192, to reach its peak; constant operands can run faster than real data)."""
    a = jax.random.normal(jax.random.key(1), (size, size), dtype)
    b = jax.random.normal(jax.random.key(2), (size, size), dtype)
    seconds = _best_time(jax.jit(jnp.dot), a, b, repeats=repeats)
    return 2.0 * size**3 / seconds


def step_matmul_flops(model: ModelConfig, batch: int, context: float) -> float:
    """FLOPs of one decode step: every weight used once per row, plus attention over the cache."""
    return batch * model.flops_per_token(int(context))


def time_weight_products(model: ModelConfig, params: Any, batch: int, repeats: int) -> float:
    """Seconds per step of a decode step's weight products alone: every layer's projections and
    MLP and the head, on [batch, hidden] activations through XLA at the sampler's shapes and
    layout (stacked layers, scanned), without attention, cache, norms or sampling. What this
    machine's XLA kernels allow a step at best, beside the roofline."""
    d, steps = model.hidden_size, 16
    layers = params["layers"]
    weights = (
        layers["attention"]["q_kernel"].reshape(model.num_layers, d, -1),
        layers["attention"]["k_kernel"].reshape(model.num_layers, d, -1),
        layers["attention"]["v_kernel"].reshape(model.num_layers, d, -1),
        layers["attention"]["o_kernel"].reshape(model.num_layers, -1, d),
        layers["mlp"]["gate_kernel"],
        layers["mlp"]["up_kernel"],
        layers["mlp"]["down_kernel"],
    )
    head = params["embedding"] if model.tie_embeddings else params["lm_head"]
    tiny = 1e-30  # keeps every product live without changing x

    def layer(x: jax.Array, w: tuple) -> tuple[jax.Array, None]:
        q, k, v, o, gate, up, down = w
        unused = (x @ k).sum(-1, keepdims=True) + (x @ v).sum(-1, keepdims=True)
        x = x + (x @ q) @ o + tiny * unused
        return x + ((x @ gate) * (x @ up)) @ down, None

    def run(x: jax.Array, weights: tuple, head: jax.Array) -> jax.Array:
        # The weights are arguments: closed over, they would be compiled in as constants (GBs).
        def step(_: int, x: jax.Array) -> jax.Array:
            x, _ = jax.lax.scan(layer, x, weights)
            logits = x @ head.T if model.tie_embeddings else x @ head
            return x + tiny * logits[:, :d]

        return jax.lax.fori_loop(0, steps, step, x)

    x = jnp.full((batch, d), 0.01, model.dtype)
    return _best_time(jax.jit(run), x, weights, head, repeats=repeats) / steps


def time_decoding(
    model: ModelConfig, params: Any, batch: int, prompt_length: int, new_tokens: int, repeats: int
) -> dict[str, float]:
    """Seconds of a prefill + one step, of a prefill + `new_tokens` steps, and per decode step."""
    rng = np.random.default_rng(batch)
    prompts = jnp.asarray(rng.integers(0, model.vocab_size, (batch, prompt_length)), jnp.int32)
    mask = jnp.ones((batch, prompt_length), bool)
    key = jax.random.key(0)

    def timed(steps: int) -> tuple[float, float]:
        sampling = SamplingConfig(max_new_tokens=steps, eos_id=model.vocab_size, pad_id=0)
        fn = jax.jit(lambda p, t, m, k: generate(model, p, t, m, k, sampling).tokens)
        start = time.perf_counter()
        compiled = fn.lower(params, prompts, mask, key).compile()
        compile_seconds = time.perf_counter() - start
        return _best_time(compiled, params, prompts, mask, key, repeats=repeats), compile_seconds

    short, _ = timed(1)
    long, compile_seconds = timed(new_tokens)
    return {
        "prefill_s": short,
        "total_s": long,
        "step_ms": 1e3 * (long - short) / (new_tokens - 1),
        "compile_s": compile_seconds,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=sorted(SHAPES), default="smollm2")
    parser.add_argument("--batches", default="1,4,32,128")
    parser.add_argument("--prompt_length", type=int, default=128)
    parser.add_argument("--new_tokens", type=int, default=64)
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--peak_n", type=int, default=2048, help="matrix size of the matmul peak (GPU: 8192)"
    )
    parser.add_argument("--json", default="", help="also write the results to this file")
    parser.add_argument(
        "--trace",
        default="",
        help="also write a jax.profiler trace (Perfetto) of one decode call at --trace_batch here",
    )
    parser.add_argument("--trace_batch", type=int, default=32)
    parser.add_argument(
        "--decode_unroll",
        default="0",
        help="ModelConfig.decode_unroll values to time, each at every batch (0: auto; 1: scan)",
    )
    args = parser.parse_args()

    model = ModelConfig(**SHAPES[args.model], dtype=args.dtype, param_dtype=args.dtype)
    params = jax.jit(lambda: init_params(model, jax.random.key(0)))()
    itemsize = jnp.dtype(args.dtype).itemsize
    weight_bytes = model.num_params() * itemsize
    bandwidth = statistics.median(
        memory_bandwidth(max(weight_bytes, 256 << 20), args.repeats) for _ in range(3)
    )
    peak = matmul_peak(jnp.dtype(args.dtype), args.repeats, args.peak_n)
    read_ms = 1e3 * weight_bytes / bandwidth
    print(
        f"{args.model}: {model.num_params() / 1e6:.1f}M parameters, {args.dtype}; "
        f"bandwidth {bandwidth / 1e9:.1f} GB/s (weights read in {read_ms:.1f} ms), "
        f"matmul peak {peak / 1e9:.0f} GFLOP/s; {jax.devices()[0].device_kind}"
    )
    print(
        "unroll  batch  step ms  roofline ms  ratio  tokens/s  (weights+KV ms, matmul ms)  "
        "weight products alone ms (ratio)  compile s"
    )
    rows, products = [], {}
    unrolls = [int(u) for u in args.decode_unroll.split(",")]
    for unroll, batch in ((u, int(b)) for u in unrolls for b in args.batches.split(",")):
        unrolled = dataclasses.replace(model, decode_unroll=unroll)
        timing = time_decoding(
            unrolled, params, batch, args.prompt_length, args.new_tokens, args.repeats
        )
        context = args.prompt_length + args.new_tokens / 2
        kv_bytes = (
            2 * model.num_layers * batch * context * model.num_kv_heads * model.dims_per_head
        ) * itemsize
        read_ms = 1e3 * (weight_bytes + kv_bytes) / bandwidth
        matmul_ms = 1e3 * step_matmul_flops(model, batch, context) / peak
        roofline = max(read_ms, matmul_ms)
        if batch not in products:  # the same for every unroll
            products[batch] = 1e3 * time_weight_products(model, params, batch, args.repeats)
        products_ms = products[batch]
        row = dict(
            decode_unroll=decode_unroll(unrolled),
            batch=batch,
            **timing,
            read_ms=read_ms,
            matmul_ms=matmul_ms,
            roofline_ms=roofline,
            ratio=timing["step_ms"] / roofline,
            tokens_per_s=1e3 * batch / timing["step_ms"],
            weight_products_ms=products_ms,
            weight_products_ratio=products_ms / roofline,
        )
        rows.append(row)
        print(
            f"{row['decode_unroll']:6d}  {batch:5d}  {row['step_ms']:7.2f}  {roofline:11.2f}  "
            f"{row['ratio']:5.2f}  "
            f"{row['tokens_per_s']:8.0f}  ({read_ms:.2f}, {matmul_ms:.2f})  "
            f"{products_ms:.2f} ({row['weight_products_ratio']:.2f})  {timing['compile_s']:.1f}",
            flush=True,
        )
        if args.json:  # after every row: a run stopped at its time limit keeps the rows so far
            report = dict(
                model=args.model,
                dtype=args.dtype,
                prompt_length=args.prompt_length,
                new_tokens=args.new_tokens,
                bandwidth_bytes_per_s=bandwidth,
                matmul_peak_flops=peak,
                weight_bytes=weight_bytes,
                device=jax.devices()[0].device_kind,
                peak_n=args.peak_n,
                rows=rows,
            )
            Path(args.json + ".tmp").write_text(json.dumps(report, indent=1))
            Path(args.json + ".tmp").replace(args.json)
    if args.trace:  # at the first --decode_unroll
        unrolled = dataclasses.replace(model, decode_unroll=unrolls[0])
        trace_decoding(
            unrolled, params, args.trace_batch, args.prompt_length, args.new_tokens, args.trace
        )


def trace_decoding(
    model: ModelConfig, params: Any, batch: int, prompt_length: int, new_tokens: int, where: str
) -> None:
    """One compiled decode call (prefill + `new_tokens` steps) under jax.profiler, written as a
    Perfetto trace (`*.trace.json.gz`) under `where`: the kernels of a step and their times."""
    prompts = jnp.zeros((batch, prompt_length), jnp.int32)
    mask = jnp.ones((batch, prompt_length), bool)
    sampling = SamplingConfig(max_new_tokens=new_tokens, eos_id=model.vocab_size, pad_id=0)
    fn = jax.jit(lambda p, t, m, k: generate(model, p, t, m, k, sampling).tokens)
    compiled = fn.lower(params, prompts, mask, jax.random.key(0)).compile()
    jax.block_until_ready(compiled(params, prompts, mask, jax.random.key(0)))
    one = Step(lambda _, __: (compiled(params, prompts, mask, jax.random.key(1)), {}))
    print(f"trace: batch {batch}, {new_tokens} new tokens: {trace_call(one, None, where)}")


if __name__ == "__main__":
    main()
