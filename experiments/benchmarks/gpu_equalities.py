"""The GPU's defaults against the engine they replace, on one small model, in seconds: what the
CPU's tests cannot run (they check the same formulations through XLA's kernels).

- cuDNN's fused attention (`ModelConfig.attention` "auto" on an NVIDIA GPU: each row's real tokens
  packed first, `jaxrl.lm.model.packed_attention`) against XLA's masked attention ("xla"): the
  logits at every real token and the gradient of a masked log-likelihood, rows with left
  padding, right padding and a hole;
- the unrolled decode step (`ModelConfig.decode_unroll` 0, auto) against the scanned one (1):
  the sampled tokens' log-probs under the same key.

bf16 compute, so the two sides agree to bf16's rounding, not exactly. Prints one line per
check and exits 1 if one fails. Off a GPU the defaults are XLA's attention and the scanned step,
so there the packed layout runs through XLA's kernel and the step is unrolled by hand: the same
formulations the CPU tests check, as a smoke test of this script.

    python experiments/benchmarks/gpu_equalities.py
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from jaxrl.lm import model as lm_model  # noqa: E402
from jaxrl.lm.model import (  # noqa: E402
    ModelConfig,
    Transformer,
    decode_unroll,
    init_params,
    packed_attention,
    token_log_probs,
)
from jaxrl.lm.sampler import SamplingConfig, generate  # noqa: E402

MODEL = ModelConfig(
    vocab_size=512,
    hidden_size=256,
    intermediate_size=512,
    num_layers=4,
    num_heads=4,
    num_kv_heads=2,
    dtype="bfloat16",
)


def attention_check(params: dict) -> tuple[bool, str]:
    """Packed (the default here) against masked attention: logits and gradients."""
    rows, length = 4, 96
    tokens = jax.random.randint(jax.random.key(1), (rows, length), 2, MODEL.vocab_size)
    mask = np.ones((rows, length), bool)
    mask[0, :20] = False
    mask[1, 70:] = False
    mask[2, :10] = mask[2, 80:] = False
    mask[3, 40:45] = False
    mask = jnp.asarray(mask)
    read = mask & jnp.pad(mask[:, :-1], ((0, 0), (1, 0)))  # predictions read at real tokens

    def run(config: ModelConfig) -> tuple[np.ndarray, list]:
        def logits(p: dict) -> jax.Array:
            return Transformer(config).apply({"params": p}, tokens, token_mask=mask)[0]

        def loss(p: dict) -> jax.Array:
            return -jnp.sum(jnp.where(read, token_log_probs(logits(p), tokens), 0.0))

        out, grad = jax.jit(lambda p: (logits(p), jax.grad(loss)(p)))(params)
        return np.asarray(out, np.float32), [
            np.asarray(g, np.float32) for g in jax.tree.leaves(grad)
        ]

    if jax.default_backend() != "gpu":  # the packed layout through XLA's kernel (module doc)
        lm_model.packed_attention = lambda config: "xla" if config.attention == "auto" else None
    what = lm_model.packed_attention(MODEL)
    packed_logits, packed_grad = run(MODEL)
    masked_logits, masked_grad = run(dataclasses.replace(MODEL, attention="xla"))
    lm_model.packed_attention = packed_attention
    real = np.asarray(mask)
    logit_gap = float(np.abs(packed_logits - masked_logits)[real].max())
    flat = lambda grads: np.concatenate([g.ravel() for g in grads])  # noqa: E731
    a, b = flat(packed_grad), flat(masked_grad)
    cosine = float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))
    finite = bool(np.isfinite(packed_logits).all() and np.isfinite(a).all())
    ok = finite and logit_gap < 0.1 and cosine > 0.999
    return ok, (
        f"attention packed ({what}) vs masked (xla): max logit gap {logit_gap:.4f} (< 0.1), "
        f"gradient cosine {cosine:.6f} (> 0.999), finite {finite}"
    )


def decode_check(params: dict) -> tuple[bool, str]:
    """The default decode step against the scanned one: the same samples' log-probs."""
    prompts = jax.random.randint(jax.random.key(2), (8, 16), 2, MODEL.vocab_size)
    mask = jnp.ones(prompts.shape, bool).at[:3, :5].set(False)
    sampling = SamplingConfig(max_new_tokens=24, eos_id=MODEL.vocab_size, pad_id=0)

    def sample(config: ModelConfig):
        fn = jax.jit(lambda p, t, m, k: generate(config, p, t, m, k, sampling))
        return fn(params, prompts, mask, jax.random.key(3))

    unrolled = MODEL
    if jax.default_backend() != "gpu":  # unrolled by hand (module doc)
        unrolled = dataclasses.replace(MODEL, decode_unroll=MODEL.num_layers)
    default, scanned = sample(unrolled), sample(dataclasses.replace(MODEL, decode_unroll=1))
    same = float(np.mean(np.asarray(default.tokens) == np.asarray(scanned.tokens)))
    # Where the tokens agree, so do their log-probs (a bf16 rounding may flip a near-tie).
    agree = np.asarray(default.tokens) == np.asarray(scanned.tokens)
    gap = float(np.abs(np.asarray(default.log_probs) - np.asarray(scanned.log_probs))[agree].max())
    ok = same > 0.9 and gap < 0.05
    return ok, (
        f"decode_unroll {decode_unroll(unrolled)} vs 1: {same:.3f} of tokens the same (> 0.9), "
        f"max log-prob gap where they are {gap:.4f} (< 0.05)"
    )


def main() -> None:
    params = jax.jit(lambda: init_params(MODEL, jax.random.key(0)))()
    print(f"{jax.devices()[0].device_kind}, jax {jax.__version__}")
    results = [attention_check(params), decode_check(params)]
    for ok, line in results:
        print(("ok    " if ok else "FAIL  ") + line, flush=True)
    raise SystemExit(0 if all(ok for ok, _ in results) else 1)


if __name__ == "__main__":
    main()
