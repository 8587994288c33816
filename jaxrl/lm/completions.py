"""Completions of prompt batches, for evaluation: greedy ones (a task's exact-match accuracy) and
sampled ones (pass@k), in batches that split over the mesh, each sampler compiled once."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from jaxrl import sharding
from jaxrl.lm.model import ModelConfig, Transformer
from jaxrl.lm.sampler import SamplingConfig, decode, generate, generation_copy, prefill


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


def greedy_sampling(tokenizer: Any, max_new_tokens: int) -> SamplingConfig:
    """Greedy decoding (temperature 0) of `max_new_tokens` with the tokenizer's end and pad."""
    return SamplingConfig(
        max_new_tokens=max_new_tokens,
        eos_id=tokenizer.eos_id,
        pad_id=tokenizer.pad_id,
        temperature=0.0,
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
    run = _greedy_generator(model, greedy_sampling(tokenizer, max_new_tokens), mesh)
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
def _greedy_and_sampled(
    model: ModelConfig, greedy: SamplingConfig, sampling: SamplingConfig, mesh: Any, samples: int
) -> Callable:
    """One jitted program per setting: each prompt prefilled once, then its greedy completion
    and its `samples` sampled ones decoded from that one cache."""
    steps = max(greedy.max_new_tokens, sampling.max_new_tokens)

    def run(params: Any, tokens: jax.Array, mask: jax.Array, key: jax.Array):
        transformer = Transformer(model, mesh=mesh)
        params = generation_copy(params, model)
        prefilled = prefill(transformer, params, tokens, mask, steps)
        greedy_out = decode(transformer, params, prefilled, jax.random.key(0), greedy)
        return greedy_out, decode(transformer, params, prefilled, key, sampling, samples)

    return jax.jit(run, out_shardings=sharding.replicated(mesh))


def greedy_and_sampled_completions(
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
) -> tuple[list[str], list[list[str]]]:
    """`greedy_completions` (of sampling.max_new_tokens) and `num_samples` completions of every
    left-padded prompt sampled with `sampling` (for pass@k), `batch_size` prompts a call, each
    prompt prefilled once for its greedy answer and its samples: the held-out evaluation's
    accuracy and pass@k at the cost of one prefill, and the samples decoded batch_size x
    num_samples rows at a time. Call i draws with fold_in(key, i), so the same key gives the
    same samples (a resumed run's evaluation is the uninterrupted run's): those of sampling each
    prompt's num_samples repeats row by row in that call. The greedy answers are
    `greedy_completions`' (up to rounding where the batch differs)."""
    greedy = greedy_sampling(tokenizer, sampling.max_new_tokens)
    run = _greedy_and_sampled(model, greedy, sampling, mesh, num_samples)
    n = len(prompt_tokens)
    prompts = batch_for_mesh(min(batch_size, n), mesh)
    answers: list[str] = []
    texts: list[str] = []
    decoded = lambda out, row: tokenizer.decode(out.tokens[row][out.mask[row]])  # noqa: E731
    for index, start in enumerate(range(0, n, prompts)):
        chosen = np.arange(start, start + prompts) % n
        tokens = sharding.shard_batch(prompt_tokens[chosen], mesh)
        mask = sharding.shard_batch(prompt_mask[chosen], mesh)
        out = jax.device_get(run(params, tokens, mask, jax.random.fold_in(key, index)))
        kept = min(prompts, n - start)
        answers += [decoded(out[0], row) for row in range(kept)]
        texts += [decoded(out[1], row) for row in range(kept * num_samples)]
    return answers, [texts[i * num_samples : (i + 1) * num_samples] for i in range(n)]


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
