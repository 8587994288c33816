"""Run directories and the metrics sink that compiled training loops stream into.

A run directory holds, as docs/design.md fixes: `config.json`, `versions.json` (package versions
and git commit), `metrics.jsonl` (one JSON object per logging step), TensorBoard event files under
`tb/`, orbax checkpoints under `checkpoints/`, and `summary.json` at the end.
"""

from __future__ import annotations

import importlib.metadata
import json
import math
import os
import platform
import subprocess
import sys
import time
from collections.abc import Mapping
from typing import Any

import numpy as np

from jaxrl.distributed import is_main_process

PACKAGES = (
    "jax",
    "jaxlib",
    "flax",
    "optax",
    "chex",
    "distrax",
    "orbax-checkpoint",
    "gymnax",
    "numpy",
    "ml-collections",
    "jaxrl",
)


def package_versions() -> dict[str, str]:
    """Installed versions of `PACKAGES` and of Python; "not installed" for a missing package."""
    versions = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = "not installed"
    return versions


def git_commit(path: str) -> str | None:
    """The HEAD commit of the git repository at `path`; None without git or a repository."""
    try:
        out = subprocess.run(
            ["git", "-C", path, "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def to_jsonable(value: Any) -> Any:
    """numpy/jax scalars and arrays -> Python numbers and lists; NaN/inf -> None (valid JSON)."""
    if isinstance(value, Mapping):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [to_jsonable(v) for v in value]
    if hasattr(value, "tolist"):
        return to_jsonable(np.asarray(value).tolist())
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def write_json(path: str, obj: Any) -> None:
    """Write atomically: a reader never sees a half-written file."""
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(to_jsonable(obj), f, indent=2, sort_keys=True)
        f.write("\n")
    os.replace(tmp, path)


class RunDirectory:
    """The files of one experiment run. In a multi-host run only process 0 writes them (`writes`);
    the others read what it wrote (the work directory is on storage every host sees)."""

    def __init__(self, workdir: str):
        self.path = os.path.abspath(workdir)
        self.writes = is_main_process()
        os.makedirs(self.path, exist_ok=True)

    def file(self, name: str) -> str:
        """The path of `name` inside the run directory."""
        return os.path.join(self.path, name)

    @property
    def checkpoint_dir(self) -> str:
        return self.file("checkpoints")

    @property
    def metrics_path(self) -> str:
        return self.file("metrics.jsonl")

    def saved_config(self) -> dict[str, Any] | None:
        """The `config.json` an earlier start of this run wrote, or None for a new run."""
        if not os.path.exists(self.file("config.json")):
            return None
        with open(self.file("config.json")) as f:
            return json.load(f)

    def write_config(self, config: Mapping[str, Any]) -> None:
        """Write `config.json` and `versions.json` (package versions, git commit, argv)."""
        if not self.writes:
            return
        write_json(self.file("config.json"), config)
        repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        write_json(
            self.file("versions.json"),
            {"packages": package_versions(), "git_commit": git_commit(repo), "argv": sys.argv},
        )

    def write_summary(self, summary: Mapping[str, Any]) -> None:
        """Write `summary.json`, the run's headline results."""
        if not self.writes:
            return
        write_json(self.file("summary.json"), summary)

    def write_learning_curve(
        self,
        x: str = "env_steps",
        y: str = "episode_return",
        title: str | None = None,
        file_name: str = "learning_curve.png",
    ) -> None:
        """Plot `y` against `x` from metrics.jsonl into `file_name`
        (`jaxrl.statistics.plot_learning_curves`)."""
        if not self.writes:
            return
        from jaxrl import statistics  # imports matplotlib: only when plotting

        statistics.plot_learning_curves(
            self.metrics_path, self.file(file_name), x=x, y=y, title=title
        )

    def truncate_metrics(self, last_step: int) -> None:
        """Drop metric lines logged after `last_step` (all of them for 0), and a torn last line
        from a killed write: a resumed run re-logs them identically. Rewritten atomically."""
        if not self.writes or not os.path.exists(self.metrics_path):
            return
        kept = []
        with open(self.metrics_path) as f:
            for line in f:
                try:
                    row = json.loads(line)
                except json.JSONDecodeError:
                    continue  # the end of a line cut by a kill mid-write
                if row.get("step", 0) <= last_step and line.endswith("\n"):
                    kept.append(line)
        tmp = f"{self.metrics_path}.tmp"
        with open(tmp, "w") as f:
            f.writelines(kept)
        os.replace(tmp, self.metrics_path)


class MetricsSink:
    """Host-side receiver of per-update metrics from inside a compiled loop.

    Called (through `jax.debug.callback`) as `sink(step, metrics)` after every piece of equally
    many updates (`jaxrl.loop.make_chunk`'s `check_every`), with the piece's mean metrics, each
    with a leading axis over runs (seeds) when there are several. It advances a progress bar
    showing units/s and ETA every call (the environment steps of all runs, so its rate is the
    program's throughput; an LM run's updates), and every `log_every` steps writes the mean of
    that row's pieces (across runs, and per run for the `per_run` keys) to `metrics.jsonl`,
    TensorBoard and the bar's postfix. Each row holds `step` and `units_name` (e.g.
    `env_steps`: step x units_per_step). The pieces of a row not yet written are `pending`: a
    run stopped between rows saves them with its checkpoint and its resumption hands them back
    (`restore_pending`), so its row is the uninterrupted run's.
    """

    def __init__(
        self,
        run_dir: RunDirectory,
        total_steps: int,
        units_per_step: int,
        num_runs: int = 1,
        log_every: int = 10,
        start_step: int = 0,
        per_run: tuple[str, ...] = ("episode_return",),
        tensorboard: bool = True,
        progress: bool = True,
        description: str = "train",
        units_name: str = "env_steps",
    ):
        self.run_dir = run_dir
        self.total_steps = total_steps
        self.units_per_step = units_per_step  # per run: what the units column counts
        self.units_name = units_name
        self.num_runs = num_runs
        self.log_every = max(1, log_every)
        self.per_run = per_run
        self.start_time = time.time()
        self.last_step = start_step
        self.latest: dict[str, float] = {}
        # In a multi-host run only process 0 writes; the others still keep `latest`.
        writes = run_dir.writes
        self._metrics_file = open(run_dir.metrics_path, "a") if writes else None  # noqa: SIM115
        self._writer = None
        if tensorboard and writes:
            from tensorboardX import SummaryWriter

            # purge_step drops events a previous, interrupted attempt logged past the checkpoint.
            self._writer = SummaryWriter(run_dir.file("tb"), purge_step=start_step + 1)
        self.progress = progress and writes
        self.description = description
        self._bar = None  # made at the first update, so its rate and ETA exclude compilation
        self._pieces: list[dict[str, np.ndarray]] = []  # of the row being gathered

    def __call__(self, step: Any, metrics: Mapping[str, Any]) -> None:
        step = int(step)
        if self.progress and self._bar is None:
            self._bar = self._make_bar()
        if self._bar is not None:
            self._bar.update((step - self.last_step) * self._bar_units())
        self.last_step = step
        self._pieces.append({k: np.asarray(v, dtype=np.float64) for k, v in metrics.items()})
        if step % self.log_every != 0 and step != self.total_steps:
            return
        row: dict[str, Any] = {
            "step": step,
            self.units_name: step * self.units_per_step,
            "wall_seconds": round(time.time() - self.start_time, 3),
        }
        pieces, self._pieces = self._pieces, []
        for name in metrics:
            # Each run's mean over the row's pieces (NaN in any piece stays NaN, as one mean over
            # the row's updates would), then the mean over runs that have a value.
            value = np.mean(np.stack([p[name] for p in pieces]), axis=0)
            row[name] = float(np.nanmean(value))
            if name in self.per_run:
                row[f"{name}_per_run"] = value.reshape(-1).tolist()
        self.latest = row
        if self._metrics_file is not None:
            self._metrics_file.write(json.dumps(to_jsonable(row)) + "\n")
            self._metrics_file.flush()
        if self._writer is not None:
            for name, value in row.items():
                if isinstance(value, float) and name != "wall_seconds":
                    self._writer.add_scalar(name, value, row[self.units_name])
        if self._bar is not None and "episode_return" in row:
            self._bar.set_postfix(episode_return=f"{row['episode_return']:.1f}", refresh=False)

    def pending(self) -> list[dict[str, Any]]:
        """The pieces of the row being gathered, as JSON (NaN as null), for a checkpoint."""
        return [
            {
                k: {
                    "shape": list(v.shape),
                    "values": [None if np.isnan(x) else float(x) for x in v.ravel()],
                }
                for k, v in piece.items()
            }
            for piece in self._pieces
        ]

    def restore_pending(self, pieces: list[dict[str, Any]]) -> None:
        """Resume gathering a row from `pending()` of the checkpoint the run resumes from (a
        float64 holds each float32 metric exactly, so the row equals the uninterrupted run's)."""
        self._pieces = [
            {
                k: np.asarray(v["values"], dtype=np.float64).reshape(v["shape"])
                for k, v in piece.items()
            }
            for piece in pieces
        ]

    def _bar_units(self) -> int:
        """What the bar counts per update: environment steps of all runs (a control run's
        throughput), or the update itself where an update is a batch of completions, pairs or
        sequences (a bar of 16 completions for 2 GRPO updates read as 16 steps)."""
        return self.units_per_step * self.num_runs if self.units_name == "env_steps" else 1

    def _make_bar(self):
        from tqdm import tqdm

        units = self._bar_units()
        return tqdm(
            total=self.total_steps * units,
            initial=self.last_step * units,
            desc=self.description,
            unit=" env steps" if self.units_name == "env_steps" else " updates",
            unit_scale=self.units_name == "env_steps",  # "1.00/4.00 updates" otherwise
            dynamic_ncols=True,
            mininterval=1.0,
            file=sys.stderr,
        )

    def close(self) -> None:
        """Close the progress bar, TensorBoard writer and metrics file."""
        if self._bar is not None:
            self._bar.close()
        if self._writer is not None:
            self._writer.close()
        if self._metrics_file is not None:
            self._metrics_file.close()


def shorten(text: str, limit: int = 300) -> str:
    """`text` cut to `limit` characters (an ellipsis marks the cut), for summaries."""
    return text if len(text) <= limit else text[: limit - 1] + "\u2026"
