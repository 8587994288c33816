"""Deterministic, resumable per-step batches of an in-memory dataset (e.g. tokenised SFT sequences
or DPO preference pairs: a dict of arrays with one row per example).

Every epoch is a permutation of the examples seeded by (seed, epoch), with its remainder dropped,
so the batch of any optimizer step can be recomputed from the step number alone: a run resumed
from a checkpoint sees exactly the batches an uninterrupted run would.

    chunk = stacked_batches(arrays, config, seed=0, first_step=0, count=10)
    # {name: [10, config.grad_accum_steps, config.micro_batch_size, ...]}, what a compiled chunk
    # of `algos.sft` / `algos.dpo` optimizer steps takes

`config` is any object with `batch_size`, `grad_accum_steps` and `micro_batch_size` (such as
`jaxrl.lm.training.TrainConfig`, `algos.sft.Config` or `algos.dpo.Config`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol

import numpy as np

from jaxrl.lm.training import shard_chunk

__all__ = ["BatchConfig", "dataset_batches", "stacked_batches", "step_batch_indices"]


class BatchConfig(Protocol):
    """The batch settings the helpers here read (`jaxrl.lm.training.TrainConfig` has them)."""

    @property
    def batch_size(self) -> int:
        """Examples per optimizer step."""
        ...

    @property
    def grad_accum_steps(self) -> int:
        """Micro-batches each step's batch is split into."""
        ...

    @property
    def micro_batch_size(self) -> int:
        """Examples per micro-batch: batch_size // grad_accum_steps."""
        ...


def step_batch_indices(num_examples: int, batch_size: int, seed: int, step: int) -> np.ndarray:
    """The example indices of optimizer step `step` (0-based): epochs are seeded permutations and
    the remainder of each is dropped, so any step's batch can be recomputed after a restart."""
    per_epoch = num_examples // batch_size
    epoch, position = divmod(step, per_epoch)
    order = np.random.default_rng([seed, epoch]).permutation(num_examples)
    return order[position * batch_size : (position + 1) * batch_size]


def stacked_batches(
    arrays: Mapping[str, np.ndarray],
    config: BatchConfig,
    seed: int,
    first_step: int,
    count: int,
) -> dict[str, np.ndarray]:
    """The batches of optimizer steps `first_step` .. `first_step + count - 1` of the dataset
    `arrays` (every array with one row per example), each array stacked
    [count, grad_accum_steps, micro_batch_size, ...]."""
    n = len(next(iter(arrays.values())))
    index = np.stack(
        [
            step_batch_indices(n, config.batch_size, seed, s)
            for s in range(first_step, first_step + count)
        ]
    ).reshape(count, config.grad_accum_steps, config.micro_batch_size)
    return {name: value[index] for name, value in arrays.items()}


def dataset_batches(
    arrays: Mapping[str, np.ndarray], config: BatchConfig, seed: int, mesh: Any
) -> Callable[[int, int], dict[str, Any]]:
    """batches_for(first_step, count) for a chunked training loop: that many steps' batches of the
    dataset `arrays` (`stacked_batches`), placed on the mesh (`jaxrl.lm.training.shard_chunk`;
    `mesh` None: default-device arrays)."""

    def batches_for(first_step: int, count: int) -> dict[str, Any]:
        return shard_chunk(stacked_batches(arrays, config, seed, first_step, count), mesh)

    return batches_for
