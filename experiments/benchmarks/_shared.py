"""Helpers the benchmark drivers share. Standard library only at import time: the peer workers
(rejax, TRL) run the benchmark scripts from their own virtual environments, where jaxrl is not
installed. The helpers that need JAX (`run_peak`, `count_backend_compiles`) import it when called,
from our own workers only."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_PEER_DIR = REPO_ROOT.parent / "shared" / "peers"
TRL_MARKER = "RESULT_JSON "  # the last line the TRL peer scripts print
PEAK_TRIALS = 6

# The model every peer script builds (README of the peers folder); fixed on both sides.
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


def marked_json(stdout: str | bytes | None, marker: str) -> dict[str, Any] | None:
    """The JSON after the last line of `stdout` that starts with `marker`, if any."""
    if isinstance(stdout, bytes):  # TimeoutExpired carries undecoded output
        stdout = stdout.decode(errors="replace")
    for line in reversed((stdout or "").splitlines()):
        if line.startswith(marker):
            return json.loads(line[len(marker) :])
    return None


def comma_list(cast: Callable[[str], Any]) -> Callable[[str], list[Any]]:
    """An argparse type: "a,b,c" -> [cast(a), cast(b), cast(c)]."""
    return lambda text: [cast(item) for item in text.split(",") if item.strip()]


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


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


def run_process(command: list[str], marker: str, timeout: float) -> dict[str, Any]:
    """Run one worker from the repository root; its marked JSON line with status "ok", or a
    status saying what failed."""
    start = time.perf_counter()
    try:
        done = subprocess.run(
            command, capture_output=True, text=True, cwd=REPO_ROOT, timeout=timeout, check=False
        )
    except subprocess.TimeoutExpired:
        return {"status": "timeout", "message": f"killed after {timeout:.0f} s"}
    except OSError as error:
        return {"status": "error", "message": f"could not start {command[0]}: {error}"}
    wall = time.perf_counter() - start
    result = marked_json(done.stdout, marker)
    if result is None:
        tail = (done.stderr or done.stdout or "")[-3000:]
        return {"status": "error", "returncode": done.returncode, "message": tail}
    return {"status": "ok", **result, "process_wall_s": wall}


def count_backend_compiles() -> Callable[[], int]:
    """A counter of XLA compilations from now on (to check nothing recompiles while timing)."""
    import jax

    count = [0]

    def listener(event: str, duration: float, **kwargs: Any) -> None:
        if event == "/jax/core/compile/backend_compile_duration":
            count[0] += 1

    jax.monitoring.register_event_duration_secs_listener(listener)
    return lambda: count[0]


def run_peak(n: int, trials: int = PEAK_TRIALS) -> dict[str, Any]:
    """This machine's fp32 matmul throughput under XLA: best of `trials` jitted n x n dots."""
    import jax
    import jax.numpy as jnp

    import jaxrl  # noqa: F401  (the XLA_FLAGS our workers run with)

    a = jax.random.normal(jax.random.key(0), (n, n), jnp.float32)
    b = jax.random.normal(jax.random.key(1), (n, n), jnp.float32)
    dot = jax.jit(jnp.dot)
    jax.block_until_ready(dot(a, b))
    jax.block_until_ready(dot(a, b))
    times = []
    for _ in range(trials):
        start = time.perf_counter()
        jax.block_until_ready(dot(a, b))
        times.append(time.perf_counter() - start)
    flops = 2.0 * n**3
    return {
        "status": "ok",
        "side": "peak",
        "n": n,
        "trial_s": times,
        "peak_flops_per_s": flops / min(times),
        "backend": jax.default_backend(),
    }


def median_of(runs: list[dict[str, Any]], key: str) -> float | None:
    """The median of `key` over the runs that have it; None if none has."""
    values = [r[key] for r in runs if r.get(key) is not None]
    return statistics.median(values) if values else None


def fmt(value: float | None, spec: str, scale: float = 1.0) -> str:
    """A table cell: `value * scale` formatted, or "-" for a missing value."""
    return "-" if value is None else format(value * scale, spec)
