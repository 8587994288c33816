"""Flat transitions for an offline learner: built from in-memory episodes or loaded from a built
RLDS dataset, then batched on the host or sampled on device inside a compiled loop.

    data = load_transitions(path)                       # or ("pendulum_v1/random", data_dir=...)
    for batch in batches(data, batch_size=256, key_or_seed=0): ...        # host NumPy
    on_device = to_device(data)                                           # or, inside jit:
    batch = sample_batch(on_device, key, batch_size=256)

Flat transitions (`Transitions`): for t < S - 1 in an episode of S steps (the RLDS step form of
`jaxrl.data.episodes`), (o_t, a_t, r_t, o_{t+1}) with terminated = is_terminal of step t + 1. So
a time-limit end is not a termination, and the last step (padding, or in some catalog datasets a
step without a successor) never forms a transition.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from jaxrl import replay
from jaxrl.data import preferences  # its batches() shuffles dicts of arrays
from jaxrl.data.episodes import (
    EpisodeDataError,
    canonical_actions,
    episode_to_steps,
    validate_episode,
)
from jaxrl.data.locate import dataset_path
from jaxrl.data.rlds_reader import read_episode_records
from jaxrl.types import Transition

__all__ = [
    "Transitions",
    "batches",
    "episodes_to_transitions",
    "load_transitions",
    "normalized_score",
    "sample_batch",
    "sample_indices",
    "to_device",
]


@struct.dataclass
class Transitions(Transition):
    """Flat transitions of a dataset: `jaxrl.types.Transition` (obs, action, reward, next_obs,
    terminated), every field with leading size N, plus where its episodes begin and end.

    terminated: next_obs is absorbing (target r, no bootstrap). A time-limit end is NOT
    terminated; it shows as last=True with terminated=False. first/last mark each episode's first
    and last transition (episode k spans first[k-th True] .. last[k-th True]); they may be None
    for transitions without episode boundaries.
    """

    first: Any = None  # bool [N]
    last: Any = None  # bool [N]

    @property
    def num_transitions(self) -> int:
        """N, the number of transitions."""
        return int(self.reward.shape[0])

    def episode_starts(self) -> np.ndarray:
        """Index of each episode's first transition."""
        return np.flatnonzero(np.asarray(self.first))

    def episode_returns(self) -> np.ndarray:
        """Undiscounted return of each episode (in the order episodes are stored)."""
        return np.add.reduceat(np.asarray(self.reward, np.float64), self.episode_starts())


_FIELDS = tuple(f.name for f in dataclasses.fields(Transitions))


