"""What the language-model experiment scripts (sft.py, dpo.py) share: the model and mesh from the
config, the task data, deterministic resumable batches, the chunked training loop with checkpoints,
and greedy-generation task accuracy."""

from __future__ import annotations

import dataclasses
import functools
import os
import signal
import time
from collections.abc import Callable
from typing import Any

import jax
import ml_collections
import numpy as np
import orbax.checkpoint as ocp

from envs.text import make_task
from experiments import _common
from experiments._common import fail
from jaxrl import sharding
from jaxrl.checkpoint import Checkpointer
from jaxrl.config import ConfigError
from jaxrl.data.step_batches import dataset_batches as dataset_batches
from jaxrl.data.step_batches import stacked_batches as stacked_batches
from jaxrl.data.step_batches import step_batch_indices as step_batch_indices
from jaxrl.lm import load_tokenizer, training
from jaxrl.lm.model import ModelConfig, init_params, param_shardings
from jaxrl.lm.sampler import SamplingConfig, generate
from jaxrl.logging import MetricsSink, RunDirectory

PARAMS_DIR = "params"  # final parameters of a run, where the next stage (DPO, GRPO) reads them


def check_run_settings(run: ml_collections.ConfigDict) -> None:
    names = ("steps_per_chunk", "checkpoint_every", "keep_checkpoints", "log_every")
    _common.check_run_settings(run, names)


def batch_for_mesh(requested: int, mesh: Any) -> int:
    """An evaluation batch size near `requested` that splits evenly over the mesh's batch shards."""
    shards = sharding.batch_size_per_shard(mesh)
    return max(shards, requested - requested % shards)


def eval_examples(task: Any, problems: list[str], completions: list[str], count: int = 5) -> list:
    """A few held-out prompts with the model's completions, for summary.json."""
    return [
        {"prompt": task.prompt(p), "completion": c}
        for p, c in zip(problems[:count], completions[:count], strict=True)
    ]


def model_config(section: ml_collections.ConfigDict) -> ModelConfig:
    try:
        return ModelConfig(**section.to_dict())
    except ConfigError as error:
        fail(f"config.model.{error}")
    except TypeError as error:
        fail(f"config.model: {error}")


def make_mesh(mesh_shape: tuple[int, int, int]) -> Any:
    try:
        return sharding.make_mesh(*mesh_shape)
    except ConfigError as error:
        fail(f"config.mesh_shape: {error}")


def task_and_tokenizer(section: ml_collections.ConfigDict):
    try:
        task = make_task(section.name, num_digits=section.num_digits)
        tokenizer = load_tokenizer(section.tokenizer)
    except (ConfigError, FileNotFoundError, ValueError) as error:
        fail(f"config.task: {error}")
    return task, tokenizer


def split_problems(task: Any, section: ml_collections.ConfigDict) -> tuple[list[str], list[str]]:
    """Held-out problems and training problems that never include them. With
    `section.held_out == "hash"` they come from the task's hashed splits, the ones GRPO's
    in-program sampler respects (use it for an SFT model that GRPO will continue); "random"
    draws the held-out set at random."""
    rng = np.random.default_rng(section.data_seed)
    try:
        if section.held_out == "hash":
            eval_problems = task.sample_problems(rng, section.num_eval, split="eval")
            train_problems = task.sample_problems(rng, section.num_train, split="train")
        else:
            eval_problems = task.sample_problems(rng, section.num_eval)
            train_problems = task.sample_problems(
                rng, section.num_train, exclude=set(eval_problems)
            )
    except ConfigError as error:
        fail(f"config.task.num_train/num_eval: {error}")
    return train_problems, eval_problems


def initial_params(
    model: ModelConfig, init_from: str, seed: int, mesh: Any
) -> tuple[Any, ModelConfig, str]:
    """Random parameters, or those of an earlier run directory (its `params/`), or a Hugging Face
    checkpoint directory (config.json + model.safetensors), placed on the mesh."""
    source = "random init"
    if not init_from:
        params = init_params(model, jax.random.key(seed))
    elif os.path.isdir(os.path.join(init_from, PARAMS_DIR)):
        # Restored straight onto this run's mesh, whatever mesh or host count saved them.
        like = jax.tree.map(
            lambda leaf, where: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=where),
            jax.eval_shape(lambda: init_params(model, jax.random.key(0))),
            placement(model, mesh),
        )
        with ocp.StandardCheckpointer() as checkpointer:
            params = checkpointer.restore(
                os.path.abspath(os.path.join(init_from, PARAMS_DIR)), like
            )
        source = f"run {init_from}"
    elif os.path.isfile(os.path.join(init_from, "config.json")):
        from jaxrl.lm.hf import load_hf_checkpoint

        model, params = load_hf_checkpoint(init_from)
        source = f"Hugging Face checkpoint {init_from}"
    else:
        fail(
            f"config.init_from: {init_from!r} holds neither a finished run ({PARAMS_DIR}/) nor a "
            "Hugging Face checkpoint (config.json); pass a run directory of experiments/sft.py"
        )
    return jax.device_put(params, placement(model, mesh)), model, source


def placement(model: ModelConfig, mesh: Any) -> Any:
    """The parameters' shardings on `mesh`, or a one-line error if the mesh does not fit them."""
    try:
        return param_shardings(model, mesh)
    except ConfigError as error:
        fail(f"config.mesh_shape: {error}")


