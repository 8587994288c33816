"""GRPO's whole update with and without shared prompts (`grpo.Config.shared_prompt`), both arms
in one run: the update as the script compiles it (`grpo.make(...).update`: rollout, loss,
gradient, AdamW) and its optimizer steps alone on one fixed rollout batch, with the training
tokens each update computes and the largest difference of the two arms' parameters after it.

The default shape is the `grpo.py:word_problems` preset's update: SmolLM2-135M's shape (random
weights, fp32), 8 prompts x 8 samples, grad_accum_steps 4 (micro-batches of 2 groups), prompts
of 96 tokens (the preset's two worked examples and a problem run 90-100), 12 new tokens. The
task is `memory_plan.fixed_length_task`'s: prompts of exactly --prompt random tokens, EOS an id
no sample is, so every completion runs all its tokens (what random weights do anyway). Each arm runs
1 + --repeats successive updates from the same start (the first compiles; the time is the
median of the others), and the parameter gap is the two arms' after the last of them.

    python experiments/benchmarks/shared_prompt_update.py --repeats 2   # 3 updates an arm
    python experiments/benchmarks/shared_prompt_update.py --model tiny --repeats 5

The machine's load average is printed before and after: on a shared host the times move with it.
It runs on the CPU unless JAX_PLATFORMS names another backend (`gpu_checks.sh`'s share17 step:
the 1.7B shape, bf16 compute, 4 prompts x 8 of 256 + 64 tokens).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from experiments.benchmarks.lm_shapes import MODEL_SHAPES  # noqa: E402


def per_row_config(
    batch_size: int = 8, group_size: int = 8, grad_accum_steps: int = 4, new: int = 12
):
    """The per-row GRPO update at the `word_problems` preset's settings (by default its shape:
    8 x 8, 4 micro-batches, 12 new tokens; lr 2e-5, the preset's for a pretrained start)."""
    from algos import grpo
    from jaxrl.lm.sampler import Sampling

    return grpo.Config(
        batch_size=batch_size,
        group_size=group_size,
        grad_accum_steps=grad_accum_steps,
        sampling=Sampling(max_new_tokens=new),
        learning_rate=2e-5,
    )


def training_tokens(config, prompt: int, passes: int) -> dict[str, int]:
    """Tokens the model runs per pass over the update's completions and per update (`passes`
    passes: the loss's, plus the old policy's and the reference's where they run)."""
    from algos import optimizer_steps

    log_prob_pass = optimizer_steps.log_prob_pass(config)
    new = config.sampling.max_new_tokens
    per_pass = log_prob_pass.tokens(config.completions_per_update, prompt, new)
    return {"per_pass": per_pass, "per_update": passes * per_pass}


