"""pass@k: the unbiased estimator of Chen et al. (2021) against a NumPy reference written from the
paper's definition with exact binomials, and pass@1 as the mean sampled accuracy."""

import math

import numpy as np
import pytest

from jaxrl import statistics


def reference(n: int, c: int, k: int) -> float:
    """1 - C(n - c, k) / C(n, k), with Python's exact integers."""
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def test_pass_at_k_equals_the_binomial_reference_on_fixed_samples():
    rng = np.random.default_rng(0)
    correct = (rng.random((50, 16)) < rng.random((50, 1))).astype(float)  # per-problem skill
    counts = correct.sum(axis=1).astype(int)
    for k in (1, 2, 4, 8, 16):
        expected = np.mean([reference(16, int(c), k) for c in counts])
        estimates = statistics.pass_at_k_estimates(correct, [k], reps=200)
        np.testing.assert_allclose(estimates[k][0], expected, rtol=1e-12)
        low, high = estimates[k][1]
        assert low <= estimates[k][0] <= high
    # Per problem, including the edges c = 0 and n - c < k.
    for n, c, k in [(10, 0, 3), (10, 10, 3), (10, 8, 3), (200, 3, 50), (1, 1, 1)]:
        np.testing.assert_allclose(statistics.pass_at_k(n, c, k), reference(n, c, k), rtol=1e-12)


def test_pass_at_1_is_the_mean_sampled_accuracy_and_pass_at_k_grows_with_k():
    correct = np.array([[1, 0, 0, 1], [0, 0, 0, 0], [1, 1, 1, 1], [0, 1, 0, 0]], float)
    estimates = statistics.pass_at_k_estimates(correct, [1, 2, 4], reps=500)
    assert estimates[1][0] == pytest.approx(correct.mean(), rel=1e-12)
    assert estimates[1][0] < estimates[2][0] < estimates[4][0] == 0.75  # 3 of 4 ever right


def test_pass_at_k_refuses_k_above_the_samples():
    with pytest.raises(ValueError, match="1 <= k"):
        statistics.pass_at_k(4, 1, 5)


@pytest.mark.parametrize(
    "script, args",
    [
        ("grpo.py", ["--config.group_size=4", "--config.batch_size=8"]),
        ("ppo_lm.py", ["--config.batch_size=8"]),
        ("online_dpo.py", ["--config.num_minibatches=1", "--config.batch_size=8"]),
        (
            "multiturn.py",
            ["--config.batch_size=2", "--config.group_size=4", "--config.task.max_turns=3"],
        ),
    ],
)
def test_lm_summaries_carry_pass_at_k_with_intervals(script, args, tmp_path):
    """Held-out pass@1, @2 and @4 of 4 samples per prompt (multi-turn: 4 episodes per game),
    before and after training, each with a bootstrap interval around it; pass@k grows with k."""
    from tests.script_runs import read_json, run_script

    workdir = str(tmp_path / "run")
    run_script(
        script,
        *args,
        "--config.num_steps=2",
        "--config.task.num_eval=16",
        "--config.run.num_chunks=1",
        "--config.run.progress=False",
        "--config.run.tensorboard=False",
        f"--workdir={workdir}",
    )
    summary = read_json(workdir, "summary.json")
    assert summary["eval_samples"] == 4
    for prefix in ("eval_", "initial_eval_"):
        points = [summary[f"{prefix}pass_at_{k}"] for k in (1, 2, 4)]
        assert points == sorted(points), points
        for k, point in zip((1, 2, 4), points, strict=True):
            low, high = summary[f"{prefix}pass_at_{k}_ci95"]
            assert 0.0 <= low <= point <= high <= 1.0, (k, low, point, high)


def test_curves_of_few_updates_have_markers_and_whole_update_ticks(tmp_path):
    """A held-out curve at updates 0, 1, 2: points drawn as markers, ticks at whole updates
    (matplotlib's default ticks at 0.25 read "250m" under the engineering formatter)."""
    out = str(tmp_path / "curve.png")
    fig = statistics.plot_sample_efficiency_curves(
        [0, 1, 2], {"greedy": np.array([0.2, 0.3, 0.5])}, {"greedy": np.zeros((2, 3))}
    )
    ax = fig.axes[0]
    assert ax.lines[0].get_marker() == "o"
    fig.canvas.draw()
    ticks = [t.get_text() for t in ax.get_xticklabels() if t.get_text()]
    assert ticks and all(t.lstrip("−-").isdigit() for t in ticks), ticks
    assert (
        statistics.plot_sample_efficiency_curves(
            [0, 1], {"a": np.zeros(2)}, {"a": np.zeros((2, 2))}, out
        )
        == out
    )
