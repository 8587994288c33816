"""Multi-turn RL of a language model playing a text game (several turns per episode, the game's
tokens masked out of the loss): what `experiments/multiturn.py` runs (`jaxrl.trainers.base`
describes the trainers' shape).

    from jaxrl.trainers import multiturn
    result = multiturn.train(multiturn.config(), "runs/game", model="runs/sft_game")
    result.summary["eval_success"]

A game of your own is a class (`game=MyGame`) with reset(seed) -> opening and
step(utterance) -> (answer, reward, done).
"""

from __future__ import annotations

import functools
import json
import time
from typing import Any

import numpy as np

from algos import asynchronous, multiturn, multiturn_partial
from algos.partial import Partial
from jaxrl import runner, statistics
from jaxrl.lm import checkpoints
from jaxrl.trainers import base, game_play, lm_runs, prompt_data, prompt_eval

config = functools.partial(base.load_config, "multiturn")
FINAL_WINDOW = 10  # updates whose training success is averaged for final_success


def evaluation_row(played: game_play.Played, prefix: str, tools: bool) -> dict[str, float]:
    """Success rate and mean turns of evaluation episodes, with the success's 95% interval; with
    `tools`, the fraction of episodes that called one."""
    low, high = prompt_eval.interval(played.success)
    row = {
        prefix: float(played.success.mean()),
        f"{prefix}_low": low,
        f"{prefix}_high": high,
        f"{prefix}_turns": float(played.turns.mean()),
    }
    if tools:
        row[f"{prefix}_tool_calls"] = float(played.tool_calls.mean())
    return row


def plot_evaluations(run_dir, initial: dict, final: dict, num_steps: int, title: str) -> None:
    """`eval_success.png`: sampled and greedy success of the evaluation episodes at the start,
    at every `eval_every` evaluation (metrics.jsonl) and at the end, with 95% intervals."""
    if not run_dir.writes:
        return
    with open(run_dir.metrics_path) as f:
        logged = [json.loads(line) for line in f if line.strip()]
    middle = [row for row in logged if "eval_success_low" in row and row["step"] < num_steps]
    rows = [initial, *middle, final]
    names = {"eval_success": "sampled", "eval_success_greedy": "greedy"}
    statistics.plot_sample_efficiency_curves(
        [0, *(row["step"] for row in middle), num_steps],
        {label: np.array([row[key] for row in rows]) for key, label in names.items()},
        {
            label: np.array(
                [[row[f"{key}_low"] for row in rows], [row[f"{key}_high"] for row in rows]]
            )
            for key, label in names.items()
        },
        run_dir.file("eval_success.png"),
        xlabel="update",
        ylabel="success rate (95% CI)",
        title=title,
    )


