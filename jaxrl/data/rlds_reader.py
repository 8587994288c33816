"""Reading a built RLDS dataset back: its episodes' records with their steps stacked into arrays,
and `load_episodes`, which returns them in the in-memory format of `jaxrl.data.episodes`.

Datasets built here are array_record files, read with `as_data_source()`: random access, no
TensorFlow. TFDS catalog datasets (e.g. `d4rl_mujoco_halfcheetah/v2-medium`) are tfrecord files;
the same reader takes them when they are already in data_dir, through TensorFlow, which is then
imported on demand (it is not a dependency). Nothing is ever downloaded.

A shard that fails to read is checked on its own, so the `CorruptDatasetError` names the file to
blame. Flat transitions for a learner are built on top of this, in `jaxrl.data.transitions`.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import tensorflow_datasets as tfds

from jaxrl.data.episodes import RLDS_STEP_FIELDS, EpisodeDataError, canonical_actions
from jaxrl.data.locate import CorruptDatasetError, dataset_path, file_format, open_builder

__all__ = ["load_episodes", "read_episode_records"]

_RANDOM_ACCESS_FORMATS = ("array_record", "parquet")


# ----------------------------------------------------------------------------------------------
# Decoding an episode's steps into arrays


def _stack_steps(steps: Any) -> dict[str, np.ndarray]:
    """One episode's steps as a dict of [S, ...] arrays.

    `as_data_source()` returns a nested Dataset as a lazy sequence that decodes one step per
    index (about 10 us each, so seconds per million steps). The sequence holds the episode's
    already-parsed stacked arrays: for plain tensor features, decoding a step is indexing them,
    so take them whole when they are there, and fall back to step-by-step decoding otherwise.
    """
    getitem = getattr(steps, "getitem", None)
    flat = getattr(getitem, "flat_example", None)
    nest = getattr(getitem, "nest", None)
    if flat is not None and nest is not None:
        stacked = nest(list(flat))
        if isinstance(stacked, Mapping) and all(
            isinstance(v, np.ndarray) and len(v) == len(steps)
            for k, v in stacked.items()
            if k in RLDS_STEP_FIELDS
        ):
            return dict(stacked)
    return _stack_rows([steps[i] for i in range(len(steps))])


def _stack_rows(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    if not rows:
        return {}
    stacked: dict[str, Any] = {}
    for key in rows[0]:
        if key not in RLDS_STEP_FIELDS:
            continue
        if isinstance(rows[0][key], Mapping):  # e.g. dict observations: `_check_steps` reports
            stacked[key] = rows[0][key]
        else:
            stacked[key] = np.stack([np.asarray(row[key]) for row in rows])
    return stacked


# ----------------------------------------------------------------------------------------------
# Reading a split's records: array_record without TensorFlow, tfrecord through it


def _split_arg(builder: Any, split: str) -> str:
    base = split.split("[")[0]  # tfds slicing: train[:10%]
    if base not in builder.info.splits:
        raise KeyError(
            f"{builder.data_dir}: no split {base!r}; choose one of "
            f"{', '.join(sorted(builder.info.splits))}"
        )
    return base


def _shard_problem(path: str, expected: int | None) -> str | None:
    """Why an array_record shard cannot be read, or None if it reads whole."""
    if not os.path.isfile(path):
        return "the file is missing"
    try:
        from array_record.python import array_record_module

        reader = array_record_module.ArrayRecordReader(path)
        try:
            count = reader.num_records()
            reader.read_all()
        finally:
            reader.close()
    except Exception as error:  # the C++ reader raises RuntimeError with riegeli's message
        return str(error)
    if expected is not None and count != expected:
        return f"it holds {count} records where dataset_info.json lists {expected}"
    return None


def _corrupted(builder: Any, split: str, error: Exception) -> CorruptDatasetError:
    """Names the first unreadable shard of `split` (checking each alone) and says to rebuild."""
    path = os.fspath(builder.data_dir)
    info = builder.info.splits[split]
    files = [os.fspath(p) for p in getattr(info, "filepaths", [])]
    lengths = list(getattr(info, "shard_lengths", [])) or [None] * len(files)
    if file_format(builder.info) == "array_record":
        for file, expected in zip(files, lengths, strict=False):
            problem = _shard_problem(file, expected)
            if problem is not None:
                return CorruptDatasetError(
                    f"{file}: cannot be read ({problem}); the dataset in {path} is corrupted "
                    "(truncated or overwritten shard): delete it and rebuild it"
                )
    return CorruptDatasetError(
        f"{path}: reading split {split!r} failed ({type(error).__name__}: {error}); the dataset "
        "is corrupted: delete it and rebuild it"
    )


def _random_access_episodes(builder: Any, split: str) -> Iterator[dict[str, Any]]:
    base = _split_arg(builder, split)
    for file in getattr(builder.info.splits[base], "filepaths", []):
        if not os.path.isfile(os.fspath(file)):
            raise CorruptDatasetError(
                f"{os.fspath(file)}: missing, so the dataset in {builder.data_dir} is corrupted; "
                "delete it and rebuild it"
            )
    try:
        source = builder.as_data_source(split=split)
        count = len(source)
    except Exception as error:
        raise _corrupted(builder, base, error) from error
    for index in range(count):
        try:
            record = source[index]
        except Exception as error:  # riegeli/array_record (RuntimeError) or protobuf decoding
            raise _corrupted(builder, base, error) from error
        if not isinstance(record, Mapping) or "steps" not in record:
            raise EpisodeDataError(
                f"{builder.data_dir}: episode {index} has no 'steps'; not an RLDS dataset"
            )
        try:
            steps = _stack_steps(record["steps"])
        except Exception as error:
            raise _corrupted(builder, base, error) from error
        yield {"steps": steps, **{k: v for k, v in record.items() if k != "steps"}}


def _tensorflow_episodes(builder: Any, split: str) -> Iterator[dict[str, Any]]:
    """Episodes of a tfrecord-format dataset (TFDS catalog datasets) through TensorFlow."""
    _split_arg(builder, split)
    try:
        import tensorflow  # noqa: F401  (tfds reads tfrecord files only through TensorFlow)
    except ImportError:
        raise ImportError(
            f"{builder.data_dir} is stored as {file_format(builder.info)} files, which only "
            "TensorFlow reads: `pip install tensorflow` to load it (TFDS catalog datasets such as "
            "d4rl_mujoco_* come in this format; datasets built by jaxrl are array_record and need "
            "no TensorFlow)"
        ) from None
    dataset = builder.as_dataset(split=split, shuffle_files=False)
    # as_numpy turns each episode's nested tf.data.Dataset of steps into an iterable of dicts.
    for episode in tfds.as_numpy(dataset):
        rows = [
            {k: v for k, v in step.items() if k in RLDS_STEP_FIELDS} for step in episode["steps"]
        ]
        yield {"steps": _stack_rows(rows), **{k: v for k, v in episode.items() if k != "steps"}}


def _read_episodes(path: str, split: str) -> Iterator[dict[str, Any]]:
    builder = open_builder(path)
    if file_format(builder.info) in _RANDOM_ACCESS_FORMATS:
        yield from _random_access_episodes(builder, split)
    else:
        yield from _tensorflow_episodes(builder, split)


# ----------------------------------------------------------------------------------------------
# Checked episode records, and episodes in the in-memory format


def _check_steps(path: str, index: int, steps: Mapping[str, np.ndarray]) -> None:
    for key in ("observation", "action", "reward", "is_terminal"):
        if key not in steps:
            raise EpisodeDataError(
                f"{path}: episode {index} has no step field {key!r}; not an RLDS dataset (steps "
                f"need {', '.join(RLDS_STEP_FIELDS)}), it has {sorted(steps)}"
            )
        if not isinstance(steps[key], np.ndarray) or steps[key].dtype == object:
            raise EpisodeDataError(
                f"{path}: episode {index}: step field {key!r} is not a numeric array (nested "
                "observations, e.g. dicts of images, are not supported)"
            )


def read_episode_records(path: str, split: str) -> Iterator[dict[str, Any]]:
    """The episodes of `split` (tfds slices like "train[:10%]" work) of the built dataset at
    `path`, in stored order: each record's fields, with "steps" a dict of [S, ...] arrays checked
    to hold the RLDS step fields as numeric arrays. Episodes of fewer than 2 steps (no
    transition in them) are skipped."""
    for index, record in enumerate(_read_episodes(path, split)):
        steps = record["steps"]
        if not steps or len(steps["observation"]) < 2:
            continue  # no transition in it
        _check_steps(path, index, steps)
        yield record


def _decode_text(value: Any) -> str | None:
    """A Text feature's value; None for anything else (catalog datasets may store, say, a dict of
    policy weights under the same key)."""
    if isinstance(value, bytes):
        return value.decode("utf-8")
    if isinstance(value, np.ndarray) and value.shape == () and value.dtype == object:
        return _decode_text(value.item())
    return value if isinstance(value, str) else None


def load_episodes(
    path_or_name: str | os.PathLike,
    split: str = "train",
    data_dir: str | os.PathLike | None = None,
) -> list[dict[str, Any]]:
    """All episodes of `split` in the in-memory format (`jaxrl.data.episodes`), in stored order,
    plus episode_id and episode_return where the dataset has them. Also reads TFDS catalog RLDS
    datasets (with TensorFlow, see the module docstring)."""
    path = dataset_path(path_or_name, data_dir)
    episodes = []
    for record in read_episode_records(path, split):
        steps = record["steps"]
        episode = {
            "observation": steps["observation"].astype(np.float32),
            "action": canonical_actions(steps["action"][:-1]),
            "reward": steps["reward"][:-1].astype(np.float32),
            "terminal": bool(steps["is_terminal"][-1]),
            "complete": bool(record.get("complete", True)),
            "policy": _decode_text(record.get("policy")),
        }
        for key in ("episode_id", "episode_return"):
            if key in record:
                episode[key] = np.asarray(record[key]).item()
        episodes.append(episode)
    return episodes
