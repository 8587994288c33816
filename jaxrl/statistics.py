"""Statistics and plots made after runs, from their scores and metrics files (NumPy, matplotlib).

- `plot_learning_curves`: one run directory's metrics.jsonl as a figure.
- Aggregate statistics over runs x tasks as Agarwal et al. (2021) recommend ("Deep Reinforcement
  Learning at the Edge of the Statistical Precipice"; their library is rliable, whose numbers the
  tests reproduce): IQM, mean, median, optimality gap, probability of improvement, stratified
  bootstrap confidence intervals, performance profiles and sample-efficiency curves, in NumPy and
  vectorised over bootstrap resamples, with plots of each. `jaxrl.comparison` (and
  `experiments/compare.py`) applies them to run directories.
- pass@k (Chen et al. 2021) and its bootstrap intervals over problems.

Evaluation inside the compiled program (returns of fresh episodes) is `jaxrl.evaluation`.
"""

from __future__ import annotations

import itertools
import textwrap
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
from numpy.typing import ArrayLike


def plot_learning_curves(
    metrics_path: str,
    out_path: str,
    x: str = "env_steps",
    y: str = "episode_return",
    title: str | None = None,
) -> str | None:
    """Plot `y` against `x` from a metrics.jsonl: one thin line per run and the mean across runs.
    Returns the written path, or None if there is nothing to plot."""
    import json

    # A standalone Figure, like the plots below: no pyplot, so no backend switch in a notebook.
    from matplotlib.figure import Figure

    with open(metrics_path) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    rows = [r for r in rows if y in r]
    if not rows:
        return None
    xs = np.array([r[x] for r in rows], dtype=float)
    fig = Figure(figsize=(6, 4), dpi=120, layout="tight")
    ax = fig.subplots()
    per_run = f"{y}_per_run"
    if per_run in rows[0]:
        runs = np.array([r[per_run] for r in rows], dtype=float)
        for i in range(runs.shape[1]):
            ax.plot(xs, runs[:, i], lw=0.8, alpha=0.4, color="tab:blue", **_markers(len(xs), 3))
    several = per_run in rows[0] and len(rows[0][per_run]) > 1
    ax.plot(
        xs, [r[y] for r in rows], lw=2.0, color="tab:blue",
        label="mean over runs" if several else "the run", **_markers(len(xs)),
    )  # fmt: skip
    _format_steps(ax.xaxis, xs)
    ax.set_xlabel(x.replace("_", " "))
    ax.set_ylabel(y.replace("_", " "))
    # Wrapped, not clipped: a title names the run's task and settings, often wider than the plot.
    ax.set_title(textwrap.fill(title or y, 70), fontsize=9 if len(title or y) > 70 else None)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    fig.savefig(out_path)
    return out_path


def _markers(num_points: int, size: float = 5) -> dict[str, Any]:
    """Markers on a line of few points: a run shorter than a few metric rows is otherwise one
    invisible point (a line needs two)."""
    return {"marker": "o", "markersize": size} if num_points <= 30 else {}


def _format_steps(axis: Any, values: np.ndarray) -> None:
    """Whole-number ticks for counts (updates, steps), never 0.25 of one (EngFormatter wrote it
    "250m"); engineering prefixes only where the counts run into thousands."""
    from matplotlib.ticker import EngFormatter, MaxNLocator

    if values.size and np.all(values == np.round(values)):
        axis.set_major_locator(MaxNLocator(integer=True))
    if values.size and np.nanmax(np.abs(values)) >= 10_000:
        axis.set_major_formatter(EngFormatter(sep=""))


# --------------------------------------------------------------------------------------------------
# Aggregate statistics across runs and tasks (post-hoc, NumPy), after Agarwal et al. (2021), "Deep
# Reinforcement Learning at the Edge of the Statistical Precipice", and their library rliable.
#
# Scores are (num_runs, num_tasks) arrays: entry [n, m] is run n's score on task m. A score dict
# maps a configuration's name to such an array; configurations may differ in their number of runs
# but not in their tasks. Every aggregate also accepts leading batch axes, (..., num_runs,
# num_tasks) -> (...), which is how the bootstrap below evaluates all its resamples at once.
# --------------------------------------------------------------------------------------------------

