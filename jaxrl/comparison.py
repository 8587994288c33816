"""Compare configurations over seeds and tasks with the statistics of Agarwal et al. (2021): what
`experiments/compare.py` runs, callable from Python.

    from jaxrl.comparison import compare
    compare(["ppo=runs/ppo-a", "ppo=runs/ppo-b", "sac=runs/sac"], out_dir="runs/cmp")

Each argument is a run directory written by a trainer (jaxrl.trainers, or experiments/<algo>.py),
optionally as LABEL=DIR. Directories with the same label form one configuration: their seeds are
pooled, task by task; a directory without a label is labelled by its name. A task is the run's
environment (`env` in summary.json; for offline runs, env and dataset; else `task` or
`dataset`). Each seed's score is `metric` (summary.json's `<metric>_per_seed`, or the value
itself for a single-seed run), optionally min-max normalised per task (`normalize`).

Printed: per configuration the interquartile mean (IQM), mean and median with stratified
bootstrap confidence intervals (runs resampled within each task), the optimality gap when scores
are normalised, and the probability of improvement P(X > Y) of every pair. Written to `out_dir`:
`comparison.json` (all numbers, also returned), `interval_estimates.png`,
`performance_profile.png`, `probability_of_improvement.png` (two or more configurations) and
`learning_curves.png` (IQM over seeds of the training return against env steps, read from each
run's metrics.jsonl). Language-model runs also get a table of their held-out pass@k
(summary.json's eval_pass_at_K) with intervals. Runs of several tasks are compared only with
`normalize` for each task: raw returns of different environments are on different scales.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from jaxrl import statistics
from jaxrl.config import fail
from jaxrl.logging import write_json

CURVE_METRICS = ("episode_return", "eval_return")
PASS_AT = "eval_pass_at_"  # summary.json's held-out pass@k of language-model runs


@dataclasses.dataclass
class Run:
    """One run directory: its task, the score of each seed and (if logged) its learning curves."""

    path: str
    algo: str
    task: str
    scores: np.ndarray  # (num_seeds,)
    curves: dict[str, tuple[np.ndarray, np.ndarray]]  # metric -> (x (points,), (seeds, points))
    # k -> (held-out pass@k, its 95% interval over problems): language-model runs' summaries
    pass_at: dict[int, tuple[float, list[float]]] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class Configuration:
    """One label's runs, and their scores by task."""

    label: str
    runs: list[Run]
    scores: np.ndarray  # (num_runs, num_tasks), tasks in the comparison's order


def parse_argument(argument: str) -> tuple[str, str]:
    """LABEL=DIR or DIR -> (label, dir). A label may itself contain '=' (lr=1e-3=runs/x): the
    directory is the part after the first '=' that names an existing path, else after the last."""
    path = argument.rstrip("/") or argument
    if os.path.exists(argument) or "=" not in argument:
        return os.path.basename(os.path.abspath(path)), argument
    splits = [i for i, c in enumerate(argument) if c == "="]
    for i in splits:
        if os.path.exists(argument[i + 1 :]):
            return argument[:i], argument[i + 1 :]
    i = splits[-1]
    if not argument[:i] or not argument[i + 1 :]:
        fail(f"{argument!r}: expected LABEL=DIR or DIR")
    return argument[:i], argument[i + 1 :]


def task_of(summary: dict) -> str | None:
    """The task a run's summary.json names: env (with the dataset, offline), task or dataset."""
    env, dataset = summary.get("env"), summary.get("dataset")
    if env and dataset:
        return f"{env} ({dataset})"  # offline RL: the dataset is part of the task
    return env or summary.get("task") or dataset


