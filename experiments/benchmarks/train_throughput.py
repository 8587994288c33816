"""Trainer-only throughput at long sequences, the way prime-rl's trainer benchmark reports it:
tokens/s and MFU of the library's own GRPO optimizer step on random sequences, no generation.

One optimizer step is `algos.optimizer_steps.make_optimize` over `grpo.make_loss` (the policy
loss on completion log-probs, the head in chunks: `jaxrl.lm.model.head_log_probs`), AdamW with
clipping from `jaxrl.lm.training`, on `--sequences` rows of `--seq_len` tokens (the first
`--prompt_len` of each are the prompt, the rest the trained completion), accumulated over
`--grad_accum_steps` micro-batches. With `--lora_rank` > 0 only the adapters train
(`jaxrl.lm.lora`). The remat policy is the first of none, save_dots, full whose estimate
(`jaxrl.lm.memory.update_estimate`) passes the memory check the algorithms run before they
compile (`memory.check_fits`); `--remat` names one instead. The step is compiled once (its
seconds and XLA's memory plan, `compiled.memory_analysis()`, reported), run `--warmup` times,
then `--steps` times, timed from the end of the warm-up to the end of the last step.

    python experiments/benchmarks/train_throughput.py --shape qwen3-0.6b --seq_len 16384
    python experiments/benchmarks/train_throughput.py --shape qwen3-4b --lora_rank 16 \\
        --param_dtype bfloat16

Model FLOPs per token, prime-rl's count (its trainer's PerfCounter, torchtitan's convention):
6 x the matmul weights a token passes (every projection and the LM head; the embedding lookup
is no matmul) + 12 x layers x hidden_size x seq_len for attention (causal masking not
discounted); with LoRA, 4 x the frozen matmul weights (forward and input gradient) + 6 x the
adapters' + the same attention term. Every token of a sequence counts, the prompt's too. MFU is
those FLOPs per second over the bf16 matmul peak measured in the same process
(`generation.matmul_peak`, a `--peak_n`-square product) and, on an H100 or H200, over the 989
TFLOP/s prime-rl divides by (its 11.1% for Qwen3-0.6B at 16k tokens is 11.9k tokens/s over 989).

`--fallback LEN[:REMAT],...`: when the step does not fit at `--seq_len` (XLA's plan exceeds the
device's memory, or running it runs out), try these in turn (each its own compile), so a first
run still gets a figure: e.g. `16384:full,8192` (the same length with remat "full", then 8,192
tokens with the policy the memory check chooses). `--attention` (`ModelConfig.attention`):
"auto" runs cuDNN's fused attention on a GPU (`jaxrl.lm.model.packed_attention`), "xla" XLA's,
which writes each layer's [heads, T, T] fp32 scores: compiled on the CPU (XLA:CPU's plan,
compile only, 2026-11-27), Qwen3-0.6B's step at 16,384 tokens plans 81.6 GiB with remat none
(75 of them temporaries, mostly the scores and their gradient), 70.2 GiB with full, and 32.2
GiB at 8,192 tokens with none; on one H200 (2026-11-28, before cuDNN) 65.3 GiB with none.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

# Run from the repository root as `python3 experiments/benchmarks/train_throughput.py`.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from experiments.benchmarks.lm_shapes import MODEL_SHAPES  # noqa: E402
from experiments.benchmarks.memory_plan import planned_bytes  # noqa: E402

SHAPES = ("tiny", "qwen3-0.6b", "qwen3-4b", "smollm2", "1.7b", "7b")
REMAT_ORDER = ("none", "save_dots", "full")  # least recomputation first
GIB = 1 << 30
# prime-rl's dense bf16 peak of an H100 SXM / H200 (trainer/perf.py), for its MFU figures.
PRIME_RL_PEAK = {"H100": 989e12, "H200": 989e12}


def matmul_weights(model: Any) -> int:
    """Weights in a token's matmuls: every layer's projections and MLP, and the LM head."""
    d, h, kv, hd = model.hidden_size, model.num_heads, model.num_kv_heads, model.dims_per_head
    per_layer = 2 * d * h * hd + 2 * d * kv * hd + 3 * d * model.intermediate_size
    return model.num_layers * per_layer + model.vocab_size * d


def flops_per_token(model: Any, seq_len: int, adapter_params: int = 0) -> float:
    """prime-rl's training FLOPs per token (module docstring): 6 x matmul weights (4 x with
    LoRA, plus 6 x the adapters') + 12 x layers x hidden x seq_len."""
    attention = 12 * model.num_layers * model.hidden_size * seq_len
    if adapter_params:
        return 4.0 * matmul_weights(model) + 6.0 * adapter_params + attention
    return 6.0 * matmul_weights(model) + attention


