"""DPO training throughput on CPU: our `algos.dpo` against TRL's `DPOTrainer`, side by side.

Both sides train the same tiny random Llama (vocab 512, hidden 256, MLP 688, 4 layers, 4 query
heads of 64, 2 kv heads, untied LM head: 3,164,416 parameters) in fp32 on batches of 8 preference
pairs, each a 32-token prompt with chosen and rejected answers of 32 tokens (31 words + EOS), so
every sequence is 64 tokens and a step scores 2 x 8 of them. beta 0.1, lr 1e-5, sigmoid loss.

Rows of the table (each a fresh worker process per repeat, so no side warms the other):

* trl:       /work/shared/peers/trl_dpo_bench.py with the TRL venv (`--trl_python`), fp32; the
             reference model runs its forward pass in every step. `--trl_extra "--bf16
             --grad_ckpt"` adds a second TRL row with those flags (TRL's own defaults).
* ours:      this script re-invoked as `--worker ours`, for every `--reference` mode and every
             `--steps_per_call` K (default: in_step and precomputed, K = 1 and 10).
             reference="in_step" is TRL's setting: the reference (a copy of the initial params)
             runs inside every step. reference="precomputed" scores the whole 512-pair dataset
             with the reference once before training; that pass is timed on its own ("ref pass s")
             and is not in the step times. K = 1 is one host dispatch per optimizer step, like
             TRL's loop; K = 10 runs 10 steps as one `lax.scan` per dispatch.

What is measured, as the peer script does it:

* s/step, pairs/s, tokens/s: wall clock from the end of step `--warmup` to the end of the last
  step, everything in between included: for ours, drawing the batch indices, gathering and
  stacking the rows in NumPy ([K, 1, 8, 64]), `jax.device_put`, the call and
  `jax.block_until_ready`, and fetching the per-step losses to the host (TRL logs every step).
  Tokens per pair are counted like the peer: prompt + chosen + rejected = 96. With K > 1 the
  warm-up is rounded up to whole calls and at least `--steps - --warmup` steps are timed.
* compile s: ours, `jax.jit(chunk, donate_argnums=0).lower(...).compile()` (the persistent
  compilation cache is off); TRL has no compile step (its slower first steps are in the JSON,
  `first_step_s` and `step_s_list`; ours has `first_call_s` and `call_s_list`).
* peak RSS: `ru_maxrss` of the worker process.
* MFU: model FLOPs per second over this machine's fp32 matmul peak. The peak is measured by a
  separate JAX worker (`--worker peak`, once per repeat; the best over repeats is used), timing
  jitted `jnp.dot` of `--peak_n`-square fp32 matrices (2 n^3 FLOPs each, best of several after a
  warm-up), so its large buffers count in no one's RSS. Model FLOPs per step: forward FLOPs per
  token from `ModelConfig.flops_per_token(context)` with context = 32.5, the mean number of
  keys a query of a causal 64-token sequence sees ((64 + 1) / 2), over 2 x 8 x 64 tokens, times
  4 with the reference in the step (policy forward + backward = 3 forwards, reference = 1) and
  times 3 with a precomputed reference (whose pass is outside the step). TRL's rows use the same
  FLOP count and the same peak (for a `--bf16` row that is still the fp32 peak).

Each side uses its default threads (torch's default; XLA's default). Ours runs with the XLA_FLAGS
that importing `jaxrl` sets, as our users run it. A side that fails is reported as failed (its
error goes to stderr) and the other rows are still measured.

From the repository root:

    python experiments/benchmarks/dpo_throughput.py --out dpo_throughput.json
    python experiments/benchmarks/dpo_throughput.py --repeats 1 --steps 6 --warmup 2   # quick
    python experiments/benchmarks/dpo_throughput.py --trl_extra "--bf16 --grad_ckpt"

Throughput on a shared machine is noisy (the peer README saw 5-15% between runs): run it with the
machine otherwise idle and `--repeats 3` or more; the table shows medians over repeats and the
range. Another busy process hurts torch's two OpenMP threads far more than XLA (TRL steps of 5 s
instead of 0.2 s were seen), so numbers from a loaded machine flatter us. Even idle, our step time
is bimodal from one process to the next (e.g. 225 or 270 ms), hence the repeats.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import resource
import shlex
import sys
import time
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
# Run directly, the script's folder is on sys.path, not the repository root.
sys.path.insert(0, str(REPO_ROOT))

from experiments.benchmarks._shared import (  # noqa: E402
    DEFAULT_PEER_DIR,
    EXPECTED_PARAMS,
    MODEL_SHAPE,
    TRL_MARKER,
    comma_list,
    count_backend_compiles,
    current_rss_mib,
    fmt,
    log,
    median_of,
    run_peak,
    run_process,
)

# The shared setup of the peer scripts (README of the peers folder): the model shape is in
# _shared.MODEL_SHAPE, the rest is fixed here on both sides.
BATCH_PAIRS = 8
PROMPT_LEN = 32
COMPLETION_LEN = 32  # 31 words + EOS
SEQ_LEN = PROMPT_LEN + COMPLETION_LEN
TOKENS_PER_PAIR = PROMPT_LEN + 2 * COMPLETION_LEN  # counted like the peer: prompt once
DATASET_ROWS = 512
BETA = 0.1
LEARNING_RATE = 1e-5
# Token ids as in the peer tokenizer: 0-3 are <pad> <eos> <bos> <unk>; words are drawn from 4-511.
EOS_ID = 1
FIRST_WORD_ID = 4
# Mean number of keys a query attends to in a causal sequence of SEQ_LEN tokens.
MEAN_CAUSAL_CONTEXT = (SEQ_LEN + 1) / 2

DEFAULT_STEPS = 20
DEFAULT_WARMUP = 2
DEFAULT_REPEATS = 3
DEFAULT_TIMEOUT_S = 900
DEFAULT_PEAK_N = 2048

RESULT_MARKER = "DPO_THROUGHPUT_RESULT "


# --------------------------------------------------------------------------------------------
# Worker side: ours


def make_dataset(seed: int) -> dict[str, Any]:
    """DATASET_ROWS random pairs in the tokenised-preference layout `dpo.score_pairs` reads:
    prompt (32 word ids) + answer (31 word ids + EOS), attention on all 64 positions and the loss
    on the 32 answer positions."""
    import numpy as np

    rng = np.random.default_rng(seed)
    prompts = rng.integers(FIRST_WORD_ID, MODEL_SHAPE["vocab_size"], (DATASET_ROWS, PROMPT_LEN))
    eos = np.full((DATASET_ROWS, 1), EOS_ID)
    loss_mask = np.zeros((DATASET_ROWS, SEQ_LEN), bool)
    loss_mask[:, PROMPT_LEN:] = True
    arrays = {}
    for side in ("chosen", "rejected"):
        words = rng.integers(
            FIRST_WORD_ID, MODEL_SHAPE["vocab_size"], (DATASET_ROWS, COMPLETION_LEN - 1)
        )
        arrays[f"{side}_tokens"] = np.concatenate([prompts, words, eos], axis=1).astype(np.int32)
        arrays[f"{side}_attention_mask"] = np.ones((DATASET_ROWS, SEQ_LEN), bool)
        arrays[f"{side}_loss_mask"] = loss_mask.copy()
    return arrays


class BatchDrawer:
    """Batches of BATCH_PAIRS rows, each epoch a fresh permutation (as a shuffling data loader
    would), stacked [K, 1, BATCH_PAIRS, ...] for a K-step chunk."""

    def __init__(self, arrays: dict[str, Any], seed: int):
        import numpy as np

        self.arrays = arrays
        self.rng = np.random.default_rng(seed + 1)
        self.order = self.rng.permutation(DATASET_ROWS)
        self.position = 0

    def _next_indices(self) -> Any:
        if self.position + BATCH_PAIRS > DATASET_ROWS:
            self.order = self.rng.permutation(DATASET_ROWS)
            self.position = 0
        index = self.order[self.position : self.position + BATCH_PAIRS]
        self.position += BATCH_PAIRS
        return index

    def chunk(self, steps: int) -> dict[str, Any]:
        import numpy as np

        index = np.stack([self._next_indices() for _ in range(steps)])  # [K, B]
        return {k: v[index][:, None] for k, v in self.arrays.items()}  # [K, 1, B, ...]


def run_ours(reference: str, steps_per_call: int, steps: int, warmup: int, seed: int, ref_batch):
    """Build, compile and time our DPO in this process; returns the measurements."""
    t_script = time.perf_counter()
    import jax
    import jax.numpy as jnp
    import numpy as np

    # Importing jaxrl (algos does) sets its XLA_FLAGS; XLA reads them when the backend starts.
    from algos import dpo
    from jaxrl.lm import training
    from jaxrl.lm.model import ModelConfig, init_params

    jax.config.update("jax_enable_compilation_cache", False)
    compiles = count_backend_compiles()

    model_config = ModelConfig(**MODEL_SHAPE)
    config = dpo.Config(
        learning_rate=LEARNING_RATE,
        batch_size=BATCH_PAIRS,
        grad_accum_steps=1,
        num_steps=steps,
        loss_type="sigmoid",
        beta=BETA,
        reference=reference,
    )
    params = init_params(model_config, jax.random.key(seed))
    n_params = sum(int(x.size) for x in jax.tree.leaves(params))
    assert n_params == model_config.num_params() == EXPECTED_PARAMS, n_params
    # Its own buffers: the state's params are donated to the first call.
    reference_params = jax.tree.map(jnp.copy, params)
    state = training.init_state(params, config.optimizer())
    arrays = make_dataset(seed)
    drawer = BatchDrawer(arrays, seed)

    result: dict[str, Any] = {"side": "ours", "reference": reference, "K": steps_per_call}
    result["rss_after_setup_mib"] = current_rss_mib()
    reference_table = None
    if reference == "precomputed":
        score = jax.jit(dpo.make_score(model_config))
        sample = {k: v[:ref_batch] for k, v in arrays.items()}
        start = time.perf_counter()
        compiled_score = score.lower(reference_params, sample).compile()
        result["ref_compile_s"] = time.perf_counter() - start
        start = time.perf_counter()
        reference_table = dpo.reference_log_probs(
            compiled_score, reference_params, arrays, ref_batch
        )
        result["ref_pass_s"] = time.perf_counter() - start
        result["ref_batch_size"] = ref_batch
        arrays = {**arrays, **reference_table}
        drawer.arrays = arrays
        step_extra = None
    else:
        step_extra = reference_params

    chunk = jax.jit(dpo.make_train_chunk(model_config, config), donate_argnums=0)
    example = jax.device_put(drawer.chunk(steps_per_call))
    drawer = BatchDrawer(arrays, seed)  # the timed run starts from the first batch again
    start = time.perf_counter()
    compiled = chunk.lower(state, example, step_extra).compile()
    result["compile_s"] = time.perf_counter() - start
    result["rss_before_train_mib"] = current_rss_mib()
    del example

    warmup_calls = math.ceil(warmup / steps_per_call)
    timed_calls = math.ceil(max(steps - warmup, 1) / steps_per_call)
    n_calls = warmup_calls + timed_calls
    compiles_before = compiles()
    losses: list[float] = []
    call_end, call_s, host_s = [], [], []
    t_train = time.perf_counter()
    for _ in range(n_calls):
        begin = time.perf_counter()
        batches = jax.device_put(drawer.chunk(steps_per_call))
        prepared = time.perf_counter()
        state, metrics = compiled(state, batches, step_extra)
        jax.block_until_ready((state, metrics))
        losses.extend(float(x) for x in np.asarray(jax.device_get(metrics["loss"])))
        end = time.perf_counter()
        call_end.append(end)
        call_s.append(end - begin)
        host_s.append(prepared - begin)
    window_start = call_end[warmup_calls - 1] if warmup_calls else t_train
    steady_s = call_end[-1] - window_start
    timed_steps = timed_calls * steps_per_call
    pairs = timed_steps * BATCH_PAIRS
    result.update(
        {
            "status": "ok",
            "params": n_params,
            "steps": n_calls * steps_per_call,
            "warmup_steps_excluded": warmup_calls * steps_per_call,
            "timed_steps": timed_steps,
            "steady_wall_s": steady_s,
            "steady_s_per_step": steady_s / timed_steps,
            "pairs_per_s": pairs / steady_s,
            "tokens_per_s": pairs * TOKENS_PER_PAIR / steady_s,
            "first_call_s": call_s[0],
            "call_s_list": call_s,
            "host_prep_s_list": host_s,  # index draw + gather + device_put, inside call_s
            "compiles_while_training": compiles() - compiles_before,
            "loss_first": losses[0],
            "loss_last": losses[-1],
            "losses": losses,
            "total_script_s": time.perf_counter() - t_script,
            "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "backend": jax.default_backend(),
            "jax_version": jax.__version__,
            "xla_flags": os.environ.get("XLA_FLAGS", ""),
        }
    )
    return result


# --------------------------------------------------------------------------------------------
# Parent side: workers, FLOPs, the table


def flops_per_step(in_step_reference: bool) -> float:
    """Model FLOPs of one DPO step (module docstring)."""
    from jaxrl.lm.model import ModelConfig

    forward_per_token = ModelConfig(**MODEL_SHAPE).flops_per_token(MEAN_CAUSAL_CONTEXT)
    forward = forward_per_token * 2 * BATCH_PAIRS * SEQ_LEN
    return forward * (4 if in_step_reference else 3)


def variants(args: argparse.Namespace) -> list[dict[str, Any]]:
    rows = [{"name": "trl fp32", "side": "trl", "extra": [], "in_step": True}]
    if args.trl_extra:
        extra = shlex.split(args.trl_extra)
        rows.append({"name": f"trl {' '.join(extra)}", "side": "trl", "extra": extra})
        rows[-1]["in_step"] = True
    for reference in args.reference:
        for k in args.steps_per_call:
            name = f"ours {reference} K={k}"
            rows.append({"name": name, "side": "ours", "reference": reference, "K": k})
            rows[-1]["in_step"] = reference == "in_step"
    return rows


def command_for(variant: dict[str, Any], args: argparse.Namespace) -> list[str]:
    if variant["side"] == "trl":
        script = str(Path(args.peer_dir) / "trl_dpo_bench.py")
        return [
            args.trl_python,
            script,
            *("--steps", str(args.steps), "--warmup", str(args.warmup)),
            *("--batch_size", str(BATCH_PAIRS), "--prompt_len", str(PROMPT_LEN)),
            *("--completion_len", str(COMPLETION_LEN), "--seed", str(args.seed)),
            *variant["extra"],
        ]
    return [
        sys.executable,
        str(Path(__file__).resolve()),
        *("--worker", "ours", "--reference", variant["reference"]),
        *("--steps_per_call", str(variant["K"]), "--steps", str(args.steps)),
        *("--warmup", str(args.warmup), "--seed", str(args.seed)),
        *("--ref_batch_size", str(args.ref_batch_size)),
    ]


def describe(result: dict[str, Any]) -> str:
    if result["status"] != "ok":
        return f"FAILED ({result['status']}): {result.get('message', '')}"
    if result["side"] == "peak":
        return f"fp32 matmul peak {result['peak_flops_per_s'] / 1e9:.1f} GFLOP/s"
    text = (
        f"{result['steady_s_per_step'] * 1e3:.1f} ms/step, {result['pairs_per_s']:.1f} pairs/s, "
        f"peak RSS {result['peak_rss_mib']:.0f} MiB"
    )
    if "compile_s" in result:
        text += f", compile {result['compile_s']:.1f} s, first call {result['first_call_s']:.2f} s"
    if "ref_pass_s" in result:
        text += f", reference pass {result['ref_pass_s']:.2f} s"
    if result.get("compiles_while_training"):
        text += f", {result['compiles_while_training']} compiles while training"
    return text


def summarise(rows: list[dict[str, Any]], peak: float | None) -> None:
    """Adds MFU to every ok run and a `median` dict to every row."""
    for row in rows:
        flops = flops_per_step(row["in_step"])
        row["model_flops_per_step"] = flops
        ok = [r for r in row["runs"] if r["status"] == "ok"]
        for run in ok:
            run["model_flops_per_s"] = flops / run["steady_s_per_step"]
            run["mfu"] = run["model_flops_per_s"] / peak if peak else None
        keys = ("steady_s_per_step", "pairs_per_s", "tokens_per_s", "mfu", "compile_s")
        keys += ("ref_pass_s", "peak_rss_mib", "model_flops_per_s")
        row["median"] = {key: median_of(ok, key) for key in keys}
        row["ok_runs"] = len(ok)


def format_table(rows: list[dict[str, Any]]) -> str:
    baseline = next((r for r in rows if r["name"] == "trl fp32"), None)
    base = baseline["median"]["pairs_per_s"] if baseline and baseline["ok_runs"] else None
    header = ["run", "ok", "ms/step", "pairs/s", "pairs/s range", "tokens/s", "MFU %"]
    header += ["compile s", "ref pass s"]
    header += ["peak RSS MiB", "loss first -> last", "pairs/s vs trl fp32"]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    for row in rows:
        m = row["median"]
        ok = [r for r in row["runs"] if r["status"] == "ok"]
        loss = f"{ok[0]['loss_first']:.4f} -> {ok[0]['loss_last']:.4f}" if ok else "-"
        rates = [r["pairs_per_s"] for r in ok]
        spread = f"{min(rates):.1f}-{max(rates):.1f}" if rates else "-"
        ratio = m["pairs_per_s"] / base if base and m["pairs_per_s"] else None
        cells = [
            row["name"],
            f"{row['ok_runs']}/{len(row['runs'])}",
            fmt(m["steady_s_per_step"], ".1f", 1e3),
            fmt(m["pairs_per_s"], ".1f"),
            spread,
            fmt(m["tokens_per_s"], ",.0f"),
            fmt(m["mfu"], ".1f", 100),
            fmt(m["compile_s"], ".1f"),
            fmt(m["ref_pass_s"], ".2f"),
            fmt(m["peak_rss_mib"], ".0f"),
            loss,
            "-" if ratio is None else f"{ratio:.2f}",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def run_benchmark(args: argparse.Namespace) -> None:
    rows = variants(args)
    for row in rows:
        row["runs"] = []
    peaks: list[dict[str, Any]] = []
    peak_command = [sys.executable, str(Path(__file__).resolve()), "--worker", "peak"]
    peak_command += ["--peak_n", str(args.peak_n)]
    for repeat in range(args.repeats):
        for row in rows:
            command = command_for(row, args)
            result = {"side": row["side"], **run_process(command, _marker(row), args.timeout)}
            result["command"] = shlex.join(command)
            row["runs"].append(result)
            log(f"[{repeat + 1}/{args.repeats}] {row['name']}: {describe(result)}")
            if result["status"] == "ok" and result.get("params") != EXPECTED_PARAMS:
                log(f"  warning: {result.get('params')} params, not {EXPECTED_PARAMS}")
        result = run_process(peak_command, RESULT_MARKER, args.timeout)
        peaks.append(result)
        log(f"[{repeat + 1}/{args.repeats}] peak: {describe(result)}")

    ok_peaks = [p["peak_flops_per_s"] for p in peaks if p["status"] == "ok"]
    peak = max(ok_peaks) if ok_peaks else None
    summarise(rows, peak)
    print(format_table(rows))
    peak_text = f"{peak / 1e9:.1f} GFLOP/s" if peak else "unmeasured"
    print(
        f"\nMedians over {args.repeats} repeat(s); {args.steps} steps, first {args.warmup} "
        f"excluded; fp32 matmul peak {peak_text} (jnp.dot {args.peak_n}^2, best of all runs); "
        f"model GFLOP/step {flops_per_step(True) / 1e9:.2f} with the reference in the step, "
        f"{flops_per_step(False) / 1e9:.2f} with it precomputed."
    )
    for row in rows:
        for index, run in enumerate(row["runs"]):
            if run["status"] != "ok":
                log(f"{row['name']} run {index + 1} failed ({run['status']}): {run.get('message')}")
    if args.out:
        report = {
            "settings": {
                "model": MODEL_SHAPE,
                "params": EXPECTED_PARAMS,
                "batch_pairs": BATCH_PAIRS,
                "prompt_len": PROMPT_LEN,
                "completion_len": COMPLETION_LEN,
                "tokens_per_pair": TOKENS_PER_PAIR,
                "beta": BETA,
                "learning_rate": LEARNING_RATE,
                "steps": args.steps,
                "warmup": args.warmup,
                "repeats": args.repeats,
                "seed": args.seed,
                "ref_batch_size": args.ref_batch_size,
                "mean_causal_context": MEAN_CAUSAL_CONTEXT,
                "trl_python": args.trl_python,
                "peer_dir": str(args.peer_dir),
                "trl_extra": args.trl_extra,
            },
            "machine": {"platform": platform.platform(), "cpu_count": os.cpu_count()},
            "peak_flops_per_s": peak,
            "peak_runs": peaks,
            "rows": rows,
        }
        Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
        print(f"wrote {args.out}", file=sys.stderr)


def _marker(row: dict[str, Any]) -> str:
    return TRL_MARKER if row["side"] == "trl" else RESULT_MARKER


# --------------------------------------------------------------------------------------------
# Command line


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n", 1)[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    add = parser.add_argument
    add("--steps", type=int, default=DEFAULT_STEPS, help="optimizer steps per run")
    add("--warmup", type=int, default=DEFAULT_WARMUP, help="steps left out of the timed window")
    add("--repeats", type=int, default=DEFAULT_REPEATS, help="fresh-process runs of every row")
    add(
        "--steps_per_call",
        type=comma_list(int),
        default=[1, 10],
        help="ours: comma-separated optimizer steps per dispatch, one row each",
    )
    add(
        "--reference",
        type=comma_list(str),
        default=["in_step", "precomputed"],
        help="ours: comma-separated reference modes, one row each (empty: TRL only)",
    )
    add("--ref_batch_size", type=int, default=64, help="ours: pairs per call of the reference pass")
    add("--trl_python", default="/tmp/trl/bin/python", help="python of a venv with TRL")
    add("--peer_dir", default=str(DEFAULT_PEER_DIR), help="folder of trl_dpo_bench.py")
    add("--trl_extra", default="", help='flags for a second TRL row, e.g. "--bf16 --grad_ckpt"')
    add("--peak_n", type=int, default=DEFAULT_PEAK_N, help="matrix size of the matmul peak")
    add("--seed", type=int, default=0)
    add("--timeout", type=float, default=DEFAULT_TIMEOUT_S, help="seconds before killing a worker")
    add("--out", default=None, help="write every raw run and the medians to this JSON file")
    # Internal: one measurement in this process.
    add("--worker", choices=("ours", "peak"), default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if min(args.steps, args.repeats, args.ref_batch_size, args.peak_n, *args.steps_per_call) <= 0:
        parser.error("--steps, --repeats, --steps_per_call, --ref_batch_size, --peak_n must be > 0")
    if not 0 <= args.warmup < args.steps:
        parser.error("--warmup must be in [0, --steps)")
    for reference in args.reference:
        if reference not in ("in_step", "precomputed"):
            parser.error(f"--reference: unknown mode {reference!r}; use in_step or precomputed")
    if args.worker == "ours" and not len(args.reference) == len(args.steps_per_call) == 1:
        parser.error("--worker ours measures one row: one --reference, one --steps_per_call")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.worker == "ours":
        result = run_ours(
            args.reference[0],
            args.steps_per_call[0],
            args.steps,
            args.warmup,
            args.seed,
            args.ref_batch_size,
        )
    elif args.worker == "peak":
        result = run_peak(args.peak_n)
    else:
        run_benchmark(args)
        return
    print(RESULT_MARKER + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