def read_scores(path: str, summary: dict, metric: str) -> np.ndarray:
    """The metric's value for each seed of a run, or an error line saying what the run has."""
    where = os.path.join(path, "summary.json")
    num_seeds = summary.get("num_seeds", 1)
    if f"{metric}_per_seed" in summary:
        values = summary[f"{metric}_per_seed"]
        if not isinstance(values, list) or len(values) != num_seeds:
            fail(f"{where}: {metric}_per_seed should list {num_seeds} values (num_seeds)")
    elif metric in summary and num_seeds == 1:
        values = [summary[metric]]
    elif metric in summary:
        fail(
            f"{where}: {metric} is a mean over {num_seeds} seeds and the run has no "
            f"{metric}_per_seed; choose a --metric with per-seed values"
        )
    else:
        numeric = sorted(k for k, v in summary.items() if isinstance(v, int | float | list))
        fail(f"{where}: no {metric!r} (--metric); this run has {', '.join(numeric)}")
    if not all(isinstance(v, int | float) and math.isfinite(v) for v in values):
        fail(f"{where}: {metric} has missing or non-finite values {values}")
    return np.asarray(values, dtype=np.float64)


def read_curves(path: str, x_key: str, num_seeds: int) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Per-seed series `<name>_per_run` of metrics.jsonl against `x_key`; NaN where not logged."""
    metrics_path = os.path.join(path, "metrics.jsonl")
    if not os.path.isfile(metrics_path):
        return {}
    rows = []
    with open(metrics_path) as f:
        for number, line in enumerate(f, 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as error:
                    fail(f"{metrics_path}:{number}: not a JSON object ({error})")
    names = {k[: -len("_per_run")] for row in rows for k in row if k.endswith("_per_run")}
    curves = {}
    for name in sorted(names):
        series = [r for r in rows if x_key in r and isinstance(r.get(f"{name}_per_run"), list)]
        series = [r for r in series if len(r[f"{name}_per_run"]) == num_seeds]
        if series:
            x = np.array([r[x_key] for r in series], dtype=np.float64)
            y = np.array(
                [[np.nan if v is None else v for v in r[f"{name}_per_run"]] for r in series],
                dtype=np.float64,
            )
            curves[name] = (x, y.T)
    return curves


def load_run(path: str, metric: str, x_key: str) -> Run:
    """A finished run directory's task, per-seed `metric` scores, curves and pass@k."""
    if not os.path.isdir(path):
        fail(f"{path}: no such directory; pass run directories of experiments/<algo>.py")
    summary_path = os.path.join(path, "summary.json")
    if not os.path.isfile(summary_path):
        fail(
            f"{path}: no summary.json, so not a finished run of an experiment script; let the "
            "run finish (or rerun it on the same --workdir to resume) and compare again"
        )
    try:
        with open(summary_path) as f:
            summary = json.load(f)
    except json.JSONDecodeError as error:
        fail(f"{summary_path}: not valid JSON ({error})")
    if not isinstance(summary, dict):
        fail(f"{summary_path}: expected a JSON object")
    task = task_of(summary)
    if not task:
        fail(f"{summary_path}: names no env, task or dataset, so its task is unknown")
    scores = read_scores(path, summary, metric)
    pass_at = {
        int(key.removeprefix(PASS_AT)): (float(value), summary.get(f"{key}_ci95") or [])
        for key, value in summary.items()
        if key.startswith(PASS_AT) and key.removeprefix(PASS_AT).isdigit()
        and isinstance(value, int | float)
    }  # fmt: skip
    return Run(
        path=path,
        algo=str(summary.get("algo", "?")),
        task=task,
        scores=scores,
        curves=read_curves(path, x_key, len(scores)),
        pass_at=pass_at,
    )


def parse_normalization(specs: list[str]) -> dict[str, tuple[float, float]]:
    """TASK:MIN:MAX specs as {task: (min, max)}; a bad spec is one error line."""
    ranges = {}
    for spec in specs:
        parts = spec.rsplit(":", 2)
        try:
            task, low, high = parts[0], float(parts[1]), float(parts[2])
        except (IndexError, ValueError):
            fail(f"--normalize={spec}: expected TASK:MIN:MAX, e.g. CartPole-v1:0:500")
        if not (math.isfinite(low) and math.isfinite(high)) or low == high:
            fail(f"--normalize={spec}: MIN and MAX must be finite and differ")
        ranges[task] = (low, high)
    return ranges