def timed(fn, repeats: int, carry=None) -> tuple[float, float, object]:
    """(seconds of the first call, median seconds of `repeats` more calls, the last result).
    With `carry`, each call takes the one before's result (`fn(carry)`): successive updates."""
    import jax
    import numpy as np

    def call(previous):
        return fn(previous) if carry is not None else fn()

    start = time.perf_counter()
    result = jax.block_until_ready(call(carry))
    first = time.perf_counter() - start
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        result = jax.block_until_ready(call(result))
        times.append(time.perf_counter() - start)
    return first, float(np.median(times)), result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2", choices=sorted(MODEL_SHAPES))
    parser.add_argument("--batch_size", type=int, default=8)
    parser.add_argument("--group_size", type=int, default=8)
    parser.add_argument("--grad_accum_steps", type=int, default=4)
    parser.add_argument("--prompt", type=int, default=96)
    parser.add_argument("--new", type=int, default=12)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    parser.add_argument("--out", default="", help="write the figures as JSON here too")
    args = parser.parse_args()
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    load_before = os.getloadavg()

    import jax
    import numpy as np

    from algos import grpo
    from experiments.benchmarks.memory_plan import fixed_length_task
    from jaxrl import hparams
    from jaxrl.lm.model import ModelConfig, init_params

    model = ModelConfig(**MODEL_SHAPES[args.model], dtype=args.dtype)
    task = fixed_length_task(args.prompt, model.vocab_size)
    params = init_params(model, jax.random.key(0))
    today = per_row_config(args.batch_size, args.group_size, args.grad_accum_steps, args.new)
    arms = {"per_row": today, "shared_prompt": dataclasses.replace(today, shared_prompt=True)}
    hp = hparams.hparams(today)
    # The rollout both arms train on in the optimizer-steps timing (the same in both arms).
    rollout = jax.jit(grpo.make_rollout(today, model, task))
    batch, _ = rollout(params, jax.random.key(1), hp)
    passes = 1 + int(today.reuses_samples)  # no reference: the preset's kl_beta is 0

    def measure(config):
        """(the arm's figures, its parameters after 1 + repeats successive updates)."""
        learner = grpo.learner(config, model, task, params)
        algorithm = grpo.make(config, model, task, params)
        state = algorithm.init(jax.random.key(2), hp)
        update = jax.jit(algorithm.update)
        first, seconds, (after, _) = timed(
            lambda previous: update(previous[0], None, hp), args.repeats, carry=(state, None)
        )
        optimize = jax.jit(learner.make_optimize(False))
        steps_first, steps_seconds, _ = timed(
            lambda: optimize(state, batch, hp, jax.random.key(3), state.params, None),
            args.repeats,
        )
        arm = dict(
            update_seconds=seconds,
            update_first_call_seconds=first,
            optimizer_steps_seconds=steps_seconds,
            optimizer_steps_first_call_seconds=steps_first,
            training_tokens=training_tokens(config, args.prompt, passes),
        )
        return arm, jax.device_get(after.params)

    figures, results = {}, {}
    for name, config in arms.items():
        figures[name], results[name] = measure(config)
        arm = figures[name]
        print(
            f"{name:>13}: update {arm['update_seconds']:.2f} s, optimizer steps "
            f"{arm['optimizer_steps_seconds']:.2f} s (median of {args.repeats}; first calls "
            f"{arm['update_first_call_seconds']:.1f} s, "
            f"{arm['optimizer_steps_first_call_seconds']:.1f} s); training tokens per update "
            f"{arm['training_tokens']['per_update']}",
            flush=True,
        )
    gap = max(
        float(np.abs(a - b).max())
        for a, b in zip(
            jax.tree.leaves(results["per_row"]),
            jax.tree.leaves(results["shared_prompt"]),
            strict=True,
        )
    )
    per_row, shared = figures["per_row"], figures["shared_prompt"]
    summary = dict(
        shape=dict(vars(args)),
        arms=figures,
        update_speedup=per_row["update_seconds"] / shared["update_seconds"],
        optimizer_steps_speedup=per_row["optimizer_steps_seconds"]
        / shared["optimizer_steps_seconds"],
        token_ratio=per_row["training_tokens"]["per_update"]
        / shared["training_tokens"]["per_update"],
        updates=1 + args.repeats,
        max_parameter_gap=gap,
        load_average_before=load_before,
        load_average_after=os.getloadavg(),
        device=str(jax.devices()[0]),
    )
    print(
        f"{args.model}, {args.batch_size} x {args.group_size}, prompt {args.prompt}, new "
        f"{args.new}, grad_accum_steps {args.grad_accum_steps}: {summary['token_ratio']:.1f}x "
        f"fewer training tokens; update {summary['update_speedup']:.2f}x faster, optimizer "
        f"steps {summary['optimizer_steps_speedup']:.2f}x; max |parameter gap| after "
        f"{1 + args.repeats} updates {gap:.2e}; load average {load_before[0]:.1f} before, "
        f"{summary['load_average_after'][0]:.1f} after (1 min)"
    )
    if args.out:
        Path(args.out).write_text(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