ScoreDict = Mapping[str, ArrayLike]
AggregateFn = Callable[[np.ndarray], np.ndarray]


def _runs_tasks(scores: ArrayLike, name: str = "scores") -> np.ndarray:
    """`scores` as a float array whose last two axes are (runs, tasks)."""
    array = np.asarray(scores, dtype=np.float64)
    if array.ndim < 2:
        raise ValueError(
            f"{name}: expected a (num_runs, num_tasks) array, got shape {array.shape}"
            + ("; for a single task pass scores[:, None]" if array.ndim == 1 else "")
        )
    return array


def aggregate_mean(scores: ArrayLike) -> np.ndarray:
    """Mean over tasks of each task's mean score over runs.

    `scores`: (..., num_runs, num_tasks) -> (...). Sensitive to outlying runs and tasks; prefer the
    IQM for a robust summary."""
    s = _runs_tasks(scores)
    return np.mean(np.mean(s, axis=-2), axis=-1)


def aggregate_median(scores: ArrayLike) -> np.ndarray:
    """Median over tasks of each task's mean score over runs (rliable's definition).

    `scores`: (..., num_runs, num_tasks) -> (...). Robust to outlying tasks, but ignores how the
    other tasks score and has a high variance with few tasks."""
    s = _runs_tasks(scores)
    return np.median(np.mean(s, axis=-2), axis=-1)


def aggregate_iqm(scores: ArrayLike) -> np.ndarray:
    """Interquartile mean: the mean of the middle 50% of all num_runs x num_tasks scores.

    With N scores, the int(N / 4) smallest and the int(N / 4) largest are dropped, as
    `scipy.stats.trim_mean(scores, 0.25, axis=None)` does. `scores`: (..., num_runs, num_tasks)
    -> (...)."""
    s = _runs_tasks(scores)
    flat = s.reshape(*s.shape[:-2], -1)
    n = flat.shape[-1]
    cut = int(0.25 * n)
    # Only the two cut points need sorting: everything between them is the middle half.
    middle = np.partition(flat, (cut, n - cut - 1), axis=-1)[..., cut : n - cut]
    return np.mean(middle, axis=-1)


def aggregate_optimality_gap(scores: ArrayLike, gamma: float = 1.0) -> np.ndarray:
    """How far the scores fall short of `gamma`: gamma - mean(min(score, gamma)) over all runs and
    tasks. Lower is better; scores above gamma earn nothing extra. Meaningful for normalised scores
    (gamma = 1: the reference "solved" score). `scores`: (..., num_runs, num_tasks) -> (...)."""
    s = _runs_tasks(scores)
    return gamma - np.mean(np.minimum(s, gamma), axis=(-2, -1))


def probability_of_improvement(scores_x: ArrayLike, scores_y: ArrayLike) -> np.ndarray:
    """P(X > Y): the probability that a random run of configuration X beats a random run of Y on
    the same task, averaged over tasks.

    Per task it is the Mann-Whitney U statistic of X against Y divided by n * m (n, m runs): the
    fraction of the n * m pairs of runs that X wins, a tie counting 1/2. `scores_x`:
    (..., n, num_tasks), `scores_y`: (..., m, num_tasks), leading axes broadcast -> (...).
    """
    x = _runs_tasks(scores_x, "scores_x")
    y = _runs_tasks(scores_y, "scores_y")
    if x.shape[-1] != y.shape[-1]:
        raise ValueError(
            f"scores_x has {x.shape[-1]} tasks but scores_y has {y.shape[-1]}; "
            "both must be (num_runs, num_tasks) arrays over the same tasks"
        )
    n, m = x.shape[-2], y.shape[-2]
    x_runs, y_runs = x[..., :, None, :], y[..., None, :, :]  # (..., n, m, tasks) when compared
    wins = np.count_nonzero(x_runs > y_runs, axis=(-3, -2))
    ties = np.count_nonzero(x_runs == y_runs, axis=(-3, -2))
    return np.mean((wins + 0.5 * ties) / (n * m), axis=-1)


AGGREGATES: dict[str, AggregateFn] = {
    "IQM": aggregate_iqm,
    "mean": aggregate_mean,
    "median": aggregate_median,
    "optimality gap": aggregate_optimality_gap,
}
"""The four aggregates the paper recommends reporting, by display name."""