def normalize_scores(
    configurations: list[Configuration], tasks: list[str], ranges: dict[str, tuple[float, float]]
) -> None:
    """Scores -> (score - MIN) / (MAX - MIN) per task, in place; every task needs its range."""
    missing = [t for t in tasks if t not in ranges]
    if missing:
        fail(
            f"--normalize: no range for task {missing[0]!r}; give TASK:MIN:MAX for each of {tasks}"
        )
    unknown = [t for t in ranges if t not in tasks]
    if unknown:
        fail(f"--normalize: {unknown[0]!r} is not among the compared tasks {tasks}")
    low = np.array([ranges[t][0] for t in tasks])
    high = np.array([ranges[t][1] for t in tasks])
    for config in configurations:
        config.scores = (config.scores - low) / (high - low)


def build_configurations(
    arguments: list[str], metric: str, x_key: str
) -> tuple[list[Configuration], list[str]]:
    """Group the run directories by label and arrange each group's scores as (runs, tasks)."""
    groups: dict[str, list[Run]] = {}
    seen: set[str] = set()
    for argument in arguments:
        label, path = parse_argument(argument)
        if os.path.realpath(path) in seen:
            fail(f"{argument}: this run directory is given twice; each run counts once")
        seen.add(os.path.realpath(path))
        groups.setdefault(label, []).append(load_run(path, metric, x_key))
    task_sets = {label: sorted({r.task for r in runs}) for label, runs in groups.items()}
    tasks = next(iter(task_sets.values()))
    for label, label_tasks in task_sets.items():
        if label_tasks != tasks:
            first = next(iter(task_sets))
            fail(
                f"configurations cover different tasks: {first!r} has {tasks}, {label!r} has "
                f"{label_tasks}; every configuration must be run on the same tasks"
            )
    configurations = []
    for label, runs in groups.items():
        per_task = [np.concatenate([r.scores for r in runs if r.task == t]) for t in tasks]
        counts = {t: len(s) for t, s in zip(tasks, per_task, strict=True)}
        if len(set(counts.values())) > 1:
            fail(
                f"configuration {label!r} has {counts} runs per task; the stratified bootstrap "
                "needs the same number of runs on every task of a configuration"
            )
        configurations.append(Configuration(label, runs, np.stack(per_task, axis=1)))
    return configurations, tasks


def pass_at_k_table(
    configurations: list[Configuration], tasks: list[str], settings: dict
) -> dict[str, dict[int, tuple[float, list[float]]]]:
    """Per configuration, held-out pass@k for every k all its runs report: the mean over runs
    (tasks pooled as the scores are) with a stratified bootstrap interval over runs; a
    configuration of one run keeps that run's interval (its problems resampled). Empty when the
    runs report no pass@k (control runs)."""
    runs = [r for c in configurations for r in c.runs]
    ks = set.intersection(*(set(r.pass_at) for r in runs)) if runs else set()
    out: dict[str, dict[int, tuple[float, list[float]]]] = {}
    if not ks:
        return out
    for c in configurations:
        out[c.label] = {}
        for k in sorted(ks):
            if len(c.runs) == 1:
                point, ci = c.runs[0].pass_at[k]
                out[c.label][k] = (point, [float(b) for b in ci] or [point, point])
                continue
            per_task = [[r.pass_at[k][0] for r in c.runs if r.task == t] for t in tasks]
            scores = np.array(per_task, dtype=np.float64).T  # (runs, tasks)
            points, intervals = statistics.interval_estimates(
                {"x": scores}, statistics.aggregate_mean, **settings
            )
            out[c.label][k] = (float(points["x"]), [float(b) for b in intervals["x"]])
    return out


