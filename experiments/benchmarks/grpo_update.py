"""Seconds per GRPO update and the memory XLA plans for it, at real model sizes with random
weights: the update the GRPO script compiles (`algos.grpo.make(...).update`: generation with the
KV-cache sampler, reward, advantages, loss, gradient and AdamW step; the state donated as the
runner donates it) on `memory_plan.py`'s synthetic task (prompts of exactly `--prompt_len`
random tokens, every completion `--new_tokens` long), at `grpo.Config`'s defaults otherwise
(remat none, one epoch of one minibatch, no KL penalty).

    python experiments/benchmarks/grpo_update.py --shape 7b --lora_rank 16          # lora7
    python experiments/benchmarks/grpo_update.py --shape 1.7b --lora_rank 0 --prompts 4

`grpo.make` runs the library's memory check first (`grpo.check_memory`: a one-line refusal when
the estimate exceeds the device), as a training run does. The update is compiled once (its
seconds and `compiled.memory_analysis()` reported: arguments + outputs not aliased to donated
arguments + temporaries, the peak XLA plans), run `--warmup` times, then `--steps` times, each
timed on its own; the device's own peak (`memory_stats()["peak_bytes_in_use"]`, GPUs) beside it,
read after initialising and after the updates.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from experiments.benchmarks.lm_shapes import MODEL_SHAPES  # noqa: E402
from experiments.benchmarks.memory_plan import planned_bytes  # noqa: E402

GIB = 1 << 30


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add = parser.add_argument
    add("--shape", choices=sorted(MODEL_SHAPES), default="7b")
    add("--lora_rank", type=int, default=16, help="0: every parameter trains")
    add("--prompts", type=int, default=2, help="prompts per update (grpo.Config.batch_size)")
    add("--group_size", type=int, default=8)
    add("--prompt_len", type=int, default=128)
    add("--new_tokens", type=int, default=256)
    add("--dtype", default="bfloat16", choices=("float32", "bfloat16"), help="compute dtype")
    add("--decode_unroll", type=int, default=0, help="ModelConfig.decode_unroll (0: auto)")
    add(
        "--attention",
        default="auto",
        choices=("auto", "xla", "cudnn"),
        help="ModelConfig.attention",
    )
    add("--param_dtype", default="bfloat16", choices=("float32", "bfloat16"))
    add("--steps", type=int, default=2, help="timed updates")
    add("--warmup", type=int, default=1, help="untimed updates after compiling")
    add("--seed", type=int, default=0)
    add("--json", default="", help="also write the report to this file")
    args = parser.parse_args()
    report: dict[str, Any] = {"status": "started"}
    try:
        measure(args, report)
    except Exception as error:  # noqa: BLE001 - out of memory, say, is a result too
        report.update(status="failed", message=f"{type(error).__name__}: {error}"[-600:])
        print(f"failed after {report.get('stage', 'the start')}: {report['message']}", flush=True)
        write(args, report)
        raise SystemExit(1) from error


def write(args: argparse.Namespace, report: dict[str, Any]) -> None:
    """The report so far to --json: after every stage, so a run stopped at its limit or failing
    keeps what it has."""
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1) + "\n")


def device_peak_gib() -> float | None:
    """The first device's peak memory in use so far (GiB), where the backend reports it."""
    import jax

    stats = jax.devices()[0].memory_stats() or {}
    peak = stats.get("peak_bytes_in_use")
    return None if peak is None else round(peak / GIB, 2)