def score_distribution(scores: ArrayLike, taus: ArrayLike) -> np.ndarray:
    """Run-score distribution: the fraction of all num_runs x num_tasks scores above each threshold.

    `scores`: (..., num_runs, num_tasks), `taus`: (num_taus,) -> (..., num_taus)."""
    s = _runs_tasks(scores)
    t = np.asarray(taus, dtype=np.float64).reshape(-1)
    return np.mean(s[..., None] > t, axis=(-3, -2))


def average_score_distribution(scores: ArrayLike, taus: ArrayLike) -> np.ndarray:
    """Average-score distribution: the fraction of tasks whose mean score over runs is above each
    threshold (rliable's `use_score_distribution=False`).

    `scores`: (..., num_runs, num_tasks), `taus`: (num_taus,) -> (..., num_taus)."""
    s = _runs_tasks(scores)
    t = np.asarray(taus, dtype=np.float64).reshape(-1)
    return np.mean(np.mean(s, axis=-2)[..., None] > t, axis=-2)


# --------------------------------------------------------------------------------------------------
# Input checks
# --------------------------------------------------------------------------------------------------


def check_scores(scores: ArrayLike, name: str = "scores", ndim: int = 2) -> np.ndarray:
    """`scores` as a float64 (num_runs, num_tasks) array (or, with ndim=3, a (num_runs, num_tasks,
    num_points) array of curves), or a ValueError saying which array is wrong and how."""
    expected = "(num_runs, num_tasks)" if ndim == 2 else "(num_runs, num_tasks, num_points)"
    try:
        array = np.asarray(scores, dtype=np.float64)
    except (TypeError, ValueError) as error:
        raise ValueError(f"{name}: expected a {expected} array of numbers ({error})") from None
    if array.ndim != ndim:
        hint = "; for a single task pass scores[:, None]" if ndim == 2 and array.ndim == 1 else ""
        raise ValueError(f"{name}: expected a {expected} array, got shape {array.shape}{hint}")
    if min(array.shape) < 1:
        raise ValueError(f"{name}: expected a {expected} array, got the empty shape {array.shape}")
    bad = np.count_nonzero(~np.isfinite(array))
    if bad:
        raise ValueError(f"{name}: {bad} of its {array.size} scores are NaN or infinite")
    return array


def check_score_dict(score_dict: ScoreDict, ndim: int = 2) -> dict[str, np.ndarray]:
    """Check every configuration's array (see `check_scores`) and that all have the same number of
    tasks (and, for curves, of points)."""
    if not score_dict:
        raise ValueError("no configurations: the score dict is empty")
    checked = {
        name: check_scores(s, f"configuration {name!r}", ndim) for name, s in score_dict.items()
    }
    shapes = {name: s.shape[1:] for name, s in checked.items()}
    if len(set(shapes.values())) > 1:
        what = "tasks" if ndim == 2 else "(tasks, points)"
        listed = ", ".join(
            f"{name!r}: {shape[0] if ndim == 2 else shape}" for name, shape in shapes.items()
        )
        raise ValueError(
            f"configurations differ in their number of {what} ({listed}); every configuration "
            "must be scored on the same tasks, in the same column order"
        )
    return checked


def _check_bootstrap_settings(reps: int, confidence: float, method: str) -> None:
    if int(reps) != reps or reps < 1:
        raise ValueError(f"reps must be a positive integer, got {reps!r}")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be strictly between 0 and 1, got {confidence!r}")
    if method not in ("percentile", "basic"):
        raise ValueError(f"method must be 'percentile' or 'basic', got {method!r}")


# --------------------------------------------------------------------------------------------------
# Stratified bootstrap
# --------------------------------------------------------------------------------------------------

# Resamples are drawn in blocks, each from its own random stream spawned from the seed, so that the
# result depends on (seed, reps) only and not on how many blocks are evaluated at once.
_BLOCK_REPS = 100
# Array elements touched per evaluated chunk of blocks: bounds memory (8 bytes each, a few copies).
_CHUNK_ELEMENTS = 1 << 23