@base.lm_trainer("multiturn")
def train(
    flat: Any, parts: lm_runs.Parts, workdir: str | None, kill_after_chunk: int | None
) -> base.Result:
    """Multi-turn RL of a language model playing a text game (several turns per episode, the
    game's tokens masked out of the loss). Called as `train(config=None, workdir=None, *,
    model=None, train_data=None, eval_data=None, rewards=None, game=None)`: `config` is
    experiments/configs/multiturn.py's (`config(preset)`), the parts are
    `jaxrl.trainers.base`'s; returns Result(state, summary, run_dir)."""
    run = lm_runs.setup(
        flat, workdir, multiturn.Config, "multiturn", parts, multiturn.check_rollout
    )
    config, mesh, section, rollout = run.config, run.mesh, run.flat.task, run.rollout
    game = game_play.make_game(section, run.tokenizer, run.parts.game)
    if isinstance(rollout, Partial):
        with runner.config_errors():  # the turn budget and the staleness bound against max_turns
            multiturn_partial.check_game(rollout, game.env)
    params, model, source = lm_runs.initial_params(run)
    turn_tokens, temperature = config.sampling.max_new_tokens, config.sampling.temperature
    evaluate = game_play.evaluator(section, game, model, run.tokenizer, turn_tokens, mesh)
    num_samples = prompt_data.eval_samples(run)

    def evaluate_both(params) -> tuple[dict, list[str]]:
        sampled = evaluate(params, temperature)
        greedy = evaluate(params, 0.0)
        tools = section.game == game_play.TOOL_GAME
        row = evaluation_row(sampled, "eval_success", tools)
        row |= evaluation_row(greedy, "eval_success_greedy", tools)
        if num_samples:  # pass@k: each evaluation game played eval_samples times, sampled
            games = evaluate.successes(params, temperature, num_samples)
            row |= prompt_eval.pass_at_k_fields(games)
        return row | {"_success": sampled.success}, sampled.transcripts

    # The starting policy's evaluation (recomputed on a resume: the same episodes).
    initial, before = evaluate_both(params)
    run_dir = lm_runs.open_run(run)
    if run_dir.writes:
        with open(run_dir.file("transcripts_before.txt"), "w") as f:
            f.write("\n".join(before))

    algorithm = multiturn.make(
        config, model, game.env, params, game.end_of_turn, run.tokenizer.pad_id, mesh, rollout
    )
    inputs = multiturn.Inputs(params if config.kl_beta > 0 else None)

    def after_chunk(state, step: int, index: int) -> dict | None:
        every = run.flat.eval_every
        if not every or (index + 1) % every or step >= config.num_steps:
            return None
        row, _ = evaluate_both(state.params)
        row = {key: value for key, value in row.items() if not key.startswith("_")}
        for key in [k for k in row if k.endswith("_ci95")]:  # metrics rows hold numbers
            row[f"{key.removesuffix('_ci95')}_low"], row[f"{key.removesuffix('_ci95')}_high"] = (
                row.pop(key)
            )
        return row

    title = f"Multi-turn GRPO ({config.credit} credit) on {section.game}"
    job = lm_runs.job(
        run,
        algorithm,
        title,
        inputs_for=lambda first, count: inputs,
        units_name="episodes",
        units_per_step=config.batch_size * config.group_size,
        after_chunk=after_chunk,
        # Async mode's two programs on two meshes are dispatched from the host.
        chunk=asynchronous.make_chunk if rollout.host_loop else None,
        host_loop=rollout.host_loop,
    )
    result = runner.train(job, run.flat.run, run_dir, kill_after_chunk)
    params = result.states.params
    checkpoints.save_params(run_dir, params)

    t0 = time.time()
    final, after = evaluate_both(params)
    if run_dir.writes:
        with open(run_dir.file("transcripts_after.txt"), "w") as f:
            f.write("\n".join(after))
    summary = runner.summary_fields(job, result, time.time() - t0)
    rows = prompt_eval.last_rows(run_dir, FINAL_WINDOW, config.num_steps, run.flat.run.log_every)
    public = lambda row: {k: v for k, v in row.items() if not k.startswith("_")}  # noqa: E731
    change = final["_success"] - initial["_success"]  # paired: the same games and keys
    episodes_per_update = config.batch_size * config.group_size
    if isinstance(rollout, Partial):  # the episodes trained on, not batch_size per update
        log_every = run.flat.run.log_every
        every = runner.block_length(config.num_steps, log_every)  # updates per metrics row
        trained = prompt_eval.last_rows(run_dir, config.num_steps, config.num_steps, log_every)
        groups = round(sum(row["trained_groups"] for row in trained) * every)
        episodes_per_update = groups * config.group_size / config.num_steps
    summary |= {
        "task": section.game,
        "init_from": source,
        "credit": config.credit,
        "episodes": round(config.num_steps * episodes_per_update),
        "episodes_per_second": round(summary["steps_per_second"] * episodes_per_update, 3),
        "final_success": float(np.mean([row["success"] for row in rows])),
        **public(final),
        **{f"initial_{key}": value for key, value in public(initial).items()},
        "eval_success_change": float(change.mean()),
        "eval_success_change_ci95": prompt_eval.interval(change),
        "num_eval": section.num_eval,
        "eval_samples": num_samples,  # episodes per evaluation game behind eval_pass_at_K
        "mesh_shape": list(config.mesh_shape),
    }
    run_dir.write_summary(summary)
    run_dir.write_learning_curve(
        x="step", y="success", title=f"{title}: success of the training episodes"
    )
    plot_evaluations(run_dir, initial, final, config.num_steps, title)
    low, high = summary["eval_success_change_ci95"]
    where = lm_runs.finish(run, run_dir)  # summary.json is written: the final state may go
    print(
        f"{title}: eval_success {final['eval_success']:.3f} (start {initial['eval_success']:.3f}; "
        f"change 95% CI [{low:+.3f}, {high:+.3f}]), greedy {final['eval_success_greedy']:.3f} "
        f"(start {initial['eval_success_greedy']:.3f}) after {config.num_steps} updates in "
        f"{summary['wall_seconds']:.0f}s ({runner.compile_note(summary)}). "
        f"{where}"
    )
    return base.Result(result.states, summary, run_dir.path)
