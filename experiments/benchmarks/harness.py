"""The harness every throughput benchmark here runs on (README.md in this folder).

A driver declares a `Workload`: its variants (rows), how a worker builds the `Step` it times, its
columns and flags. `main` does the rest: one fresh worker process per row and repeat (this script
re-run with `--worker`, or a peer's own script), warm-up and timed calls, compile time, peak RSS,
MFU against a measured matmul peak, medians over repeats, a table and a JSON report.

Standard library only at import time: peer workers (rejax, d3rlpy) run the driver scripts from
their own virtual environments, where jaxrl is not installed. What needs JAX imports it when called.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import resource
import shlex
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
PEER_DIR = REPO_ROOT.parent / "shared" / "peers"
# The last line every worker prints, ours and the peer scripts alike; and an earlier one with the
# compile time, so that a worker killed later still reports it.
MARKER = "RESULT_JSON "
COMPILED_MARKER = "COMPILED_JSON "
# XLA_FLAGS as the user set them: what every side gets.
USER_XLA_FLAGS = os.environ.get("XLA_FLAGS", "")

# The model every LM peer script builds (README of the peers folder); fixed on both sides.
MODEL_SHAPE = dict(
    vocab_size=512,
    hidden_size=256,
    intermediate_size=688,
    num_layers=4,
    num_heads=4,
    num_kv_heads=2,
    max_position_embeddings=512,
    tie_embeddings=False,
)
EXPECTED_PARAMS = 3_164_416
LM_PEERS = {"trl": "/tmp/trl/bin/python", "tunix": "/tmp/tunix/bin/python"}


# --------------------------------------------------------------------------------------------
# Declarations


@dataclass
class Variant:
    """One row of the table and what its worker processes run."""

    group: str  # the rows of one group are compared with each other (ratio columns)
    label: str  # the row's name in its group; a peer's label names its ratio columns
    side: str  # "ours", or the peer library
    params: dict[str, Any] = field(default_factory=dict)  # our worker's settings, as JSON
    python: str = sys.executable
    script: str | None = None  # a peer's own script; None: the driver itself with --worker
    args: list[str] = field(default_factory=list)  # the peer script's flags
    env: dict[str, str] = field(default_factory=dict)  # environment overrides for the worker
    flops_per_step: float | None = None  # model FLOPs per step, for MFU
    # Result values every run of this row should have, over the workload's `expect`.
    expect: dict[str, Any] = field(default_factory=dict)
    runs: list[dict[str, Any]] = field(default_factory=list)
    median: dict[str, float | None] = field(default_factory=dict)

    def command(self, driver: str, steps: int, warmup: int) -> list[str]:
        if self.script is not None:
            return [self.python, self.script, *self.args]
        params = {"side": self.side, "steps": steps, "warmup": warmup, **self.params}
        return [self.python, driver, "--worker", json.dumps(params)]


@dataclass
class Step:
    """What a worker's build function hands the timing loop: `call(state, i)` runs call `i`
    (`steps_per_call` steps) to completion and returns the new state and the work it did, as
    counts (env steps, pairs, ...) that the harness sums into `<count>_per_s` rates."""

    call: Callable[[Any, int], tuple[Any, dict[str, float]]]
    state: Any = None
    steps_per_call: int = 1
    compile_s: float | None = None
    info: dict[str, Any] = field(default_factory=dict)  # recorded in the result as it is
    # Run after the timed calls and the peak RSS reading: (final state, result) -> more results.
    after: Callable[[Any, dict[str, Any]], dict[str, Any]] | None = None


@dataclass(frozen=True)
class Column:
    """A table column: the median of `key` over a row's ok runs, `format(value * scale, spec)`."""

    header: str
    key: str
    spec: str = ".1f"
    scale: float = 1.0