def _stack_aggregates(
    aggregate_fn: AggregateFn | Sequence[AggregateFn] | Mapping[str, AggregateFn],
) -> AggregateFn:
    """One function from several: their outputs stacked along a new last axis."""
    if callable(aggregate_fn):
        return aggregate_fn
    fns = list(aggregate_fn.values() if isinstance(aggregate_fn, Mapping) else aggregate_fn)
    if not fns or not all(callable(f) for f in fns):
        raise ValueError("aggregate_fn must be a function or a non-empty list/dict of functions")
    return lambda scores: np.stack([np.asarray(f(scores), np.float64) for f in fns], axis=-1)


def stratified_bootstrap(
    statistic: Callable[..., np.ndarray],
    *arrays: ArrayLike,
    reps: int = 50_000,
    seed: int = 0,
    work_per_rep: int | None = None,
) -> np.ndarray:
    """The bootstrap distribution of `statistic(*arrays)` under stratified resampling of runs.

    Each array is (num_runs, num_tasks, ...). In each resample, every cell [n, m, ...] takes the
    score of a run drawn uniformly with replacement from task m's runs (at the same trailing
    position): runs are resampled within each task (the strata), tasks stay fixed. Several arrays
    (e.g. two configurations for the probability of improvement) are resampled independently.
    `statistic(*resampled)` receives arrays with a leading axis of resamples and must return one
    result per resample. Returns (reps, *result_shape).

    The resamples are evaluated in chunks; `work_per_rep` (default: the arrays' size) estimates the
    elements the statistic touches per resample and sets the chunk size, not the result.
    """
    arrays = tuple(_runs_tasks(a, f"array {i}") for i, a in enumerate(arrays))
    if not arrays:
        raise ValueError("stratified_bootstrap needs at least one (num_runs, num_tasks) array")
    if int(reps) != reps or reps < 1:
        raise ValueError(f"reps must be a positive integer, got {reps!r}")
    work = max(1, work_per_rep or sum(a.size for a in arrays))
    blocks_per_chunk = max(1, _CHUNK_ELEMENTS // (work * _BLOCK_REPS))
    streams = np.random.SeedSequence(seed).spawn(-(-reps // _BLOCK_REPS))
    results = []
    for start in range(0, len(streams), blocks_per_chunk):
        resampled: list[list[np.ndarray]] = [[] for _ in arrays]
        for block, stream in enumerate(streams[start : start + blocks_per_chunk], start):
            rng = np.random.default_rng(stream)
            size = min(_BLOCK_REPS, reps - block * _BLOCK_REPS)
            for i, a in enumerate(arrays):
                runs = rng.integers(0, a.shape[0], size=(size, *a.shape))
                resampled[i].append(np.take_along_axis(a[None], runs, axis=1))
        results.append(np.asarray(statistic(*[np.concatenate(r) for r in resampled])))
    return np.concatenate(results)


def confidence_interval(
    samples: ArrayLike,
    point: ArrayLike,
    confidence: float = 0.95,
    method: str = "percentile",
) -> np.ndarray:
    """(2, ...) lower and upper bounds from a bootstrap distribution `samples` (reps, ...).

    'percentile' takes the (1 - confidence) / 2 and (1 + confidence) / 2 quantiles of the samples
    (linear interpolation, as numpy.percentile); 'basic' reflects them about the point estimate:
    [2 * point - upper quantile, 2 * point - lower quantile]."""
    _check_bootstrap_settings(1, confidence, method)
    alpha = (1.0 - confidence) / 2
    lower, upper = np.percentile(np.asarray(samples), [100 * alpha, 100 * (1.0 - alpha)], axis=0)
    if method == "basic":
        point = np.asarray(point, dtype=np.float64)
        lower, upper = 2.0 * point - upper, 2.0 * point - lower
    return np.stack([lower, upper])


def interval_estimates(
    score_dict: ScoreDict,
    aggregate_fn: AggregateFn | Sequence[AggregateFn] | Mapping[str, AggregateFn],
    *,
    reps: int = 50_000,
    confidence: float = 0.95,
    method: str = "percentile",
    seed: int = 0,
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Point estimates and stratified-bootstrap confidence intervals of aggregate metrics.

    `score_dict` maps configuration -> (num_runs, num_tasks) scores. `aggregate_fn` is one aggregate
    ((..., runs, tasks) -> (...), e.g. `aggregate_iqm`) or a list or dict of them (e.g.
    `AGGREGATES`), whose results are stacked along a last axis in that order. Returns
    `(points, intervals)`: per configuration, the aggregate(s) of its scores (shape () or (k,)) and
    a (2, ...) array of lower and upper bounds. Each configuration is resampled `reps` times from
    `seed` (the same streams for each: identical scores give identical intervals).
    """
    _check_bootstrap_settings(reps, confidence, method)
    checked = check_score_dict(score_dict)
    fn = _stack_aggregates(aggregate_fn)
    points, intervals = {}, {}
    for name, scores in checked.items():
        point = np.asarray(fn(scores), dtype=np.float64)
        samples = stratified_bootstrap(fn, scores, reps=reps, seed=seed)
        points[name] = point
        intervals[name] = confidence_interval(samples, point, confidence, method)
    return points, intervals


def probability_of_improvement_estimates(
    score_dict: ScoreDict,
    pairs: Sequence[tuple[str, str]] | None = None,
    *,
    reps: int = 50_000,
    confidence: float = 0.95,
    method: str = "percentile",
    seed: int = 0,
) -> tuple[dict[tuple[str, str], np.ndarray], dict[tuple[str, str], np.ndarray]]:
    """P(X > Y) (see `probability_of_improvement`) with a bootstrap confidence interval for each
    pair (X, Y) of configurations; by default every pair, X before Y in `score_dict`'s order.

    X's and Y's runs are resampled independently, each within its tasks. Returns
    `(points, intervals)` keyed by (X, Y): a scalar and its (2,) lower and upper bounds.
    P(Y > X) = 1 - P(X > Y), so one order per pair says it all.
    """
    _check_bootstrap_settings(reps, confidence, method)
    checked = check_score_dict(score_dict)
    if pairs is None:
        pairs = list(itertools.combinations(checked, 2))
    points, intervals = {}, {}
    for x, y in pairs:
        for name in (x, y):
            if name not in checked:
                raise ValueError(
                    f"pair ({x!r}, {y!r}): no configuration {name!r} among {list(checked)}"
                )
        sx, sy = checked[x], checked[y]
        point = np.asarray(probability_of_improvement(sx, sy))
        work = sx.shape[0] * sy.shape[0] * sx.shape[1]  # the pairwise comparison dominates
        samples = stratified_bootstrap(
            probability_of_improvement, sx, sy, reps=reps, seed=seed, work_per_rep=work
        )
        points[(x, y)] = point
        intervals[(x, y)] = confidence_interval(samples, point, confidence, method)
    return points, intervals


def performance_profiles(
    score_dict: ScoreDict,
    taus: ArrayLike,
    *,
    use_score_distribution: bool = True,
    reps: int = 2_000,
    confidence: float = 0.95,
    method: str = "percentile",
    seed: int = 0,
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Performance profiles at thresholds `taus`, with pointwise bootstrap confidence bands.

    With `use_score_distribution` (the paper's recommendation) a profile is the run-score
    distribution: the fraction of all runs x tasks scoring above tau (`score_distribution`);
    otherwise the fraction of tasks whose mean score is above tau (`average_score_distribution`).
    Returns `(profiles, intervals)`: per configuration (num_taus,) and (2, num_taus). The default
    `reps` is rliable's for profiles.
    """
    _check_bootstrap_settings(reps, confidence, method)
    checked = check_score_dict(score_dict)
    t = np.asarray(taus, dtype=np.float64).reshape(-1)
    if t.size == 0 or not np.all(np.isfinite(t)):
        raise ValueError("taus must be a non-empty list of finite thresholds")
    profile_of = score_distribution if use_score_distribution else average_score_distribution
    fn = lambda scores: profile_of(scores, t)
    profiles, intervals = {}, {}
    for name, scores in checked.items():
        profile = fn(scores)
        samples = stratified_bootstrap(
            fn, scores, reps=reps, seed=seed, work_per_rep=scores.size * t.size
        )
        profiles[name] = profile
        intervals[name] = confidence_interval(samples, profile, confidence, method)
    return profiles, intervals


def learning_curve_estimates(
    curve_dict: ScoreDict,
    aggregate_fn: AggregateFn = aggregate_iqm,
    *,
    reps: int = 2_000,
    confidence: float = 0.95,
    method: str = "percentile",
    seed: int = 0,
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """An aggregate (IQM by default) at each point of a learning curve, with pointwise bootstrap
    confidence bands: the sample-efficiency curves of the paper.

    `curve_dict` maps configuration -> (num_runs, num_tasks, num_points) scores, e.g. the return at
    each logged step; configurations may have different numbers of points (their own x values).
    Returns `(points, intervals)`: per configuration (num_points,) and (2, num_points). Each point
    is resampled on its own, as rliable does for arrays with trailing axes.
    """
    _check_bootstrap_settings(reps, confidence, method)
    if not curve_dict:
        raise ValueError("no configurations: the curve dict is empty")
    checked = {n: check_scores(c, f"configuration {n!r}", ndim=3) for n, c in curve_dict.items()}
    tasks = {name: c.shape[1] for name, c in checked.items()}
    if len(set(tasks.values())) > 1:
        raise ValueError(
            f"configurations differ in their number of tasks ({tasks}); every configuration "
            "must be scored on the same tasks, in the same order"
        )
    # (..., runs, tasks, points) -> (..., points, runs, tasks) -> aggregate -> (..., points)
    fn = lambda curves: aggregate_fn(np.moveaxis(curves, -1, -3))
    points, intervals = {}, {}
    for name, curves in checked.items():
        point = np.asarray(fn(curves), dtype=np.float64)
        samples = stratified_bootstrap(fn, curves, reps=reps, seed=seed)
        points[name] = point
        intervals[name] = confidence_interval(samples, point, confidence, method)
    return points, intervals


# --------------------------------------------------------------------------------------------------
# Plots of the estimates above. Each draws on a matplotlib Figure of its own (no pyplot state) and
# returns the written path when given `out_path`, else the Figure.
# --------------------------------------------------------------------------------------------------


def _colors(names: Sequence[str], colors: Mapping[str, Any] | None) -> dict[str, Any]:
    """One colour per configuration, stable across plots: the default colour cycle in order."""
    return {name: (colors or {}).get(name, f"C{i % 10}") for i, name in enumerate(names)}


def _finish(fig: Any, out_path: str | None) -> Any:
    if out_path is None:
        return fig
    fig.savefig(out_path, bbox_inches="tight")
    return out_path


def plot_interval_estimates(
    points: Mapping[str, ArrayLike],
    intervals: Mapping[str, ArrayLike],
    metric_names: Sequence[str],
    out_path: str | None = None,
    *,
    xlabel: str | None = None,
    colors: Mapping[str, Any] | None = None,
    title: str | None = None,
) -> Any:
    """One panel per metric, side by side with a shared y axis listing the configurations; in each,
    a bar per configuration spans its confidence interval and a black tick marks the estimate.

    `points[name]`: (num_metrics,) and `intervals[name]`: (2, num_metrics), as returned by
    `interval_estimates` with a list of aggregates; `metric_names` titles the panels."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    names = list(points)
    num_metrics = len(metric_names)
    for name in names:
        if np.atleast_1d(points[name]).shape != (num_metrics,):
            raise ValueError(
                f"points[{name!r}] has shape {np.shape(points[name])}, but there are "
                f"{num_metrics} metric names"
            )
    color = _colors(names, colors)
    longest = max(len(n) for n in names)
    fig = Figure(
        figsize=(0.8 + 0.07 * longest + 2.6 * num_metrics, 1.1 + 0.42 * len(names)),
        layout="constrained",
    )
    axes = fig.subplots(1, num_metrics, sharey=True, squeeze=False)[0]
    rows = np.arange(len(names))[::-1]  # the first configuration on top
    for j, (ax, metric) in enumerate(zip(axes, metric_names, strict=True)):
        ends = []
        for row, name in zip(rows, names, strict=True):
            lower, upper = np.asarray(intervals[name], dtype=np.float64).reshape(2, -1)[:, j]
            point = np.atleast_1d(points[name])[j]
            ax.barh(row, upper - lower, left=lower, height=0.6, color=color[name], alpha=0.75)
            ax.vlines(point, row - 0.32, row + 0.32, color="k", lw=1.5)
            ends += [lower, upper, point]
        # Bars are "sticky" to autoscaling margins: pad the limits by hand.
        low, high = min(ends), max(ends)
        pad = 0.06 * (high - low) or 0.05 * max(abs(high), 1e-3)
        ax.set_xlim(low - pad, high + pad)
        ax.set_title(metric)
        ax.xaxis.set_major_locator(MaxNLocator(4))
        ax.grid(True, axis="x", alpha=0.3)
        ax.spines[["top", "right"]].set_visible(False)
        ax.tick_params(axis="y", length=0)
    axes[0].set_yticks(rows, labels=names)
    axes[0].set_ylim(-0.6, len(names) - 0.4)
    if xlabel:
        fig.supxlabel(xlabel)
    if title:
        fig.suptitle(title)
    return _finish(fig, out_path)


def plot_probability_of_improvement(
    points: Mapping[tuple[str, str], ArrayLike],
    intervals: Mapping[tuple[str, str], ArrayLike],
    out_path: str | None = None,
    *,
    colors: Mapping[str, Any] | None = None,
    title: str | None = None,
) -> Any:
    """One row per pair (X, Y): X on the left axis, Y on the right, a bar over the confidence
    interval of P(X > Y); the dashed line at 0.5 is "no
    difference". The estimate is a dot, written out with its interval above the bar. Takes what
    `probability_of_improvement_estimates` returns."""
    from matplotlib.figure import Figure

    pairs = list(points)
    if not pairs:
        raise ValueError("no pairs to plot: probability of improvement needs two configurations")
    color = _colors(list(dict.fromkeys(name for pair in pairs for name in pair)), colors)
    longest = max(len(name) for pair in pairs for name in pair)
    fig = Figure(figsize=(4.5 + 0.14 * longest, 1.2 + 0.45 * len(pairs)), layout="constrained")
    ax = fig.subplots()
    rows = np.arange(len(pairs))[::-1]
    for row, pair in zip(rows, pairs, strict=True):
        lower, upper = np.asarray(intervals[pair], dtype=np.float64).reshape(2)
        point = float(points[pair])
        ax.barh(row, upper - lower, left=lower, height=0.45, color=color[pair[0]], alpha=0.75)
        # A dot, not a tick: it stays visible when the interval is a point or at 0 or 1.
        ax.plot(point, row, "o", color="k", ms=5, zorder=3)
        ax.annotate(
            f"{point:.2f} [{lower:.2f}, {upper:.2f}]",
            (min(max(point, 0.15), 0.85), row + 0.26),
            ha="center",
            va="bottom",
            fontsize="small",
        )
    ax.axvline(0.5, ls="--", color="k", alpha=0.5, lw=1)
    ax.set_xlim(-0.03, 1.03)
    ax.set_ylim(-0.6, len(pairs) - 0.1)
    ax.set_yticks(rows, labels=[x for x, _ in pairs])
    ax.set_ylabel("X")
    right = ax.twinx()
    right.set_ylim(ax.get_ylim())
    right.set_yticks(rows, labels=[y for _, y in pairs])
    right.set_ylabel("Y")
    for axis in (ax, right):
        axis.tick_params(axis="y", length=0)
    ax.set_xlabel("P(X > Y): probability that a run of X beats a run of Y on a task")
    ax.grid(True, axis="x", alpha=0.3)
    ax.set_title(title or "probability of improvement (95% CI)")
    return _finish(fig, out_path)


def plot_performance_profiles(
    taus: ArrayLike,
    profiles: Mapping[str, ArrayLike],
    intervals: Mapping[str, ArrayLike],
    out_path: str | None = None,
    *,
    xlabel: str = "score τ",
    ylabel: str = "fraction of runs with score > τ",
    colors: Mapping[str, Any] | None = None,
    title: str | None = None,
) -> Any:
    """A performance profile per configuration (a line) with its confidence band (shaded), as
    `performance_profiles` returns them."""
    from matplotlib.figure import Figure

    t = np.asarray(taus, dtype=np.float64).reshape(-1)
    color = _colors(list(profiles), colors)
    fig = Figure(figsize=(6.0, 4.0), layout="constrained")
    ax = fig.subplots()
    for name, profile in profiles.items():
        lower, upper = np.asarray(intervals[name], dtype=np.float64)
        # A profile is piecewise constant: held from each threshold to the next.
        ax.step(t, profile, where="post", color=color[name], lw=2, label=name)
        ax.fill_between(t, lower, upper, step="post", color=color[name], alpha=0.2, lw=0)
    ax.set_xlim(t[0], t[-1])
    ax.set_ylim(-0.02, 1.02)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    ax.legend(loc="best")
    ax.set_title(title or "performance profile (95% CI bands)")
    return _finish(fig, out_path)


def plot_sample_efficiency_curves(
    xs: Mapping[str, ArrayLike] | ArrayLike,
    points: Mapping[str, ArrayLike],
    intervals: Mapping[str, ArrayLike],
    out_path: str | None = None,
    *,
    xlabel: str = "env steps",
    ylabel: str = "IQM return",
    colors: Mapping[str, Any] | None = None,
    title: str | None = None,
) -> Any:
    """An aggregate learning curve per configuration (a line) with its pointwise confidence band
    (shaded), as `learning_curve_estimates` returns them; `xs` gives the x values, per
    configuration or shared."""
    from matplotlib.figure import Figure

    color = _colors(list(points), colors)
    fig = Figure(figsize=(6.5, 4.0), layout="constrained")
    ax = fig.subplots()
    all_x = []
    for name, curve in points.items():
        x = np.asarray(xs[name] if isinstance(xs, Mapping) else xs, dtype=np.float64)
        lower, upper = np.asarray(intervals[name], dtype=np.float64)
        ax.plot(x, curve, color=color[name], lw=2, label=name, **_markers(len(x)))
        ax.fill_between(x, lower, upper, color=color[name], alpha=0.2, lw=0)
        all_x.append(x)
    _format_steps(ax.xaxis, np.concatenate(all_x) if all_x else np.zeros(0))
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    ax.legend(loc="best")
    if title:
        ax.set_title(title)
    return _finish(fig, out_path)


# --------------------------------------------------------------------------------------------
# pass@k (Chen et al. 2021, "Evaluating Large Language Models Trained on Code")


def pass_at_k(num_samples: ArrayLike, num_correct: ArrayLike, k: int) -> np.ndarray:
    """The unbiased estimate of pass@k per problem from `num_correct` right answers among
    `num_samples` samples: 1 - C(n - c, k) / C(n, k), the chance that k of the n samples drawn
    without replacement include a right one.

    Computed as Chen et al.'s stable product 1 - prod_{i=n-c+1}^{n} (1 - k / i) rather than from
    the binomials, which overflow for large n. Where n - c < k every draw of k holds a right
    answer: 1. Needs 1 <= k <= n."""
    n = np.asarray(num_samples, dtype=np.int64)
    c = np.asarray(num_correct, dtype=np.int64)
    n, c = np.broadcast_arrays(n, c)
    if k < 1 or (n < k).any():
        raise ValueError(f"pass@{k} needs 1 <= k <= the number of samples per problem")
    if ((c < 0) | (c > n)).any():
        raise ValueError("num_correct must lie in [0, num_samples]")
    out = np.ones(n.shape, dtype=np.float64)
    for index in np.ndindex(n.shape):
        ni, ci = int(n[index]), int(c[index])
        if ni - ci >= k:
            out[index] = 1.0 - np.prod(1.0 - k / np.arange(ni - ci + 1, ni + 1, dtype=np.float64))
    return out


def pass_at_k_estimates(
    correct: ArrayLike, ks: Sequence[int], *, reps: int = 10_000, seed: int = 0
) -> dict[int, tuple[float, list[float]]]:
    """pass@k of each k in `ks` over problems with `correct` [problems, samples] (1 for a right
    sample): the mean over problems of the unbiased per-problem estimate, and its bootstrap 95%
    interval with problems resampled (`interval_estimates`). pass@1 is the mean sampled
    accuracy."""
    correct = np.asarray(correct, dtype=np.float64)
    if correct.ndim != 2:
        raise ValueError(f"correct must be [problems, samples], got shape {correct.shape}")
    n = correct.shape[1]
    c = correct.sum(axis=1).round().astype(np.int64)
    out = {}
    for k in ks:
        per_problem = pass_at_k(n, c, k)
        points, bounds = interval_estimates(
            {"x": per_problem[:, None]}, aggregate_mean, reps=reps, seed=seed
        )
        out[k] = (float(points["x"]), [float(b) for b in bounds["x"]])
    return out
