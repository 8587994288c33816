"""The held-out evaluation of an RL run on prompts (GRPO, PPO for language models, online DPO,
multi-turn's starting model): greedy completions of the held-out prompts scored by the task or
the reward functions, sampled ones for pass@k, their intervals and plot, and the run's summary.
What the run samples and is rewarded by is `jaxrl.trainers.prompt_data`'s."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import numpy as np

from algos.partial import Partial
from envs.text import protocol
from jaxrl import distributed, host, logging, runner, statistics
from jaxrl.lm import checkpoints
from jaxrl.lm.completions import (
    eval_examples,
    greedy_and_sampled_completions,
    greedy_completions,
)
from jaxrl.lm.model import ModelConfig
from jaxrl.logging import RunDirectory
from jaxrl.trainers import lm_runs
from jaxrl.trainers.prompt_data import PromptData, Prompts, eval_samples

INITIAL_EVAL_FILE = "initial_eval.json"  # the starting model's held-out result, kept for resumes
FINAL_WINDOW = 10  # updates averaged into final_mean_reward


def last_rows(run_dir: RunDirectory, updates: int, num_steps: int, log_every: int) -> list[dict]:
    """The metrics.jsonl rows (each the mean of a block of updates) of the last `updates` updates,
    at least one row. Read from the file rather than the last chunk's metrics, so that a finished
    run restarted for its summary (no chunk left to run) reports what the uninterrupted run did;
    the barrier waits for process 0 to have written them."""
    distributed.barrier("metrics written")
    with open(run_dir.metrics_path) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    rows = [row for row in rows if "loss" in row]  # training rows, not the evaluations
    block = runner.block_length(num_steps, log_every)  # updates per row
    return rows[-max(1, updates // block) :]


def trained_totals(run_dir: RunDirectory, num_steps: int, log_every: int) -> tuple[int, int, float]:
    """Partial rollouts' (`algos.partial`) groups and completion tokens trained on over the
    whole run, summed from metrics.jsonl's `trained_groups` and `trained_tokens` (each row the
    mean of a block of updates; the counts are whole numbers, so the sums are exact), and the
    mean decode steps per update."""
    rows = last_rows(run_dir, num_steps, num_steps, log_every)
    block = runner.block_length(num_steps, log_every)
    groups = sum(row["trained_groups"] for row in rows) * block
    tokens = sum(row["trained_tokens"] for row in rows) * block
    return round(groups), round(tokens), float(np.mean([row["decode_steps"] for row in rows]))


class HeldOut(NamedTuple):
    """Greedy completions of the held-out prompts, scored; and sampled ones, for pass@k."""

    accuracy: float  # mean of `correct`
    correct: np.ndarray  # [num_eval]: 1 for a right answer (a prompt file: its first reward)
    rewards: dict[str, float]  # summary fields: each reward function's mean, or the task score
    examples: list[dict[str, str]]  # a few prompts with their completions
    # [num_eval, eval_samples]: 1 for a right sampled answer (None: eval_samples is 0)
    samples: np.ndarray | None = None


def pass_at_ks(num_samples: int) -> list[int]:
    """The k reported for `num_samples` samples per prompt: 1, the powers of 2 between, and n."""
    ks = {1, num_samples}
    ks |= {2**i for i in range(1, num_samples.bit_length()) if 2**i < num_samples}
    return sorted(ks)


def pass_at_k_fields(held: HeldOut | np.ndarray | None, prefix: str = "eval_") -> dict[str, Any]:
    """`{prefix}pass_at_K` and its `_ci95` for every reported k of a held-out result (or its
    [problems, samples] correctness); nothing without samples."""
    samples = held.samples if isinstance(held, HeldOut) else held
    if samples is None or samples.size == 0:
        return {}
    fields: dict[str, Any] = {}
    estimates = statistics.pass_at_k_estimates(samples, pass_at_ks(samples.shape[1]))
    for k, (point, bounds) in estimates.items():
        fields[f"{prefix}pass_at_{k}"] = point
        fields[f"{prefix}pass_at_{k}_ci95"] = bounds
    return fields


def task_evaluator(run: lm_runs.Setup, model: ModelConfig, held_out: Any, problems: list[str]):
    """evaluate(params) -> HeldOut on the in-program task's held-out problems, scored by the
    task."""

    def evaluate(params: Any) -> HeldOut:
        completions, sampled = held_out_completions(
            run, model, params, held_out.tokens, held_out.mask
        )
        scores = [run.task.score(p, c) for p, c in zip(problems, completions, strict=True)]
        mean_score = float(np.mean(scores))
        correct = np.array([s == 1.0 for s in scores], np.float64)
        examples = eval_examples(run.task, problems, completions)
        samples = None
        if sampled is not None:
            samples = np.array(
                [
                    [run.task.score(p, c) == 1.0 for c in row]
                    for p, row in zip(problems, sampled, strict=True)
                ],
                np.float64,
            )
        return HeldOut(
            float(correct.mean()), correct, {"eval_task_score": mean_score}, examples, samples
        )

    return evaluate


def file_evaluator(run: lm_runs.Setup, model: ModelConfig, data: PromptData):
    """evaluate(params) -> HeldOut on a prompt file's held-out rows: greedy completions scored
    by the same reward functions as training, the first of which measures accuracy (1 for a
    right answer). A reward function failing here is one error line, as in training."""
    table = data.held_out
    prompts = [row.prompt for row in table.rows]
    columns = {name: [row.columns[name] for row in table.rows] for name in table.column_names()}

    def evaluate(params: Any) -> HeldOut:
        texts, sampled = held_out_completions(run, model, params, table.tokens, table.mask)
        completions: list = texts
        if table.conversational:
            completions = [[{"role": "assistant", "content": text}] for text in texts]
        means, first = {}, None
        for name, function, _ in data.functions:
            label = f"reward function {function.__module__}:{function.__qualname__}"
            try:
                values = host.call(label, function, prompts, completions, **columns)
                values = host.check_rewards(label, values, len(completions))
            except Exception:
                runner.report_host_failure(host.take_failure())
            means[f"eval_reward_{name}"] = float(values.mean())
            first = values if first is None else first
        examples = [
            {
                "prompt": logging.shorten(p if isinstance(p, str) else p[-1]["content"]),
                "completion": t,
            }
            for p, t in zip(prompts[:5], texts[:5], strict=False)
        ]
        correct = (first >= 1.0).astype(np.float64)  # full marks: a right answer
        samples = None
        if sampled is not None:  # the first reward function scores every sample
            n = eval_samples(run)
            flat_texts = [text for row in sampled for text in row]
            flat: list = flat_texts
            if table.conversational:
                flat = [[{"role": "assistant", "content": text}] for text in flat_texts]
            repeated = {
                name: [v for v in values for _ in range(n)] for name, values in columns.items()
            }
            name, function, _ = data.functions[0]
            label = f"reward function {function.__module__}:{function.__qualname__}"
            try:
                values = host.call(
                    label, function, [p for p in prompts for _ in range(n)], flat, **repeated
                )
                values = host.check_rewards(label, values, len(flat))
            except Exception:
                runner.report_host_failure(host.take_failure())
            samples = (np.asarray(values).reshape(len(prompts), n) >= 1.0).astype(np.float64)
        return HeldOut(float(correct.mean()), correct, means, examples, samples)

    return evaluate


def held_out_completions(
    run: lm_runs.Setup, model: ModelConfig, params: Any, tokens: np.ndarray, mask: np.ndarray
) -> tuple[list[str], list[list[str]] | None]:
    """The greedy answer to every held-out prompt and, with eval_samples > 0, that many
    completions of each sampled as training samples (None without), with a key fixed by the
    run's seed (the same params give the same samples). Each prompt is prefilled once for its
    greedy answer and its samples together."""
    n = eval_samples(run)
    if not n:
        answers = greedy_completions(
            model, params, run.tokenizer, tokens, mask, run.config.sampling.max_new_tokens,
            run.mesh, run.flat.eval_batch_size,
        )  # fmt: skip
        return answers, None
    sampling = run.config.sampling.for_tokens(run.tokenizer.eos_id, run.tokenizer.pad_id)
    return greedy_and_sampled_completions(
        model, params, run.tokenizer, tokens, mask, sampling, n,
        jax.random.fold_in(jax.random.key(run.flat.seed), 1), run.mesh,
        run.flat.eval_batch_size,
    )  # fmt: skip


def interval(values: np.ndarray, seed: int = 0) -> list[float]:
    """The bootstrap 95% interval of the mean of per-problem `values` (problems resampled)."""
    _, bounds = statistics.interval_estimates(
        {"x": values[:, None]}, statistics.aggregate_mean, reps=10_000, seed=seed
    )
    return [float(b) for b in bounds["x"]]


def plot_held_out_accuracy(
    run_dir: Any, initial: HeldOut, final: HeldOut, num_steps: int, title: str
) -> None:
    """`held_out_accuracy.png`: greedy held-out accuracy at the start, at every `eval_every`
    evaluation (metrics.jsonl) and at the end, each with its bootstrap 95% interval."""
    if not run_dir.writes:
        return
    with open(run_dir.metrics_path) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    middle = [r for r in rows if "eval_task_accuracy_low" in r and r["step"] < num_steps]
    steps = [0, *(r["step"] for r in middle), num_steps]
    points = [initial.accuracy, *(r["eval_task_accuracy"] for r in middle), final.accuracy]
    bounds = [
        interval(initial.correct),
        *([r["eval_task_accuracy_low"], r["eval_task_accuracy_high"]] for r in middle),
        interval(final.correct),
    ]
    name = f"greedy, {len(final.correct)} problems"
    xs, ys, bands = {name: steps}, {name: np.array(points)}, {name: np.array(bounds).T}
    if final.samples is not None and initial.samples is not None:
        n = final.samples.shape[1]
        for k in sorted({1, n}):  # the sampled accuracy, and the chance one of n is right
            key = f"eval_pass_at_{k}"
            at = [r for r in middle if key in r]
            first = pass_at_k_fields(initial)
            last = pass_at_k_fields(final)
            label = f"pass@{k} of {n} samples"
            xs[label] = [0, *(r["step"] for r in at), num_steps]
            ys[label] = np.array([first[key], *(r[key] for r in at), last[key]])
            bands[label] = np.array(
                [first[f"{key}_ci95"], *([r[f"{key}_low"], r[f"{key}_high"]] for r in at),
                 last[f"{key}_ci95"]]
            ).T  # fmt: skip
    statistics.plot_sample_efficiency_curves(
        xs,
        ys,
        bands,
        run_dir.file("held_out_accuracy.png"),
        xlabel="update",
        ylabel="held-out accuracy (95% CI)",
        title=title,
    )


def initial_evaluation(run: lm_runs.Setup, evaluate: Callable, params: Any) -> HeldOut:
    """The starting model's held-out result, computed once: a resumed run reads it back from
    the run directory instead of spending another evaluation on it. Evaluated before the run
    directory is written, so a reward function that fails on it leaves nothing behind."""
    path = os.path.join(run.workdir, INITIAL_EVAL_FILE)
    if os.path.isfile(path):
        saved = checkpoints.read_json(path)
        samples = saved.get("samples")
        return HeldOut(
            saved["accuracy"],
            np.array(saved["correct"]),
            saved["rewards"],
            saved["examples"],
            None if samples is None else np.array(samples, np.float64),
        )
    return evaluate(params)


# --- one RL run on prompts: evaluation and summary ------------------------------------------


def evaluator(run: lm_runs.Setup, model: ModelConfig, prompts: Prompts) -> Callable[[Any], HeldOut]:
    """evaluate(policy params) -> HeldOut on the held-out prompts."""
    if prompts.data is not None:
        return file_evaluator(run, model, prompts.data)
    task = run.task
    held_out = jax.device_get(task.encode_prompts(prompts.problems, run.tokenizer))
    return task_evaluator(run, model, held_out, prompts.problems)


def open_run_with_initial_evaluation(
    run: lm_runs.Setup, evaluate: Callable, params: Any
) -> tuple[RunDirectory, HeldOut]:
    """The starting model's held-out result (computed before anything is written, read back on a
    resume) and the opened run directory, which keeps it."""
    initial = initial_evaluation(run, evaluate, params)
    run_dir = lm_runs.open_run(run)
    if run_dir.writes:
        checkpoints.write_json(run_dir.file(INITIAL_EVAL_FILE), initial._asdict() | {
            "correct": initial.correct.tolist(),
            "samples": None if initial.samples is None else initial.samples.tolist(),
        })  # fmt: skip
    return run_dir, initial


def evaluate_every(
    run: lm_runs.Setup, evaluate: Callable, policy: Callable[[Any], Any]
) -> Callable[[Any, int, int], dict[str, float] | None]:
    """The runner's after_chunk: every config.eval_every chunks, the held-out accuracy (with
    its interval) of `policy(state)`. The last chunk's state is evaluated after training, for
    the summary."""

    def after_chunk(state: Any, step: int, index: int) -> dict[str, float] | None:
        every = run.flat.eval_every
        if not every or (index + 1) % every or step >= run.config.num_steps:
            return None
        held = evaluate(policy(state))
        low, high = interval(held.correct)
        return {
            "eval_task_accuracy": held.accuracy,
            "eval_task_accuracy_low": low,
            "eval_task_accuracy_high": high,
            **held.rewards,
            **{
                name: value
                for name, value in pass_at_k_fields(held).items()
                if not name.endswith("_ci95")
            },
            **{
                f"{name.removesuffix('_ci95')}_{side}": bound
                for name, value in pass_at_k_fields(held).items()
                if name.endswith("_ci95")
                for side, bound in zip(("low", "high"), value, strict=True)
            },
        }

    return after_chunk


def summary_fields(
    run: lm_runs.Setup,
    prompts: Prompts,
    run_dir: RunDirectory,
    initial: HeldOut,
    final: HeldOut,
    completions_per_update: int,
    source: str,
    steps_per_second: float,
) -> dict[str, Any]:
    """summary.json's fields about the prompts, the rewards, the throughput in tokens and the
    held-out evaluation."""
    config = run.config
    rows = last_rows(run_dir, FINAL_WINDOW, config.num_steps, run.flat.run.log_every)
    final_reward = float(np.mean([row[prompts.reward_key] for row in rows]))
    # Generated tokens as the peers count them: up to and including EOS (the final rows' mean).
    length = float(np.mean([row["completion_length"] for row in rows]))
    completions = config.num_steps * completions_per_update
    tokens = config.num_steps * completions_per_update * length  # generated tokens
    partial = {}
    if isinstance(run.rollout, Partial):
        # Partial rollouts train a varying number of groups per update, and decode tokens that
        # train later, or never (dropped for staleness): count what was trained on, every
        # update's, not a sync run's fixed batch.
        groups, tokens, steps = trained_totals(run_dir, config.num_steps, run.flat.run.log_every)
        completions = groups * config.group_size
        partial = {
            "rollout_mode": "partial",
            "trained_groups_per_update": groups / config.num_steps,
            "decode_steps_per_update": steps,
        }
    generated_per_update = tokens / config.num_steps
    # The training pass's tokens: every trained completion at its fixed shape (with
    # length_buckets > 0 the pass runs shorter buckets, so this is an upper bound). With shared
    # prompts a group's pass holds its prompt once and its completions after it.
    prompt, new_tokens = prompts.prompt_length, config.sampling.max_new_tokens
    group = config.group_size if getattr(config, "shared_prompt", False) else 1
    trained_per_update = completions / group / config.num_steps * (prompt + group * new_tokens)
    summary = {
        "task": prompts.name,
        "init_from": source,
        # Completions trained on and their tokens (up to and including EOS); in sync mode every
        # update trains completions_per_update, and the tokens are the final rows' mean length.
        "completions": completions,
        "tokens": round(tokens),
        "tokens_per_second": round(steps_per_second * generated_per_update),
        "trained_tokens_per_second": round(steps_per_second * trained_per_update),
        **partial,
        # The sampled completions' reward over the last updates: an in-program task's score
        # (reward_task), or, with a prompt file, the weighted sum of its reward functions.
        "final_mean_reward": final_reward,
        "final_mean_reward_metric": prompts.reward_key,
        "eval_task_accuracy": final.accuracy,
        "eval_task_accuracy_ci95": interval(final.correct),
        "initial_eval_task_accuracy": initial.accuracy,
        # Paired by problem: the change each held-out problem saw, and its interval.
        "eval_accuracy_change": final.accuracy - initial.accuracy,
        "eval_accuracy_change_ci95": interval(final.correct - initial.correct),
        **final.rewards,
        # pass@k of `eval_samples` sampled completions per held-out prompt (Chen et al. 2021's
        # unbiased estimator, problems resampled for the interval), before and after training.
        "eval_samples": final.samples.shape[1] if final.samples is not None else 0,
        **pass_at_k_fields(final),
        **pass_at_k_fields(initial, "initial_eval_"),
        "num_eval": prompts.num_eval,
        "eval_examples": final.examples,
        "mesh_shape": list(config.mesh_shape),
    }
    if prompts.data is None:
        options = protocol.task_options(run.task)
        summary["task_options"] = options
        if "num_digits" in options:  # as the digit tasks' summaries have always named it
            summary["num_digits"] = options["num_digits"]
    else:
        data = prompts.data
        summary |= {"num_train": len(data.train.rows), "prompt_length": prompts.prompt_length}
        summary |= {"cut_prompts": data.train.cut + data.held_out.cut}
    return summary


def write_plots_and_report(
    run: lm_runs.Setup,
    prompts: Prompts,
    run_dir: RunDirectory,
    initial: HeldOut,
    final: HeldOut,
    summary: dict[str, Any],
    title: str,
) -> None:
    """The learning curve, the held-out accuracy plot and the closing line."""
    what = "answer reward" if prompts.data is None else "reward (weighted sum of the functions)"
    run_dir.write_learning_curve(
        x="step", y=prompts.reward_key, title=f"{title}: {what} of sampled completions"
    )
    plot_held_out_accuracy(run_dir, initial, final, run.config.num_steps, f"{title}: held-out")
    change = summary["eval_accuracy_change_ci95"]
    where = lm_runs.finish(run, run_dir)  # summary.json is written: the final state may go
    print(
        f"{title}: final_mean_reward {summary['final_mean_reward']:.3f}, eval_task_accuracy "
        f"{final.accuracy:.3f} (start: {initial.accuracy:.3f}; change 95% CI "
        f"[{change[0]:+.3f}, {change[1]:+.3f}]) after {run.config.num_steps} updates "
        f"in {summary['wall_seconds']:.0f}s ({runner.compile_note(summary)}). "
        f"{where}"
    )


def finish(
    run: lm_runs.Setup,
    prompts: Prompts,
    run_dir: RunDirectory,
    job: runner.Job,
    result: runner.RunResult,
    evaluation: tuple[Callable[[Any], HeldOut], HeldOut, Any],
    units_per_update: int,
    source: str,
    title: str,
    extra: Callable[[list[dict]], dict[str, Any]] = lambda rows: {},
) -> dict[str, Any]:
    """The end of an RL run on prompts (GRPO, PPO, online DPO): the final policy saved and
    evaluated on the held-out prompts (`evaluation`: the evaluator, the starting policy's
    result, the final policy's parameters), summary.json (the common fields, the prompts', and
    `extra(last metric rows)`), the plots and the closing line. Returns the summary."""
    evaluate, initial, policy = evaluation
    checkpoints.save_params(run_dir, policy)
    t0 = time.time()
    final = evaluate(policy)
    summary = runner.summary_fields(job, result, time.time() - t0)
    summary |= summary_fields(
        run, prompts, run_dir, initial, final, units_per_update, source,
        summary["steps_per_second"],
    )  # fmt: skip
    summary |= extra(last_rows(run_dir, FINAL_WINDOW, run.config.num_steps, run.flat.run.log_every))
    if run_dir.writes:  # per-problem results beside initial_eval.json's: paired comparisons
        checkpoints.write_json(run_dir.file("final_eval.json"), {"correct": final.correct.tolist()})
    run_dir.write_summary(summary)  # after the results: its presence says the run finished
    write_plots_and_report(run, prompts, run_dir, initial, final, summary, title)
    return summary
