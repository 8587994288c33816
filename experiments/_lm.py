"""What the language-model scripts (sft.py, dpo.py, grpo.py) share besides `jaxrl.runner`: the
settings every one of them reads (model, mesh, task), the starting parameters and where a run
leaves its final ones, the runner's `Job` for one LM run, and greedy-generation task accuracy."""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import ml_collections
import numpy as np
import orbax.checkpoint as ocp

from envs.text import DigitTask, make_task
from jaxrl import hparams, runner, sharding
from jaxrl.config import ConfigError
from jaxrl.lm import Tokenizer, load_tokenizer, training
from jaxrl.lm.model import ModelConfig, init_params, param_shardings
from jaxrl.lm.sampler import SamplingConfig, generate
from jaxrl.logging import RunDirectory
from jaxrl.loop import Algorithm
from jaxrl.runner import fail

PARAMS_DIR = "params"  # final parameters of a run, where the next stage (DPO, GRPO) reads them
SETTINGS = ("init_from", "seed", "eval_batch_size")  # top-level scalars that are not Config fields


class Setup(NamedTuple):
    """What every LM script reads first, each setting checked (one error line otherwise)."""

    name: str  # the algorithm's: "sft", "dpo" or "grpo"
    flat: ml_collections.ConfigDict  # the whole config, sections included
    config: Any  # the algorithm's frozen Config
    mesh: Any
    task: DigitTask
    tokenizer: Tokenizer
    model: ModelConfig  # the config's model (init_from may replace it: see `initial_params`)
    workdir: str


def setup(flags: dict[str, Any], config_cls: type, name: str) -> Setup:
    """Check the config, and make the mesh, task and tokenizer (each problem one error line)."""
    flat = flags["config"].value
    config = runner.build_config(config_cls, flat, SETTINGS)
    runner.check_run_settings(flat.run)
    mesh = make_mesh(config.mesh_shape)
    task, tokenizer = task_and_tokenizer(flat.task)
    workdir = flags["workdir"].value or os.path.join(
        "runs", f"{name}-{task.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    )
    return Setup(name, flat, config, mesh, task, tokenizer, model_config(flat.model), workdir)


def job(
    run: Setup,
    algorithm: Algorithm,
    description: str,
    *,
    inputs_for: Callable[[int, int], Any],
    units_name: str,
    units_per_step: int,
    scan_inputs: bool = False,
    chunk: Callable[..., Callable] | None = None,
) -> runner.Job:
    """The runner's `Job` for one LM run (no runs axis): the state made once with
    `PRNGKey(config.seed)` and the config's hyper-parameters (replicated over the mesh), kept in
    its shardings by every chunk. The runner compiles chunks of `algorithm.update` itself
    (`scan_inputs`: `inputs_for` gives one host batch per update), unless `chunk(update, length,
    log_every=, callback=, keep_going=)` makes them (DPO's, which hands every update the same
    reference)."""
    hp = jax.device_put(hparams.hparams(run.config), sharding.replicated(run.mesh))
    state = algorithm.init(jax.random.PRNGKey(run.flat.seed), hp)
    custom = None
    if chunk is not None:

        def custom(length: int, block: int, sink: Callable, keep_going: Callable | None):
            return chunk(
                algorithm.update, length, log_every=block, callback=sink, keep_going=keep_going
            )

    return runner.Job(
        name=run.name,
        description=description,
        num_steps=run.config.num_steps,
        init_states=lambda: state,
        hparams=hp,
        update=algorithm.update,
        scan_inputs=scan_inputs,
        make_chunk=custom,
        units_per_step=units_per_step,
        units_name=units_name,
        runs_axis=False,
        inputs_for=inputs_for,
        per_run=(),
        out_shardings=(training.state_shardings(state), sharding.replicated(run.mesh)),
    )


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
    """The `model` section as a `ModelConfig`."""
    try:
        return ModelConfig(**section.to_dict())
    except ConfigError as error:
        fail(f"config.model.{error}")
    except TypeError as error:
        fail(f"config.model: {error}")


def make_mesh(mesh_shape: tuple[int, int, int]) -> Any:
    """The (data, fsdp, tensor) device mesh."""
    try:
        return sharding.make_mesh(*mesh_shape)
    except ConfigError as error:
        fail(f"config.mesh_shape: {error}")


def task_and_tokenizer(section: ml_collections.ConfigDict) -> tuple[DigitTask, Tokenizer]:
    """The `task` section's task and tokenizer."""
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
    """Save the final parameters to the run's `params/` (where `initial_params` finds them)."""
    path = os.path.abspath(run_dir.file(PARAMS_DIR))
    with ocp.StandardCheckpointer() as checkpointer:
        checkpointer.save(path, params, force=True)


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