@dataclass
class Workload:
    """Everything particular to one benchmark driver."""

    # The driver's globals(): its file is re-run as the worker, its docstring is its description
    # and its upper-case constants (fixed settings) go into the report.
    module: dict[str, Any]
    builders: dict[str, Callable[[dict[str, Any]], Step]]  # side -> the worker's build function
    variants: Callable[[argparse.Namespace], list[Variant]]
    columns: list[Column]  # the first is the headline rate, shown with its range over repeats
    # Each row's median over each peer row's of its group; by default the headline column's.
    ratios: list[Column] | None = None
    peers: dict[str, str | None] = field(default_factory=dict)  # side -> default --<side>_python
    defaults: dict[str, Any] = field(default_factory=dict)  # steps, warmup, repeats, timeout, help
    add_flags: Callable[[argparse.ArgumentParser], None] | None = None
    note: Callable[[argparse.Namespace], str] | None = None  # printed under the table
    expect: dict[str, Any] = field(default_factory=dict)  # result values every run should have

    @property
    def script(self) -> str:
        return self.module["__file__"]

    @property
    def settings(self) -> dict[str, Any]:
        kinds = (int, float, str, tuple, dict)
        return {
            k.lower(): v for k, v in self.module.items() if k.isupper() and isinstance(v, kinds)
        }


COMMON_COLUMNS = [
    Column("compile s", "compile_s", ".1f"),
    Column("peak RSS MiB", "peak_rss_mib", ".0f"),
    Column("cpu/wall", "cpu_per_wall", ".2f"),
]
MFU_COLUMN = Column("MFU %", "mfu", ".1f", 100)
DEFAULTS = dict(steps=2, warmup=1, repeats=1, timeout=600.0, steps_help="steps per worker")


# --------------------------------------------------------------------------------------------
# Small helpers


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def comma_list(
    cast: Callable[[str], Any], choices: Sequence[Any] | None = None
) -> Callable[[str], list[Any]]:
    """An argparse type: "a,b,c" -> [cast(a), cast(b), cast(c)], each among `choices` if given."""

    def parse(text: str) -> list[Any]:
        items = [cast(item) for item in text.split(",") if item.strip()]
        if choices is not None and not set(items) <= set(choices):
            raise argparse.ArgumentTypeError(f"choose from {', '.join(map(str, choices))}")
        return items

    return parse


def fmt(value: float | None, spec: str, scale: float = 1.0) -> str:
    """A table cell: `value * scale` formatted, or "-" for a missing value."""
    return "-" if value is None else format(value * scale, spec)


def median_of(runs: list[dict[str, Any]], key: str) -> float | None:
    """The median of `key` over the runs that have it; None if none has."""
    values = [r[key] for r in runs if r.get(key) is not None]
    return statistics.median(values) if values else None


def marked_json(stdout: str | bytes | None, marker: str) -> dict[str, Any] | None:
    """The JSON after the last line of `stdout` that starts with `marker`, if any."""
    if isinstance(stdout, bytes):  # TimeoutExpired carries undecoded output
        stdout = stdout.decode(errors="replace")
    for line in reversed((stdout or "").splitlines()):
        if line.startswith(marker):
            return json.loads(line[len(marker) :])
    return None


def current_rss_mib() -> float | None:
    """Resident memory now (VmRSS), in MiB; None where /proc is not there."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


# --------------------------------------------------------------------------------------------
# Worker side


def compile_timed(jitted: Any, *example: Any) -> tuple[Any, float]:
    """`jitted` lowered and compiled for `example`, and the seconds that took (printed at once)."""
    start = time.perf_counter()
    compiled = jitted.lower(*example).compile()
    seconds = time.perf_counter() - start
    print(COMPILED_MARKER + json.dumps({"compile_s": seconds}), flush=True)
    return compiled, seconds


def train_run_step(
    train: Callable[[Any], Any],
    seeds: int,
    counts: dict[str, float],
    read: Callable[[Any], dict[str, Any]] | None = None,
) -> Step:
    """A whole training run `train(key)` as the step, all seeds in one program (vmapped when
    more than one); `read(output)` turns the last run's output into results."""
    import jax

    keys = jax.random.PRNGKey(0)
    if seeds > 1:
        train, keys = jax.vmap(train), jax.random.split(keys, seeds)
    compiled, compile_s = compile_timed(jax.jit(train), keys)
    last: list[Any] = []

    def call(state: Any, index: int) -> tuple[Any, dict[str, float]]:
        output = jax.block_until_ready(compiled(keys))
        last[:] = [output] if read else []  # keep an output only when it is read
        return state, counts

    after = (lambda state, result: read(last[0])) if read else None
    return Step(call, compile_s=compile_s, after=after)