def save_params(run_dir: RunDirectory, params: Any) -> None:
    path = os.path.abspath(run_dir.file(PARAMS_DIR))
    with ocp.StandardCheckpointer() as checkpointer:
        checkpointer.save(path, params, force=True)


@dataclasses.dataclass
class LoopResult:
    state: training.TrainState
    compile_seconds: float
    train_seconds: float
    resumed_from_step: int
    last_metrics: dict[str, np.ndarray] | None  # per step of the last chunk run, if any


def train_in_chunks(
    make_chunk: Callable[[Callable], Callable],
    state: training.TrainState,
    batches_for: Callable[[int, int], Any],
    num_steps: int,
    units_per_step: int,
    run: ml_collections.ConfigDict,
    run_dir: RunDirectory,
    mesh: Any,
    description: str,
    extra: Any = None,
    kill_after_chunk: int | None = None,
) -> LoopResult:
    """Run `num_steps` steps as compiled chunks of run.steps_per_chunk, each fed
    `batches_for(first_step, count)`, saving a checkpoint after each `run.checkpoint_every`
    chunks and resuming from the newest one. The progress bar counts `units_per_step` per step
    (sequences, pairs or completions). Returns the final state and the last chunk's metrics."""
    checkpointer = Checkpointer(
        run_dir.checkpoint_dir, save_every=run.checkpoint_every, keep=run.keep_checkpoints
    )
    done = 0
    if checkpointer.latest_step() is not None:
        state, meta = checkpointer.restore(state)
        done = int(meta["steps"])
        run_dir.truncate_metrics(done)
        print(f"Resuming {run_dir.path} from step {done}/{num_steps}.")

    sink = MetricsSink(
        run_dir,
        total_updates=num_steps,
        steps_per_update=units_per_step,
        log_every=run.log_every,
        start_update=done,
        per_run=(),
        tensorboard=run.tensorboard,
        progress=run.progress,
        description=description,
    )
    boundaries = list(range(0, num_steps, run.steps_per_chunk)) + [num_steps]
    lengths = [b - a for a, b in zip(boundaries[:-1], boundaries[1:], strict=True)]
    state_sharding = training.state_shardings(state)
    t0 = time.time()
    compiled = {}
    for length in sorted(set(lengths)):
        example = batches_for(0, length)
        jitted = jax.jit(
            make_chunk(sink),
            donate_argnums=0,
            out_shardings=(state_sharding, sharding.replicated(mesh)),
        )
        compiled[length] = jitted.lower(state, example, extra).compile()
    compile_seconds = time.time() - t0

    start = time.time()
    last_metrics = None
    for index, (first, length) in enumerate(zip(boundaries[:-1], lengths, strict=True)):
        if first + length <= done:
            continue
        state, last_metrics = compiled[length](state, batches_for(first, length), extra)
        is_last = index == len(lengths) - 1
        checkpointer.save(index + 1, state, {"steps": first + length}, force=is_last)
        if kill_after_chunk == index + 1:
            os.kill(os.getpid(), signal.SIGKILL)
    jax.block_until_ready(state)
    sink.close()
    checkpointer.close()
    last_metrics = None if last_metrics is None else jax.device_get(last_metrics)
    return LoopResult(state, compile_seconds, time.time() - start, done, last_metrics)


@functools.lru_cache(maxsize=8)
def _greedy_generator(model: ModelConfig, sampling: SamplingConfig, mesh: Any) -> Callable:
    """One jitted sampler per (model, sampling, mesh): evaluating the SFT model and then the
    trained one (dpo.py) compiles it once."""
    # Replicated outputs: every process of a multi-host run can read the whole batch.
    return jax.jit(
        lambda p, t, m: generate(model, p, t, m, jax.random.key(0), sampling, mesh),
        out_shardings=sharding.replicated(mesh),
    )


def task_accuracy(
    model: ModelConfig,
    params: Any,
    task: Any,
    tokenizer: Any,
    problems: list[str],
    prompt_tokens: np.ndarray,
    prompt_mask: np.ndarray,
    max_new_tokens: int,
    mesh: Any,
    batch_size: int = 256,
) -> tuple[float, float, list[str]]:
    """Greedy generations for every problem, scored by the task: exact-match accuracy, mean score,
    and the decoded completions."""
    sampling = SamplingConfig(
        max_new_tokens=max_new_tokens,
        eos_id=tokenizer.eos_id,
        pad_id=tokenizer.pad_id,
        temperature=0.0,
    )
    run = _greedy_generator(model, sampling, mesh)
    n = len(problems)
    batch_size = batch_for_mesh(batch_size, mesh)
    completions: list[str] = []
    for start in range(0, n, batch_size):
        index = np.arange(start, start + batch_size) % n
        tokens = sharding.shard_batch(prompt_tokens[index], mesh)
        mask = sharding.shard_batch(prompt_mask[index], mesh)
        out = jax.device_get(run(params, tokens, mask))
        for row in range(min(batch_size, n - start)):
            completions.append(tokenizer.decode(out.tokens[row][out.mask[row]]))
    scores = [task.score(p, c) for p, c in zip(problems, completions, strict=True)]
    return float(np.mean([s == 1.0 for s in scores])), float(np.mean(scores)), completions
