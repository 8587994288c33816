"""Offline RL datasets in RLDS shape, as tensorflow-datasets datasets, and loaders that turn them
into flat transitions for a learner (host batches, or one on-device array set sampled in JAX).

    path = build_episode_dataset(episodes, "~/tensorflow_datasets", "pendulum_v1/random",
                                 env_name="Pendulum-v1", policy="random", mixture="random")
    data = load_transitions(path)                       # or ("pendulum_v1/random", data_dir=...)
    for batch in batches(data, batch_size=256, key_or_seed=0): ...        # host NumPy
    on_device = to_device(data)                                           # or, inside jit:
    batch = sample_batch(on_device, key, batch_size=256)

Why RLDS: it is the episode format of the TFDS catalog's offline RL datasets (D4RL, RL Unplugged),
so one loader reads ours and theirs, and episodes keep what a flat (s, a, r, s', done) table
loses: where episodes start and end and why they ended.

Episodes in memory (what `jaxrl.data.collect.collect_episodes` returns and `build_episode_dataset`
takes), for an episode of L transitions:

    observation  float32 [L + 1, *obs_shape]   o_0 ... o_L; o_L is where the last action led
    action       float32 [L, *action_shape]    continuous actions, as executed (clipped), or
                 int32   [L]                   discrete actions: the action index (see below)
    reward       float32 [L]
    terminal     bool                           o_L is an absorbing state (never bootstrap from it)
    complete     bool, optional (default True)  False: collection stopped mid-episode
    policy       str, optional                  which policy acted (mixtures hold several)

Stored form (RLDS): L + 1 steps. Step t < L holds (o_t, a_t, r_t, discount_t); the last step holds
o_L with is_last=True and zero padding for its action and reward. is_terminal is True on that last
step only when the episode ended in an absorbing state: a time-limit truncation, or a cut at the
end of collection, has is_terminal=False, so a learner bootstraps from o_L. discount_t is 0 for the
transition into a terminal state and 1 otherwise (as TFDS's D4RL datasets store it).

Discrete actions are stored as int32 scalars (the index), not one-hot or float: that is how RLDS
catalog datasets store them, it is exact, and a discrete learner indexes Q-values with it.

Flat transitions (`Transitions`): for t < S - 1 in an episode of S steps, (o_t, a_t, r_t, o_{t+1})
with terminal = is_terminal of step t + 1. So a time-limit end is not a terminal, and the last
step (padding, or in some catalog datasets a step without a successor) never forms a transition.

Datasets are written as array_record and read with `as_data_source()`: random access, no
TensorFlow. TFDS catalog datasets (e.g. `d4rl_mujoco_halfcheetah/v2-medium`) are tfrecord files;
the same loader reads them when they are already in data_dir, through TensorFlow, which is then
imported on demand (it is not a dependency). Nothing is ever downloaded.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import shutil
import tempfile
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import tensorflow_datasets as tfds

from jaxrl.config import require
from jaxrl.data import preferences  # its batches() shuffles dicts of arrays

__all__ = [
    "CorruptDatasetError",
    "DatasetNotFoundError",
    "EpisodeDataError",
    "EpisodeSpec",
    "RLDS_STEP_FIELDS",
    "Transitions",
    "batches",
    "build_episode_dataset",
    "build_path",
    "dataset_path",
    "default_data_dir",
    "episodes_from_flat",
    "episodes_to_transitions",
    "load_dataset_info",
    "load_episodes",
    "load_transitions",
    "normalized_score",
    "read_episodes_jsonl",
    "read_episodes_npz",
    "sample_batch",
    "sample_indices",
    "to_device",
    "validate_episode",
]

RLDS_STEP_FIELDS = (
    "observation",
    "action",
    "reward",
    "discount",
    "is_first",
    "is_last",
    "is_terminal",
)
FORMAT = "jaxrl-rlds/1"  # recorded in the metadata of every dataset built here
DEFAULT_VERSION = "1.0.0"
# `name[/config][:version]`: tfds's own naming (tensorflow_datasets/core/naming.py).
_NAME = re.compile(
    r"^(?P<name>[a-zA-Z]\w*)(/(?P<config>[\w+\-.]+))?(:(?P<version>\d+\.\d+\.\d+))?$"
)
_VERSION = re.compile(r"^\d+\.\d+\.\d+$")
_SPLIT = re.compile(r"^[\w-]+$")  # what tfds accepts as a split name
_RANDOM_ACCESS_FORMATS = ("array_record", "parquet")
_HOW_TO_CREATE = (
    "create it with `python experiments/collect.py --env=<ENV> --policy=random "
    "--data_dir=<DATA_DIR> --name=<NAME>` (or jaxrl.data.build_episode_dataset)"
)


class EpisodeDataError(ValueError):
    """An episode given to `build_episode_dataset` is malformed; the message names the episode
    index and the field."""


class DatasetNotFoundError(FileNotFoundError):
    """No built dataset at the given path or name; the message says how to create one."""


class CorruptDatasetError(RuntimeError):
    """A built dataset cannot be read; the message names the file and says to rebuild it."""


def default_data_dir() -> str:
    """TFDS's default: $TFDS_DATA_DIR, else ~/tensorflow_datasets (where `tfds build` puts catalog
    datasets, so ours and theirs sit side by side)."""
    return os.path.expanduser(os.environ.get("TFDS_DATA_DIR") or "~/tensorflow_datasets")


# ----------------------------------------------------------------------------------------------
# Episodes: validation and conversion to RLDS steps


@dataclasses.dataclass(frozen=True)
class EpisodeSpec:
    """Shapes shared by every episode of a dataset (fixed by the first episode)."""

    obs_shape: tuple[int, ...]
    action_shape: tuple[int, ...]
    discrete: bool


def _field(episode: Mapping[str, Any], index: int, name: str) -> np.ndarray:
    if name not in episode:
        raise EpisodeDataError(
            f"episode {index}: missing field {name!r}; episodes need observation [L+1, ...], "
            "action [L, ...], reward [L] and terminal (bool)"
        )
    try:
        return np.asarray(episode[name])
    except (TypeError, ValueError) as error:  # ragged nested lists
        raise EpisodeDataError(
            f"episode {index}: field {name!r} is not a rectangular array ({error})"
        ) from None


def _check_finite(index: int, name: str, values: np.ndarray) -> None:
    if values.dtype.kind == "f" and not np.isfinite(values).all():
        bad = np.argwhere(~np.isfinite(values))[0]
        raise EpisodeDataError(
            f"episode {index}: field {name!r} has a non-finite value ({values[tuple(bad)]}) at "
            f"index {tuple(int(i) for i in bad)}; drop or repair that episode"
        )


def validate_episode(
    episode: Mapping[str, Any], index: int, spec: EpisodeSpec | None = None
) -> tuple[dict[str, Any], EpisodeSpec]:
    """Checks one in-memory episode (format: module docstring) and returns it with canonical
    dtypes, plus its shapes. With `spec`, the shapes must match it.

    Every problem raises `EpisodeDataError` naming the episode index and field, so a bad row in a
    large collection is found before anything is written.
    """
    if not isinstance(episode, Mapping):
        raise EpisodeDataError(
            f"episode {index}: expected a dict of arrays, got {type(episode).__name__}"
        )
    obs = _field(episode, index, "observation")
    action = _field(episode, index, "action")
    reward = _field(episode, index, "reward")
    terminal = _field(episode, index, "terminal")
    if obs.ndim < 1 or obs.dtype.kind not in "biuf":
        raise EpisodeDataError(
            f"episode {index}: field 'observation' must be a numeric array [L+1, ...], got "
            f"shape {obs.shape} dtype {obs.dtype}"
        )
    length = obs.shape[0] - 1
    if length < 1:
        raise EpisodeDataError(
            f"episode {index}: field 'observation' has {obs.shape[0]} row(s); an episode needs "
            "its L+1 observations for L >= 1 transitions (the last one is where the last action "
            "led)"
        )
    if action.ndim < 1 or action.shape[0] != length:
        raise EpisodeDataError(
            f"episode {index}: field 'action' has shape {action.shape}; expected {length} rows, "
            f"one per transition (observation has {length + 1} rows)"
        )
    if reward.shape != (length,):
        raise EpisodeDataError(
            f"episode {index}: field 'reward' has shape {reward.shape}; expected ({length},), "
            f"one scalar per transition (observation has {length + 1} rows)"
        )
    if terminal.shape != () or terminal.dtype.kind not in "bi":
        raise EpisodeDataError(
            f"episode {index}: field 'terminal' must be one bool (did the episode end in an "
            f"absorbing state?), got shape {terminal.shape} dtype {terminal.dtype}"
        )
    discrete = action.dtype.kind in "iu" or action.dtype.kind == "b"
    if discrete and action.ndim != 1:
        raise EpisodeDataError(
            f"episode {index}: field 'action' is integer with shape {action.shape}; discrete "
            "actions are one index per transition, shape (L,). For continuous actions pass floats"
        )
    if action.dtype.kind not in "biuf":
        raise EpisodeDataError(
            f"episode {index}: field 'action' must be numeric, got dtype {action.dtype}"
        )
    for name, values in (("observation", obs), ("action", action), ("reward", reward)):
        _check_finite(index, name, values)
    this = EpisodeSpec(tuple(obs.shape[1:]), tuple(action.shape[1:]), discrete)
    if spec is not None:
        if this.obs_shape != spec.obs_shape:
            raise EpisodeDataError(
                f"episode {index}: field 'observation' has per-step shape {this.obs_shape}, but "
                f"earlier episodes have {spec.obs_shape}"
            )
        if this.discrete != spec.discrete:
            kinds = {True: "discrete (integer)", False: "continuous (float)"}
            raise EpisodeDataError(
                f"episode {index}: field 'action' is {kinds[this.discrete]}, but earlier "
                f"episodes' actions are {kinds[spec.discrete]}"
            )
        if this.action_shape != spec.action_shape:
            raise EpisodeDataError(
                f"episode {index}: field 'action' has per-step shape {this.action_shape}, but "
                f"earlier episodes have {spec.action_shape}"
            )
    policy = episode.get("policy")
    if policy is not None and not isinstance(policy, str):
        raise EpisodeDataError(
            f"episode {index}: field 'policy' must be a string, got {type(policy).__name__}"
        )
    clean = {
        "observation": obs.astype(np.float32),
        "action": action.astype(np.int32 if discrete else np.float32),
        "reward": reward.astype(np.float32),
        "terminal": bool(terminal),
        "complete": bool(episode.get("complete", True)),
        "policy": policy,
    }
    # float64 -> float32 may overflow to inf; that is as broken as a NaN in the input.
    for name in ("observation", "action", "reward"):
        _check_finite(index, name, clean[name])
    return clean, this


def _episode_to_steps(episode: Mapping[str, Any], spec: EpisodeSpec) -> dict[str, np.ndarray]:
    """In-memory episode -> RLDS step arrays of length L + 1 (see the module docstring)."""
    obs, action, reward = episode["observation"], episode["action"], episode["reward"]
    length = len(reward)
    steps = length + 1
    is_first = np.zeros(steps, bool)
    is_first[0] = True
    is_last = np.zeros(steps, bool)
    is_last[-1] = True
    is_terminal = np.zeros(steps, bool)
    is_terminal[-1] = episode["terminal"]
    discount = np.ones(steps, np.float32)
    discount[-1] = 0.0  # padding
    if episode["terminal"]:
        discount[-2] = 0.0  # the transition into the absorbing state
    pad_action = np.zeros((1, *spec.action_shape), action.dtype)
    return {
        "observation": obs,
        "action": np.concatenate([action, pad_action]),
        "reward": np.concatenate([reward, np.zeros(1, np.float32)]),
        "discount": discount,
        "is_first": is_first,
        "is_last": is_last,
        "is_terminal": is_terminal,
    }


# ----------------------------------------------------------------------------------------------
# Users' own files: D4RL-style flat arrays (NPZ) and one episode per line (JSONL)


def episodes_from_flat(
    observations: np.ndarray,
    actions: np.ndarray,
    rewards: np.ndarray,
    terminals: np.ndarray,
    timeouts: np.ndarray,
    next_observations: np.ndarray | None = None,
) -> list[dict[str, Any]]:
    """Episodes from D4RL's flat layout (row i: o_i, a_i, r_i, and whether the episode ended
    after it in an absorbing state (`terminals`) or by a time limit (`timeouts`)).

    Without `next_observations` the observation after an episode's last row is unknown: a
    time-limit end then loses its last transition (the same as D4RL's `qlearning_dataset`), and a
    terminal end gets a zero observation after it (never used: nothing bootstraps from a terminal;
    what TFDS's D4RL builder does too). Rows after the last end form a final episode with
    complete=False.
    """
    observations, actions = np.asarray(observations), np.asarray(actions)
    rewards = np.asarray(rewards).reshape(-1)
    terminals = np.asarray(terminals).reshape(-1).astype(bool)
    timeouts = np.asarray(timeouts).reshape(-1).astype(bool)
    n = len(observations)
    named = {"actions": actions, "rewards": rewards, "terminals": terminals, "timeouts": timeouts}
    if next_observations is not None:
        next_observations = np.asarray(next_observations)
        named["next_observations"] = next_observations
    for key, value in named.items():
        if len(value) != n:
            raise EpisodeDataError(
                f"flat arrays: {key!r} has {len(value)} rows but 'observations' has {n}; every "
                "array needs one row per transition"
            )
    ends = np.flatnonzero(terminals | timeouts)
    bounds = [
        (int(start), int(end), True)
        for start, end in zip(np.r_[0, ends + 1][:-1], ends, strict=True)
    ]
    last_start = int(ends[-1]) + 1 if len(ends) else 0
    if last_start < n:
        bounds.append((last_start, n - 1, False))
    episodes = []
    for start, end, complete in bounds:
        terminal = bool(terminals[end]) and complete
        rows = slice(start, end + 1)
        if next_observations is not None:
            obs = np.concatenate([observations[rows], next_observations[end : end + 1]])
            act, rew = actions[rows], rewards[rows]
        elif terminal:
            obs = np.concatenate([observations[rows], np.zeros_like(observations[:1])])
            act, rew = actions[rows], rewards[rows]
        else:
            obs, act, rew = observations[rows], actions[start:end], rewards[start:end]
        if len(rew) == 0:
            continue  # a single row with no successor: no transition to keep
        episodes.append(
            {
                "observation": obs,
                "action": act,
                "reward": rew,
                "terminal": terminal,
                "complete": complete,
            }
        )
    return episodes


def read_episodes_npz(path: str | os.PathLike) -> list[dict[str, Any]]:
    """Episodes from an .npz with D4RL's flat keys: observations, actions, rewards, terminals,
    timeouts, and optionally next_observations (see `episodes_from_flat`)."""
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path}: no such file; pass an existing .npz file")
    try:
        with np.load(path, allow_pickle=False) as data:
            arrays = {key: data[key] for key in data.files}
    except (OSError, ValueError) as error:
        raise EpisodeDataError(f"{path}: not a readable .npz file ({error})") from None
    required = ("observations", "actions", "rewards", "terminals", "timeouts")
    missing = [key for key in required if key not in arrays]
    if missing:
        raise EpisodeDataError(
            f"{path}: missing array(s) {missing}; a D4RL-style .npz needs {list(required)} (and "
            f"optionally 'next_observations'); it has {sorted(arrays)}"
        )
    try:
        return episodes_from_flat(
            *(arrays[key] for key in required), arrays.get("next_observations")
        )
    except EpisodeDataError as error:
        raise EpisodeDataError(f"{path}: {error}") from None


def read_episodes_jsonl(path: str | os.PathLike) -> list[dict[str, Any]]:
    """Episodes from a JSONL file, one JSON object per line in the in-memory episode format
    (observation: list of L+1 lists, action, reward: lists of L, terminal: bool; optional
    complete, policy). Malformed lines raise `EpisodeDataError` naming file and line."""
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path}: no such file; pass an existing .jsonl file")
    episodes = []
    with open(path, encoding="utf-8") as f:
        for line_number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as error:
                raise EpisodeDataError(
                    f"{path}:{line_number}: invalid JSON ({error.msg} at column {error.colno})"
                ) from None
            if not isinstance(row, dict):
                raise EpisodeDataError(
                    f"{path}:{line_number}: expected a JSON object (one episode), got "
                    f"{type(row).__name__}"
                )
            try:
                validate_episode(row, len(episodes))
            except EpisodeDataError as error:
                raise EpisodeDataError(f"{path}:{line_number}: {error}") from None
            episodes.append(row)
    return episodes


def _read_episode_file(path: str) -> list[dict[str, Any]]:
    if path.endswith(".npz"):
        return read_episodes_npz(path)
    if path.endswith((".jsonl", ".json")):
        return read_episodes_jsonl(path)
    raise EpisodeDataError(
        f"{path}: unknown episode file type; pass a D4RL-style .npz or an episode-per-line .jsonl"
    )


# ----------------------------------------------------------------------------------------------
# The TFDS builder


class RLDSEpisodes(tfds.core.GeneratorBasedBuilder, skip_registration=True):
    """RLDS episodes from memory, one example per episode (see the module docstring).

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
                    "steps": _episode_to_steps(episode, self._spec),
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


def _parse_name(name: str) -> tuple[str, str | None, str | None]:
    match = _NAME.match(name)
    if not match:
        raise ValueError(
            f"dataset name {name!r} is not NAME[/CONFIG][:X.Y.Z]; NAME is a letter then letters, "
            "digits or '_' (e.g. 'pendulum_v1/medium', 'd4rl_mujoco_halfcheetah/v2-medium')"
        )
    return match["name"], match["config"], match["version"]


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
    base_name, config_name, _ = _parse_name(name)
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

    `episodes`: in-memory episodes (module docstring), or the path of a D4RL-style .npz
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
    a CPU core, so half a minute per million steps; reading back is much faster (`_stack_steps`).
    """
    base_name, config_name, name_version = _parse_name(name)
    if name_version is not None:
        raise ValueError(
            f"dataset name {name!r}: give the version with version={name_version!r}, not in the "
            "name"
        )
    require(bool(_VERSION.match(version)), "version", f"{version!r} is not X.Y.Z", "e.g. '1.0.0'")
    require(
        bool(_SPLIT.match(split)),
        "split",
        f"{split!r} is not letters, digits, '_' or '-'",
        "e.g. 'train'",
    )
    target = build_path(data_dir, name, version, overwrite=overwrite)  # fail early if it exists
    data_dir = os.path.abspath(os.path.expanduser(os.fspath(data_dir or default_data_dir())))
    if isinstance(episodes, str | os.PathLike):
        episodes = _read_episode_file(os.fspath(episodes))
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


# ----------------------------------------------------------------------------------------------
# Finding and opening a built dataset


def _is_version_dir(path: str) -> bool:
    return bool(_VERSION.match(os.path.basename(path))) and os.path.isdir(path)


def _looks_built(path: str) -> bool:
    """Files a prepared dataset directory holds besides dataset_info.json."""
    try:
        names = os.listdir(path)
    except OSError:
        return False
    return any(
        n == "features.json" or re.search(r"\.(array_record|tfrecord|riegeli|parquet)", n)
        for n in names
    )


def _newest_version(path: str) -> str | None:
    """The newest built version directory under `path` (None if it has none)."""
    versions = [os.path.join(path, v) for v in os.listdir(path)]
    versions = [v for v in versions if _is_version_dir(v)]
    built = [v for v in versions if os.path.isfile(os.path.join(v, "dataset_info.json"))]
    broken = [v for v in versions if v not in built and _looks_built(v)]
    if not built and broken:
        raise _missing_info(broken[0])
    if not built:
        return None
    return max(built, key=lambda v: tuple(int(x) for x in os.path.basename(v).split(".")))


def _missing_info(path: str) -> CorruptDatasetError:
    return CorruptDatasetError(
        f"{os.path.join(path, 'dataset_info.json')}: missing, so the dataset in {path} is "
        "corrupted (an interrupted build or a partial copy); delete it and rebuild it"
    )


def _resolve_dir(path: str) -> str | None:
    """A built dataset directory found from a dataset, config or name directory, else None."""
    if os.path.isfile(os.path.join(path, "dataset_info.json")):
        return path
    if _looks_built(path):
        raise _missing_info(path)
    newest = _newest_version(path)
    if newest is not None:
        return newest
    # A dataset directory holding config directories (e.g. d4rl_mujoco_halfcheetah/).
    configs = {}
    for entry in sorted(os.listdir(path)):
        sub = os.path.join(path, entry)
        if os.path.isdir(sub) and not _is_version_dir(sub):
            found = _newest_version(sub)
            if found is not None:
                configs[entry] = found
    if len(configs) == 1:
        return next(iter(configs.values()))
    if len(configs) > 1:
        raise ValueError(
            f"{path}: holds {len(configs)} datasets ({', '.join(sorted(configs))}); pass one of "
            "them, e.g. NAME/CONFIG"
        )
    return None


def _list_datasets(root: str) -> list[str]:
    """NAME and NAME/CONFIG of the datasets under a data directory (for error messages)."""
    names = []
    for name in sorted(os.listdir(root)):
        top = os.path.join(root, name)
        if not os.path.isdir(top) or _is_version_dir(top):
            continue
        for entry in sorted(os.listdir(top)):
            sub = os.path.join(top, entry)
            if _is_version_dir(sub):
                names.append(name)
            elif os.path.isdir(sub) and any(
                _is_version_dir(os.path.join(sub, v)) for v in os.listdir(sub)
            ):
                names.append(f"{name}/{entry}")
    return list(dict.fromkeys(names))  # one entry per NAME with several versions


def dataset_path(path_or_name: str | os.PathLike, data_dir: str | os.PathLike | None = None) -> str:
    """The directory of a built dataset, given either a path (a dataset's version directory, or a
    directory above it holding one dataset) or a name `NAME[/CONFIG][:X.Y.Z]` under `data_dir`
    (default `default_data_dir()`), newest version first.

    Raises `DatasetNotFoundError` (what was looked for, and how to create it) or
    `CorruptDatasetError` (a dataset directory without its dataset_info.json).
    """
    given = os.fspath(path_or_name)
    path = os.path.abspath(os.path.expanduser(given))
    if os.path.isdir(path):
        found = _resolve_dir(path)
        if found is None:
            inside = _list_datasets(path)
            if inside:  # a data_dir: say what is in it
                raise DatasetNotFoundError(
                    f"{path}: is a data directory holding {', '.join(inside)}; pass one of these "
                    f"names with data_dir={path!r}, or its full path"
                )
            raise DatasetNotFoundError(
                f"{path}: no built RLDS dataset in this directory; {_HOW_TO_CREATE}"
            )
        return found
    root = os.path.abspath(os.path.expanduser(os.fspath(data_dir or default_data_dir())))
    try:
        base_name, config_name, version = _parse_name(given)
    except ValueError:
        raise DatasetNotFoundError(
            f"{path}: no such dataset directory (and {given!r} is not a dataset name to look up "
            f"under {root}); {_HOW_TO_CREATE}"
        ) from None
    where = os.path.join(root, base_name, *([config_name] if config_name else []))
    candidate = os.path.join(where, version) if version else where
    found = _resolve_dir(candidate) if os.path.isdir(candidate) else None
    if found is None:
        raise DatasetNotFoundError(
            f"{candidate}: no built dataset {given!r} in data_dir {root}; {_HOW_TO_CREATE}. A "
            "TFDS catalog dataset must already be prepared in data_dir (e.g. `tfds build NAME "
            f"--data_dir={root}`): nothing is downloaded here"
        )
    return found


def _open_builder(path: str) -> Any:
    """`tfds.builder_from_directory`, with unreadable metadata reported as corruption."""
    for required in ("dataset_info.json", "features.json"):
        if not os.path.isfile(os.path.join(path, required)):
            raise CorruptDatasetError(
                f"{os.path.join(path, required)}: missing, so the dataset in {path} is corrupted; "
                "delete it and rebuild it"
            )
    try:
        builder = tfds.builder_from_directory(path)
        builder.info.splits  # noqa: B018  (parses the split metadata now, not at first read)
    except Exception as error:  # json, protobuf and tfds errors alike: the files are bad
        raise CorruptDatasetError(
            f"{path}/dataset_info.json or features.json: unreadable ({type(error).__name__}: "
            f"{error}); the dataset is corrupted, delete it and rebuild it"
        ) from error
    return builder


def load_dataset_info(
    path_or_name: str | os.PathLike, data_dir: str | os.PathLike | None = None
) -> dict[str, Any]:
    """{"path", "name", "version", "description", "file_format", "splits": {split: episodes},
    "metadata": {...}} of a built dataset (metadata: what `build_episode_dataset` recorded; empty
    for datasets from elsewhere)."""
    path = dataset_path(path_or_name, data_dir)
    builder = _open_builder(path)
    info = builder.info
    return {
        "path": path,
        "name": info.full_name,
        "version": str(info.version),
        "description": info.description,
        "file_format": _file_format(info),
        "splits": {name: split.num_examples for name, split in info.splits.items()},
        "metadata": dict(info.metadata or {}),
    }


def _file_format(info: Any) -> str:
    fmt = info.file_format
    return getattr(fmt, "value", fmt) or "tfrecord"  # tfds < 4.? wrote no format: tfrecord


# ----------------------------------------------------------------------------------------------
# Reading episodes


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
    if _file_format(builder.info) == "array_record":
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
            f"{builder.data_dir} is stored as {_file_format(builder.info)} files, which only "
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
    builder = _open_builder(path)
    if _file_format(builder.info) in _RANDOM_ACCESS_FORMATS:
        yield from _random_access_episodes(builder, split)
    else:
        yield from _tensorflow_episodes(builder, split)


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
    """All episodes of `split` in the in-memory format (module docstring), in stored order, plus
    episode_id and episode_return where the dataset has them. Also reads TFDS catalog RLDS
    datasets (with TensorFlow, see `load_transitions`)."""
    path = dataset_path(path_or_name, data_dir)
    episodes = []
    for index, record in enumerate(_read_episodes(path, split)):
        steps = record["steps"]
        if not steps or len(steps["observation"]) < 2:
            continue  # no transition in it
        _check_steps(path, index, steps)
        episode = {
            "observation": steps["observation"].astype(np.float32),
            "action": _action_array(steps["action"][:-1]),
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


def _action_array(action: np.ndarray) -> np.ndarray:
    return action.astype(np.int32 if action.dtype.kind in "biu" else np.float32)


# ----------------------------------------------------------------------------------------------
# Flat transitions


class Transitions(NamedTuple):
    """Flat transitions, every field with leading size N (so `jax.tree.map` indexes them all).

    terminal: next_obs is absorbing (target r, no bootstrap). A time-limit end is NOT terminal;
    it shows as last=True with terminal=False. first/last mark each episode's first and last
    transition (episode boundaries: episode k spans first[k-th True] .. last[k-th True]).
    """

    obs: Any  # float32 [N, *obs_shape]
    action: Any  # float32 [N, *action_shape], or int32 [N] for discrete actions
    reward: Any  # float32 [N]
    next_obs: Any  # float32 [N, *obs_shape]
    terminal: Any  # bool [N]
    first: Any  # bool [N]
    last: Any  # bool [N]

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


def _steps_to_transitions(steps: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    obs = steps["observation"].astype(np.float32)
    count = len(obs) - 1
    first = np.zeros(count, bool)
    first[0] = True
    last = np.zeros(count, bool)
    last[-1] = True
    return {
        "obs": obs[:-1],
        "action": _action_array(steps["action"][:-1]),
        "reward": steps["reward"][:-1].astype(np.float32),
        "next_obs": obs[1:],
        "terminal": steps["is_terminal"][1:].astype(bool),
        "first": first,
        "last": last,
    }


def _concatenate(parts: list[dict[str, np.ndarray]], where: str) -> Transitions:
    if not parts:
        raise EpisodeDataError(f"{where}: no transitions (every episode has fewer than 2 steps)")
    return Transitions(**{f: np.concatenate([p[f] for p in parts]) for f in Transitions._fields})


def episodes_to_transitions(episodes: Sequence[Mapping[str, Any]]) -> Transitions:
    """In-memory episodes -> `Transitions` (terminal only on the last transition of an episode
    that ended in an absorbing state)."""
    parts = []
    spec = None
    for index, episode in enumerate(episodes):
        episode, spec = validate_episode(episode, index, spec)
        parts.append(_steps_to_transitions(_episode_to_steps(episode, spec)))
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
    parts = []
    for index, record in enumerate(_read_episodes(path, split)):
        steps = record["steps"]
        if not steps or len(steps["observation"]) < 2:
            continue
        _check_steps(path, index, steps)
        parts.append(_steps_to_transitions(steps))
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
    arrays = {name: np.asarray(value) for name, value in transitions._asdict().items()}
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


def sample_batch(transitions: Transitions, key: jax.Array, batch_size: int) -> Transitions:
    """A uniform batch (with replacement) of on-device transitions; jit/scan/vmap-compatible
    (`batch_size` must be static)."""
    index = sample_indices(key, transitions.reward.shape[0], batch_size)
    return jax.tree.map(lambda x: jnp.take(x, index, axis=0), transitions)


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