def learning_curves(
    configurations: list[Configuration],
    tasks: list[str],
    requested: str | None,
    normalize: dict[str, tuple[float, float]],
    x_key: str = "env_steps",
) -> tuple[str | None, dict[str, np.ndarray], dict[str, np.ndarray], str]:
    """(metric, x per configuration, (runs, tasks, points) per configuration, reason if none).

    Runs pooled in a configuration (and its tasks) share the x values they all logged."""
    runs = [r for c in configurations for r in c.runs]
    if requested:
        missing = [r.path for r in runs if requested not in r.curves]
        if missing:
            fail(f"{missing[0]}/metrics.jsonl: no {requested}_per_run series (--curve_metric)")
        metric = requested
    else:
        common = [m for m in CURVE_METRICS if all(m in r.curves for r in runs)]
        if not common:
            return None, {}, {}, "not every run logged episode_return or eval_return per seed"
        metric = common[0]
    xs, curves = {}, {}
    for config in configurations:
        x = None
        for run in config.runs:
            run_x = run.curves[metric][0]
            x = run_x if x is None else np.intersect1d(x, run_x)
        if x is None or x.size == 0:
            return None, {}, {}, f"the runs of {config.label!r} logged no common {x_key}"
        per_task = []
        for task in tasks:
            rows = []
            for run in (r for r in config.runs if r.task == task):
                run_x, values = run.curves[metric]
                rows.append(values[:, np.searchsorted(run_x, x)])
            per_task.append(np.concatenate(rows))
        stacked = np.stack(per_task, axis=1)  # (runs, tasks, points)
        if normalize:
            low = np.array([normalize[t][0] for t in tasks])[:, None]
            high = np.array([normalize[t][1] for t in tasks])[:, None]
            stacked = (stacked - low) / (high - low)
        logged = np.all(np.isfinite(stacked), axis=(0, 1))  # e.g. before any episode ended
        if not logged.any():
            return None, {}, {}, f"{config.label!r} has no point where every run logged {metric}"
        xs[config.label], curves[config.label] = x[logged], stacked[:, :, logged]
    return metric, xs, curves, ""


def number_format(values: np.ndarray) -> Callable[[float], str]:
    """One format for all numbers of a table: 4 significant digits of its largest magnitude."""
    largest = float(np.max(np.abs(values))) if np.size(values) else 0.0
    decimals = max(0, 3 - math.floor(math.log10(largest))) if largest > 0 else 3
    return lambda value: f"{value:.{decimals}f}"


