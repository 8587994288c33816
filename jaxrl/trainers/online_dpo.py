"""Online DPO of a language model: pairs sampled from the policy and labelled by a reward model:
what `experiments/online_dpo.py` runs (`jaxrl.trainers.base` describes the trainers' shape).

    from jaxrl.trainers import online_dpo
    config = online_dpo.config()
    config.reward_model = "runs/rm"   # a reward_model trainer run
    result = online_dpo.train(config, "runs/online_dpo", model="runs/sft")
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import numpy as np

from algos import online_dpo
from jaxrl import runner, sharding
from jaxrl.trainers import base, lm_runs, prompt_data, prompt_eval

config = functools.partial(base.load_config, "online_dpo")


@base.lm_trainer("online_dpo")
def train(
    flat: Any, parts: lm_runs.Parts, workdir: str | None, kill_after_chunk: int | None
) -> base.Result:
    """Online DPO of a language model: pairs sampled from the policy and labelled by a reward
    model. Called as `train(config=None, workdir=None, *, model=None, train_data=None,
    eval_data=None, rewards=None, game=None)`: `config` is experiments/configs/online_dpo.py's
    (`config(preset)`), the parts are `jaxrl.trainers.base`'s; returns Result(state, summary,
    run_dir)."""
    run = lm_runs.setup(flat, workdir, online_dpo.Config, "online_dpo", parts)
    flat, config, mesh = run.flat, run.config, run.mesh
    prompts, reward_params, reward_config, reward_paths = prompt_data.with_reward_models(
        run, online_dpo.Config
    )
    params, model, source = lm_runs.initial_params(run)
    evaluate = prompt_eval.evaluator(run, model, prompts)
    run_dir, initial = prompt_eval.open_run_with_initial_evaluation(run, evaluate, params)
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
        after_chunk=prompt_eval.evaluate_every(run, evaluate, lambda state: state.params),
    )
    result = runner.train(job, flat.run, run_dir, kill_after_chunk)
    summary = prompt_eval.finish(
        run, prompts, run_dir, job, result, (evaluate, initial, result.states.params),
        config.batch_size * config.num_samples, source, f"online DPO {prompts.name}",
        lambda rows: {
            "loss_type": config.loss_type,
            "reward_model": reward_paths,
            "final_score": float(np.mean([row["score"] for row in rows])),
            "final_tied_fraction": float(np.mean([row["tied_fraction"] for row in rows])),
        },
    )  # fmt: skip
    return base.Result(result.states, summary, run_dir.path)
