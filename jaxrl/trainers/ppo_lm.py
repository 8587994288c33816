"""PPO of a language model against a reward model (RLHF): what `experiments/ppo_lm.py` runs
(`jaxrl.trainers.base` describes the trainers' shape).

    from jaxrl.trainers import ppo_lm
    config = ppo_lm.config()
    config.reward_model = "runs/rm"   # a reward_model trainer run
    result = ppo_lm.train(config, "runs/ppo_lm", model="runs/sft")
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import numpy as np

from algos import ppo_lm
from jaxrl import runner, sharding
from jaxrl.trainers import base, lm_runs, prompt_data, prompt_eval

config = functools.partial(base.load_config, "ppo_lm")


@base.lm_trainer("ppo_lm")
def train(
    flat: Any, parts: lm_runs.Parts, workdir: str | None, kill_after_chunk: int | None
) -> base.Result:
    """PPO of a language model against a reward model (RLHF). Called as `train(config=None,
    workdir=None, *, model=None, train_data=None, eval_data=None, rewards=None, game=None)`:
    `config` is experiments/configs/ppo_lm.py's (`config(preset)`), the parts are
    `jaxrl.trainers.base`'s; returns Result(state, summary, run_dir)."""
    run = lm_runs.setup(flat, workdir, ppo_lm.Config, "ppo_lm", parts)
    flat, config, mesh = run.flat, run.config, run.mesh
    prompts, reward_params, reward_config, reward_paths = prompt_data.with_reward_models(
        run, ppo_lm.Config
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

    evaluate = prompt_eval.evaluator(run, model, prompts)
    run_dir, initial = prompt_eval.open_run_with_initial_evaluation(run, evaluate, lm_params)
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
        after_chunk=prompt_eval.evaluate_every(run, evaluate, lambda state: state.params["policy"]),
    )
    result = runner.train(job, flat.run, run_dir, kill_after_chunk)
    policy = result.states.params["policy"]  # saved alone: a language model's run
    summary = prompt_eval.finish(
        run, prompts, run_dir, job, result, (evaluate, initial, policy), config.batch_size,
        source, f"PPO {prompts.name}",
        lambda rows: {
            "reward_model": reward_paths,
            "critic": config.critic,
            "final_score": float(np.mean([row["score"] for row in rows])),
            "final_kl": float(np.mean([row["kl"] for row in rows])),
            "final_kl_coef": float(result.states.kl_coef),
        },
    )  # fmt: skip
    if reward_paths:
        run_dir.write_learning_curve(
            x="step", y="score", title=f"PPO {prompts.name}: reward-model score",
            file_name="score_curve.png",
        )  # fmt: skip
    return base.Result(result.states, summary, run_dir.path)