def print_table(headers: list[str], rows: list[list[str]]) -> None:
    """Print rows under headers, columns left-aligned."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    print("  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip())
    for row in rows:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())


def compare(
    arguments: Sequence[str],
    out_dir: str | None = None,
    *,
    metric: str = "final_eval_return",
    normalize: Sequence[str] = (),
    curve_metric: str | None = None,
    curve_x: str = "env_steps",
    reps: int = 50_000,
    curve_reps: int = 2_000,
    confidence: float = 0.95,
    bootstrap_seed: int = 0,
) -> dict[str, Any] | None:
    """Compare the runs `arguments` ([LABEL=]DIR each): print the tables and, with `out_dir`,
    write comparison.json (returned) and the plots. `normalize` holds TASK:MIN:MAX specs;
    `curve_metric` None picks episode_return, else eval_return, whichever every run logged.
    Every problem is one `error:` line."""
    arguments = list(arguments)
    if not arguments:
        fail("no run directories; usage: compare.py [LABEL=]DIR [[LABEL=]DIR ...] --out_dir=DIR")
    if reps < 1 or curve_reps < 1:
        fail(f"--reps and --curve_reps must be >= 1, got {reps} and {curve_reps}")
    if not 0.0 < confidence < 1.0:
        fail(f"--confidence must be strictly between 0 and 1, got {confidence}")
    seed = bootstrap_seed
    normalize = parse_normalization(list(normalize))
    if out_dir is not None and os.path.exists(out_dir) and not os.path.isdir(out_dir):
        fail(f"--out_dir={out_dir}: is a file, not a directory; pass a directory path")
    start = time.time()

    configurations, tasks = build_configurations(arguments, metric, curve_x)
    if len(tasks) > 1 and not normalize:
        fail(
            f"the runs cover {len(tasks)} tasks ({', '.join(tasks)}) and their raw {metric} "
            "are on different scales, so pooling them is meaningless; pass "
            "--normalize=TASK:MIN:MAX for each task, or compare one task at a time"
        )
    if normalize:
        normalize_scores(configurations, tasks, normalize)
    score_dict = {c.label: c.scores for c in configurations}
    score_name = f"normalized {metric}" if normalize else metric

    aggregates = {"IQM": statistics.aggregate_iqm, "mean": statistics.aggregate_mean}
    aggregates["median"] = statistics.aggregate_median
    if normalize:
        aggregates["optimality gap"] = statistics.aggregate_optimality_gap
    settings = dict(reps=reps, confidence=confidence, seed=seed)
    points, intervals = statistics.interval_estimates(score_dict, aggregates, **settings)
    poi_points, poi_intervals = statistics.probability_of_improvement_estimates(
        score_dict, **settings
    )
    all_scores = np.concatenate([s.reshape(-1) for s in score_dict.values()])
    low_score, high_score = float(all_scores.min()), float(all_scores.max())
    pad = 0.02 * (high_score - low_score) or max(1e-3, 0.05 * abs(low_score))
    taus = np.linspace(low_score - pad, high_score + pad, 101)
    profiles, profile_intervals = statistics.performance_profiles(
        score_dict, taus, reps=min(reps, 2_000), confidence=confidence, seed=seed
    )
    curve_metric, curve_xs, curves, no_curves = learning_curves(
        configurations, tasks, curve_metric, normalize, curve_x
    )
    if curve_metric:
        curve_points, curve_intervals = statistics.learning_curve_estimates(
            curves, reps=curve_reps, confidence=confidence, seed=seed
        )

    level = f"{confidence:.0%}"
    print(
        f"{score_name} of {len(configurations)} configurations on {len(tasks)} task(s) "
        f"({', '.join(tasks)}); [{level} CI]: stratified bootstrap, {reps} resamples of the runs "
        f"within each task, percentile intervals, seed {seed}"
    )
    fmt = number_format(np.concatenate([s.reshape(-1) for s in score_dict.values()]))
    with_ci = lambda point, ci: f"{fmt(point)} [{fmt(ci[0])}, {fmt(ci[1])}]"
    headers = ["configuration", "tasks", "runs/task", *(f"{m} [{level} CI]" for m in aggregates)]
    rows = [
        [
            c.label,
            str(len(tasks)),
            str(c.scores.shape[0]),
            *(
                with_ci(points[c.label][i], intervals[c.label][:, i])
                for i in range(len(aggregates))
            ),
        ]
        for c in configurations
    ]
    print()
    print_table(headers, rows)
    if len(tasks) == 1:
        print("(one task: the median over tasks of the mean over runs is the mean)")
    if poi_points:
        print(f"\nprobability of improvement P(X > Y) [{level} CI]; P(Y > X) = 1 - P(X > Y):")
        width = max(len(f"{x} > {y}") for x, y in poi_points)
        for (x, y), p in poi_points.items():
            ci = poi_intervals[(x, y)]
            print(f"  {f'{x} > {y}'.ljust(width)}  {p:.3f} [{ci[0]:.3f}, {ci[1]:.3f}]")
    print(f"\n{score_name} per run:")
    label_width = max(len(c.label) for c in configurations)
    task_width = max(len(t) for t in tasks) + 1
    for c in configurations:
        for j, task in enumerate(tasks):
            values = " ".join(fmt(v) for v in c.scores[:, j])
            print(f"  {c.label.ljust(label_width)}  {(task + ':').ljust(task_width)} {values}")

    pass_at = pass_at_k_table(configurations, tasks, settings)
    if pass_at:
        ks = sorted(next(iter(pass_at.values())))
        print(f"\nheld-out pass@k [{level} CI] (mean over runs; one run: its problems resampled):")
        print_table(
            ["configuration", *(f"pass@{k}" for k in ks)],
            [
                [label, *(f"{e[k][0]:.3f} [{e[k][1][0]:.3f}, {e[k][1][1]:.3f}]" for k in ks)]
                for label, e in pass_at.items()
            ],
        )

    if out_dir is None:
        print(f"\n({time.time() - start:.1f}s; pass --out_dir=DIR for comparison.json and plots)")
        return None
    try:
        os.makedirs(out_dir, exist_ok=True)
        probe = os.path.join(out_dir, f".write_test.{os.getpid()}")
        with open(probe, "w"):
            pass
        os.remove(probe)
    except OSError as error:
        fail(f"--out_dir={out_dir}: cannot write there ({error.strerror}); pass a writable path")
    written = [
        statistics.plot_interval_estimates(
            points,
            intervals,
            list(aggregates),
            os.path.join(out_dir, "interval_estimates.png"),
            xlabel=score_name,
            title=f"{level} stratified bootstrap confidence intervals",
        ),
        statistics.plot_performance_profiles(
            taus,
            profiles,
            profile_intervals,
            os.path.join(out_dir, "performance_profile.png"),
            xlabel=f"{score_name} τ",
            ylabel="fraction of runs with score > τ",
        ),
    ]
    if poi_points:
        written.append(
            statistics.plot_probability_of_improvement(
                poi_points, poi_intervals, os.path.join(out_dir, "probability_of_improvement.png")
            )
        )
    if curve_metric:
        written.append(
            statistics.plot_sample_efficiency_curves(
                curve_xs,
                curve_points,
                curve_intervals,
                os.path.join(out_dir, "learning_curves.png"),
                xlabel=curve_x.replace("_", " "),
                ylabel=f"IQM {'normalized ' if normalize else ''}{curve_metric.replace('_', ' ')}",
                title=f"IQM over runs, {level} bootstrap bands ({curve_reps} resamples)",
            )
        )
    else:
        print(f"\nnote: no learning_curves.png: {no_curves}")

    def estimate(point, ci) -> dict:
        return {"estimate": float(point), "ci": [float(ci[0]), float(ci[1])]}

    comparison = {
        "metric": metric,
        "normalization": {t: list(r) for t, r in normalize.items()} or None,
        "tasks": tasks,
        "bootstrap": {**settings, "method": "percentile", "curve_reps": curve_reps},
        "configurations": {
            c.label: {
                "run_dirs": [os.path.abspath(r.path) for r in c.runs],
                "algos": sorted({r.algo for r in c.runs}),
                "runs_per_task": int(c.scores.shape[0]),
                "scores": {t: c.scores[:, j].tolist() for j, t in enumerate(tasks)},
                **{
                    name: estimate(points[c.label][i], intervals[c.label][:, i])
                    for i, name in enumerate(aggregates)
                },
            }
            for c in configurations
        },
        "probability_of_improvement": [
            {"x": x, "y": y, **estimate(p, poi_intervals[(x, y)])}
            for (x, y), p in poi_points.items()
        ],
        "pass_at_k": {
            label: {str(k): {"estimate": p, "ci": ci} for k, (p, ci) in e.items()}
            for label, e in pass_at.items()
        }
        or None,
        "performance_profile": {
            "taus": taus.tolist(),
            "reps": min(reps, 2_000),
            "profiles": {k: v.tolist() for k, v in profiles.items()},
            "ci": {k: v.tolist() for k, v in profile_intervals.items()},
        },
        "learning_curves": {
            "metric": curve_metric,
            "x": curve_x,
            "configurations": {
                label: {
                    "x": curve_xs[label].tolist(),
                    "iqm": curve_points[label].tolist(),
                    "ci": curve_intervals[label].tolist(),
                }
                for label in curve_xs
            },
        }
        if curve_metric
        else None,
    }
    comparison_path = os.path.join(out_dir, "comparison.json")
    write_json(comparison_path, comparison)
    written.insert(0, comparison_path)
    print(f"\nwrote {', '.join(os.path.basename(w) for w in written)} to {out_dir} "
          f"({time.time() - start:.1f}s)")  # fmt: skip
    return comparison
