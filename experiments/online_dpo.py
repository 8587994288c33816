"""Online DPO of a language model: pairs of its own samples, ranked by a reward model or a
task's reward, trained on with DPO's losses as they are drawn.

    python experiments/online_dpo.py --config.init_from=runs/sft3 --workdir=runs/online_dpo
    python experiments/online_dpo.py --config.init_from=runs/sft3 --config.reward_model=runs/rm3 \\
        --workdir=runs/online_dpo_rm

Every update samples num_samples completions per prompt from the current policy, scores them
(`--config.reward_model`: reward_model.py runs, comma-separated for an ensemble; without it the
task's reward, grpo.py's prompts, prompt files and reward functions), pairs each prompt's best
against its worst and takes DPO steps (`--config.loss_type`: sigmoid, ipo or simpo) against the
starting model, all in one compiled program (`algos/online_dpo.py`); chunks, checkpoints and
resumption are the runner's. `params/` holds the policy; `summary.json` reports
`final_mean_reward` (the task's reward of the samples, last 10 updates), `final_score` and the
held-out `eval_task_accuracy` against the start's.
"""

from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import numpy as np  # noqa: E402

from algos import online_dpo  # noqa: E402
from jaxrl import extras, runner, sharding  # noqa: E402
from jaxrl.trainers import lm_runs, prompt_rl  # noqa: E402

# A missing optional extra is one error line, before flags are parsed or anything compiles.
extras.require("lm", "experiments/online_dpo.py")

FLAGS = runner.define_flags("online_dpo.py", seeds=False)


def main(argv: list[str]) -> None:
    run = lm_runs.setup(FLAGS, online_dpo.Config, "online_dpo")
    flat, config, mesh = run.flat, run.config, run.mesh
    prompt_rl.reward_model_paths(run, online_dpo.Config())  # its flags, before anything is read
    prompts = prompt_rl.read_task(run)
    reward_params, reward_config, reward_paths = prompt_rl.reward_models(
        run, prompts.prompt_length, online_dpo.Config()
    )
    params, model, source = lm_runs.initial_params(run)
    evaluate = prompt_rl.evaluator(run, model, prompts)
    run_dir, initial = prompt_rl.open_run_with_initial_evaluation(run, evaluate, params)
    algorithm = online_dpo.make(config, model, prompts.task, params, mesh, reward_config)
    task_data = jax.device_put(prompts.task.data, sharding.replicated(mesh))
    inputs = online_dpo.Inputs(params, reward_params, task_data)
    job = lm_runs.job(
        run,
        algorithm,
        f"online DPO {prompts.name}",
        inputs_for=lambda first, count: inputs,
        units_name="completions",
        units_per_step=config.batch_size * config.num_samples,
        after_chunk=prompt_rl.evaluate_every(run, evaluate, lambda state: state.params),
    )
    result = runner.train(job, flat.run, run_dir, FLAGS["kill_after_chunk"].value)
    policy = result.states.params
    lm_runs.save_params(run_dir, policy)

    t0 = time.time()
    final = evaluate(policy)
    summary = runner.summary_fields(job, result, time.time() - t0)
    summary |= prompt_rl.summary_fields(
        run, prompts, run_dir, initial, final, config.batch_size * config.num_samples, source,
        summary["steps_per_second"],
    )  # fmt: skip
    rows = prompt_rl.last_rows(
        run_dir, prompt_rl.FINAL_WINDOW, config.num_steps, flat.run.log_every
    )
    summary |= {
        "loss_type": config.loss_type,
        "reward_model": reward_paths,
        "final_score": float(np.mean([row["score"] for row in rows])),
        "final_tied_fraction": float(np.mean([row["tied_fraction"] for row in rows])),
    }
    run_dir.write_summary(summary)
    prompt_rl.write_plots_and_report(
        run, prompts, run_dir, initial, final, summary, f"online DPO {prompts.name}"
    )


if __name__ == "__main__":
    runner.main(main)
