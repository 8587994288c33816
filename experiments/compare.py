"""Compare configurations over seeds and tasks with the statistics of Agarwal et al. (2021).

    python experiments/compare.py runs/a runs/b --out_dir=runs/compare
    python experiments/compare.py lr=2.5e-4=runs/lr-small lr=1e-3=runs/lr-large --out_dir=runs/cmp
    python experiments/compare.py ppo=runs/ppo-cartpole ppo=runs/ppo-acrobot \\
        sac=runs/sac-cartpole sac=runs/sac-acrobot \\
        --normalize=CartPole-v1:0:500 --normalize=Acrobot-v1:-500:0 --out_dir=runs/cmp

Each argument is a run directory written by an experiment script (experiments/ppo.py, sac.py,
cql.py, ...), optionally as LABEL=DIR. Directories with the same label form one configuration:
their seeds are pooled, task by task; a directory without a label is labelled by its name. A
task is the run's environment (`env` in summary.json; for offline runs, env and dataset; else
`task` or `dataset`). Each seed's score is `--metric` (summary.json's `<metric>_per_seed`, or the
value itself for a single-seed run), optionally min-max normalised per task with --normalize.

Printed: per configuration the interquartile mean (IQM), mean and median with 95% stratified
bootstrap confidence intervals (runs resampled within each task), the optimality gap when scores
are normalised, and the probability of improvement P(X > Y) of every pair. Written to --out_dir:
`comparison.json` (all numbers), `interval_estimates.png`, `performance_profile.png`,
`probability_of_improvement.png` (two or more configurations) and `learning_curves.png` (IQM
over seeds of the training return against env steps, read from each run's metrics.jsonl).
Language-model runs (grpo.py, ppo_lm.py, online_dpo.py) also get a table of their held-out pass@k
(summary.json's eval_pass_at_K) with intervals; `--metric=eval_pass_at_4` compares by one of them.
Runs of several tasks are compared only with --normalize for each task: raw returns of different
environments are on different scales.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from jaxrl import interrupts

interrupts.for_a_script()  # first: Ctrl-C during the imports below is one line too

from absl import flags

from jaxrl import cli
from jaxrl.comparison import compare

_OUT_DIR = flags.DEFINE_string(
    "out_dir", None, "Directory for comparison.json and the plots; without it, only the table."
)
_METRIC = flags.DEFINE_string(
    "metric",
    "final_eval_return",
    "Score of each seed: summary.json's <metric>_per_seed (or <metric> for a one-seed run).",
)
_NORMALIZE = flags.DEFINE_multi_string(
    "normalize",
    [],
    "TASK:MIN:MAX, one per task: scores become (score - MIN) / (MAX - MIN), so tasks aggregate "
    "on one scale and the optimality gap (to 1) is reported.",
)
_CURVE_METRIC = flags.DEFINE_string(
    "curve_metric",
    None,
    "metrics.jsonl series for the learning curves (its <name>_per_run lists). Default: "
    "episode_return, else eval_return, whichever every run logged.",
)
_CURVE_X = flags.DEFINE_string("curve_x", "env_steps", "metrics.jsonl column for the x axis.")
_REPS = flags.DEFINE_integer(
    "reps", 50_000, "Bootstrap resamples for the intervals, profiles and P(X > Y)."
)
_CURVE_REPS = flags.DEFINE_integer(
    "curve_reps", 2_000, "Bootstrap resamples at each point of the learning curves."
)
_CONFIDENCE = flags.DEFINE_float("confidence", 0.95, "Coverage of the confidence intervals.")
_BOOTSTRAP_SEED = flags.DEFINE_integer("bootstrap_seed", 0, "Seed of the bootstrap resampling.")


def main(argv: list[str]) -> None:
    compare(
        argv[1:],
        _OUT_DIR.value,
        metric=_METRIC.value,
        normalize=_NORMALIZE.value,
        curve_metric=_CURVE_METRIC.value,
        curve_x=_CURVE_X.value,
        reps=_REPS.value,
        curve_reps=_CURVE_REPS.value,
        confidence=_CONFIDENCE.value,
        bootstrap_seed=_BOOTSTRAP_SEED.value,
    )


if __name__ == "__main__":
    cli.main(main, positional=True)