def peak_step(params: dict[str, Any]) -> Step:
    """This machine's matmul peak under XLA (our XLA_FLAGS) in `dtype` (fp32 unless given):
    jitted n x n dots of random matrices, best call."""
    import jax
    import jax.numpy as jnp

    import jaxrl  # noqa: F401  (as every workload starts; it sets no XLA flags)

    n, dtype = params["n"], jnp.dtype(params.get("dtype", "float32"))
    a = jax.random.normal(jax.random.key(0), (n, n), dtype)
    b = jax.random.normal(jax.random.key(1), (n, n), dtype)
    dot, compile_s = compile_timed(jax.jit(jnp.dot), a, b)
    flops = 2.0 * n**3
    return Step(
        lambda state, index: (jax.block_until_ready(dot(a, b)), {"flops": flops}),
        compile_s=compile_s,
        info={"n": n},
        after=lambda state, result: {"peak_flops_per_s": flops / result["best_call_s"]},
    )


def call_counts(steps: int, warmup: int, steps_per_call: int) -> tuple[int, int]:
    """Warm-up and timed calls: the warm-up rounded up to whole calls, then at least
    `steps - warmup` steps (at least one call) timed."""
    return math.ceil(warmup / steps_per_call), math.ceil(max(steps - warmup, 1) / steps_per_call)


def compile_counter() -> Callable[[], int] | None:
    """A counter of XLA compilations from now on, where the worker uses JAX (to check that
    nothing recompiles while timing)."""
    if "jax" not in sys.modules:
        return None
    import jax

    count = [0]

    def listener(event: str, duration: float, **kwargs: Any) -> None:
        count[0] += event == "/jax/core/compile/backend_compile_duration"

    jax.monitoring.register_event_duration_secs_listener(listener)
    return lambda: count[0]


def time_calls(step: Step, steps: int, warmup: int) -> tuple[Any, dict[str, Any]]:
    """Run the warm-up calls, then time the rest as one window, everything in between included.
    Returns the final state and the timings."""
    per_call = step.steps_per_call
    warmup_calls, timed_calls = call_counts(steps, warmup, per_call)
    compiles = compile_counter()
    state, totals, seconds = step.state, {}, []
    window_start = cpu_start = 0.0
    for index in range(warmup_calls + timed_calls):
        if index == warmup_calls:
            window_start, cpu_start = time.perf_counter(), cpu_seconds()
        begin = time.perf_counter()
        state, counts = step.call(state, index)
        seconds.append(time.perf_counter() - begin)
        if index >= warmup_calls:
            for key, value in counts.items():
                totals[key] = totals.get(key, 0) + value
    window = time.perf_counter() - window_start
    timed = seconds[warmup_calls:]
    return state, {
        "steps": (warmup_calls + timed_calls) * per_call,
        "warmup_steps_excluded": warmup_calls * per_call,
        "timed_steps": timed_calls * per_call,
        "steady_wall_s": window,
        "steady_s_per_step": window / (timed_calls * per_call),
        "median_step_s": statistics.median(timed) / per_call,
        "best_call_s": min(timed),
        "first_call_s": seconds[0],
        "call_s_list": seconds,
        **{f"timed_{key}": value for key, value in totals.items()},
        **{f"{key}_per_s": value / window for key, value in totals.items()},
        "compiles_while_training": compiles() if compiles else None,
        # CPU seconds per wall second: about the thread count when the cores are ours alone.
        "cpu_per_wall": (cpu_seconds() - cpu_start) / window,
    }


