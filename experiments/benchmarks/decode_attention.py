"""One decode step's attention alone, in the layouts a sampler could keep its KV cache in, at
the 1.7B shape's sizes, against the time to read the cache once (measured in the same run).

The decode step's attention was 35 us a layer at batch 32 on an H200 where reading that
layer's keys and values takes 15 (docs/speed.md, "Language models on one GPU"): XLA runs the
one-query products as reduce kernels. Timed here, each over every layer's slice of a cache
[layers, B, kv_heads, ...] inside a scan, as the sampler reads it:

- `DS` (the sampler's layout): keys [B, kv, D, S], values [B, kv, S, D], `model.attend_one`;
- `SD`: keys [B, kv, S, D] too, the same softmax attention through einsums;
- `cudnn` (an NVIDIA GPU only): both [B, kv, S, D] through `jax.nn.dot_product_attention`
  (implementation "cudnn", "BNSH" layout) with the padding mask as a [B, 1, 1, S] bias.

Each variant's output is checked against `DS`'s before it is timed.

    python experiments/benchmarks/decode_attention.py --batches 32,128
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from experiments.benchmarks.generation import memory_bandwidth  # noqa: E402
from experiments.benchmarks.lm_shapes import MODEL_SHAPES  # noqa: E402
from jaxrl.lm.model import ModelConfig, attend_one  # noqa: E402


def attend_sd(q: jax.Array, keys: jax.Array, values: jax.Array, allowed: jax.Array) -> jax.Array:
    """`attend_one` with keys [B, kv, S, D]: the same attention."""
    batch, _, heads, dims = q.shape
    kv_heads = keys.shape[1]
    grouped = q.reshape(batch, kv_heads, heads // kv_heads, dims)
    f32 = jnp.float32
    scores = jnp.einsum("bkgd,bksd->bkgs", grouped, keys, preferred_element_type=f32)
    scores = scores * (1.0 / math.sqrt(dims))
    scores = jnp.where(allowed[:, None, None], scores, -0.7 * jnp.finfo(f32).max)
    probs = jax.nn.softmax(scores, axis=-1)
    out = jnp.einsum(
        "bkgs,bksd->bkgd", probs.astype(values.dtype), values, preferred_element_type=f32
    )
    return out.reshape(batch, 1, heads, dims).astype(q.dtype)


def attend_cudnn(q: jax.Array, keys: jax.Array, values: jax.Array, allowed: jax.Array) -> jax.Array:
    """cuDNN's fused attention over keys and values [B, kv, S, D] ("BNSH")."""
    bias = jnp.where(allowed, 0.0, -1e9).astype(q.dtype)[:, None, None, :]
    out = jax.nn.dot_product_attention(
        q.transpose(0, 2, 1, 3), keys, values, bias=bias, implementation="cudnn"
    )
    return out.transpose(0, 2, 1, 3)


VARIANTS = {"DS": attend_one, "SD": attend_sd, "cudnn": attend_cudnn}


def caches(model: ModelConfig, batch: int, slots: int, layout: str) -> tuple[jax.Array, ...]:
    """Random keys and values of every layer in `layout`, and the query, in the compute dtype."""
    dtype = jnp.dtype(model.dtype)
    shape = (model.num_layers, batch, model.num_kv_heads, slots, model.dims_per_head)
    keys = jax.random.normal(jax.random.key(1), shape, dtype)
    values = jax.random.normal(jax.random.key(2), shape, dtype)
    if layout == "DS":
        keys = keys.swapaxes(-1, -2)
    q = jax.random.normal(
        jax.random.key(3), (batch, 1, model.num_heads, model.dims_per_head), dtype
    )
    return q, keys, values


def timed(fn: Any, *args: Any, repeats: int) -> float:
    jax.block_until_ready(fn(*args))
    best = math.inf
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        best = min(best, time.perf_counter() - start)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="1.7b", choices=sorted(MODEL_SHAPES))
    parser.add_argument("--batches", default="32,128")
    parser.add_argument("--slots", type=int, default=192, help="cache length (128 + 64 tokens)")
    parser.add_argument("--filled", type=int, default=160, help="slots a row attends to")
    parser.add_argument("--dtype", default="bfloat16", choices=("float32", "bfloat16"))
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", default="")
    args = parser.parse_args()
    model = ModelConfig(**MODEL_SHAPES[args.model], dtype=args.dtype, param_dtype=args.dtype)
    itemsize = jnp.dtype(args.dtype).itemsize
    bandwidth = memory_bandwidth(256 << 20, args.repeats)
    names = [name for name in VARIANTS if name != "cudnn" or jax.default_backend() == "gpu"]
    print(
        f"{jax.devices()[0].device_kind}: {bandwidth / 1e9:.0f} GB/s streamed; {args.model} "
        f"attention, {model.num_layers} layers, cache of {args.slots} slots"
    )
    rows = []
    for batch in (int(b) for b in args.batches.split(",")):
        allowed = jnp.broadcast_to(jnp.arange(args.slots) < args.filled, (batch, args.slots))
        per_layer = 2 * batch * model.num_kv_heads * args.slots * model.dims_per_head * itemsize
        read_us = 1e6 * per_layer / bandwidth
        reference = None
        for name in names:
            q, keys, values = caches(model, batch, args.slots, "DS" if name == "DS" else "SD")
            attend = VARIANTS[name]

            def every_layer(q, keys, values, allowed, attend=attend):
                def layer(carry, kv):
                    return carry + attend(q, kv[0], kv[1], allowed).astype(jnp.float32), None

                return jax.lax.scan(layer, jnp.zeros(q.shape, jnp.float32), (keys, values))[0]

            fn = jax.jit(every_layer)
            try:
                out = np.asarray(fn(q, keys, values, allowed))
            except Exception as error:  # noqa: BLE001 - a kernel this machine lacks is a row
                rows.append(dict(batch=batch, variant=name, error=f"{type(error).__name__}"))
                print(f"batch {batch:4d} {name:6s}: failed ({type(error).__name__}: {error})"[:300])
                continue
            if reference is None:
                reference = out
            gap = float(np.abs(out - reference).max() / (np.abs(reference).max() + 1e-9))
            us = 1e6 * timed(fn, q, keys, values, allowed, repeats=args.repeats) / model.num_layers
            rows.append(
                dict(
                    batch=batch,
                    variant=name,
                    us_per_layer=us,
                    read_us=read_us,
                    ratio=us / read_us,
                    relative_gap=gap,
                )
            )
            print(
                f"batch {batch:4d} {name:6s}: {us:7.1f} us a layer, reading the cache once "
                f"{read_us:6.1f} us ({us / read_us:.2f}x); output against DS {gap:.1e}",
                flush=True,
            )
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                dict(device=jax.devices()[0].device_kind, bandwidth=bandwidth, rows=rows), indent=1
            )
        )


if __name__ == "__main__":
    main()
