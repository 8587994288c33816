"""Writing episodes as an RLDS dataset: a tensorflow-datasets builder that stores in-memory
episodes (format: `jaxrl.data.episodes`) as array_record files, plus their metadata.

    path = build_episode_dataset(episodes, "~/tensorflow_datasets", "pendulum_v1/random",
                                 env_name="Pendulum-v1", policy="random", mixture="random")

Why RLDS: it is the episode format of the TFDS catalog's offline RL datasets (D4RL, RL Unplugged),
so one loader reads ours and theirs, and episodes keep what a flat (s, a, r, s', done) table
loses: where episodes start and end and why they ended.

Datasets are written as array_record, which `jaxrl.data.rlds_reader` reads back with
`as_data_source()`: random access, no TensorFlow. The dataset lands in
`data_dir/NAME[/CONFIG]/VERSION`, where `jaxrl.data.locate` finds it by name.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import tensorflow_datasets as tfds

from jaxrl.config import require
from jaxrl.data.episodes import (
    EpisodeDataError,
    EpisodeSpec,
    episode_to_steps,
    read_episode_file,
    validate_episode,
)
from jaxrl.data.locate import VERSION_PATTERN, default_data_dir, parse_dataset_name

__all__ = [
    "DEFAULT_VERSION",
    "FORMAT",
    "RLDSEpisodes",
    "build_episode_dataset",
    "build_path",
]

FORMAT = "jaxrl-rlds/1"  # recorded in the metadata of every dataset built here
DEFAULT_VERSION = "1.0.0"
_SPLIT = re.compile(r"^[\w-]+$")  # what tfds accepts as a split name


class RLDSEpisodes(tfds.core.GeneratorBasedBuilder, skip_registration=True):
    """RLDS episodes from memory, one example per episode (the step form: `jaxrl.data.episodes`).

    The dataset's name is the user's, so each name gets its own subclass (`_builder_class`):
    tfds takes a dataset's name and version from class attributes. Not registered with
    `tfds.builder(...)`; reading needs no class at all (`tfds.builder_from_directory`).
    """

    name = "rlds_episodes"
    # No download checksums to look up (see PreferencePairs in preferences.py for why this is None).
    code_path = None
    VERSION = tfds.core.Version(DEFAULT_VERSION)

    def __init__(
        self,
        *,
        episodes: Sequence[Mapping[str, Any]],
        spec: EpisodeSpec,
        split: str,
        description: str,
        metadata: Mapping[str, Any],
        default_policy: str,
        **kwargs: Any,
    ) -> None:
        self._episodes = episodes
        self._spec = spec
        self._split = split
        self._description = description
        self._metadata = dict(metadata)
        self._default_policy = default_policy
        super().__init__(**kwargs)

    def _info(self) -> tfds.core.DatasetInfo:
        spec = self._spec
        if spec.discrete:
            action = tfds.features.Tensor(shape=(), dtype=np.int32)
        else:
            action = tfds.features.Tensor(shape=spec.action_shape, dtype=np.float32)
        scalar = lambda dtype: tfds.features.Tensor(shape=(), dtype=dtype)  # noqa: E731
        steps = tfds.features.Dataset(
            {
                "observation": tfds.features.Tensor(shape=spec.obs_shape, dtype=np.float32),
                "action": action,
                "reward": scalar(np.float32),
                "discount": scalar(np.float32),
                "is_first": scalar(np.bool_),
                "is_last": scalar(np.bool_),
                "is_terminal": scalar(np.bool_),
            }
        )
        features = tfds.features.FeaturesDict(
            {
                "steps": steps,
                "episode_id": scalar(np.int64),
                "episode_return": scalar(np.float32),
                "episode_length": scalar(np.int32),
                "complete": scalar(np.bool_),
                "policy": tfds.features.Text(),
            }
        )
        # `DatasetInfo` directly: `dataset_info_from_configs` reads per-package metadata files.
        return tfds.core.DatasetInfo(
            builder=self,
            description=self._description,
            features=features,
            metadata=tfds.core.MetadataDict(self._metadata),
            # Keep episode order: collection order (e.g. the checkpoints of medium-replay).
            disable_shuffling=True,
        )

    def _split_generators(self, dl_manager: Any) -> dict[str, Iterator[tuple[int, dict]]]:
        del dl_manager  # nothing to download
        return {self._split: self._generate_examples()}

    def _generate_examples(self) -> Iterator[tuple[int, dict[str, Any]]]:
        for index, episode in enumerate(self._episodes):
            yield (
                index,
                {
                    "steps": episode_to_steps(episode, self._spec),
                    "episode_id": index,
                    "episode_return": float(np.sum(episode["reward"], dtype=np.float64)),
                    "episode_length": len(episode["reward"]),
                    "complete": episode["complete"],
                    "policy": episode["policy"] or self._default_policy,
                },
            )


def _builder_class(name: str, version: str) -> type[RLDSEpisodes]:
    return type(  # type: ignore[return-value]
        f"RLDSEpisodes_{name}",
        (RLDSEpisodes,),
        {
            "__module__": __name__,  # recorded in dataset_info.json
            "name": name,
            "VERSION": tfds.core.Version(version),
            "RELEASE_NOTES": {version: "RLDS episodes built by jaxrl.data.build_episode_dataset."},
        },
        skip_registration=True,
    )


def _describe(
    metadata: Mapping[str, Any], num_episodes: int, num_transitions: int, extra: str | None
) -> str:
    parts = [
        f"RLDS episodes of {metadata.get('env_name') or 'an environment'}",
        f"collected by {metadata['policy']}" if metadata.get("policy") else None,
        f"(mixture: {metadata['mixture']})" if metadata.get("mixture") else None,
    ]
    text = " ".join(p for p in parts if p) + f": {num_episodes} episodes, {num_transitions} "
    text += (
        "transitions. observation float32 "
        f"{list(metadata['observation_shape'])}, action "
        + ("int32 index" if metadata["discrete_actions"] else f"float32 {metadata['action_shape']}")
        + ". is_terminal marks absorbing states only; time-limit ends are not terminal."
    )
    return text + (f"\n\n{extra}" if extra else "")


def build_path(
    data_dir: str | os.PathLike | None, name: str, version: str, *, overwrite: bool = False
) -> str:
    """Where `build_episode_dataset` will write: data_dir/NAME[/CONFIG]/VERSION. Raises
    FileExistsError if a dataset is there and not `overwrite` (scripts check this before
    spending time on collection)."""
    base_name, config_name, _ = parse_dataset_name(name)
    data_dir = os.path.abspath(os.path.expanduser(os.fspath(data_dir or default_data_dir())))
    if os.path.exists(data_dir) and not os.path.isdir(data_dir):
        raise NotADirectoryError(f"{data_dir}: data_dir is a file; pass a directory")
    target = os.path.join(data_dir, base_name, *([config_name] if config_name else []), version)
    if os.path.exists(target) and not overwrite:
        raise FileExistsError(
            f"{target}: a dataset already exists here; pass overwrite=True (collect.py: "
            "--overwrite) to replace it, or choose another name or version"
        )
    return target


def build_episode_dataset(
    episodes: Iterable[Mapping[str, Any]] | str | os.PathLike,
    data_dir: str | os.PathLike | None,
    name: str,
    *,
    env_name: str | None = None,
    policy: str | None = None,
    mixture: str | None = None,
    reference_min_return: float | None = None,
    reference_max_return: float | None = None,
    num_actions: int | None = None,
    metadata: Mapping[str, Any] | None = None,
    description: str | None = None,
    version: str = DEFAULT_VERSION,
    split: str = "train",
    overwrite: bool = False,
) -> str:
    """Writes episodes as an RLDS TFDS dataset (array_record) and returns its directory,
    `data_dir/NAME[/CONFIG]/VERSION`.

    `episodes`: in-memory episodes (format: `jaxrl.data.episodes`), or the path of a D4RL-style .npz
    (`read_episodes_npz`) or an episode-per-line .jsonl (`read_episodes_jsonl`). Every episode is
    validated first (shapes, dtypes, finite values), so a bad one fails with its index and field
    before anything is written. `name` is `NAME` or `NAME/CONFIG` (like the catalog's
    `d4rl_mujoco_halfcheetah/v2-medium`); `data_dir` None means `default_data_dir()`.

    The dataset's metadata (`load_dataset_info`) records the environment, shapes, the collection
    `policy` and `mixture`, D4RL-style reference returns (`normalized_score` maps a return to 0 at
    `reference_min_return` and 100 at `reference_max_return`), counts, the behaviour policy's mean
    return over complete episodes, and `metadata` (JSON-serialisable extra fields).

    An existing dataset at that path is an error unless `overwrite`: silently reusing it would
    hand back different data than was just collected.

    Cost: tfds encodes a nested Dataset feature step by step in Python, about 30 us per step on
    a CPU core, so half a minute per million steps; reading back is much faster
    (`jaxrl.data.rlds_reader`).
    """
    base_name, config_name, name_version = parse_dataset_name(name)
    if name_version is not None:
        raise ValueError(
            f"dataset name {name!r}: give the version with version={name_version!r}, not in the "
            "name"
        )
    require(
        bool(VERSION_PATTERN.match(version)), "version", f"{version!r} is not X.Y.Z", "e.g. '1.0.0'"
    )
    require(
        bool(_SPLIT.match(split)),
        "split",
        f"{split!r} is not letters, digits, '_' or '-'",
        "e.g. 'train'",
    )
    target = build_path(data_dir, name, version, overwrite=overwrite)  # fail early if it exists
    data_dir = os.path.abspath(os.path.expanduser(os.fspath(data_dir or default_data_dir())))
    if isinstance(episodes, str | os.PathLike):
        episodes = read_episode_file(os.fspath(episodes))
    clean: list[dict[str, Any]] = []
    spec: EpisodeSpec | None = None
    for index, episode in enumerate(episodes):
        episode, spec = validate_episode(episode, index, spec)
        clean.append(episode)
    if spec is None:
        raise EpisodeDataError("no episodes; pass at least one episode")
    if spec.discrete:
        top = max(int(e["action"].max()) for e in clean)
        low = min(int(e["action"].min()) for e in clean)
        if low < 0 or (num_actions is not None and top >= num_actions):
            limit = "num_actions - 1" if num_actions is None else num_actions - 1
            raise EpisodeDataError(
                f"discrete actions range over [{low}, {top}]; actions are indices 0 .. {limit}"
            )

    complete_returns = [
        float(np.sum(e["reward"], dtype=np.float64)) for e in clean if e["complete"]
    ]
    info: dict[str, Any] = {
        "format": FORMAT,
        "env_name": env_name,
        "observation_shape": list(spec.obs_shape),
        "action_shape": list(spec.action_shape),
        "discrete_actions": spec.discrete,
        "num_actions": num_actions,
        "policy": policy,
        "mixture": mixture,
        "reference_min_return": reference_min_return,
        "reference_max_return": reference_max_return,
        "num_episodes": len(clean),
        "num_complete_episodes": len(complete_returns),
        "num_transitions": int(sum(len(e["reward"]) for e in clean)),
        "num_terminal_episodes": int(sum(e["terminal"] for e in clean)),
        # The behaviour score: mean undiscounted return of the episodes that ended in the env.
        "mean_episode_return": float(np.mean(complete_returns)) if complete_returns else None,
    }
    clash = sorted(set(metadata or {}) & set(info))
    if clash:
        raise ValueError(f"metadata keys {clash} are set by build_episode_dataset; rename them")
    info.update(metadata or {})
    try:
        json.dumps(info)
    except TypeError as error:
        raise ValueError(f"metadata must be JSON-serialisable: {error}") from None

    if os.path.exists(target):
        shutil.rmtree(target)  # overwrite (build_path refused otherwise), now the data is valid

    config = None
    if config_name is not None:
        config = tfds.core.BuilderConfig(name=config_name, version=version)
    builder = _builder_class(base_name, version)(
        episodes=clean,
        spec=spec,
        split=split,
        description=_describe(info, len(clean), info["num_transitions"], description),
        metadata=info,
        default_policy=policy or "unknown",
        data_dir=data_dir,
        config=config,
        file_format="array_record",
    )
    if os.path.abspath(os.fspath(builder.data_dir)) != target:  # tfds changed its layout
        raise RuntimeError(f"tfds would write to {builder.data_dir}, expected {target}")
    # Nothing is downloaded, but tfds creates its download directory anyway (by default under
    # ~/tensorflow_datasets): keep it out of the user's home.
    with tempfile.TemporaryDirectory() as download_dir:
        builder.download_and_prepare(download_dir=download_dir)
    return target
