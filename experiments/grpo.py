"""GRPO (or Dr. GRPO / DAPO / RLOO) of a language model on a text task with a verifiable reward.

    python experiments/grpo.py --workdir=runs/grpo                 # reverse 3 digits, random init
    python experiments/grpo.py --config.variant=dapo --config.seed=1
    python experiments/sft.py --config=experiments/configs/sft.py:addition --workdir=runs/sft_add
    python experiments/grpo.py --config=experiments/configs/grpo.py:addition \\
        --config.init_from=runs/sft_add --workdir=runs/grpo_add

Every update samples prompts, generates group_size completions per prompt, scores them and
updates the policy inside one compiled program (`algos/grpo.py`); updates run in compiled chunks
with a checkpoint after each, and a restarted run resumes from the newest. --config.init_from
takes an SFT run directory or a Hugging Face checkpoint directory; without it the model starts
from random weights. Rewards: the task's answer reward (exact match 1, partial credit below 0.5),
plus `rewards.format_weight` x the format reward, plus an optional host Python function
(`--config.rewards.host=my_module:my_reward`, called as f(prompts, completions, answer=[...])).

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
from absl import app, flags, logging  # noqa: E402
from ml_collections import config_flags  # noqa: E402

from algos import grpo  # noqa: E402
from envs.text import answer_reward, format_reward  # noqa: E402
from experiments import _lm  # noqa: E402
from experiments._common import REPO_ROOT, build_config, check_resumable, fail  # noqa: E402
from jaxrl import sharding  # noqa: E402
from jaxrl.config import ConfigError  # noqa: E402
from jaxrl.lm import training  # noqa: E402
from jaxrl.logging import RunDirectory, to_jsonable  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file(
    "config",
    os.path.join(REPO_ROOT, "experiments", "configs", "grpo.py"),
    "Config file and preset; override fields with --config.X=V.",
    lock_config=True,
)
_WORKDIR = flags.DEFINE_string("workdir", None, "Run directory; an existing one is resumed.")
_KILL_AFTER_CHUNK = flags.DEFINE_integer(
    "kill_after_chunk", None, "Testing aid: SIGKILL this process right after chunk K's checkpoint."
)
FINAL_WINDOW = 10  # updates averaged into final_mean_reward


def reward_terms(task, task_tokens, tokenizer, section, mesh) -> list[grpo.RewardTerm]:
    eos = tokenizer.eos_id
    terms = [
        grpo.RewardTerm(
            "task",
            1.0,
            lambda p, c: answer_reward(c.tokens, c.mask, p.answer_tokens, p.answer_length, eos),
        )
    ]
    if section.format_weight:
        digits = task_tokens.digit_ids
        terms.append(
            grpo.RewardTerm(
                "format",
                section.format_weight,
                lambda p, c: format_reward(c.tokens, c.mask, digits, eos),
            )
        )
    if section.host:
        module_name, _, function_name = section.host.partition(":")
        try:
            function = getattr(importlib.import_module(module_name), function_name)
        except (ImportError, AttributeError, ValueError) as error:
            fail(
                f"config.rewards.host: cannot load {section.host!r} ({error}); give "
                "'module.path:function' importable from the working directory"
            )
        terms.append(grpo.host_reward(function, tokenizer, "host", section.host_weight, mesh))
    return terms


def final_mean_reward(result: _lm.LoopResult, run_dir: RunDirectory) -> float:
    """The answer reward of sampled completions, mean over the last FINAL_WINDOW updates (from
    the last chunk, or from metrics.jsonl when a finished run is restarted)."""
    if result.last_metrics is not None:
        return float(np.mean(result.last_metrics["reward_task"][-FINAL_WINDOW:]))
    with open(run_dir.metrics_path) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return float(np.mean([row["reward_task"] for row in rows[-FINAL_WINDOW:]]))


def main(argv: list[str]) -> None:
    logging.set_verbosity(logging.WARNING)
    if len(argv) > 1:
        fail(f"unexpected arguments {argv[1:]}; settings are flags, e.g. --config.num_steps=100")
    flat = _CONFIG.value
    config = build_config(grpo.Config, flat)
    _lm.check_run_settings(flat.run)
    mesh = _lm.make_mesh(config.mesh_shape)
    task, tokenizer = _lm.task_and_tokenizer(flat.task)
    try:
        task_tokens = task.tokens(tokenizer)
    except ConfigError as error:
        fail(f"config.task.{error}")
    model = _lm.model_config(flat.model)
    workdir = _WORKDIR.value or os.path.join(
        "runs", f"grpo-{task.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    )
    params, model, source = _lm.initial_params(model, flat.init_from, flat.seed, mesh)
    # Held-out problems: the task's eval split, which the in-program sampler never draws.
    rng = np.random.default_rng(flat.task.data_seed)
    eval_problems = task.sample_problems(rng, flat.task.num_eval, split="eval", allow_fewer=True)
    held_out = jax.device_get(task.encode_problems(task.problem_digits(eval_problems), task_tokens))

    prompt_length = held_out.tokens.shape[1]  # every prompt of a task has one length
    if prompt_length + config.max_new_tokens > model.max_position_embeddings:
        fail(
            f"config.max_new_tokens: prompts of {prompt_length} tokens + {config.max_new_tokens} "
            f"new ones exceed the model's max_position_embeddings={model.max_position_embeddings}"
        )
    terms = reward_terms(task, task_tokens, tokenizer, flat.rewards, mesh)
    run_dir = RunDirectory(workdir)
    check_resumable(run_dir.saved_config(), to_jsonable(flat.to_dict()), workdir)
    run_dir.write_config(to_jsonable(flat.to_dict()))

    def accuracy(params):
        return _lm.task_accuracy(
            model, params, task, tokenizer, eval_problems, held_out.tokens, held_out.mask,
            config.max_new_tokens, mesh, flat.eval_batch_size,
        )  # fmt: skip

    initial_accuracy, _, _ = accuracy(params)

    # A copy: the training state's params are donated to each chunk call.
    reference_params = jax.tree.map(lambda x: x.copy(), params) if config.kl_beta > 0 else None
    state = training.init_state(params, config.optimizer(), mesh)
    replicated = sharding.replicated(mesh)

    def update_indices(first: int, count: int):
        return jax.device_put(np.arange(first, first + count, dtype=np.int32), replicated)

    sample_prompts = lambda key, n: task.sample_prompts(key, n, task_tokens)  # noqa: E731
    result = _lm.train_in_chunks(
        lambda sink: grpo.make_train_chunk(
            model,
            config,
            sample_prompts,
            terms,
            tokenizer.eos_id,
            tokenizer.pad_id,
            flat.seed,
            mesh,
            callback=sink,
        ),
        state,
        update_indices,
        config.num_steps,
        config.completions_per_update,
        flat.run,
        run_dir,
        mesh,
        f"GRPO ({config.variant}) {task.name}",
        extra=reference_params,
        kill_after_chunk=_KILL_AFTER_CHUNK.value,
    )
    _lm.save_params(run_dir, result.state.params)

    t0 = time.time()
    final_accuracy, mean_score, completions = accuracy(result.state.params)
    eval_seconds = time.time() - t0
    final_reward = final_mean_reward(result, run_dir)
    updates_run = config.num_steps - result.resumed_from_step
    # Generated tokens as the peers count them: up to and including EOS (the last chunk's mean).
    lengths = (result.last_metrics or {}).get("completion_length", [config.max_new_tokens])
    generated_per_update = config.completions_per_update * float(np.mean(lengths))
    trained_per_update = config.completions_per_update * (prompt_length + config.max_new_tokens)
    train_seconds = max(result.train_seconds, 1e-9)
    summary = {
        "algo": "grpo",
        "variant": config.variant,
        "task": task.name,
        "num_digits": task.num_digits,
        "num_seeds": 1,
        "init_from": source,
        "wall_seconds": round(result.compile_seconds + result.train_seconds + eval_seconds, 2),
        "compile_seconds": round(result.compile_seconds, 2),
        "updates": config.num_steps,
        "completions": config.num_steps * config.completions_per_update,
        "tokens": round(config.num_steps * generated_per_update),  # generated tokens
        "tokens_per_second": round(updates_run * generated_per_update / train_seconds),
        "trained_tokens_per_second": round(updates_run * trained_per_update / train_seconds),
        "updates_per_second": round(updates_run / train_seconds, 3),
        "final_mean_reward": final_reward,
        "eval_task_accuracy": final_accuracy,
        "eval_task_score": mean_score,
        "initial_eval_task_accuracy": initial_accuracy,
        "num_eval": len(eval_problems),
        "eval_examples": _lm.eval_examples(task, eval_problems, completions),
        "mesh_shape": list(config.mesh_shape),
        "resumed_from_step": result.resumed_from_step,
    }
    run_dir.write_summary(summary)
    run_dir.write_learning_curve(
        x="update",
        y="reward_task",
        title=f"GRPO ({config.variant}) {task.name}: answer reward of sampled completions",
    )
    print(
        f"GRPO ({config.variant}) {task.name}: final_mean_reward {final_reward:.3f}, "
        f"eval_task_accuracy {final_accuracy:.3f} (start: {initial_accuracy:.3f}) after "
        f"{config.num_steps} updates in {summary['wall_seconds']:.0f}s (compile "
        f"{result.compile_seconds:.0f}s). Run directory: {run_dir.path}"
    )


if __name__ == "__main__":
    app.run(main)