def trace_call(step: Step, state: Any, where: str) -> str:
    """One more call of `step` under jax.profiler, a Perfetto trace under `where`; what became
    of it, in words (a profiler the machine lacks must not lose the row)."""
    import jax

    try:
        with jax.profiler.trace(where, create_perfetto_trace=True):
            jax.block_until_ready(step.call(state, 0)[0])
    except Exception as error:  # noqa: BLE001
        return f"not written ({type(error).__name__}: {error})"[:300]
    return where


def run_worker(
    builders: dict[str, Callable[[dict[str, Any]], Step]], params: dict[str, Any]
) -> dict[str, Any]:
    """Build, compile and time one row in this process; returns the measurements."""
    load_start = os.getloadavg()[0]
    # Compile times must be real: no persistent-cache hits (JAX reads this when imported).
    os.environ["JAX_ENABLE_COMPILATION_CACHE"] = "false"
    start = time.perf_counter()
    step = builders[params["side"]](params)
    result: dict[str, Any] = {"side": params["side"], "status": "ok", **params, **step.info}
    result.update(compile_s=step.compile_s, rss_before_train_mib=current_rss_mib())
    state, timings = time_calls(step, params["steps"], params["warmup"])
    result.update(timings, peak_rss_mib=peak_rss_mib())
    if step.after is not None:
        result.update(step.after(state, result))
    if params.get("trace"):  # one more call, untimed, under the profiler (--trace)
        result["trace"] = trace_call(step, state, params["trace"])
    result.update(total_script_s=time.perf_counter() - start, loadavg_start=load_start)
    result.update(loadavg_end=os.getloadavg()[0], xla_flags=os.environ.get("XLA_FLAGS", ""))
    if "jax" in sys.modules:
        import jax

        result.update(backend=jax.default_backend(), jax_version=jax.__version__)
    return result


# --------------------------------------------------------------------------------------------
# Parent side


def run_process(command: list[str], timeout: float, env: dict[str, str]) -> dict[str, Any]:
    """Run one worker from the repository root: its result with status "ok", or status "timeout"
    (with the compile time, if compilation had finished) or "error" (with its stderr's end)."""
    start = time.perf_counter()
    try:
        done = subprocess.run(
            command,
            capture_output=True,
            text=True,
            cwd=REPO_ROOT,  # so that our workers can import `algos`
            timeout=timeout,
            check=False,
            env={**os.environ, **env},
        )
    except subprocess.TimeoutExpired as expired:
        compiled = marked_json(expired.stdout, COMPILED_MARKER) or {}
        return {"status": "timeout", "message": f"killed after {timeout:.0f} s", **compiled}
    except OSError as error:
        return {"status": "error", "message": f"could not start {command[0]}: {error}"}
    result = marked_json(done.stdout, MARKER)
    if result is None:
        tail = (done.stderr or done.stdout or "")[-3000:]
        return {"status": "error", "returncode": done.returncode, "message": tail}
    return {"status": "ok", **result, "process_wall_s": time.perf_counter() - start}


def installed(variants: list[Variant]) -> tuple[list[Variant], list[str]]:
    """The rows whose interpreter and script exist, and one line per peer that is missing."""
    kept, missing = [], {}
    for variant in variants:
        if shutil.which(variant.python) is None:
            missing.setdefault(variant.side, f"{variant.python} not found")
        elif variant.script is not None and not Path(variant.script).is_file():
            missing.setdefault(variant.side, f"{variant.script} not found")
        else:
            kept.append(variant)
    lines = [f"{side}: {why}; its rows are left out" for side, why in missing.items()]
    return kept, lines