def _steps_to_transitions(steps: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    obs = steps["observation"].astype(np.float32)
    count = len(obs) - 1
    first = np.zeros(count, bool)
    first[0] = True
    last = np.zeros(count, bool)
    last[-1] = True
    return {
        "obs": obs[:-1],
        "action": canonical_actions(steps["action"][:-1]),
        "reward": steps["reward"][:-1].astype(np.float32),
        "next_obs": obs[1:],
        "terminated": steps["is_terminal"][1:].astype(bool),
        "first": first,
        "last": last,
    }


def _concatenate(parts: list[dict[str, np.ndarray]], where: str) -> Transitions:
    if not parts:
        raise EpisodeDataError(f"{where}: no transitions (every episode has fewer than 2 steps)")
    return Transitions(**{f: np.concatenate([p[f] for p in parts]) for f in _FIELDS})


def episodes_to_transitions(episodes: Sequence[Mapping[str, Any]]) -> Transitions:
    """In-memory episodes -> `Transitions` (terminated only on the last transition of an episode
    that ended in an absorbing state)."""
    parts = []
    spec = None
    for index, episode in enumerate(episodes):
        episode, spec = validate_episode(episode, index, spec)
        parts.append(_steps_to_transitions(episode_to_steps(episode, spec)))
    return _concatenate(parts, "episodes")


def load_transitions(
    path_or_name: str | os.PathLike,
    split: str = "train",
    data_dir: str | os.PathLike | None = None,
) -> Transitions:
    """Flat transitions of a built dataset's `split` (tfds slices like "train[:10%]" work),
    episodes in stored order.

    `path_or_name`: a dataset directory, or a name `NAME[/CONFIG][:X.Y.Z]` under `data_dir`
    (default `default_data_dir()`). Datasets built here are array_record, read with
    `as_data_source()` without TensorFlow. TFDS catalog RLDS datasets (e.g.
    `d4rl_mujoco_halfcheetah/v2-medium`) already prepared in data_dir are tfrecord files: they are
    read through TensorFlow (`pip install tensorflow`), imported only then.

    Errors: `DatasetNotFoundError` (nothing there, with how to create it), `CorruptDatasetError`
    (names the unreadable file; rebuild), `KeyError` (no such split).
    """
    path = dataset_path(path_or_name, data_dir)
    parts = [_steps_to_transitions(record["steps"]) for record in read_episode_records(path, split)]
    return _concatenate(parts, path)


# ----------------------------------------------------------------------------------------------
# Batching: host iterator, and in-JAX sampling for compiled training loops


def batches(
    transitions: Transitions,
    batch_size: int,
    key_or_seed: int | Any,
    *,
    epochs: int | None = 1,
) -> Iterator[Transitions]:
    """Shuffled fixed-shape batches of host NumPy arrays: `epochs` passes (None: endless), each a
    fresh permutation without replacement, the last N % batch_size transitions of a pass dropped
    so that every batch has one shape (one compiled update). Deterministic given `key_or_seed`
    (an int or a JAX key). Arguments are checked here, not at the first `next()`."""
    arrays = {
        name: np.asarray(getattr(transitions, name))
        for name in _FIELDS
        if getattr(transitions, name) is not None
    }
    iterator = preferences.batches(arrays, batch_size, key_or_seed, epochs=epochs)
    return (Transitions(**batch) for batch in iterator)


def to_device(transitions: Transitions, device: Any = None) -> Transitions:
    """The whole dataset as JAX arrays (on `device`, or a `jax.sharding.Sharding`, if given), for
    `sample_batch` inside a compiled loop: offline datasets of ~1M transitions fit on any
    accelerator, and sampling on device keeps host transfers out of the training chunk."""
    return jax.tree.map(lambda x: jax.device_put(np.asarray(x), device), transitions)


def sample_indices(key: jax.Array, num_transitions: int, batch_size: int) -> jax.Array:
    """`batch_size` uniform indices in [0, num_transitions), with replacement: the usual offline
    RL sampler (CQL, IQL, TD3+BC), and one that needs no state between compiled steps."""
    return jax.random.randint(key, (batch_size,), 0, num_transitions, dtype=jnp.int32)


def sample_batch(transitions: Transition, key: jax.Array, batch_size: int) -> Transition:
    """A uniform batch (with replacement) of on-device transitions, drawn at `sample_indices`;
    jit/scan/vmap-compatible (`batch_size` must be static). The offline learners' sampler
    (`jaxrl.replay.sample_uniform`)."""
    return replay.sample_uniform(transitions, key, batch_size)


# ----------------------------------------------------------------------------------------------
# Scores: a return against the dataset's reference returns


def normalized_score(
    episode_return: float | np.ndarray | jax.Array,
    reference_min_return: float,
    reference_max_return: float,
) -> Any:
    """D4RL's normalised score: 0 at the reference minimum (a random policy's return), 100 at the
    reference maximum (an expert's)."""
    if not (math.isfinite(reference_min_return) and math.isfinite(reference_max_return)):
        raise ValueError("reference returns must be finite numbers")
    if reference_max_return == reference_min_return:
        raise ValueError(
            f"reference_max_return equals reference_min_return ({reference_min_return}); the "
            "normalised score is undefined"
        )
    span = reference_max_return - reference_min_return
    return 100.0 * (episode_return - reference_min_return) / span
