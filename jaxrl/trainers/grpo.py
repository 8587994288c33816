"""GRPO (or Dr. GRPO / DAPO / RLOO / ReMax / GSPO / CISPO) of a language model on prompts with
verifiable rewards: what `experiments/grpo.py` runs (`jaxrl.trainers.base` describes the
trainers' shape).

    from jaxrl.trainers import grpo
    def reward(prompts, completions, answer, **columns):
        return [float(a in c) for a, c in zip(answer, completions)]
    rows = [{"prompt": "What is 2+2?", "answer": "4"}, ...]
    result = grpo.train(grpo.config("word_problems"), "runs/grpo", model="smollm2",
                        train_data=rows, rewards=[reward])
    result.summary["eval_task_accuracy"], result.summary["eval_pass_at_k"]
"""

from __future__ import annotations

import functools
from typing import Any

import jax

from algos import asynchronous, grpo
from jaxrl import runner, sharding
from jaxrl.trainers import base, lm_runs, prompt_data, prompt_eval

config = functools.partial(base.load_config, "grpo")


@base.lm_trainer("grpo")
def train(
    flat: Any, parts: lm_runs.Parts, workdir: str | None, kill_after_chunk: int | None
) -> base.Result:
    """GRPO (or Dr. GRPO / DAPO / RLOO / ReMax / GSPO / CISPO) of a language model on prompts
    with verifiable rewards. Called as `train(config=None, workdir=None, *, model=None,
    train_data=None, eval_data=None, rewards=None, game=None)`: `config` is
    jaxrl.trainers.presets.grpo's (`config(preset)`), the parts are `jaxrl.trainers.base`'s;
    returns Result(state, summary, run_dir)."""
    run = lm_runs.setup(flat, workdir, grpo.Config, "grpo", parts, grpo.check_rollout)
    config, mesh, rollout = run.config, run.mesh, run.rollout
    prompts = prompt_data.read_task(run)
    params, model, source = lm_runs.initial_params(run)
    evaluate = prompt_eval.evaluator(run, model, prompts)
    run_dir, initial = prompt_eval.open_run_with_initial_evaluation(run, evaluate, params)

    algorithm = grpo.make(config, model, prompts.task, params, mesh, rollout)
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
        after_chunk=prompt_eval.evaluate_every(run, evaluate, lambda state: state.params),
        # Async mode's two programs on two meshes are dispatched from the host.
        chunk=asynchronous.make_chunk if rollout.host_loop else None,
        host_loop=rollout.host_loop,
    )
    result = runner.train(job, run.flat.run, run_dir, kill_after_chunk)
    summary = prompt_eval.finish(
        run, prompts, run_dir, job, result, (evaluate, initial, result.states.params),
        config.completions_per_update, source, f"GRPO ({config.variant}) {prompts.name}",
        lambda rows: {"variant": config.variant},
    )  # fmt: skip
    return base.Result(result.states, summary, run_dir.path)