def out_of_memory(error: BaseException) -> bool:
    text = f"{type(error).__name__}: {error}"
    return "RESOURCE_EXHAUSTED" in text or "out of memory" in text.lower()


def choose_remat(model: Any, config: Any, seq_len: int, new_tokens: int) -> tuple[str, Any]:
    """The first policy of REMAT_ORDER whose estimate passes `memory.check_fits` (no check where
    the device does not report its memory: "none"), and that estimate."""
    from jaxrl.config import ConfigError
    from jaxrl.lm import memory

    estimate = None
    for policy in REMAT_ORDER:
        candidate = dataclasses.replace(model, remat=policy)
        estimate = memory.update_estimate(
            candidate,
            rows=config.micro_batch_size,
            length=seq_len,
            scored=new_tokens,
            lora_rank=config.lora_rank,
            lora_targets=config.lora_targets,
        )
        try:
            memory.check_fits(estimate, candidate, "train_throughput")
        except ConfigError:
            continue
        return policy, estimate
    return REMAT_ORDER[-1], estimate


def device_peak_gib() -> float | None:
    """The first device's peak memory in use so far (GiB), where the backend reports it."""
    import jax

    stats = jax.devices()[0].memory_stats() or {}
    peak = stats.get("peak_bytes_in_use")
    return None if peak is None else round(peak / GIB, 2)


def attempts(args: argparse.Namespace) -> list[tuple[int, str]]:
    """(seq_len, remat) to try in turn: --seq_len at --remat, then each --fallback entry."""
    tried = [(args.seq_len, args.remat)]
    for entry in filter(None, args.fallback.split(",")):
        length, _, remat = entry.partition(":")
        remat = remat or "auto"
        if remat not in ("auto", *REMAT_ORDER) or not length.isdigit():
            raise SystemExit(f"--fallback: {entry!r}; give LEN or LEN:REMAT (auto, none, ...)")
        tried.append((int(length), remat))
    return tried


