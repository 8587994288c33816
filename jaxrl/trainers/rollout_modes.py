"""The rollout mode of a GRPO or multi-turn GRPO run, from a config file's flat settings: the one
place the string `rollout_mode` becomes an object (`algos.rollouts`).

A config file (and the command line) keeps the flat spelling

    --config.rollout_mode=partial --config.rollout_budget=12 --config.max_staleness=2

and `from_settings` turns it into `Partial(rollout_budget=12, max_staleness=2)`: the mode's
class takes the settings named by its fields; a setting that only another mode reads, given
anything but its default, is refused in one line naming the modes that read it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from algos.asynchronous import Async
from algos.partial import Partial
from algos.rollouts import Sync
from jaxrl.config import ConfigError, fail, from_flat, require

MODES = {"sync": Sync, "partial": Partial, "async": Async}


def defaults() -> dict[str, Any]:
    """{flat setting: default}: `rollout_mode` and every mode's fields (what a config file of an
    algorithm with rollout modes holds)."""
    values: dict[str, Any] = {"rollout_mode": "sync"}
    for mode in MODES.values():
        for field in dataclasses.fields(mode):
            values.setdefault(field.name, field.default)
    return values


SETTINGS = tuple(defaults())  # the flat names, beside the algorithm Config's


def field_names(mode: type) -> set[str]:
    """The settings a mode's class takes."""
    return {field.name for field in dataclasses.fields(mode)}


def from_settings(values: Mapping[str, Any]) -> Any:
    """The rollout object of flat settings (missing ones at their defaults): the mode
    `rollout_mode` names, built from its own settings. A setting another mode reads, given a
    value other than its default, is a ConfigError naming the modes that read it."""
    mode = values.get("rollout_mode", "sync")
    require(
        mode in MODES,
        "rollout_mode",
        f"unknown mode {mode!r}",
        f"choose {', '.join(list(MODES)[:-1])} or {list(MODES)[-1]}",
    )
    own = field_names(MODES[mode])
    for name, default in defaults().items():
        value = values.get(name, default)
        if name == "rollout_mode" or name in own or same(value, default):
            continue
        modes = " or ".join(m for m, cls in MODES.items() if name in field_names(cls))
        raise ConfigError(
            f"{name}: got {value!r}, but it is read only with rollout_mode={modes}; "
            f"set rollout_mode={modes}, or drop it"
        )
    return MODES[mode](**{name: values[name] for name in own if name in values})


def same(value: Any, default: Any) -> bool:
    """A setting left at its default (a mesh shape may come as a list)."""
    if isinstance(default, tuple) and isinstance(value, list | tuple):
        return tuple(value) == default
    return value == default


def configure(
    config_cls: type, values: Mapping[str, Any], check_rollout: Callable[[Any, Any], None]
) -> tuple[Any, Any]:
    """The algorithm's Config and its rollout from flat settings (a config file's spelling: the
    Config's fields, its sections' by their own names, and `SETTINGS`), the rollout checked
    against the Config by the algorithm's `check_rollout` (`grpo.check_rollout`,
    `multiturn.check_rollout`). Raises the first problem's one-line ConfigError."""
    config = from_flat(config_cls, {k: v for k, v in values.items() if k not in SETTINGS})
    rollout = from_settings(values)
    check_rollout(config, rollout)
    return config, rollout


def for_run(flat: Any, config: Any, check_rollout: Callable[[Any, Any], None]) -> Any:
    """The run's rollout from its config file (`config` built from the same file), checked
    against the Config and, in async mode, against the devices: each problem one
    `error: config.<field>: ...` line."""
    try:
        rollout = from_settings({name: flat[name] for name in SETTINGS if name in flat})
        check_rollout(config, rollout)
        if isinstance(rollout, Async):  # the devices split into the training and generation meshes
            rollout.split_devices(config)
    except ConfigError as error:
        fail(f"config.{error}")
    return rollout