def describe(result: dict[str, Any], columns: list[Column]) -> str:
    """One run in a log line."""
    if result["status"] != "ok":
        return f"FAILED ({result['status']}): {result.get('message', '')}"
    cells = [
        f"{c.header} {fmt(result[c.key], c.spec, c.scale)}" for c in columns if c.key in result
    ]
    if result.get("compiles_while_training"):
        cells.append(f"{result['compiles_while_training']} compiles while timing")
    return ", ".join(cells)


def summarise(variants: list[Variant], peak: float | None) -> None:
    """MFU for every ok run of a row with model FLOPs, and the medians of every number."""
    for variant in variants:
        ok = [run for run in variant.runs if run["status"] == "ok"]
        for run in ok:
            if variant.flops_per_step and run.get("steady_s_per_step"):
                run["model_flops_per_s"] = variant.flops_per_step / run["steady_s_per_step"]
                run["mfu"] = run["model_flops_per_s"] / peak if peak else None
        numbers = {k for run in ok for k, v in run.items() if type(v) in (int, float)}
        variant.median = {key: median_of(ok, key) for key in sorted(numbers)}


def ratio(value: float | None, base: float | None) -> float | None:
    return value / base if value and base else None


def format_table(variants: list[Variant], workload: Workload, with_mfu: bool) -> str:
    """A markdown table, one line per row: the workload's columns, ratios, the common ones."""
    peers = list(dict.fromkeys(v.label for v in variants if v.side != "ours"))
    by_name = {(v.group, v.label): v for v in variants}
    headline, *extra = workload.columns
    common = ([MFU_COLUMN] if with_mfu else []) + COMMON_COLUMNS
    grouped = any(v.group for v in variants)
    header = (["group"] if grouped else []) + ["row", "ok"] + [c.header for c in workload.columns]
    ratios = workload.ratios if workload.ratios is not None else [headline]
    header += [f"{c.header} vs {peer}" for c in ratios for peer in peers]
    header += [c.header for c in common] + ["load"]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    for v in variants:
        ok = [run for run in v.runs if run["status"] == "ok"]
        rates = [run[headline.key] for run in ok if run.get(headline.key) is not None]
        first = fmt(v.median.get(headline.key), headline.spec, headline.scale)
        if len(rates) > 1:
            low, high = (fmt(x, headline.spec, headline.scale) for x in (min(rates), max(rates)))
            first += f" ({low}-{high})"
        cells = ([v.group] if grouped else []) + [v.label, f"{len(ok)}/{len(v.runs)}"]
        cells.append(first if ok else v.runs[-1]["status"])
        cells += [fmt(v.median.get(c.key), c.spec, c.scale) for c in extra]
        for c in ratios:
            for peer in peers:
                base = by_name.get((v.group, peer))
                value = ratio(v.median.get(c.key), base.median.get(c.key)) if base else None
                cells.append(fmt(value, ".2f"))
        cells += [fmt(v.median.get(c.key), c.spec, c.scale) for c in common]
        loads = [run["loadavg_start"] for run in ok if "loadavg_start" in run]
        cells.append(f"{min(loads):.1f}-{max(loads):.1f}" if loads else "-")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def run_benchmark(workload: Workload, args: argparse.Namespace) -> None:
    """Every row, one worker at a time (never two at once: they would compete for the cores),
    `--repeats` times; then the medians, the table and the report."""
    variants, missing = installed(workload.variants(args))
    for line in missing:
        log(line)
    with_mfu = any(v.flops_per_step for v in variants)
    peak_command = [sys.executable, workload.script, "--worker"]
    peak_spec = {"side": "peak", "n": args.peak_n, "dtype": args.peak_dtype}
    peak_command.append(json.dumps({**peak_spec, "steps": 8, "warmup": 2}))
    peaks: list[dict[str, Any]] = []
    if getattr(args, "trace", ""):  # our rows' workers each trace one more call
        for v in variants:
            if v.side == "ours" and v.script is None:
                slug = "".join(c if c.isalnum() else "_" for c in v.label)
                v.params = {**v.params, "trace": str(Path(args.trace) / slug)}
    for repeat in range(args.repeats):
        for v in variants:
            command = v.command(workload.script, args.steps, args.warmup)
            env = {"XLA_FLAGS": USER_XLA_FLAGS} if v.side != "ours" else {}
            result = {"side": v.side, **run_process(command, args.timeout, {**env, **v.env})}
            result["command"] = shlex.join(command)
            v.runs.append(result)
            columns = workload.columns + COMMON_COLUMNS
            name = f"{v.group} {v.label}".strip()
            log(f"[{repeat + 1}/{args.repeats}] {name}: {describe(result, columns)}")
            for key, value in {**workload.expect, **v.expect}.items():
                if result["status"] == "ok" and result.get(key) != value:
                    log(f"  warning: {key} is {result.get(key)}, not {value}")
        if with_mfu:
            peaks.append(run_process(peak_command, args.timeout, {}))
            gflops = Column("GFLOP/s", "peak_flops_per_s", ".1f", 1e-9)
            log(f"[{repeat + 1}/{args.repeats}] matmul peak: {describe(peaks[-1], [gflops])}")

    ok_peaks = [p["peak_flops_per_s"] for p in peaks if p["status"] == "ok"]
    peak = max(ok_peaks) if ok_peaks else None
    summarise(variants, peak)
    print(format_table(variants, workload, with_mfu))
    print(
        f"\nMedians over {args.repeats} worker process(es) per row (range of the first column in "
        f"brackets); {args.steps} steps per worker, the first {args.warmup} untimed; load: "
        f"1-minute load average at worker start ({os.cpu_count()} CPUs)."
    )
    if with_mfu:
        peak_text = f"{peak / 1e9:.1f} GFLOP/s" if peak else "unmeasured"
        print(
            f"MFU: model FLOPs/s over the {args.peak_dtype} matmul peak, {peak_text} "
            f"(jnp.dot {args.peak_n}^2)."
        )
    if workload.note:
        print(workload.note(args))
    if args.out:
        report = {
            "settings": {**workload.settings, **vars(args), "xla_flags": USER_XLA_FLAGS},
            "machine": {"platform": platform.platform(), "cpu_count": os.cpu_count()},
            "missing_peers": missing,
            "peak_flops_per_s": peak,
            "peak_runs": peaks,
            "rows": [asdict(v) for v in variants],
        }
        Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
        log(f"wrote {args.out}")


