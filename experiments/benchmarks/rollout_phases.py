"""Where a synchronous GRPO update's time goes on the long-tailed task, and the most partial
rollouts could save (issue 39's 1.5x criterion).

Times, each as its own compiled program with random weights (so every completion runs to
max_new_tokens, as a synchronous batch does whenever one of its answers is the longest):
the rollout alone (`grpo.make_rollout`: prefill and max_new_tokens decode steps) and the whole
update (rollout, loss, gradient, AdamW); training is their difference. Partial rollouts change
only the decoding: at best (every slot always busy) a trained completion costs the decode steps
of its own length rather than the batch's longest, so the bound on their speed-up in trained
completions per second is

    (train + d * E[longest in the batch]) / (train + d * E[length])

with d the time of one decode step and the lengths those of the task's answers plus EOS (what
a policy that has learned the task generates). The training pass stays at its fixed shape
(prompt + max_new_tokens) either way; `bucketed_training_speedup_bound` is the same bound if
partial mode also trained each completion at its own length (the training pass measured at
max_new_tokens = the mean learned length): not built, an upper bound on what it could give.

    python experiments/benchmarks/rollout_phases.py --shape=tiny --num_digits=5
    python experiments/benchmarks/rollout_phases.py --shape=smollm2 --num_digits=5 \\
        --batch_size=4 --group_size=4 --reps=2
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", default="tiny", choices=("tiny", "smollm2"))
    parser.add_argument("--num_digits", type=int, default=5, help="repeat_digit's (5: 1-32)")
    parser.add_argument("--batch_size", type=int, default=16)
    parser.add_argument("--group_size", type=int, default=4)
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    os.environ.setdefault("JAX_PLATFORMS", "cpu")

    import jax
    import numpy as np

    from algos import grpo
    from envs.text import make_task
    from experiments.benchmarks.lm_shapes import MODEL_SHAPES
    from jaxrl import hparams
    from jaxrl.lm.model import ModelConfig, init_params
    from jaxrl.lm.sampler import Sampling
    from jaxrl.lm.tokenizer import ByteTokenizer
    from jaxrl.trainers.presets.lm import TINY_MODEL

    digit_task = make_task("repeat_digit", num_digits=args.num_digits)
    task = digit_task.text_task(ByteTokenizer())
    new_tokens = 2**args.num_digits + 1  # the longest answer and its EOS
    shape = dict(TINY_MODEL) if args.shape == "tiny" else dict(MODEL_SHAPES["smollm2"])
    shape["max_position_embeddings"] = 16 + new_tokens
    model = ModelConfig(**shape)
    params = init_params(model, jax.random.key(0))

    def timed(fn, *fn_args):
        start = time.perf_counter()
        jax.block_until_ready(fn(*fn_args))
        return time.perf_counter() - start

    def phases(new_tokens: int) -> tuple[float, float, float]:
        """Median seconds of the rollout and of the whole update at this max_new_tokens, and
        the sampled completions' mean length."""
        config = grpo.Config(
            batch_size=args.batch_size,
            group_size=args.group_size,
            sampling=Sampling(max_new_tokens=new_tokens),
            warn_no_signal_updates=0,
        )
        hp = hparams.hparams(config)
        rollout = jax.jit(grpo.make_rollout(config, model, task))
        algorithm = grpo.make(config, model, task, params)
        update = jax.jit(algorithm.update)
        state = algorithm.init(jax.random.PRNGKey(0), hp)
        timed(rollout, params, jax.random.key(1), hp)  # compile
        state, metrics = update(state, None, hp)  # compile
        jax.block_until_ready(state)
        rollouts = [timed(rollout, params, jax.random.key(2 + i), hp) for i in range(args.reps)]
        updates = []
        for _ in range(args.reps):
            start = time.perf_counter()
            state, metrics = update(state, None, hp)
            jax.block_until_ready(state)
            updates.append(time.perf_counter() - start)
        length = float(metrics["completion_length"])
        return float(np.median(rollouts)), float(np.median(updates)), length

    rollout_s, update_s, sampled_length = phases(new_tokens)
    train_s = update_s - rollout_s
    step_s = rollout_s / new_tokens

    # A policy that has learned the task: each group's completions are its answer and EOS.
    lengths = np.asarray(digit_task.lengths()) + 1
    rng = np.random.default_rng(0)
    codes = rng.integers(0, 10, (100_000, args.batch_size))
    longest = float(lengths[codes].max(axis=1).mean())
    mean = float(lengths.mean())
    bound = (train_s + step_s * longest) / (train_s + step_s * mean)
    # If partial mode also trained each completion at (a bucket of) its own length, not at
    # max_new_tokens: the training pass at the mean learned length, measured.
    short_rollout_s, short_update_s, _ = phases(int(np.ceil(mean)))
    short_train_s = short_update_s - short_rollout_s
    bucketed = (train_s + step_s * longest) / (short_train_s + step_s * mean)
    row = {
        "shape": args.shape,
        "backend": jax.default_backend(),
        "batch": f"{args.batch_size}x{args.group_size}",
        "max_new_tokens": new_tokens,
        "completion_length_sampled": sampled_length,
        "update_s": round(update_s, 4),
        "rollout_s": round(rollout_s, 4),
        "train_s": round(train_s, 4),
        "decode_share": round(rollout_s / update_s, 3),
        "decode_step_ms": round(1e3 * step_s, 3),
        "learned_mean_length": round(mean, 2),
        "learned_longest_in_batch": round(longest, 2),
        "sync_update_s_learned": round(train_s + step_s * longest, 4),
        "partial_speedup_bound": round(bound, 3),
        "train_s_at_mean_length": round(short_train_s, 4),
        "bucketed_training_speedup_bound": round(bucketed, 3),
    }
    print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
