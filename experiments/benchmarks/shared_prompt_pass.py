"""One training pass over a GRPO batch, per row against shared prompt: the forward and backward
of an advantage-weighted log-prob loss through `completion_log_probs` (every row runs its own
copy of the prompt, today's update) and through `grouped_completion_log_probs` (each group's
prompt once, packed with its G completions), both arms in one run, with the tokens each pass
computes and the largest difference of their log-probs and gradients.

The default shape is one micro-batch of the `grpo.py:word_problems` preset's update (8 prompts x
8 samples of about 96 prompt tokens and 12 new ones, in grad_accum_steps = 4 micro-batches of 2
groups) on SmolLM2-135M's shape with random weights; `--groups 8` is the whole update in one
pass (several GB of activations per row-wise pass at SmolLM2's shape):

    python experiments/benchmarks/shared_prompt_pass.py
    python experiments/benchmarks/shared_prompt_pass.py --model tiny --groups 8 --repeats 5

This times the pass only (no rollout, no optimizer): the part of an update the shared prompt
changes.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))  # this tree's jaxrl
sys.path.insert(0, HERE)

from lm_shapes import MODEL_SHAPES  # noqa: E402


def batch_of(groups: int, group_size: int, prompt: int, new: int, vocab: int, seed: int = 0):
    """A GRPO-shaped batch: left-padded prompts (the shortest 3/4 of the longest) repeated over
    their groups' contiguous rows, completions that end at random steps."""
    import numpy as np

    rng = np.random.default_rng(seed)
    rows = groups * group_size
    real = rng.integers(prompt * 3 // 4, prompt + 1, groups)
    prompt_mask = np.arange(prompt)[None, :] >= (prompt - real)[:, None]
    prompt_tokens = np.where(prompt_mask, rng.integers(3, vocab, (groups, prompt)), 0)
    lengths = rng.integers(1, new + 1, rows)
    completion_mask = np.arange(new)[None, :] < lengths[:, None]
    completion = np.where(completion_mask, rng.integers(3, vocab, (rows, new)), 0)
    return {
        "tokens": np.concatenate([np.repeat(prompt_tokens, group_size, 0), completion], 1).astype(
            np.int32
        ),
        "attention_mask": np.concatenate(
            [np.repeat(prompt_mask, group_size, 0), completion_mask], 1
        ),
        "completion_mask": completion_mask,
        "advantages": rng.normal(size=rows).astype(np.float32),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2", choices=sorted(MODEL_SHAPES))
    parser.add_argument("--groups", type=int, default=2)
    parser.add_argument("--group_size", type=int, default=8)
    parser.add_argument("--prompt", type=int, default=96)
    parser.add_argument("--new", type=int, default=12)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    import jax
    import jax.numpy as jnp
    import numpy as np

    from jaxrl.lm.log_probs import completion_log_probs, grouped_completion_log_probs
    from jaxrl.lm.model import ModelConfig, Transformer, init_params

    config = ModelConfig(**MODEL_SHAPES[args.model])
    model = Transformer(config)
    params = init_params(config, jax.random.key(0))
    batch = batch_of(args.groups, args.group_size, args.prompt, args.new, config.vocab_size)

    def step_of(log_probs_fn):
        def loss(params):
            log_probs = log_probs_fn(params).log_probs
            weighted = log_probs * batch["advantages"][:, None]
            return jnp.sum(jnp.where(batch["completion_mask"], weighted, 0.0))

        return jax.jit(jax.value_and_grad(loss))

    arms = {
        "per_row": step_of(lambda p: completion_log_probs(model, p, batch, 1.0)),
        "shared_prompt": step_of(
            lambda p: grouped_completion_log_probs(model, p, batch, 1.0, args.group_size)
        ),
    }
    rows = args.groups * args.group_size
    tokens = {
        "per_row": rows * (args.prompt + args.new),
        "shared_prompt": args.groups * (args.prompt + args.group_size * args.new),
    }
    results, seconds = {}, {}
    for name, step in arms.items():
        start = time.perf_counter()
        results[name] = jax.block_until_ready(step(params))
        compile_s = time.perf_counter() - start
        times = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            jax.block_until_ready(step(params))
            times.append(time.perf_counter() - start)
        seconds[name] = float(np.median(times))
        print(
            f"{name:>13}: {tokens[name]:6d} tokens per pass, forward+backward "
            f"{seconds[name]:.3f} s (median of {args.repeats}; first call {compile_s:.1f} s)"
        )
    (loss_a, grads_a), (loss_b, grads_b) = results["per_row"], results["shared_prompt"]
    gap = max(
        float(jnp.max(jnp.abs(a - b)))
        for a, b in zip(jax.tree.leaves(grads_a), jax.tree.leaves(grads_b), strict=True)
    )
    print(
        f"{args.model}, {args.groups} x {args.group_size}, prompt {args.prompt}, new {args.new}: "
        f"{tokens['per_row'] / tokens['shared_prompt']:.1f}x fewer tokens, "
        f"{seconds['per_row'] / seconds['shared_prompt']:.2f}x faster; "
        f"|loss gap| {abs(float(loss_a - loss_b)):.2e}, max |gradient gap| {gap:.2e}"
    )


if __name__ == "__main__":
    main()
