"""Aggregate statistics of jaxrl.statistics against rliable, whose outputs on fixed inputs are
stored in fixtures/rliable_reference.json (made by fixtures/make_rliable_reference.py), and by
hand.

Tolerances. Point estimates are deterministic functions of the scores: they must equal rliable's
to 1e-12. Confidence intervals come from two independent bootstraps (ours, rliable's) of
B = 50,000 resamples each, so they differ by Monte-Carlo error. The empirical CDF of B resamples,
at any fixed value, has standard deviation sqrt(p (1 - p) / B) = 7.0e-4 at p = 0.025 (and 0.975);
the difference of two independent ones, 9.9e-4. So our 2.5% quantile (the percentile interval's
lower bound) must lie between rliable's 2.0% and 3.0% bootstrap quantiles, and our 97.5% quantile
between its 97% and 98%: a margin of 0.005 in probability, five standard deviations. Stated in
probability rather than in score units, the tolerance also holds for the discrete bootstrap
distributions of medians, ties and profiles, where a quantile jumps between atoms.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from jaxrl import statistics as ev

FIXTURE = os.path.join(os.path.dirname(__file__), "fixtures", "rliable_reference.json")
with open(FIXTURE) as f:
    REFERENCE = json.load(f)
REPS = REFERENCE["reps"]
LEVELS = REFERENCE["quantile_levels"]
assert LEVELS == [0.02, 0.025, 0.03, 0.97, 0.975, 0.98] and REPS == 50_000
CASES = sorted(REFERENCE["cases"])
AGGREGATES = [ev.AGGREGATES[name] for name in REFERENCE["aggregates"]]
SLACK = 1e-12  # float round-off around the brackets


def case_scores(case: str) -> dict[str, np.ndarray]:
    return {k: np.array(v) for k, v in REFERENCE["cases"][case]["scores"].items()}


def assert_in_brackets(ci, quantiles, point=None, method="percentile"):
    """`ci` (2, ...) against rliable's bootstrap quantiles (6, ...) at LEVELS (see the docstring).
    For 'basic' intervals, [2 point - q(97.5%), 2 point - q(2.5%)], the brackets reflect too."""
    q = np.asarray(quantiles)
    low_bracket, high_bracket = (q[0], q[2]), (q[3], q[5])
    if method == "basic":
        low_bracket = (2 * point - q[5], 2 * point - q[3])
        high_bracket = (2 * point - q[2], 2 * point - q[0])
    for bound, (lo, hi) in zip(ci, (low_bracket, high_bracket), strict=True):
        assert np.all(bound >= lo - SLACK) and np.all(bound <= hi + SLACK), (bound, lo, hi)


@pytest.mark.parametrize("case", CASES)
def test_point_estimates_equal_rliable(case):
    ref = REFERENCE["cases"][case]
    scores = case_scores(case)
    for name, s in scores.items():
        ours = [fn(s) for fn in AGGREGATES]
        np.testing.assert_allclose(ours, ref["points"][name], rtol=0, atol=1e-12)
    for pair in ref["probability_of_improvement"]:
        ours = ev.probability_of_improvement(scores[pair["x"]], scores[pair["y"]])
        assert abs(ours - pair["point"]) <= 1e-12, pair
    taus = ref["taus"]
    for name, s in scores.items():
        for variant, fn in [
            ("score_distribution", ev.score_distribution),
            ("average_score_distribution", ev.average_score_distribution),
        ]:
            expected = ref["profiles"][variant][name]["profile"]
            np.testing.assert_allclose(fn(s, taus), expected, rtol=0, atol=1e-12)


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("method", ["percentile", "basic"])
def test_interval_estimates_match_rliable(case, method):
    ref = REFERENCE["cases"][case]
    points, intervals = ev.interval_estimates(
        case_scores(case), AGGREGATES, reps=REPS, method=method, seed=0
    )
    for name in points:
        np.testing.assert_allclose(points[name], ref["points"][name], rtol=0, atol=1e-12)
        assert intervals[name].shape == (2, len(AGGREGATES))
        quantiles = ref["bootstrap_quantiles"][name]
        assert_in_brackets(intervals[name], quantiles, points[name], method)
        # The fixture is self-consistent: rliable's own API output passes the same test.
        assert_in_brackets(np.array(ref[f"{method}_ci"][name]), quantiles, points[name], method)


@pytest.mark.parametrize("case", CASES)
def test_probability_of_improvement_intervals_match_rliable(case):
    ref = REFERENCE["cases"][case]["probability_of_improvement_intervals"]
    pairs = [(p["x"], p["y"]) for p in ref]
    points, intervals = ev.probability_of_improvement_estimates(
        case_scores(case), pairs, reps=REPS, seed=0
    )
    assert list(points) == pairs
    for pair in ref:
        key = (pair["x"], pair["y"])
        assert_in_brackets(intervals[key], pair["bootstrap_quantiles"])
        if "percentile_ci" in pair:
            assert_in_brackets(np.array(pair["percentile_ci"]), pair["bootstrap_quantiles"])


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("variant", ["score_distribution", "average_score_distribution"])
def test_performance_profiles_match_rliable(case, variant):
    ref = REFERENCE["cases"][case]
    profiles, intervals = ev.performance_profiles(
        case_scores(case),
        ref["taus"],
        use_score_distribution=variant == "score_distribution",
        reps=REPS,
        seed=0,
    )
    for name, expected in ref["profiles"][variant].items():
        np.testing.assert_allclose(profiles[name], expected["profile"], rtol=0, atol=1e-12)
        assert intervals[name].shape == (2, len(ref["taus"]))
        assert_in_brackets(intervals[name], expected["bootstrap_quantiles"])
        assert_in_brackets(np.array(expected["percentile_ci"]), expected["bootstrap_quantiles"])


def test_hand_computed_aggregates():
    scores = np.arange(1.0, 9.0).reshape(4, 2)  # 8 scores: IQM drops 1, 2 and 7, 8
    assert ev.aggregate_iqm(scores) == 4.5
    assert ev.aggregate_mean(scores) == 4.5
    # Task means 4 and 5 -> median 4.5; with a third task of mean 10 the median is 5.
    assert ev.aggregate_median(np.c_[scores, np.full(4, 10.0)]) == 5.0
    # Nine scores: int(9 / 4) = 2 dropped each side, the mean of the middle five.
    assert ev.aggregate_iqm(np.array([[9.0, 1, 100], [2, 8, 3], [7, -50, 5]])) == 5.0
    # Optimality gap: gamma minus the mean of min(score, gamma).
    assert ev.aggregate_optimality_gap(np.array([[0.5, 1.5], [0.0, 1.0]])) == 1 - 2.5 / 4
    assert ev.aggregate_optimality_gap(np.array([[50.0]]), gamma=100) == 50.0
    # P(X > Y): pairs (1,1) tie, (1,0) win, (2,1) win, (2,0) win -> 3.5 / 4.
    assert ev.probability_of_improvement([[1.0], [2.0]], [[1.0], [0.0]]) == 0.875
    # Averaged over tasks; each task may have its own sign; 3 runs of X against 1 of Y.
    x, y = np.array([[1.0, 0.0], [2.0, 0.0], [3.0, 0.0]]), np.array([[2.0, 1.0]])
    assert ev.probability_of_improvement(x, y) == (1.5 / 3 + 0) / 2
    assert ev.probability_of_improvement(y, x) == (1.5 / 3 + 1) / 2
    # Leading batch axes are kept.
    batch = np.stack([scores, scores + 1, 2 * scores])
    np.testing.assert_array_equal(ev.aggregate_iqm(batch), [4.5, 5.5, 9.0])
    np.testing.assert_array_equal(ev.score_distribution(scores, [0, 4, 8]), [1.0, 0.5, 0.0])
    np.testing.assert_array_equal(ev.average_score_distribution(scores, [4, 4.5]), [0.5, 0.5])


def test_bootstrap_intervals_by_hand():
    # Identical runs: every resample is the data, the interval is the point.
    constant = {"c": np.full((6, 3), 2.0)}
    points, intervals = ev.interval_estimates(constant, ev.aggregate_iqm, reps=500)
    assert points["c"] == 2.0
    np.testing.assert_array_equal(intervals["c"], [2.0, 2.0])
    # One run per task: nothing to resample.
    points, intervals = ev.interval_estimates({"one": [[1.0, 3.0]]}, ev.aggregate_mean, reps=300)
    np.testing.assert_array_equal(intervals["one"], [2.0, 2.0])
    # Two runs of one task, values 0 and 1: the mean of a resample is 0, 1/2 or 1 with
    # probabilities 1/4, 1/2, 1/4, so the 95% percentile interval is [0, 1], a 40% one [1/2, 1/2].
    two = {"t": [[0.0], [1.0]]}
    assert np.array_equal(ev.interval_estimates(two, ev.aggregate_mean, reps=2000)[1]["t"], [0, 1])
    narrow = ev.interval_estimates(two, ev.aggregate_mean, reps=2000, confidence=0.4)[1]["t"]
    np.testing.assert_array_equal(narrow, [0.5, 0.5])


def test_bootstrap_is_reproducible_and_independent_of_chunking(monkeypatch):
    scores = {"a": np.random.default_rng(1).normal(size=(5, 4))}
    _, first = ev.interval_estimates(scores, ev.aggregate_iqm, reps=1234, seed=7)
    monkeypatch.setattr(ev, "_CHUNK_ELEMENTS", 1)  # one block of resamples at a time
    _, chunked = ev.interval_estimates(scores, ev.aggregate_iqm, reps=1234, seed=7)
    np.testing.assert_array_equal(first["a"], chunked["a"])
    _, other_seed = ev.interval_estimates(scores, ev.aggregate_iqm, reps=1234, seed=8)
    assert not np.array_equal(first["a"], other_seed["a"])
    samples = ev.stratified_bootstrap(ev.aggregate_iqm, scores["a"], reps=1234, seed=7)
    assert samples.shape == (1234,)
    # Stratified: each task's resampled column holds only that task's scores.
    column_sets = ev.stratified_bootstrap(lambda s: s, scores["a"], reps=50)
    for task in range(4):
        assert set(column_sets[:, :, task].ravel()) <= set(scores["a"][:, task])


def test_learning_curve_estimates():
    rng = np.random.default_rng(0)
    curves = {"a": rng.normal(size=(6, 2, 5)).cumsum(-1), "b": np.ones((3, 2, 4))}
    points, intervals = ev.learning_curve_estimates(curves, reps=400)
    assert points["a"].shape == (5,) and intervals["a"].shape == (2, 5)
    for i in range(5):
        assert points["a"][i] == pytest.approx(ev.aggregate_iqm(curves["a"][:, :, i]), abs=1e-15)
    assert np.all(intervals["a"][0] <= points["a"] + 1e-12)
    assert np.all(points["a"] <= intervals["a"][1] + 1e-12)
    np.testing.assert_array_equal(intervals["b"], np.ones((2, 4)))


def test_input_errors_name_the_configuration_and_the_shape():
    good = np.zeros((5, 2))
    expected = (
        r"configuration 'ppo': expected a \(num_runs, num_tasks\) array, got shape \(5,\); "
        r"for a single task pass scores\[:, None\]"
    )
    with pytest.raises(ValueError, match=expected):
        ev.interval_estimates({"ppo": np.zeros(5)}, ev.aggregate_iqm)
    with pytest.raises(ValueError, match=r"'a': 2, 'b': 3.*same tasks"):
        ev.interval_estimates({"a": good, "b": np.zeros((5, 3))}, ev.aggregate_iqm)
    with pytest.raises(ValueError, match=r"configuration 'nan': 1 of its 10 scores are NaN"):
        ev.performance_profiles({"nan": np.r_[good.ravel()[:-1], np.nan].reshape(5, 2)}, [0.0])
    with pytest.raises(ValueError, match=r"configuration 'e': .*empty shape \(0, 2\)"):
        ev.interval_estimates({"e": np.zeros((0, 2))}, ev.aggregate_mean)
    with pytest.raises(ValueError, match="score dict is empty"):
        ev.interval_estimates({}, ev.aggregate_mean)
    with pytest.raises(ValueError, match="scores_x has 2 tasks but scores_y has 3"):
        ev.probability_of_improvement(good, np.zeros((4, 3)))
    with pytest.raises(ValueError, match=r"no configuration 'c'"):
        ev.probability_of_improvement_estimates({"a": good, "b": good}, [("a", "c")])
    with pytest.raises(ValueError, match="confidence must be strictly between 0 and 1"):
        ev.interval_estimates({"a": good}, ev.aggregate_mean, confidence=95)
    with pytest.raises(ValueError, match="method must be 'percentile' or 'basic'"):
        ev.interval_estimates({"a": good}, ev.aggregate_mean, method="bca")
    with pytest.raises(ValueError, match=r"\(num_runs, num_tasks, num_points\)"):
        ev.learning_curve_estimates({"a": good}, reps=10)
    with pytest.raises(ValueError, match=r"expected a \(num_runs, num_tasks\) array"):
        ev.aggregate_iqm([1.0, 2.0, 3.0])


def test_plots_write_files(tmp_path):
    rng = np.random.default_rng(0)
    scores = {"short": rng.random((5, 3)), "a much longer label": rng.random((4, 3)) + 0.2}
    points, intervals = ev.interval_estimates(scores, ev.AGGREGATES, reps=200)
    path = ev.plot_interval_estimates(
        points, intervals, list(ev.AGGREGATES), str(tmp_path / "ie.png"), xlabel="score"
    )
    poi = ev.probability_of_improvement_estimates(scores, reps=200)
    taus = np.linspace(0, 1.2, 25)
    profiles = ev.performance_profiles(scores, taus, reps=200)
    curves = {k: np.repeat(v[:, :, None], 6, -1) * np.arange(6) for k, v in scores.items()}
    curve_estimates = ev.learning_curve_estimates(curves, reps=100)
    paths = [
        path,
        ev.plot_probability_of_improvement(*poi, str(tmp_path / "poi.png")),
        ev.plot_performance_profiles(taus, *profiles, str(tmp_path / "pp.png")),
        ev.plot_sample_efficiency_curves(
            np.arange(6) * 1000, *curve_estimates, str(tmp_path / "curves.png")
        ),
    ]
    for p in paths:
        assert os.path.getsize(p) > 5000
    figure = ev.plot_performance_profiles(taus, *profiles)  # no path: the Figure
    assert len(figure.axes) == 1
    with pytest.raises(ValueError, match=r"points\['short'\] has shape \(4,\), but there are 2"):
        ev.plot_interval_estimates(points, intervals, ["IQM", "mean"])
