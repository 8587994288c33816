"""GRPO (or Dr. GRPO / DAPO / RLOO) of a language model on a text task with a verifiable reward.

    python experiments/grpo.py --workdir=runs/grpo                 # reverse 3 digits, random init
    python experiments/grpo.py --config.variant=dapo --config.seed=1
    python experiments/sft.py --config=experiments/configs/sft.py:addition --workdir=runs/sft_add
    python experiments/grpo.py --config=experiments/configs/grpo.py:addition \\
        --config.init_from=runs/sft_add --workdir=runs/grpo_add

Every update samples prompts, generates group_size completions per prompt, scores them and
updates the policy inside one compiled program (`algos/grpo.py`); updates run in compiled chunks
on `jaxrl.runner`, with a checkpoint after each, and a restarted run resumes from the newest.
--config.init_from takes an SFT or DPO run directory, a Hugging Face checkpoint directory or a
GGUF file (its architecture and tokenizer come along); without it the model starts from random
weights. Rewards are the task's (`envs.text`): the answer reward
(exact match 1, partial credit below 0.5), plus `rewards.format_weight` x the format reward, plus
an optional host Python function (`--config.rewards.host=my_module:my_reward`, called as
f(prompts, completions, answer=[...])).

`summary.json` reports `final_mean_reward` (the answer reward of the sampled completions, mean
over the last 10 updates) and `eval_task_accuracy` (greedy generations exactly right on held-out
problems), next to the starting model's `initial_eval_task_accuracy`.
"""

from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402

from algos import grpo  # noqa: E402
from jaxrl import extras, runner, sharding  # noqa: E402
from jaxrl.trainers import lm_runs, prompt_rl  # noqa: E402

# A missing optional extra is one error line, before flags are parsed or anything compiles.
extras.require("lm", "experiments/grpo.py")

FLAGS = runner.define_flags("grpo.py", seeds=False)


def main(argv: list[str]) -> None:
    run = lm_runs.setup(FLAGS, grpo.Config, "grpo")
    config, mesh = run.config, run.mesh
    prompts = prompt_rl.read_task(run)
    params, model, source = lm_runs.initial_params(run)
    evaluate = prompt_rl.evaluator(run, model, prompts)
    run_dir, initial = prompt_rl.open_run_with_initial_evaluation(run, evaluate, params)

    algorithm = grpo.make(config, model, prompts.task, params, mesh)
    # The starting model is the KL penalty's reference; a prompt file's token table is the
    # prompts' source. Both are the update's inputs, placed on the devices once.
    task_data = jax.device_put(prompts.task.data, sharding.replicated(mesh))
    inputs = grpo.Inputs(params if config.kl_beta > 0 else None, task_data)
    job = lm_runs.job(
        run,
        algorithm,
        f"GRPO ({config.variant}) {prompts.name}",
        inputs_for=lambda first, count: inputs,
        units_name="completions",
        units_per_step=config.completions_per_update,
        after_chunk=prompt_rl.evaluate_every(run, evaluate, lambda state: state.params),
    )
    result = runner.train(job, run.flat.run, run_dir, FLAGS["kill_after_chunk"].value)
    params = result.states.params
    lm_runs.save_params(run_dir, params)

    t0 = time.time()
    final = evaluate(params)
    summary = runner.summary_fields(job, result, time.time() - t0)
    summary |= {"variant": config.variant}
    summary |= prompt_rl.summary_fields(
        run, prompts, run_dir, initial, final, config.completions_per_update, source,
        summary["steps_per_second"],
    )  # fmt: skip
    run_dir.write_summary(summary)
    title = f"GRPO ({config.variant}) {prompts.name}"
    prompt_rl.write_plots_and_report(run, prompts, run_dir, initial, final, summary, title)


if __name__ == "__main__":
    runner.main(main)