def measure(args: argparse.Namespace, seq_len: int, remat: str) -> dict[str, Any]:
    """Build, compile and time the optimizer step at `seq_len` with remat policy `remat` ("auto":
    the memory check's choice); the row of the report."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from algos import grpo, optimizer_steps
    from jaxrl import hparams
    from jaxrl.hparams import static
    from jaxrl.lm import memory, training
    from jaxrl.lm.model import ModelConfig, Transformer, init_params, packed_attention
    from jaxrl.lm.sampler import Sampling

    new_tokens = seq_len - args.prompt_len
    model = ModelConfig(
        **MODEL_SHAPES[args.shape],
        dtype=args.dtype,
        param_dtype=args.param_dtype,
        attention=args.attention,
    )
    # GRPO's settings for the loss and the optimizer: one prompt, `sequences` completions of it.
    config = grpo.Config(
        batch_size=1,
        group_size=args.sequences,
        sampling=Sampling(max_new_tokens=new_tokens),
        grad_accum_steps=args.grad_accum_steps,
        lora_rank=args.lora_rank,
        num_steps=args.warmup + args.steps,
    )
    chosen_by = "memory check" if remat == "auto" else "given"
    if remat == "auto":
        remat, estimate = choose_remat(model, config, seq_len, new_tokens)
    else:
        estimate = memory.update_estimate(
            dataclasses.replace(model, remat=remat),
            rows=config.micro_batch_size,
            length=seq_len,
            scored=new_tokens,
            lora_rank=config.lora_rank,
            lora_targets=config.lora_targets,
        )
    model = dataclasses.replace(model, remat=remat)
    adapters = 0
    if args.lora_rank:
        adapters = memory.lora_params(model, args.lora_rank, config.lora_targets)
    row: dict[str, Any] = dict(
        shape=args.shape,
        seq_len=seq_len,
        prompt_len=args.prompt_len,
        sequences_per_step=args.sequences,
        grad_accum_steps=args.grad_accum_steps,
        lora_rank=args.lora_rank,
        dtype=model.dtype,
        param_dtype=model.param_dtype,
        remat=remat,
        remat_chosen_by=chosen_by,
        params=model.num_params(),
        adapter_params=adapters,
        attention=packed_attention(model) or "xla",
        estimate_gib=round(estimate.total / GIB, 2),
        flops_per_token=flops_per_token(model, seq_len, adapters),
    )

    hp = hparams.hparams(config)
    transformer = Transformer(model)
    optimize = optimizer_steps.make_optimize(
        transformer, grpo.make_loss(transformer, config), static(config), None
    )
    key = jax.random.key(args.seed)
    params = jax.jit(lambda: init_params(model, key))()
    state = training.make_init(params, config, None, model)(key, hp)
    del params  # the state holds its own copy

    rng = np.random.default_rng(args.seed)
    rows = args.sequences
    batch = {
        "tokens": jnp.asarray(rng.integers(0, model.vocab_size, (rows, seq_len)), jnp.int32),
        "attention_mask": jnp.ones((rows, seq_len), bool),
        "completion_mask": jnp.ones((rows, new_tokens), bool),
        # Non-zero advantages, so that every step has a gradient to apply.
        "advantages": jnp.asarray(rng.standard_normal(rows), jnp.float32),
        "weights": jnp.ones((rows,), jnp.float32),
    }
    shuffle_key = jax.random.key(args.seed + 1)
    row["device_peak_init_gib"] = device_peak_gib()  # weights, their copy, the batch

    def step(state: Any, batch: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
        # One sampled batch, one optimizer step (num_epochs = num_minibatches = 1): neither the
        # old policy's nor a reference's log-probs are computed.
        state, metrics = optimize(state, batch, hp, shuffle_key, None, None)
        return state, jax.tree.map(jnp.mean, metrics)

    start = time.perf_counter()
    compiled = jax.jit(step, donate_argnums=0).lower(state, batch).compile()
    row["compile_s"] = time.perf_counter() - start
    planned = planned_bytes(compiled)
    if planned is not None:
        row["xla_temp_gib"] = round(planned["temp"] / GIB, 2)
        row["xla_total_gib"] = round(planned["total"] / GIB, 2)
    print(
        f"{args.shape} seq {seq_len} x {rows} (micro-batches of {config.micro_batch_size}), "
        f"remat {remat} ({row['remat_chosen_by']}), attention {row['attention']}, "
        f"estimate {row['estimate_gib']} GiB, XLA plan "
        f"{row.get('xla_total_gib')} GiB; compiled in {row['compile_s']:.1f} s",
        flush=True,
    )
    limit = memory.device_memory()
    if planned is not None and limit is not None and planned["total"] > limit:
        # Running it would fail allocating: say so now, without spending the time.
        message = (
            f"XLA plans {planned['total'] / GIB:.2f} GiB, the device holds {limit / GIB:.2f} GiB"
        )
        return dict(row, status="oom", message=message)

    try:
        for _ in range(args.warmup):
            state, metrics = compiled(state, batch)
        jax.block_until_ready(state)
        seconds = []
        begin = time.perf_counter()
        for _ in range(args.steps):
            t0 = time.perf_counter()
            state, metrics = compiled(state, batch)
            jax.block_until_ready(state)
            seconds.append(time.perf_counter() - t0)
    except Exception as error:  # noqa: BLE001 - running out of memory is a result
        if not out_of_memory(error):
            raise
        return dict(row, status="oom", message=f"{type(error).__name__}: {error}"[-600:])
    window = time.perf_counter() - begin
    metrics = {k: float(v) for k, v in jax.device_get(metrics).items()}
    if args.trace:  # one more step, untimed, under the profiler
        from experiments.benchmarks.harness import Step, trace_call

        one = Step(lambda state, _: (compiled(state, batch)[0], {}))
        row["trace"] = trace_call(one, state, args.trace)
    tokens = rows * seq_len * args.steps
    row.update(
        status="ok",
        step_s=seconds,
        median_step_s=statistics.median(seconds),
        tokens_per_s=tokens / window,
        loss=metrics.get("loss"),
        grad_norm=metrics.get("grad_norm"),
    )
    row["device_peak_gib"] = device_peak_gib()
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add = parser.add_argument
    add("--shape", choices=SHAPES, default="qwen3-0.6b")
    add("--seq_len", type=int, default=16384, help="tokens per sequence, prompt included")
    add("--prompt_len", type=int, default=256, help="of seq_len: context, not trained")
    add("--sequences", type=int, default=2, help="sequences per optimizer step (>= 2)")
    add("--grad_accum_steps", type=int, default=2, help="micro-batches per optimizer step")
    add("--lora_rank", type=int, default=0, help="0: every parameter trains")
    add("--dtype", default="bfloat16", choices=("float32", "bfloat16"), help="compute dtype")
    add(
        "--attention",
        default="auto",
        choices=("auto", "xla", "cudnn"),
        help="ModelConfig.attention",
    )
    add("--param_dtype", default="float32", choices=("float32", "bfloat16"))
    add("--remat", default="auto", choices=("auto", *REMAT_ORDER), help="auto: the memory check")
    add("--steps", type=int, default=3, help="timed optimizer steps")
    add("--warmup", type=int, default=1, help="untimed optimizer steps after compiling")
    add("--fallback", default="", help="LEN[:REMAT],... to try in turn where it does not fit")
    add("--peak_n", type=int, default=8192, help="matrix size of the bf16 matmul peak")
    add("--seed", type=int, default=0)
    add("--json", default="", help="also write the report to this file")
    add("--trace", default="", help="a jax.profiler trace of one more step of the row that ran")
    args = parser.parse_args()

    import jax
    import jax.numpy as jnp

    from experiments.benchmarks.generation import matmul_peak

    device = jax.devices()[0].device_kind
    peak = matmul_peak(jnp.bfloat16, 3, args.peak_n)
    datasheet = next((v for k, v in PRIME_RL_PEAK.items() if k in device), None)
    print(f"{device}: bf16 matmul peak {peak / 1e9:,.0f} GFLOP/s (n={args.peak_n})", flush=True)
    report: dict[str, Any] = dict(
        device=device,
        jax=jax.__version__,
        peak_flops=peak,
        peak_n=args.peak_n,
        prime_rl_peak_flops=datasheet,
        flops_formula="6 x matmul weights (LoRA: 4 x, + 6 x adapters) + 12 x layers x hidden x seq",
        rows=[],
    )
    for seq_len, remat in attempts(args):
        if any((r["seq_len"], r.get("remat")) == (seq_len, remat) for r in report["rows"]):
            continue  # the memory check had already chosen it: it did not fit
        gc.collect()  # a row that ran out of memory leaves nothing behind for the next
        if not 0 < args.prompt_len < seq_len:
            raise SystemExit(f"--prompt_len {args.prompt_len}: use 1 to {seq_len - 1}")
        try:
            row = measure(args, seq_len, remat)
        except Exception as error:  # noqa: BLE001 - a failed row is a result too
            status = "oom" if out_of_memory(error) else "error"
            message = f"{type(error).__name__}: {error}"[-600:]
            row = dict(shape=args.shape, seq_len=seq_len, remat=remat, status=status)
            row["message"] = message
        if row["status"] != "ok":
            what = f"{args.shape} seq {seq_len} remat {row['remat']}: {row['status']}"
            print(f"{what}: {row['message'][-300:]}", flush=True)
        else:
            achieved = row["tokens_per_s"] * row["flops_per_token"]
            row["mfu"] = achieved / peak
            row["mfu_prime_rl_peak"] = achieved / datasheet if datasheet else None
            print(
                f"{args.shape} seq {seq_len}: {row['tokens_per_s']:,.0f} tokens/s, "
                f"{row['median_step_s']:.3f} s/step, MFU {100 * row['mfu']:.1f}% of the "
                f"measured peak"
                + (f", {100 * row['mfu_prime_rl_peak']:.1f}% of 989 TFLOP/s" if datasheet else "")
                + f", device peak {row.get('device_peak_gib')} GiB",
                flush=True,
            )
        report["rows"].append(row)
        if args.json:  # after every row: a step stopped at its limit keeps what it measured
            Path(args.json).write_text(json.dumps(report, indent=1) + "\n")
        if row["status"] == "error":
            raise SystemExit(1)  # not a size that does not fit: no shorter length is tried
        if row["status"] == "ok":
            return
    raise SystemExit(1)  # no length fitted


if __name__ == "__main__":
    main()
