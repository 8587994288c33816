"""The acceptance figures of gpu_checks.sh's steps, read from its logs folder, as one short table
(the last lines of a device call's output):

    python experiments/benchmarks/gpu_summary.py LOGS_DIR

Issue 35: decoding step / roofline at batch 32 and 128 (gen17, gen135; want <= 2), GRPO seconds
per update ours against TRL bf16 (grpo17; want TRL / ours >= 4), DPO MFU against the bf16 matmul
peak (dpo17; want >= 35%). Issue 46: trainer-only tokens/s and MFU at 16k-token sequences
(train06, train06_4b; prime-rl: 11.9k tokens/s, 11.1% MFU for Qwen3-0.6B; want >= 1.5x), seconds
per 7B LoRA GRPO update and XLA's planned memory (lora7), a decode step's attention per cache
layout (attn17). Issue 39: trained tokens/s of sync,
partial and async GRPO on repeat_digit_long (partial_*.jsonl, the updates after the first
`--skip`). Standard library only."""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any


def load(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def decode_attention(logs: Path) -> list[str]:
    """attn17: a decode step's attention alone per cache layout, against reading the cache."""
    report = load(logs / "attn17.json")
    if report is None:
        return []
    lines = [f"attn17: decode attention on {report['device']}"]
    for row in report["rows"]:
        if "error" in row:
            lines.append(f"  batch {row['batch']:4d} {row['variant']:6s}: {row['error']}")
            continue
        lines.append(
            f"  batch {row['batch']:4d} {row['variant']:6s}: {row['us_per_layer']:6.1f} us a "
            f"layer, {row['ratio']:.2f}x reading the cache, output gap {row['relative_gap']:.1e}"
        )
    return lines


def generation(logs: Path) -> list[str]:
    lines = []
    for name in ("gen17", "gen135"):
        report = load(logs / f"{name}.json")
        if report is None:
            continue
        head = (
            f"{name}: {report['model']} {report['dtype']} on {report['device']}: "
            f"{report['bandwidth_bytes_per_s'] / 1e12:.2f} TB/s, "
            f"peak {report['matmul_peak_flops'] / 1e12:.0f} TFLOP/s (n={report.get('peak_n')})"
        )
        lines.append(head)
        for row in report["rows"]:
            lines.append(
                f"  unroll {row.get('decode_unroll', 1):2d} batch {row['batch']:4d}: "
                f"{row['step_ms']:7.2f} ms/step, roofline "
                f"{row['roofline_ms']:6.2f} ms, ratio {row['ratio']:5.2f}, "
                f"{row['tokens_per_s']:9.0f} tok/s, weight products alone "
                f"{row['weight_products_ratio']:.2f}x roofline, compile {row['compile_s']:.0f} s"
            )
    return lines


def harness_rows(logs: Path, name: str, columns: list[tuple[str, str, float]]) -> list[str]:
    """One line per row of a harness report: its medians, and each row's s/step against the
    TRL row's."""
    report = load(logs / f"{name}.json")
    if report is None:
        return []
    peak = report.get("peak_flops_per_s")
    lines = [f"{name}: matmul peak {peak / 1e12:.0f} TFLOP/s" if peak else f"{name}: no peak"]
    rows = report["rows"]
    trl = [r for r in rows if r["side"] == "trl" and r["median"].get("steady_s_per_step")]
    for row in rows:
        median = row["median"]
        failed = [r for r in row["runs"] if r.get("status") != "ok"]
        cells = [f"  {row['label']:28s}"]
        for label, key, scale in columns:
            value = median.get(key)
            cells.append(f"{label} {value * scale:.3g}" if value is not None else f"{label} -")
        if trl and median.get("steady_s_per_step") and row["side"] != "trl":
            speedup = trl[0]["median"]["steady_s_per_step"] / median["steady_s_per_step"]
            cells.append(f"TRL/ours {speedup:.2f}x")
        for run in failed:
            cells.append(f"{run.get('status')}: {str(run.get('message', ''))[-160:]!r}")
        lines.append(", ".join(cells))
    return lines


# prime-rl's trainer benchmark on one H100 (its benchmarks' baselines): tokens/s at 16k tokens.
PRIME_RL_TOKENS_PER_S = {("qwen3-0.6b", 0): 11_900.0, ("qwen3-4b", 16): 6_200.0}


def trainer(logs: Path) -> list[str]:
    """train06's rows (train06.json, train06_4b.json): tokens/s, MFU and memory, beside
    prime-rl's tokens/s for the same shape at 16k tokens."""
    lines = []
    for name in ("train06", "train06_4b"):
        report = load(logs / f"{name}.json")
        if report is None:
            continue
        lines.append(
            f"{name}: {report['device']}, jax {report['jax']}, bf16 peak "
            f"{report['peak_flops'] / 1e12:.3g} TFLOP/s (n={report['peak_n']}); FLOPs/token "
            f"{report['flops_formula']}"
        )
        for row in report["rows"]:
            head = f"  {row['shape']} seq {row['seq_len']}"
            if row.get("status") != "ok":
                message = str(row.get("message", ""))[-160:]
                lines.append(f"{head} remat {row.get('remat')}: {row.get('status')}: {message!r}")
                continue
            if row["lora_rank"]:
                head += f" LoRA {row['lora_rank']}"
            cells = [
                f"{row['tokens_per_s']:,.0f} tok/s",
                f"{row['median_step_s']:.2f} s/step of {row['sequences_per_step']}",
                f"MFU {100 * row['mfu']:.1f}% (measured peak)",
            ]
            if row.get("mfu_prime_rl_peak") is not None:
                cells.append(f"{100 * row['mfu_prime_rl_peak']:.1f}% (989 TFLOP/s)")
            peer = PRIME_RL_TOKENS_PER_S.get((row["shape"], row["lora_rank"]))
            if peer and row["seq_len"] == 16384:
                cells.append(f"{row['tokens_per_s'] / peer:.2f}x prime-rl")
            cells.append(
                f"remat {row['remat']}, attention {row.get('attention', 'xla')}, "
                f"compile {row['compile_s']:.0f} s, memory: estimate "
                f"{row['estimate_gib']}, XLA {row.get('xla_total_gib')}, device peak "
                f"{row.get('device_peak_gib')} GiB"
            )
            lines.append(f"{head}: " + ", ".join(cells))
    return lines


def lora_update(logs: Path) -> list[str]:
    """lora7: seconds per update and memory (estimate, XLA's plan, the device's peak)."""
    report = load(logs / "lora7.json")
    if report is None:
        return []
    what = (
        f"lora7: {report['shape']} LoRA {report['lora_rank']}, {report['batch']}, "
        f"{report['dtype']} over {report['param_dtype']}, remat {report['remat']} on "
        f"{report['device']}: "
    )
    memory = (
        f"memory: estimate {report['estimate_gib']}, XLA {report.get('xla_total_gib')} "
        f"(temporaries {report.get('xla_temp_gib')}), device peak "
        f"{report.get('device_peak_gib')} GiB"
    )
    compile_s = report.get("compile_s")
    compiled = f"compile {compile_s:.0f} s" if compile_s is not None else "not compiled"
    if report.get("status") != "ok":
        message = str(report.get("message", ""))[-160:]
        return [what + f"{report.get('status', 'started')}, {compiled}, {memory} {message!r}"]
    return [
        what + f"{report['median_update_s']:.2f} s/update, {compiled}, {memory}, mean "
        f"completion {report['completion_length']:.0f} tokens"
    ]


def partial(logs: Path, skip: int) -> list[str]:
    """Trained tokens per second of each partial_<mode>.jsonl, over its updates after `skip`
    (wall_seconds between them); sync trains every completion (completion_length x count)."""
    lines = []
    for path in sorted(logs.glob("partial_*.jsonl")):
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        rows = [r for r in rows if "wall_seconds" in r and "completions" in r]
        if len(rows) <= skip + 1:
            lines.append(f"{path.stem}: {len(rows)} updates logged, too few")
            continue
        tokens, per_update = 0.0, []
        for before, row in zip(rows[skip:], rows[skip + 1 :], strict=False):
            completions = row["completions"] - before["completions"]
            trained = row.get("trained_tokens", row.get("completion_length", 0.0) * completions)
            tokens += trained
            per_update.append(trained)
        seconds = rows[-1]["wall_seconds"] - rows[skip]["wall_seconds"]
        mean_length = statistics.mean(r.get("completion_length", 0.0) for r in rows[skip + 1 :])
        lines.append(
            f"{path.stem}: {tokens / seconds:,.0f} trained tokens/s over updates "
            f"{rows[skip]['step'] + 1}-{rows[-1]['step']} ({len(per_update) / seconds:.2f} "
            f"updates/s, mean completion length {mean_length:.1f})"
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("logs", type=Path)
    parser.add_argument("--skip", type=int, default=3, help="partial: first updates left out")
    args = parser.parse_args()
    lines = generation(args.logs)
    lines += decode_attention(args.logs)
    lines += harness_rows(
        args.logs,
        "grpo17",
        [
            ("s/update", "steady_s_per_step", 1.0),
            ("MFU %", "mfu", 100.0),
            ("compile s", "compile_s", 1.0),
            ("rollout %", "rollout_share_of_step", 100.0),
        ],
    )
    lines += harness_rows(
        args.logs,
        "dpo17",
        [
            ("ms/step", "steady_s_per_step", 1e3),
            ("MFU %", "mfu", 100.0),
            ("compile s", "compile_s", 1.0),
        ],
    )
    lines += trainer(args.logs)
    lines += lora_update(args.logs)
    lines += partial(args.logs, args.skip)
    summary = args.logs / "summary.txt"
    if summary.exists():
        lines += ["steps:"] + ["  " + line for line in summary.read_text().splitlines()]
    print("\n".join(lines) if lines else "gpu_summary: nothing measured yet")


if __name__ == "__main__":
    main()
