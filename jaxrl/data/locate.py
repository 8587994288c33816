"""Finding a built RLDS dataset on disk, opening its metadata, and saying clearly what is wrong
when it is missing or damaged.

A dataset is named like a TFDS one, `NAME[/CONFIG][:X.Y.Z]`, and lives in
`data_dir/NAME[/CONFIG]/VERSION` (`data_dir` defaults to TFDS's own, so ours and the catalog's
sit side by side). `dataset_path` accepts either such a name or a path, and resolves a name or
config directory to its newest built version:

    path = dataset_path("pendulum_v1/random", data_dir="~/tensorflow_datasets")
    info = load_dataset_info(path)        # name, version, splits, the builder's metadata

Nothing here reads episodes (`jaxrl.data.rlds_reader` does) or writes them
(`jaxrl.data.rlds_builder`). Failures are `DatasetNotFoundError`, which says what was looked for
and how to create it, and `CorruptDatasetError`, which names the bad file and says to rebuild.
"""

from __future__ import annotations

import os
import re
from typing import Any

__all__ = [
    "CorruptDatasetError",
    "DatasetNotFoundError",
    "VERSION_PATTERN",
    "dataset_path",
    "default_data_dir",
    "file_format",
    "load_dataset_info",
    "open_builder",
    "parse_dataset_name",
]

# `name[/config][:version]`: tfds's own naming (tensorflow_datasets/core/naming.py).
_NAME = re.compile(
    r"^(?P<name>[a-zA-Z]\w*)(/(?P<config>[\w+\-.]+))?(:(?P<version>\d+\.\d+\.\d+))?$"
)
VERSION_PATTERN = re.compile(r"^\d+\.\d+\.\d+$")  # a version directory's name, X.Y.Z
_HOW_TO_CREATE = (
    "create it with `python experiments/collect.py --env=<ENV> --policy=random "
    "--data_dir=<DATA_DIR> --name=<NAME>` (or jaxrl.data.build_episode_dataset)"
)


class DatasetNotFoundError(FileNotFoundError):
    """No built dataset at the given path or name; the message says how to create one."""


class CorruptDatasetError(RuntimeError):
    """A built dataset cannot be read; the message names the file and says to rebuild it."""


def default_data_dir() -> str:
    """TFDS's default: $TFDS_DATA_DIR, else ~/tensorflow_datasets (where `tfds build` puts catalog
    datasets, so ours and theirs sit side by side)."""
    return os.path.expanduser(os.environ.get("TFDS_DATA_DIR") or "~/tensorflow_datasets")


def parse_dataset_name(name: str) -> tuple[str, str | None, str | None]:
    """(NAME, CONFIG or None, VERSION or None) of a dataset name `NAME[/CONFIG][:X.Y.Z]`; a
    `ValueError` saying what a name looks like otherwise."""
    match = _NAME.match(name)
    if not match:
        raise ValueError(
            f"dataset name {name!r} is not NAME[/CONFIG][:X.Y.Z]; NAME is a letter then letters, "
            "digits or '_' (e.g. 'pendulum_v1/medium', 'd4rl_mujoco_halfcheetah/v2-medium')"
        )
    return match["name"], match["config"], match["version"]


# ----------------------------------------------------------------------------------------------
# Finding a built dataset's directory


def _is_version_dir(path: str) -> bool:
    return bool(VERSION_PATTERN.match(os.path.basename(path))) and os.path.isdir(path)


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


def _missing_info(path: str) -> CorruptDatasetError:
    return CorruptDatasetError(
        f"{os.path.join(path, 'dataset_info.json')}: missing, so the dataset in {path} is "
        "corrupted (an interrupted build or a partial copy); delete it and rebuild it"
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


def dataset_path(
    path_or_name: str | os.PathLike,
    data_dir: str | os.PathLike | None = None,
    *,
    kind: str = "RLDS dataset",
    how_to_create: str = _HOW_TO_CREATE,
) -> str:
    """The directory of a built dataset, given either a path (a dataset's version directory, or a
    directory above it holding one dataset) or a name `NAME[/CONFIG][:X.Y.Z]` under `data_dir`
    (default `default_data_dir()`), newest version first.

    Raises `DatasetNotFoundError` (what was looked for, and `how_to_create` it: by default an
    episode dataset's collect.py command; `kind` names what was looked for) or
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
                f"{path}: no built {kind} in this directory; {how_to_create}"
            )
        return found
    root = os.path.abspath(os.path.expanduser(os.fspath(data_dir or default_data_dir())))
    try:
        base_name, config_name, version = parse_dataset_name(given)
    except ValueError:
        raise DatasetNotFoundError(
            f"{path}: no such dataset directory (and {given!r} is not a dataset name to look up "
            f"under {root}); {how_to_create}"
        ) from None
    where = os.path.join(root, base_name, *([config_name] if config_name else []))
    candidate = os.path.join(where, version) if version else where
    found = _resolve_dir(candidate) if os.path.isdir(candidate) else None
    if found is None:
        raise DatasetNotFoundError(
            f"{candidate}: no built dataset {given!r} in data_dir {root}; {how_to_create}. A "
            "TFDS catalog dataset must already be prepared in data_dir (e.g. `tfds build NAME "
            f"--data_dir={root}`): nothing is downloaded here"
        )
    return found


# ----------------------------------------------------------------------------------------------
# Opening a built dataset's metadata


def open_builder(path: str) -> Any:
    """`tfds.builder_from_directory` of a built dataset's directory, with missing or unreadable
    metadata reported as `CorruptDatasetError`."""
    for required in ("dataset_info.json", "features.json"):
        if not os.path.isfile(os.path.join(path, required)):
            raise CorruptDatasetError(
                f"{os.path.join(path, required)}: missing, so the dataset in {path} is corrupted; "
                "delete it and rebuild it"
            )
    import tensorflow_datasets as tfds  # here, not at the top: start-up time

    try:
        builder = tfds.builder_from_directory(path)
        builder.info.splits  # noqa: B018  (parses the split metadata now, not at first read)
    except Exception as error:  # json, protobuf and tfds errors alike: the files are bad
        raise CorruptDatasetError(
            f"{path}/dataset_info.json or features.json: unreadable ({type(error).__name__}: "
            f"{error}); the dataset is corrupted, delete it and rebuild it"
        ) from error
    return builder


def file_format(info: Any) -> str:
    """The file format a dataset's `tfds.core.DatasetInfo` records: "array_record", "tfrecord"..."""
    fmt = info.file_format
    return getattr(fmt, "value", fmt) or "tfrecord"  # tfds < 4.? wrote no format: tfrecord


def load_dataset_info(
    path_or_name: str | os.PathLike, data_dir: str | os.PathLike | None = None
) -> dict[str, Any]:
    """{"path", "name", "version", "description", "file_format", "splits": {split: episodes},
    "metadata": {...}} of a built dataset (metadata: what `build_episode_dataset` recorded; empty
    for datasets from elsewhere)."""
    path = dataset_path(path_or_name, data_dir)
    builder = open_builder(path)
    info = builder.info
    return {
        "path": path,
        "name": info.full_name,
        "version": str(info.version),
        "description": info.description,
        "file_format": file_format(info),
        "splits": {name: split.num_examples for name, split in info.splits.items()},
        "metadata": dict(info.metadata or {}),
    }
