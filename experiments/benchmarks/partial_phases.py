"""Where one GRPO update's time goes on `grpo.py:repeat_digit_long`, synchronous or with partial
rollouts, as trained (issue 39; the README's "Length-bucketed training" profile).

Each figure is a separately compiled piece, timed after warm-up updates from the SFT run:
- the whole update (`grpo.make`'s, jitted), median over --updates updates;
- the same update with `optimizer_steps.make_optimize` replaced by a no-op (rollout, scoring,
  bookkeeping);
- GRPO's optimizer steps alone (`optimizer_steps.make_optimize`) on batches captured from
  steady-state updates, as run and with the explicit no-grad old / proximal log-prob pass forced;
- one decode step of the model at the mode's rows x cache columns, and the prefill of a batch
  of prompts into a fresh cache.

    python experiments/sft.py --config=experiments/configs/sft.py:repeat_digit_long \\
        --workdir=runs/sft_long
    python experiments/benchmarks/partial_phases.py --init_from=runs/sft_long --mode=sync
    python experiments/benchmarks/partial_phases.py --init_from=runs/sft_long --mode=partial \\
        --budget=129 --rollout_groups=24
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from algos import grpo, optimizer_steps, partial  # noqa: E402
from jaxrl import hparams, sharding  # noqa: E402
from jaxrl.lm import training  # noqa: E402
from jaxrl.lm.model import Transformer, init_cache, positions_from_mask  # noqa: E402
from jaxrl.lm.sampler import generation_copy  # noqa: E402
from jaxrl.trainers import (  # noqa: E402
    base,
    lm_runs,
    prompt_data,  # noqa: E402
)


def seconds(fn, *args, reps: int = 20) -> float:
    """Median wall time of fn(*args) after one call (compile)."""
    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--init_from", required=True, help="the sft.py:repeat_digit_long run")
    parser.add_argument("--mode", default="partial", choices=("sync", "partial"))
    parser.add_argument("--budget", type=int, default=64)
    parser.add_argument("--rollout_groups", type=int, default=24)
    parser.add_argument("--max_staleness", type=int, default=4)
    parser.add_argument("--length_buckets", type=int, default=8)
    parser.add_argument("--warm", type=int, default=20, help="updates before timing")
    parser.add_argument("--updates", type=int, default=40, help="updates timed")
    args = parser.parse_args()

    flat = base.load_config("grpo", "repeat_digit_long")
    with flat.unlocked():
        flat.init_from, flat.length_buckets = args.init_from, args.length_buckets
        if args.mode == "partial":
            flat.rollout_mode, flat.rollout_budget = "partial", args.budget
            flat.max_staleness, flat.rollout_groups = args.max_staleness, args.rollout_groups
    # The run directory is named, never created: nothing is written.
    workdir = f"{tempfile.gettempdir()}/partial_phases"
    run = lm_runs.setup(flat, workdir, grpo.Config, "grpo", check_rollout=grpo.check_rollout)
    config, mesh, rollout = run.config, run.mesh, run.rollout
    max_staleness = getattr(rollout, "max_staleness", 0)
    prompts = prompt_data.read_task(run)
    params, model, _ = lm_runs.initial_params(run)
    task_data = jax.device_put(prompts.task.data, sharding.replicated(mesh))
    inputs, hp = grpo.Inputs(None, task_data), hparams.hparams(config)
    real_make_optimize = optimizer_steps.make_optimize
    captured = []

    def no_training(transformer, loss_fn, cfg, mesh):
        real = real_make_optimize(transformer, loss_fn, cfg, mesh)

        def optimize(state, batch, hp, key, policy, reference):
            # Keep the batch (for the optimizer timed alone) and return zero metrics.
            jax.debug.callback(lambda b: captured.append(jax.tree.map(np.asarray, b)), batch)
            shapes = jax.eval_shape(real, state, batch, hp, key, policy, reference)[1]
            return state, jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)

        return optimize

    def updates(label: str, stub: bool) -> tuple[float, object]:
        optimizer_steps.make_optimize = no_training if stub else real_make_optimize
        algorithm = grpo.make(config, model, prompts.task, params, mesh, rollout)
        optimizer_steps.make_optimize = real_make_optimize
        update = jax.jit(algorithm.update)
        state = algorithm.init(jax.random.key(0), hp)
        for _ in range(args.warm):
            state, metrics = update(state, inputs, hp)
        times, rows = [], []
        for _ in range(args.updates):
            start = time.perf_counter()
            state, metrics = jax.block_until_ready(update(state, inputs, hp))
            times.append(time.perf_counter() - start)
            rows.append(jax.device_get(metrics))
        means = {
            name: float(np.mean([row[name] for row in rows]))
            for name in ("decode_steps", "trained_groups", "trained_tokens", "completion_length")
            if name in rows[0]
        }
        # The median: a few updates of a run can take seconds (seen once, cause not found).
        ms = {"ms": np.median(times), "mean_ms": np.mean(times), "max_ms": np.max(times)}
        ms = {name: round(1e3 * value, 2) for name, value in ms.items()}
        print(json.dumps(dict(piece=label, **ms, **means)), flush=True)
        return float(np.mean(times)), state

    updates("whole update", stub=False)
    _, state = updates("update without training", stub=True)

    transformer = Transformer(model, mesh=mesh)
    loss_fn = grpo.make_loss(transformer, config, behaviour_clip=max_staleness > 0)
    train_state = training.TrainState(state.params, state.opt_state, state.key, state.step)
    batches = captured[-20:]
    for label, forced in (("training pass", False), ("training pass, proximal pass forced", True)):
        if forced:  # the explicit no-grad pass runs when samples are reused
            grpo.Config.reuses_samples = property(lambda self: True)
        optimize = jax.jit(real_make_optimize(transformer, loss_fn, hparams.static(config), mesh))
        key = jax.random.key(2)
        times = [
            seconds(optimize, train_state, b, hp, key, train_state.params, None, reps=1)
            for b in batches
        ]
        print(json.dumps(dict(piece=label, ms=round(1e3 * np.mean(times), 2))), flush=True)

    # One decode step and the prefill at this mode's shapes.
    groups = rollout.rollout_groups if args.mode == "partial" else config.batch_size
    batch = prompts.task.sample_prompts(jax.random.key(1), groups, task_data)
    prompt_length = batch.tokens.shape[1]  # the update's: prompts padded as a batch
    if args.mode == "partial":
        columns = partial.geometry(
            prompt_length, config.sampling.max_new_tokens, args.budget
        ).length
    else:
        columns = prompt_length + config.sampling.max_new_tokens
    rows = groups * config.group_size
    weights = generation_copy(params, model)

    @jax.jit
    def prefill(weights, tokens, mask):
        mask = mask.astype(bool)
        cache = init_cache(model, groups, columns)
        return transformer.apply(
            {"params": weights}, tokens, positions_from_mask(mask), mask, cache, logits_for_last=1
        )

    @jax.jit
    def decode_64(weights, cache):
        def step(i, cache):
            token = jnp.full((rows, 1), 5, jnp.int32)
            position = jnp.full((rows, 1), prompt_length + i)
            alive = jnp.ones((rows, 1), bool)
            return transformer.apply({"params": weights}, token, position, alive, cache)[1]

        return jax.lax.fori_loop(0, 64, step, cache)

    cache = dict(init_cache(model, rows, columns), index=jnp.asarray(prompt_length, jnp.int32))
    print(json.dumps(dict(
        piece="pieces", rows=rows, cache_columns=columns,
        prefill_ms=round(1e3 * seconds(prefill, weights, batch.tokens, batch.mask), 3),
        decode_step_ms=round(1e3 * seconds(decode_64, weights, cache, reps=10) / 64, 3),
    )))  # fmt: skip


if __name__ == "__main__":
    main()