def measure(args: argparse.Namespace, report: dict[str, Any]) -> None:
    """Build, compile and time the update, filling `report` as it goes."""
    import jax

    from algos import grpo
    from experiments.benchmarks.memory_plan import fixed_length_task
    from jaxrl import hparams
    from jaxrl.lm import memory
    from jaxrl.lm.model import ModelConfig, init_params
    from jaxrl.lm.sampler import Sampling

    model = ModelConfig(
        **MODEL_SHAPES[args.shape],
        dtype=args.dtype,
        param_dtype=args.param_dtype,
        attention=args.attention,
        decode_unroll=args.decode_unroll,
    )
    config = grpo.Config(
        batch_size=args.prompts,
        group_size=args.group_size,
        sampling=Sampling(max_new_tokens=args.new_tokens),
        lora_rank=args.lora_rank,
        num_steps=args.warmup + args.steps,
    )
    task = fixed_length_task(args.prompt_len, model.vocab_size)
    hp = hparams.hparams(config)
    key = jax.random.key(args.seed)
    estimate = memory.grpo_estimate(config, model, args.prompt_len)
    report.update(
        device=jax.devices()[0].device_kind,
        jax=jax.__version__,
        shape=args.shape,
        params=model.num_params(),
        lora_rank=args.lora_rank,
        dtype=model.dtype,
        param_dtype=model.param_dtype,
        remat=model.remat,
        batch=f"{args.prompts}x{args.group_size}x({args.prompt_len}+{args.new_tokens})",
        estimate_gib=round(estimate.total / GIB, 2),
        estimate_parts_gib={k: round(v / GIB, 2) for k, v in estimate.parts.items()},
    )

    write(args, report)
    start = time.perf_counter()
    params = jax.jit(lambda: init_params(model, key))()
    state = grpo.make(config, model, task, params).init(key, hp)
    del params  # the state holds its own copy
    # The update from an algorithm built on abstract parameters: the one built on concrete ones
    # keeps them alive (its init copies them), a second copy of the base weights.
    abstract = jax.eval_shape(lambda: init_params(model, key))
    update = grpo.make(config, model, task, abstract).update
    jax.block_until_ready(state)
    report.update(init_s=time.perf_counter() - start, stage="initialising")
    # The device's peak so far (the weights and their copy for the state): the peak read after
    # the updates is theirs only where it is larger.
    report["device_peak_init_gib"] = device_peak_gib()
    write(args, report)
    start = time.perf_counter()
    compiled = jax.jit(update, donate_argnums=0).lower(state, None, hp).compile()
    report["compile_s"] = time.perf_counter() - start
    planned = planned_bytes(compiled)
    if planned is not None:
        report["xla_temp_gib"] = round(planned["temp"] / GIB, 2)
        report["xla_argument_gib"] = round(planned["argument"] / GIB, 2)
        report["xla_total_gib"] = round(planned["total"] / GIB, 2)
    print(
        f"{args.shape} LoRA {args.lora_rank}, {report['batch']}, {model.dtype} over "
        f"{model.param_dtype}, remat {model.remat}: estimate {report['estimate_gib']} GiB, XLA "
        f"plan {report.get('xla_total_gib')} GiB (temporaries {report.get('xla_temp_gib')}); "
        f"compiled in {report['compile_s']:.1f} s",
        flush=True,
    )
    report.update(status="compiled", stage="compiling")
    write(args, report)

    for _ in range(args.warmup):
        state, metrics = compiled(state, None, hp)
    jax.block_until_ready(state)
    seconds = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        state, metrics = compiled(state, None, hp)
        jax.block_until_ready(state)
        seconds.append(time.perf_counter() - t0)
    metrics = jax.device_get(metrics)
    report.update(
        status="ok",
        update_s=seconds,
        median_update_s=statistics.median(seconds),
        completion_length=float(metrics["completion_length"]),
        loss=float(metrics["loss"]),
    )
    report["device_peak_gib"] = device_peak_gib()
    report["stage"] = "timing"
    print(
        f"{report['median_update_s']:.2f} s/update (each: "
        f"{', '.join(f'{s:.2f}' for s in seconds)}), device peak "
        f"{report.get('device_peak_gib')} GiB",
        flush=True,
    )
    write(args, report)


if __name__ == "__main__":
    main()
