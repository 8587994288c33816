"""Episodes in memory: their format, their validation, their RLDS step form, and reading users'
own episode files (D4RL-style NPZ, JSONL) into that format.

Episodes in memory (what `jaxrl.data.collect.collect_episodes` returns and
`jaxrl.data.build_episode_dataset` takes), for an episode of L transitions:

    observation  float32 [L + 1, *obs_shape]   o_0 ... o_L; o_L is where the last action led
    action       float32 [L, *action_shape]    continuous actions, as executed (clipped), or
                 int32   [L]                   discrete actions: the action index (see below)
    reward       float32 [L]
    terminal     bool                           o_L is an absorbing state (never bootstrap from it)
    complete     bool, optional (default True)  False: collection stopped mid-episode
    policy       str, optional                  which policy acted (mixtures hold several)

Stored form (RLDS, `episode_to_steps`): L + 1 steps. Step t < L holds (o_t, a_t, r_t,
discount_t); the last step holds o_L with is_last=True and zero padding for its action and reward.
is_terminal is True on that last step only when the episode ended in an absorbing state: a
time-limit truncation, or a cut at the end of collection, has is_terminal=False, so a learner
bootstraps from o_L. discount_t is 0 for the transition into a terminal state and 1 otherwise (as
TFDS's D4RL datasets store it).

Discrete actions are stored as int32 scalars (the index), not one-hot or float: that is how RLDS
catalog datasets store them, it is exact, and a discrete learner indexes Q-values with it.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping
from typing import Any

import numpy as np

__all__ = [
    "EpisodeDataError",
    "EpisodeSpec",
    "RLDS_STEP_FIELDS",
    "canonical_actions",
    "episode_to_steps",
    "episodes_from_flat",
    "read_episode_file",
    "read_episodes_jsonl",
    "read_episodes_npz",
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


class EpisodeDataError(ValueError):
    """An episode given to `build_episode_dataset` is malformed; the message names the episode
    index and the field."""


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


def canonical_actions(action: np.ndarray) -> np.ndarray:
    """Actions with their stored dtype: int32 indices for integer (or bool) actions, float32
    otherwise."""
    return action.astype(np.int32 if action.dtype.kind in "biu" else np.float32)


def episode_to_steps(episode: Mapping[str, Any], spec: EpisodeSpec) -> dict[str, np.ndarray]:
    """A validated in-memory episode -> RLDS step arrays of length L + 1 (see the module
    docstring)."""
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


def read_episode_file(path: str) -> list[dict[str, Any]]:
    """Episodes from a user's file: a D4RL-style .npz (`read_episodes_npz`) or an episode-per-line
    .jsonl / .json (`read_episodes_jsonl`), chosen by the file's extension."""
    if path.endswith(".npz"):
        return read_episodes_npz(path)
    if path.endswith((".jsonl", ".json")):
        return read_episodes_jsonl(path)
    raise EpisodeDataError(
        f"{path}: unknown episode file type; pass a D4RL-style .npz or an episode-per-line .jsonl"
    )
