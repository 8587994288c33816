"""Completions of prompt batches, for evaluation: greedy ones (a task's exact-match accuracy) and
sampled ones (pass@k), in batches that split over the mesh, each sampler compiled once."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from jaxrl import sharding
from jaxrl.lm.model import ModelConfig
from jaxrl.lm.sampler import SamplingConfig, generate


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


@functools.lru_cache(maxsize=8)
def _greedy_generator(model: ModelConfig, sampling: SamplingConfig, mesh: Any) -> Callable:
    """One jitted sampler per (model, sampling, mesh): evaluating the SFT model and then the
    trained one (dpo.py) compiles it once."""
    # Replicated outputs: every process of a multi-host run can read the whole batch.
    return jax.jit(
        lambda p, t, m: generate(model, p, t, m, jax.random.key(0), sampling, mesh),
        out_shardings=sharding.replicated(mesh),
    )


def greedy_completions(
    model: ModelConfig,
    params: Any,
    tokenizer: Any,
    prompt_tokens: np.ndarray,
    prompt_mask: np.ndarray,
    max_new_tokens: int,
    mesh: Any,
    batch_size: int = 256,
) -> list[str]:
    """The decoded greedy completion of every left-padded prompt, `batch_size` prompts at a time
    (the last batch padded with repeats, so one program serves every batch)."""
    sampling = SamplingConfig(
        max_new_tokens=max_new_tokens,
        eos_id=tokenizer.eos_id,
        pad_id=tokenizer.pad_id,
        temperature=0.0,
    )
    run = _greedy_generator(model, sampling, mesh)
    n = len(prompt_tokens)
    batch_size = batch_for_mesh(min(batch_size, n), mesh)  # no batch of mostly repeats
    completions: list[str] = []
    for start in range(0, n, batch_size):
        index = np.arange(start, start + batch_size) % n
        tokens = sharding.shard_batch(prompt_tokens[index], mesh)
        mask = sharding.shard_batch(prompt_mask[index], mesh)
        out = jax.device_get(run(params, tokens, mask))
        for row in range(min(batch_size, n - start)):
            completions.append(tokenizer.decode(out.tokens[row][out.mask[row]]))
    return completions


@functools.lru_cache(maxsize=8)
def _sampler(model: ModelConfig, sampling: SamplingConfig, mesh: Any, group_size: int) -> Callable:
    """One jitted sampler per (model, sampling, mesh, samples per prompt), its key an argument."""
    return jax.jit(
        lambda p, t, m, k: generate(model, p, t, m, k, sampling, mesh, group_size=group_size),
        out_shardings=sharding.replicated(mesh),
    )


def sampled_completions(
    model: ModelConfig,
    params: Any,
    tokenizer: Any,
    prompt_tokens: np.ndarray,
    prompt_mask: np.ndarray,
    sampling: SamplingConfig,
    num_samples: int,
    key: jax.Array,
    mesh: Any,
    batch_size: int = 256,
) -> list[list[str]]:
    """`num_samples` decoded completions of every left-padded prompt sampled with `sampling`
    (for pass@k), about `batch_size` rows (batch_size // num_samples prompts) at a time; batch i
    draws with `fold_in(key, i)`, so the same key gives the same samples (a resumed run's
    evaluation is the uninterrupted run's). Each prompt is prefilled once and its cache shared
    by its samples (`generate`'s group_size): the samples of repeating each prompt num_samples
    times, a prompt's computation once."""
    run = _sampler(model, sampling, mesh, num_samples)
    n = len(prompt_tokens)
    prompts = batch_for_mesh(min(max(1, batch_size // num_samples), n), mesh)
    texts: list[str] = []
    for index, start in enumerate(range(0, n, prompts)):
        chosen = np.arange(start, start + prompts) % n
        tokens = sharding.shard_batch(prompt_tokens[chosen], mesh)
        mask = sharding.shard_batch(prompt_mask[chosen], mesh)
        out = jax.device_get(run(params, tokens, mask, jax.random.fold_in(key, index)))
        for row in range(min(prompts, n - start) * num_samples):
            texts.append(tokenizer.decode(out.tokens[row][out.mask[row]]))
    return [texts[i * num_samples : (i + 1) * num_samples] for i in range(n)]


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
    completions = greedy_completions(
        model, params, tokenizer, prompt_tokens, prompt_mask, max_new_tokens, mesh, batch_size
    )
    scores = [task.score(p, c) for p, c in zip(problems, completions, strict=True)]
    return float(np.mean([s == 1.0 for s in scores])), float(np.mean(scores)), completions
