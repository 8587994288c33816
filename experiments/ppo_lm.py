"""PPO of a language model (RLHF): against a reward model trained on preferences, or a task's
verifiable reward.

    TASK="--config.task.num_digits=3 --config.task.num_train=512 --config.task.num_eval=128"
    python experiments/sft.py $TASK --config.num_steps=50 --workdir=runs/sft
    python experiments/reward_model.py $TASK --config.init_from=runs/sft --workdir=runs/rm
    python experiments/ppo_lm.py --config.init_from=runs/sft --config.reward_model=runs/rm \\
        --workdir=runs/ppo
    python experiments/ppo_lm.py --config.init_from=runs/sft --workdir=runs/ppo_task  # task reward

Every update samples one completion per prompt, scores it with the reward model (or the task),
computes the policy's log-probs and values and the reference's log-probs, folds the KL penalty
into per-token rewards, estimates advantages by GAE and takes PPO's clipped steps, all inside one
compiled program (`algos/ppo_lm.py`); updates run in compiled chunks on `jaxrl.runner`, with a
checkpoint after each, and a restarted run resumes from the newest. The reference is the
starting model. --config.reward_model takes reward_model.py run directories (comma-separated:
an ensemble combined by --config.ensemble_rule); without it the score is the task's reward, as
in grpo.py (its prompts, prompt files and reward functions work here the same way). With a
reward model the task's reward is still logged (`reward`, `reward_<name>`): where it is the
known "gold" reward, the distance between it and `score` is over-optimisation of the proxy.
--config.critic=separate trains a critic of its own, started from the (first) reward model as
TRL does, or from the policy without one.

The run directory follows the other scripts' contract: `params/` holds the trained policy (a
language model later scripts can start from), `summary.json` reports `final_mean_reward` (the
task's reward of the samples, mean over the last 10 updates), `final_score`, `final_kl` and the
held-out `eval_task_accuracy` against the start's.
"""

from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import numpy as np  # noqa: E402

from algos import ppo_lm  # noqa: E402
from jaxrl import extras, runner, sharding  # noqa: E402
from jaxrl.trainers import lm_runs, prompt_rl  # noqa: E402

# A missing optional extra is one error line, before flags are parsed or anything compiles.
extras.require("lm", "experiments/ppo_lm.py")

FLAGS = runner.define_flags("ppo_lm.py", seeds=False)


def main(argv: list[str]) -> None:
    run = lm_runs.setup(FLAGS, ppo_lm.Config, "ppo_lm")
    flat, config, mesh = run.flat, run.config, run.mesh
    prompt_rl.reward_model_paths(run, ppo_lm.Config())  # its flags, before anything is read
    prompts = prompt_rl.read_task(run)
    reward_params, reward_config, reward_paths = prompt_rl.reward_models(
        run, prompts.prompt_length, ppo_lm.Config()
    )
    lm_params, model, source = lm_runs.initial_params(run)

    critic_params, critic_model = None, None
    if config.critic == "separate" and reward_params is not None:
        # TRL's choice: the critic starts as the reward model (an ensemble's first member).
        critic_model = reward_config
        first = jax.tree.map(lambda x: x[0], reward_params) if len(reward_paths) > 1 else None
        critic_params = jax.tree.map(jax.numpy.copy, first or reward_params)
    params = ppo_lm.init_params(
        lm_params, model, jax.random.key(flat.seed), config.critic, critic_params
    )
    on_mesh = set(sharding.replicated(mesh).device_set)
    params = jax.tree.map(
        lambda x: x if x.sharding.device_set == on_mesh else jax.device_put(
            x, sharding.replicated(mesh)
        ),
        params,
    )  # fmt: skip

    evaluate = prompt_rl.evaluator(run, model, prompts)
    run_dir, initial = prompt_rl.open_run_with_initial_evaluation(run, evaluate, lm_params)
    algorithm = ppo_lm.make(config, model, prompts.task, params, mesh, reward_config, critic_model)
    task_data = jax.device_put(prompts.task.data, sharding.replicated(mesh))
    inputs = ppo_lm.Inputs(lm_params, reward_params, task_data)
    job = lm_runs.job(
        run,
        algorithm,
        f"PPO {prompts.name}",
        inputs_for=lambda first, count: inputs,
        units_name="completions",
        units_per_step=config.batch_size,
        after_chunk=prompt_rl.evaluate_every(run, evaluate, lambda state: state.params["policy"]),
    )
    result = runner.train(job, flat.run, run_dir, FLAGS["kill_after_chunk"].value)
    policy = result.states.params["policy"]
    lm_runs.save_params(run_dir, policy)  # the policy alone: a language model's run

    t0 = time.time()
    final = evaluate(policy)
    summary = runner.summary_fields(job, result, time.time() - t0)
    summary |= prompt_rl.summary_fields(
        run, prompts, run_dir, initial, final, config.batch_size, source,
        summary["steps_per_second"],
    )  # fmt: skip
    rows = prompt_rl.last_rows(
        run_dir, prompt_rl.FINAL_WINDOW, config.num_steps, flat.run.log_every
    )
    summary |= {
        "reward_model": reward_paths,
        "critic": config.critic,
        "final_score": float(np.mean([row["score"] for row in rows])),
        "final_kl": float(np.mean([row["kl"] for row in rows])),
        "final_kl_coef": float(result.states.kl_coef),
    }
    run_dir.write_summary(summary)
    title = f"PPO {prompts.name}"
    if reward_paths:
        run_dir.write_learning_curve(
            x="step", y="score", title=f"{title}: reward-model score", file_name="score_curve.png"
        )
    prompt_rl.write_plots_and_report(run, prompts, run_dir, initial, final, summary, title)


if __name__ == "__main__":
    runner.main(main)