def positive(cast: Callable[[str], Any]) -> Callable[[str], Any]:
    """An argparse type: `cast(text)`, which must be > 0."""

    def parse(text: str) -> Any:
        value = cast(text)
        if value <= 0:
            raise argparse.ArgumentTypeError("must be positive")
        return value

    return parse


def parse_args(workload: Workload, argv: list[str]) -> argparse.Namespace:
    """The flags every driver has, then the workload's own."""
    parser = argparse.ArgumentParser(
        description=workload.module["__doc__"],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    d = {**DEFAULTS, **workload.defaults}
    add = parser.add_argument
    add("--repeats", "--runs", type=positive(int), default=d["repeats"], help="workers per row")
    add("--steps", type=positive(int), default=d["steps"], help=d["steps_help"])
    add("--warmup", type=int, default=d["warmup"], help="first steps left out of the timing")
    add("--timeout", type=positive(float), default=d["timeout"], help="seconds per worker")
    add("--seed", type=int, default=0, help="of our model and data, and the LM peers'")
    add("--peak_n", type=positive(int), default=2048, help="matrix size of the matmul peak (MFU)")
    add(
        "--peak_dtype",
        default="float32",
        choices=("float32", "bfloat16"),
        help="dtype of the matmul peak (MFU): bfloat16 for bf16 compute on a GPU",
    )
    add("--out", "--json_out", dest="out", default=None, help="write every run to this JSON file")
    add("--peer_dir", default=str(PEER_DIR), help="folder of the peers' own scripts")
    for side, default in workload.peers.items():
        add(
            f"--{side}_python", default=default, help=f"python of a venv with {side}: adds its rows"
        )
    if workload.add_flags:
        workload.add_flags(parser)
    args = parser.parse_args(argv)
    if not 0 <= args.warmup < args.steps:
        parser.error("--warmup must be in [0, --steps)")
    return args


def main(workload: Workload, argv: list[str] | None = None) -> None:
    """A driver's entry point: a worker with `--worker JSON`, the whole benchmark otherwise."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--worker"]:
        result = run_worker({"peak": peak_step, **workload.builders}, json.loads(argv[1]))
        print(MARKER + json.dumps(result), flush=True)
    else:
        run_benchmark(workload, parse_args(workload, argv))


# --------------------------------------------------------------------------------------------
# Peers shared by several drivers


def rejax_env() -> dict[str, str]:
    """rejax's environment variables: the user's XLA_FLAGS, as ours get."""
    return {"XLA_FLAGS": USER_XLA_FLAGS}


def rejax_without_eval(algo: Any, evaluate: bool) -> Any:
    """rejax's algorithm, its evaluation replaced by a no-op unless `evaluate` (rejax's `train`
    calls the callback once per `eval_freq` steps; it returns (lengths, returns))."""
    if evaluate:
        return algo
    import jax.numpy as jnp

    return algo.replace(eval_callback=lambda algo, ts, rng: (jnp.zeros(1), jnp.zeros(1)))


def add_lm_flags(parser: argparse.ArgumentParser) -> None:
    """The flags of the LM drivers (GRPO, DPO, reward model): our model's runtime fields, our
    dispatch sizes, a second TRL row and our rows' profiles."""
    add = parser.add_argument
    add("--dtype", default="float32", choices=("float32", "bfloat16"), help="ours: compute dtype")
    add(
        "--remat",
        default="none",
        choices=("none", "save_dots", "full"),
        help="ours: what each layer keeps for the backward pass (ModelConfig.remat)",
    )
    add(
        "--attention",
        default="auto",
        choices=("auto", "xla", "cudnn"),
        help="ours: ModelConfig.attention (auto: cuDNN on a GPU)",
    )
    steps = comma_list(positive(int))
    add("--steps_per_call", type=steps, default="1,10", help="ours: steps per dispatch, a row each")
    add("--trl_extra", default="", help='flags of a second TRL row, e.g. "--bf16 --grad_ckpt"')
    add("--trace", default="", help="ours: a jax.profiler trace of one more call, DIR/<row>")
    add(
        "--skip_trl_fp32",
        action="store_true",
        help="leave out the fp32 TRL row: only --trl_extra's (a 1.7B model on a GPU)",
    )


def lm_peer_rows(
    args: argparse.Namespace, algorithm: str, flags: dict[str, list[str]], flops: float
) -> list[Variant]:
    """The rows of the LM peers' own scripts in --peer_dir: TRL fp32 (plus a TRL row with
    --trl_extra) and Tunix fp32, each given the common flags and its own `flags[side]`."""
    common = ["--steps", str(args.steps), "--warmup", str(args.warmup), "--seed", str(args.seed)]
    rows = [("trl", []), ("tunix", [])]
    if args.trl_extra:
        rows.insert(1, ("trl", shlex.split(args.trl_extra)))
    if args.skip_trl_fp32:
        rows = [row for row in rows if row != ("trl", [])]
    return [
        Variant(
            "",
            f"{side} {' '.join(extra) or 'fp32'}",
            side,
            python=getattr(args, f"{side}_python"),
            script=str(Path(args.peer_dir) / f"{side}_{algorithm}_bench.py"),
            args=[*common, *flags[side], *extra],
            flops_per_step=flops,
        )
        for side, extra in rows
        if getattr(args, f"{side}_python")
    ]
