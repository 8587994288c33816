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

import importlib
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import numpy as np  # noqa: E402

from algos import grpo  # noqa: E402
from envs.text import TextTask  # noqa: E402
from experiments import _lm  # noqa: E402
from jaxrl import distributed, runner  # noqa: E402
from jaxrl.config import ConfigError  # noqa: E402
from jaxrl.logging import RunDirectory  # noqa: E402

FLAGS = runner.define_flags("grpo.py", seeds=False)
FINAL_WINDOW = 10  # updates averaged into final_mean_reward


def text_task(run: _lm.Setup) -> TextTask:
    """The task's prompt sampler and rewards, plus the host reward of config.rewards.host."""
    section = run.flat.rewards
    try:
        task = run.task.text_task(run.tokenizer, section.format_weight)
    except ConfigError as error:
        runner.fail(f"config.task.{error}")
    if not section.host:
        return task
    module_name, _, function_name = section.host.partition(":")
    try:
        function = getattr(importlib.import_module(module_name), function_name)
    except (ImportError, AttributeError, ValueError) as error:
        runner.fail(
            f"config.rewards.host: cannot load {section.host!r} ({error}); give "
            "'module.path:function' importable from the working directory"
        )
    host = grpo.host_reward(function, run.tokenizer, "host", section.host_weight, run.mesh)
    return task.with_reward(host)


def last_rows(run_dir: RunDirectory, updates: int, num_steps: int, log_every: int) -> list[dict]:
    """The metrics.jsonl rows (each the mean of a block of updates) of the last `updates` updates,
    at least one row. Read from the file rather than the last chunk's metrics, so that a finished
    run restarted for its summary (no chunk left to run) reports what the uninterrupted run did;
    the barrier waits for process 0 to have written them."""
    distributed.barrier("metrics written")
    with open(run_dir.metrics_path) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    block = runner.block_length(num_steps, log_every)  # updates per row
    return rows[-max(1, updates // block) :]


def main(argv: list[str]) -> None:
    run = _lm.setup(FLAGS, grpo.Config, "grpo")
    flat, config, mesh, task = run.flat, run.config, run.mesh, run.task
    rewarded = text_task(run)  # a host reward that cannot be loaded fails before any compile
    # Held-out problems: the task's eval split, which the in-program sampler never draws.
    rng = np.random.default_rng(flat.task.data_seed)
    eval_problems = task.sample_problems(rng, flat.task.num_eval, split="eval", allow_fewer=True)
    held_out = jax.device_get(
        task.encode_problems(task.problem_digits(eval_problems), task.tokens(run.tokenizer))
    )
    prompt_length = held_out.tokens.shape[1]  # every prompt of a task has one length

    # The model (init_from's architecture included) is known before any parameter is built.
    if prompt_length + config.max_new_tokens > run.model.max_position_embeddings:
        runner.fail(
            f"config.max_new_tokens: prompts of {prompt_length} tokens + "
            f"{config.max_new_tokens} new ones exceed the model's max_position_embeddings="
            f"{run.model.max_position_embeddings}; set max_new_tokens <= "
            f"{run.model.max_position_embeddings - prompt_length}"
        )
    params, model, source = _lm.initial_params(run)
    run_dir = _lm.open_run(run)

    def accuracy(params):
        return _lm.task_accuracy(
            model, params, task, run.tokenizer, eval_problems, held_out.tokens, held_out.mask,
            config.max_new_tokens, mesh, flat.eval_batch_size,
        )  # fmt: skip

    initial_accuracy, _, _ = accuracy(params)

    algorithm = grpo.make(config, model, rewarded, params, mesh)
    # The starting model is the KL penalty's reference (the update's input).
    reference_params = params if config.kl_beta > 0 else None
    job = _lm.job(
        run,
        algorithm,
        f"GRPO ({config.variant}) {task.name}",
        inputs_for=lambda first, count: reference_params,
        units_name="completions",
        units_per_step=config.completions_per_update,
    )
    result = runner.train(job, flat.run, run_dir, FLAGS["kill_after_chunk"].value)
    params = result.states.params
    _lm.save_params(run_dir, params)

    t0 = time.time()
    final_accuracy, mean_score, completions = accuracy(params)
    summary = runner.summary_fields(job, result, time.time() - t0)
    final = last_rows(run_dir, FINAL_WINDOW, config.num_steps, flat.run.log_every)
    final_reward = float(np.mean([row["reward_task"] for row in final]))
    # Generated tokens as the peers count them: up to and including EOS (the final rows' mean).
    length = float(np.mean([row["completion_length"] for row in final]))
    generated_per_update = config.completions_per_update * length
    trained_per_update = config.completions_per_update * (prompt_length + config.max_new_tokens)
    summary |= {
        "variant": config.variant,
        "task": task.name,
        "num_digits": task.num_digits,
        "init_from": source,
        "completions": config.num_steps * config.completions_per_update,
        "tokens": round(config.num_steps * generated_per_update),  # generated tokens
        "tokens_per_second": round(summary["steps_per_second"] * generated_per_update),
        "trained_tokens_per_second": round(summary["steps_per_second"] * trained_per_update),
        "final_mean_reward": final_reward,
        "eval_task_accuracy": final_accuracy,
        "eval_task_score": mean_score,
        "initial_eval_task_accuracy": initial_accuracy,
        "num_eval": len(eval_problems),
        "eval_examples": _lm.eval_examples(task, eval_problems, completions),
        "mesh_shape": list(config.mesh_shape),
    }
    run_dir.write_summary(summary)
    title = f"GRPO ({config.variant}) {task.name}"
    run_dir.write_learning_curve(
        x="step", y="reward_task", title=f"{title}: answer reward of sampled completions"
    )
    print(
        f"{title}: final_mean_reward {final_reward:.3f}, eval_task_accuracy "
        f"{final_accuracy:.3f} (start: {initial_accuracy:.3f}) after {config.num_steps} updates "
        f"in {summary['wall_seconds']:.0f}s (compile {summary['compile_seconds']:.0f}s). "
        f"Run directory: {run_dir.path}"
    )


if __name__ == "__main__":
    runner.main(main)
