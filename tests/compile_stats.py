"""Where a test's time goes: the XLA compiles it ran in this process (JAX's monitoring events).

Loaded by conftest.py, which also fails a run whose CI-tier test went over its budget. Each
test's compiles are counted: programs compiled by XLA, programs taken from the persistent cache,
and the seconds of tracing, lowering and compiling. Every worker appends one JSON line per test
to the directory in JAXRL_COMPILE_STATS (made per run by conftest.py), and the run's end prints
the totals and the files that compile the most. Scripts the tests start run in their own
processes and are not counted here: their seconds show as the rest of the test's wall time."""

import collections
import json
import os
import time

import pytest

# Every program XLA is asked for reports a backend compile, whether it is compiled or taken from
# the cache (a cache turned off reports no misses), so compiled = programs - cached.
_CACHE_HIT = "/jax/compilation_cache/cache_hits"
_PROGRAM = "/jax/core/compile/backend_compile_duration"
_DURATIONS = {
    "/jax/core/compile/jaxpr_trace_duration": "trace_s",
    "/jax/core/compile/jaxpr_to_mlir_module_duration": "lower_s",
    _PROGRAM: "compile_s",
}
_current: collections.Counter = collections.Counter()
_installed = False


def _install() -> None:
    global _installed
    if _installed:
        return
    from jax import monitoring

    def on_event(event: str, **_) -> None:
        if event == _CACHE_HIT:
            _current["cached"] += 1

    def on_duration(event: str, seconds: float, **_) -> None:
        if event in _DURATIONS:
            _current[_DURATIONS[event]] += seconds
        if event == _PROGRAM:
            _current["compiled"] += 1

    monitoring.register_event_listener(on_event)
    monitoring.register_event_duration_secs_listener(on_duration)
    _installed = True


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    directory = os.environ.get("JAXRL_COMPILE_STATS")
    if not directory:
        yield
        return
    _install()
    _current.clear()
    start = time.perf_counter()
    yield
    row = {"test": item.nodeid, "wall_s": round(time.perf_counter() - start, 2)}
    if "slow" in item.keywords:
        row["slow"] = True
    row.update({k: round(v, 2) if isinstance(v, float) else v for k, v in _current.items()})
    if "compiled" in row:
        row["compiled"] -= row.get("cached", 0)
    name = os.environ.get("PYTEST_XDIST_WORKER", "main")
    with open(os.path.join(directory, f"{name}.jsonl"), "a") as f:
        f.write(json.dumps(row) + "\n")


def read_rows(directory: str) -> list[dict]:
    rows = []
    for name in sorted(os.listdir(directory)):
        with open(os.path.join(directory, name)) as f:
            rows.extend(json.loads(line) for line in f)
    return rows


def over_budget(rows: list[dict], seconds: float) -> list[dict]:
    """The CI-tier tests (not marked slow) whose wall time, set-up included, passed `seconds`."""
    return [r for r in rows if not r.get("slow") and r["wall_s"] > seconds]


def summary_lines(rows: list[dict], top: int = 10) -> list[str]:
    """The run's compiles in total and the files that compiled the most seconds."""
    total = collections.Counter()
    by_file: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for row in rows:
        for key in ("compiled", "cached", "trace_s", "lower_s", "compile_s", "wall_s"):
            total[key] += row.get(key, 0)
            by_file[row["test"].split("::")[0]][key] += row.get(key, 0)
    lines = [
        f"XLA compiles: {total['compiled']} compiled, {total['cached']} from the persistent "
        f"cache; {total['compile_s']:.0f} s compiling, {total['trace_s']:.0f} s tracing, "
        f"{total['lower_s']:.0f} s lowering, of {total['wall_s']:.0f} s of test time "
        f"({len(rows)} tests)"
    ]
    ranked = sorted(by_file.items(), key=lambda kv: -kv[1]["wall_s"])[:top]
    for path, c in ranked:
        lines.append(
            f"  {c['wall_s']:7.0f} s  {path}: {c['compiled']} compiled, {c['cached']} cached, "
            f"{c['compile_s']:.0f} s compiling, {c['trace_s'] + c['lower_s']:.0f} s tracing"
        )
    return lines
