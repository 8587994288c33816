"""experiments/compare.py on run directories: synthetic ones written here (fast), one real PPO run
(the file format the scripts actually write), and its one-line errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from jaxrl import comparison as compare
from jaxrl import statistics
from jaxrl.config import InputError

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(REPO, "experiments", "compare.py")
PPO = os.path.join(REPO, "experiments", "ppo.py")


def write_run(path, env, per_seed, curve=None, algo="ppo", steps=(512, 1024, 1536, 2048), **extra):
    """A run directory as experiments/ppo.py writes it: summary.json and metrics.jsonl."""
    os.makedirs(path, exist_ok=True)
    summary = {
        "algo": algo,
        "env": env,
        "num_seeds": len(per_seed),
        "final_eval_return": float(np.mean(per_seed)),
        "final_eval_return_per_seed": list(per_seed),
        **extra,
    }
    with open(os.path.join(path, "summary.json"), "w") as f:
        json.dump(summary, f)
    if curve is not None:
        with open(os.path.join(path, "metrics.jsonl"), "w") as f:
            for step, values in zip(steps, curve, strict=True):
                row = {"update": step // 512, "env_steps": step, "episode_return": np.mean(values)}
                f.write(json.dumps({**row, "episode_return_per_run": list(values)}) + "\n")
    return str(path)


def run_compare(*args, check=True):
    result = subprocess.run(
        [sys.executable, SCRIPT, *args], capture_output=True, text=True, timeout=300, cwd=REPO
    )
    if check and result.returncode != 0:
        raise AssertionError(f"compare.py failed ({result.returncode}):\n{result.stderr[-3000:]}")
    return result


def error_of(capsys, fn, *args):
    """compare's helpers raise InputError with one line (the script prints it as `error: ...`,
    exit status 2: tests/test_bad_inputs.py), printing nothing themselves."""
    with pytest.raises(InputError) as error:
        fn(*args)
    assert not capsys.readouterr().err
    err = f"error: {error.value}"
    assert "\n" not in err
    return err


def test_compare_synthetic_runs_two_tasks_pooled_and_normalized(tmp_path):
    rng = np.random.default_rng(0)
    curve = lambda n, top: [
        list(np.minimum(top, rng.normal(top * f, 5, n))) for f in (0.1, 0.4, 0.7, 1)
    ]
    # Configuration "a": CartPole from two directories (3 + 2 seeds pooled), Acrobot from one.
    a1 = write_run(tmp_path / "a1", "CartPole-v1", [500.0, 480.0, 350.0], curve(3, 500))
    a2 = write_run(tmp_path / "a2", "CartPole-v1", [420.0, 500.0], curve(2, 500))
    a3 = write_run(tmp_path / "a3", "Acrobot-v1", [-90.0, -85.0, -100.0, -80.0, -95.0])
    b1 = write_run(tmp_path / "b", "CartPole-v1", [200.0, 250.0, 180.0, 320.0, 150.0])
    b2 = write_run(tmp_path / "b_acro", "Acrobot-v1", [-200.0, -150.0, -500.0, -120.0, -180.0])
    out = tmp_path / "cmp"
    result = run_compare(
        f"a={a1}", f"a={a2}", f"a={a3}", f"b={b1}", f"b={b2}",
        "--normalize=CartPole-v1:0:500", "--normalize=Acrobot-v1:-500:0",
        f"--out_dir={out}", "--reps=3000",
    )  # fmt: skip
    lines = result.stdout.splitlines()
    header = next(line for line in lines if line.startswith("configuration"))
    assert "IQM [95% CI]" in header and "optimality gap [95% CI]" in header
    assert next(line for line in lines if line.startswith("a ")).split()[1:3] == ["2", "5"]
    assert any(line.strip().startswith("a > b") for line in lines)
    # A metrics.jsonl is missing (a3, b_acro): the table is printed, the curves are left out.
    assert "note: no learning_curves.png" in result.stdout

    with open(out / "comparison.json") as f:
        comparison = json.load(f)
    assert comparison["tasks"] == ["Acrobot-v1", "CartPole-v1"]
    a = comparison["configurations"]["a"]
    np.testing.assert_allclose(
        a["scores"]["CartPole-v1"], np.array([500, 480, 350, 420, 500]) / 500
    )
    scores = {
        name: np.array([c["scores"]["Acrobot-v1"], c["scores"]["CartPole-v1"]]).T
        for name, c in comparison["configurations"].items()
    }
    assert scores["b"][2, 0] == 0.0  # -500 on Acrobot is the minimum: 0 normalised
    for name, fn in [("IQM", statistics.aggregate_iqm), ("median", statistics.aggregate_median)]:
        assert a[name]["estimate"] == pytest.approx(float(fn(scores["a"])), abs=1e-12)
        lo, hi = a[name]["ci"]
        assert lo <= a[name]["estimate"] <= hi
    gap = comparison["configurations"]["b"]["optimality gap"]["estimate"]
    assert gap == pytest.approx(float(statistics.aggregate_optimality_gap(scores["b"])))
    (poi,) = comparison["probability_of_improvement"]
    assert (poi["x"], poi["y"]) == ("a", "b")
    assert poi["estimate"] == pytest.approx(
        float(statistics.probability_of_improvement(scores["a"], scores["b"]))
    )
    assert comparison["learning_curves"] is None
    for name in ["interval_estimates.png", "probability_of_improvement.png",
                 "performance_profile.png"]:  # fmt: skip
        assert os.path.getsize(out / name) > 5000
    assert not (out / "learning_curves.png").exists()


def test_compare_real_ppo_runs(tmp_path):
    """A real, tiny PPO run against a synthetic one on the same task, with learning curves."""
    ppo_dir = str(tmp_path / "ppo")
    subprocess.run(
        [sys.executable, PPO, f"--workdir={ppo_dir}", "--num_seeds=3",
         "--config.total_timesteps=10240", "--config.eval_episodes=2",
         "--config.run.num_chunks=1", "--config.run.log_every=5",
         "--config.run.progress=False", "--config.run.tensorboard=False"],
        check=True, capture_output=True, timeout=300, cwd=REPO,
    )  # fmt: skip
    steps = (2560, 5120, 7680, 10240)  # ppo logs every 5 updates of 512 steps
    other = write_run(tmp_path / "other", "CartPole-v1", [9.0, 10.0, 11.0, 12.0],
                      [[9.0, 10.0, 11.0, 12.0]] * 4, steps=steps)  # fmt: skip
    out = tmp_path / "cmp"
    result = run_compare(f"lr=2.5e-4={ppo_dir}", other, f"--out_dir={out}", "--reps=2000")
    assert "optimality gap" not in result.stdout  # raw returns: no normalisation, no gap
    with open(out / "comparison.json") as f:
        comparison = json.load(f)
    assert list(comparison["configurations"]) == ["lr=2.5e-4", "other"]
    with open(os.path.join(ppo_dir, "summary.json")) as f:
        per_seed = json.load(f)["final_eval_return_per_seed"]
    assert comparison["configurations"]["lr=2.5e-4"]["scores"] == {"CartPole-v1": per_seed}
    curves = comparison["learning_curves"]
    assert curves["metric"] == "episode_return"
    assert curves["configurations"]["lr=2.5e-4"]["x"] == list(steps)
    assert curves["configurations"]["other"]["iqm"] == [10.5] * 4
    for name in ["learning_curves.png", "interval_estimates.png", "performance_profile.png",
                 "probability_of_improvement.png"]:  # fmt: skip
        assert os.path.getsize(out / name) > 5000


def test_compare_errors(tmp_path, capsys):
    good = write_run(tmp_path / "good", "CartPole-v1", [1.0, 2.0])
    result = run_compare(str(tmp_path / "missing"), good, check=False)
    assert result.returncode == 2
    assert result.stderr.strip() == (
        f"error: {tmp_path / 'missing'}: no such directory; pass run directories of "
        "experiments/<algo>.py"
    )

    os.makedirs(tmp_path / "unfinished")
    unfinished = str(tmp_path / "unfinished")
    err = error_of(capsys, compare.load_run, unfinished, "final_eval_return", "env_steps")
    assert "unfinished: no summary.json" in err
    err = error_of(capsys, compare.load_run, good, "eval_task_accuracy", "env_steps")
    assert "no 'eval_task_accuracy' (--metric); this run has" in err and "final_eval_return" in err
    with open(os.path.join(good, "summary.json")) as f:
        summary = json.load(f)
    err = error_of(
        capsys, compare.read_scores, good, {**summary, "num_seeds": 3}, "final_eval_return"
    )
    assert "final_eval_return_per_seed should list 3 values (num_seeds)" in err
    err = error_of(capsys, compare.read_scores, good, {**summary, "median": 1.5}, "median")
    assert "median is a mean over 2 seeds and the run has no median_per_seed" in err

    other_task = write_run(tmp_path / "acrobot", "Acrobot-v1", [1.0, 2.0])
    err = error_of(capsys, compare.build_configurations, [f"a={good}", f"b={other_task}"],
                   "final_eval_return", "env_steps")  # fmt: skip
    assert "configurations cover different tasks: 'a' has ['CartPole-v1'], 'b' has" in err
    three = write_run(tmp_path / "three", "Acrobot-v1", [1.0, 2.0, 3.0])
    err = error_of(capsys, compare.build_configurations, [f"a={good}", f"a={three}"],
                   "final_eval_return", "env_steps")  # fmt: skip
    assert "configuration 'a' has {'Acrobot-v1': 3, 'CartPole-v1': 2} runs per task" in err

    err = error_of(capsys, compare.parse_normalization, ["CartPole-v1:500"])
    assert (
        err == "error: --normalize=CartPole-v1:500: expected TASK:MIN:MAX, e.g. CartPole-v1:0:500"
    )
    configs, tasks = compare.build_configurations([good], "final_eval_return", "env_steps")
    err = error_of(capsys, compare.normalize_scores, configs, tasks, {"Pong": (0.0, 1.0)})
    assert "no range for task 'CartPole-v1'" in err


def test_parse_argument(tmp_path):
    run = write_run(tmp_path / "lr=1e-3", "CartPole-v1", [1.0])
    assert compare.parse_argument(run) == ("lr=1e-3", run)  # an existing path is never split
    assert compare.parse_argument(f"lr=2.5e-4={run}") == ("lr=2.5e-4", run)
    assert compare.parse_argument("base=runs/missing") == ("base", "runs/missing")
    assert compare.parse_argument("runs/x/") == ("x", "runs/x/")


def test_compare_reports_held_out_pass_at_k_of_language_model_runs(tmp_path):
    """GRPO-like summaries (one seed each, eval_pass_at_K with ci95): a configuration of one run
    keeps its interval; one of two runs gets the mean over runs and a bootstrap interval;
    comparison.json holds both; --metric=eval_pass_at_4 compares by it."""

    def lm_run(name, p1, p4):
        path = tmp_path / name
        os.makedirs(path)
        summary = {"algo": "grpo", "task": "say_digit", "num_seeds": 1, "eval_task_accuracy": p1}
        summary |= {"eval_pass_at_1": p1, "eval_pass_at_1_ci95": [p1 - 0.1, p1 + 0.1]}
        summary |= {"eval_pass_at_4": p4, "eval_pass_at_4_ci95": [p4 - 0.1, p4 + 0.1]}
        with open(path / "summary.json", "w") as f:
            json.dump(summary, f)
        return str(path)

    a, b1, b2 = lm_run("a", 0.3, 0.6), lm_run("b1", 0.5, 0.8), lm_run("b2", 0.7, 0.9)
    out = tmp_path / "cmp"
    result = run_compare(
        f"a={a}", f"b={b1}", f"b={b2}", "--metric=eval_pass_at_4", f"--out_dir={out}", "--reps=500"
    )
    assert "held-out pass@k" in result.stdout
    with open(out / "comparison.json") as f:
        comparison = json.load(f)
    table = comparison["pass_at_k"]
    assert table["a"]["1"] == {"estimate": 0.3, "ci": [0.19999999999999998, 0.4]}
    assert table["b"]["4"]["estimate"] == pytest.approx(0.85)
    low, high = table["b"]["4"]["ci"]
    assert 0.8 <= low <= 0.85 <= high <= 0.9
    assert comparison["configurations"]["a"]["mean"]["estimate"] == pytest.approx(0.6)
