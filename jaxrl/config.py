"""Settings: the checks every algorithm's frozen `Config` shares, and the building of a `Config`
from a config file's ml_collections dict.

A bad setting must fail before anything compiles, with one line that names the field and the fix:
`require` and its kin raise `ConfigError("field: problem; fix")` inside a Config's
`__post_init__`; `fail` raises the `InputError` a script prints as `error: ...` (exit 2).
"""

from __future__ import annotations

import copy
import dataclasses
import math
import os
import sys
import traceback
from collections.abc import Mapping
from typing import Any, NoReturn

import ml_collections


class ConfigError(ValueError):
    """A configuration value is invalid; the message names the field and how to fix it."""


class InputError(ConfigError):
    """A bad input (a setting, a file, a model or data given from Python) or a run that cannot
    go on, in one line `<field or file:line>: <problem>; <fix>`: what `jaxrl.fail` raises.
    From Python it is the exception a trainer raises; a script (`jaxrl.cli.main`) prints it
    as `error: <line>` and exits with status 2, without a traceback. `abrupt`: the script exits
    without the interpreter's shutdown (threads of a failed checkpoint read would print)."""

    def __init__(self, message: str, abrupt: bool = False) -> None:
        super().__init__(message)
        self.abrupt = abrupt

    def _render_traceback_(self) -> list[str]:
        """How IPython and Jupyter show it (they ask an exception for this method): the
        user's own frames and the one line, without the library's frames."""
        return short_traceback(self)


# The library's own folder: frames inside it are left out of an InputError's traceback.
PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep


def short_traceback(error: BaseException) -> list[str]:
    """The traceback of a bad input as a user reads it: their own calls (file, line and code)
    and the line that says what to fix. The frames inside jaxrl say nothing they can act on."""
    lines = ["Traceback (most recent call last):"]
    for frame in traceback.extract_tb(error.__traceback__):
        if not frame.filename.startswith(PACKAGE_DIR):
            lines.append(f'  File "{frame.filename}", line {frame.lineno}, in {frame.name}')
            lines += [f"    {frame.line}"] if frame.line else []
    return [*lines, f"{type(error).__module__}.{type(error).__qualname__}: {error}"]


def _show_input_errors_short(kind: type, error: BaseException, tb: Any) -> None:
    """`sys.excepthook` of a Python program that imports jaxrl: an `InputError` nobody caught
    prints as `short_traceback` says; every other exception goes to the hook that was there."""
    if isinstance(error, InputError):
        print("\n".join(short_traceback(error)), file=sys.stderr)
    else:
        _previous_excepthook(kind, error, tb)


# Only the interpreter's own hook is replaced: a hook a user or a tool installed stays theirs.
_previous_excepthook = sys.excepthook
if sys.excepthook is sys.__excepthook__:
    sys.excepthook = _show_input_errors_short


def require(condition: bool, field: str, problem: str, fix: str) -> None:
    """Raise `ConfigError("field: problem; fix")` unless `condition` holds."""
    if not condition:
        raise ConfigError(f"{field}: {problem}; {fix}")


def is_finite_number(value: Any) -> bool:
    """True for an int or a finite float (not NaN, not +-inf); False for anything else."""
    try:
        return math.isfinite(value)
    except TypeError:
        return False


def require_positive(config: Any, *fields: str) -> None:
    """Require each named attribute of `config` to be a finite number > 0."""
    for field in fields:
        value = getattr(config, field)
        require_finite(config, field)
        require(value > 0, field, f"must be positive, got {value}", f"set {field} > 0")


def require_finite(config: Any, *fields: str) -> None:
    """Require each named attribute of `config` to be a number that is neither NaN nor +-inf."""
    for field in fields:
        value = getattr(config, field)
        require(is_finite_number(value), field, f"must be a finite number, got {value}", "give one")


def require_non_negative(config: Any, *fields: str) -> None:
    """Require each named attribute of `config` to be a finite number >= 0."""
    for field in fields:
        value = getattr(config, field)
        require_finite(config, field)
        require(value >= 0, field, f"must be >= 0, got {value}", f"set {field} >= 0")


def require_count(config: Any, field: str, fix: str) -> None:
    """Require the attribute `field` of `config` to be a whole number >= 0 (not a bool)."""
    value = getattr(config, field)
    require(
        isinstance(value, int) and not isinstance(value, bool) and value >= 0,
        field,
        f"got {value!r}",
        fix,
    )


def require_in_range(config: Any, field: str, low: float, high: float) -> None:
    """Require the attribute `field` of `config` to lie in the closed interval [low, high]."""
    value = getattr(config, field)
    require(
        low <= value <= high,
        field,
        f"must lie in [{low}, {high}], got {value}",
        f"choose {field} between {low} and {high}",
    )


MAX_STEPS = 2**31 - 1  # step and sample counters are int32 inside the program


def require_step_count(config: Any, field: str) -> None:
    """Require a count of steps/samples that int32 counters inside the program can hold."""
    value = getattr(config, field)
    require(
        value <= MAX_STEPS,
        field,
        f"({value}) exceeds {MAX_STEPS:,}, the largest count the program's int32 counters hold",
        f"set {field} <= {MAX_STEPS}",
    )


def divisors(n: int) -> list[int]:
    """The positive divisors of `n` in increasing order (for "choose one of ..." hints)."""
    return [d for d in range(1, n + 1) if n % d == 0]


def fail(message: str, abrupt: bool = False) -> NoReturn:
    """Stop with one clear line: raise `InputError(message)` (bad inputs are the user's to fix,
    not bugs). A script prints it as `error: <message>` and exits with status 2, no traceback
    (`exit_on_input_error`, its boundary); from Python it is the exception the trainer raises.
    An InputError already on its way up passes a handler that would reword it unchanged."""
    in_flight = sys.exc_info()[1]
    if isinstance(in_flight, InputError):
        raise in_flight
    raise InputError(message, abrupt=abrupt)


class Settings(ml_collections.ConfigDict):
    """A trainer's ConfigDict as `jaxrl.trainers.<algo>.config(preset)` gives it to Python: an
    assignment the config refuses (a field it does not have, a value of the wrong type) raises
    one `InputError` line, `config.<path>: <problem>; <fix>`, with the "did you mean" the script
    gives for its flags, at the line that assigned it, instead of ml_collections' KeyError (which
    lists every field) or TypeError. Reading, copying and locking are ConfigDict's.

    Each section also records the fields assigned to it (a copy keeps the record): the settings
    the user chose, which `given_settings` lists, as against the preset's, which a trainer may
    fit to the data it is given (a held-out size larger than the rows)."""

    @classmethod
    def of(cls, config: ml_collections.ConfigDict, path: str = "config") -> Settings:
        """`config` and every section in it, as `Settings` (the same objects, their class
        changed, so field references between sections still hold)."""
        object.__setattr__(config, "__class__", cls)
        object.__setattr__(config, "_settings_path", path)
        if "_given" not in config.__dict__:
            object.__setattr__(config, "_given", set())
        for name, value in config.items():
            if isinstance(value, ml_collections.ConfigDict):
                cls.of(value, f"{path}.{name}")
        return config

    def __setattr__(self, name: str, value: Any) -> None:
        # Each refusal is raised from this frame (not a helper's), so a user's traceback is
        # their line, this one and the error.
        error = self._refusal(name, value)
        if error is not None:
            raise error
        super().__setattr__(name, value)

    def __setitem__(self, key: Any, value: Any) -> None:
        error = self._refusal(key, value)
        if error is not None:
            raise error
        super().__setitem__(key, value)
        # ConfigDict's own copying fills a new section through here before its record exists.
        given = self.__dict__.get("_given")
        if given is not None:
            given.add(str(key))

    def __setstate__(self, state: dict[str, Any]) -> None:
        # copy.deepcopy (a trainer copies the config it is given) rebuilds the fields only:
        # keep the section's path and its record of assigned fields.
        super().__setstate__(state)
        for name in ("_settings_path", "_given"):
            if name in state:
                object.__setattr__(self, name, copy.copy(state[name]))

    def _refusal(self, key: Any, value: Any) -> InputError | None:
        """The InputError that assigning `value` to `key` gets, or None if it is fine."""
        path = f"{self.__dict__.get('_settings_path', 'config')}.{key}"
        if self.is_locked and key not in self:
            import difflib

            close = difflib.get_close_matches(str(key), [str(k) for k in self.keys()], 1, 0.6)
            fix = f"did you mean {path.rpartition('.')[0]}.{close[0]}?" if close else ""
            fix = fix or f"the fields here are {', '.join(sorted(map(str, self.keys())))}"
            return InputError(f"{path}: no such setting; {fix}")
        if key not in self:
            return None
        # ml_collections' own check (type-safe ConfigDicts): an int field takes an int (a
        # float takes an int), a str a str, a section a dict or ConfigDict.
        try:
            ml_collections.ConfigDict({"probe": self[key]}).probe = value
        except TypeError:
            current = self[key]
            wanted = type(current).__name__
            article = "an" if wanted[0] in "aeiou" else "a"
            return InputError(
                f"{path}: expected {article} {wanted}, got {value!r} ({type(value).__name__}); "
                f"e.g. {path} = {current!r}"
            )
        return None


def given_settings(config: ml_collections.ConfigDict) -> frozenset[str]:
    """The paths ("num_steps", "task.num_eval") of the settings assigned in `config` since its
    preset made it: from Python (a `Settings` records each assignment) or as --config.X flags
    (`mark_given`). A section assigned as a whole gives every field under it."""
    found = set(config.__dict__.get("_given", ()))
    for name, value in config.items():
        if isinstance(value, ml_collections.ConfigDict):
            found |= {f"{name}.{inner}" for inner in given_settings(value)}
    return frozenset(found)


def is_given(given: frozenset[str], path: str) -> bool:
    """Whether setting `path` ("task.num_eval") is among `given` (`given_settings`), itself or
    a section holding it."""
    parts = path.split(".")
    return any(".".join(parts[:end]) in given for end in range(1, len(parts) + 1))


def mark_given(config: ml_collections.ConfigDict, paths: Any) -> Settings:
    """`config` as `Settings` (`Settings.of`), with the settings at `paths` ("task.num_eval",
    what --config.X flags name) recorded as given, as an assignment from Python records them."""
    settings = Settings.of(config)
    for path in paths:
        *sections, name = str(path).split(".")
        section = settings
        for part in sections:
            section = section.get(part)
            if not isinstance(section, ml_collections.ConfigDict):
                break
        else:
            section.__dict__.setdefault("_given", set()).add(name)
    return settings


def run_section(**overrides: Any) -> ml_collections.ConfigDict:
    """The `run` section of every config file: how a run is driven, not what it learns."""
    return ml_collections.ConfigDict(
        dict(
            num_chunks=10,  # compiled chunks; the loop checkpoints (and may evaluate) between them
            checkpoint_every=1,  # chunks
            keep_checkpoints=3,
            log_every=10,  # updates per metrics row
            tensorboard=True,
            progress=True,
        )
        | overrides
    )


def sections_of(config_cls: type) -> dict[str, type]:
    """{field: its dataclass} for a Config's typed sections (a field whose default is itself a
    dataclass, e.g. `sampling: Sampling`): a config file spells their fields flat, by their own
    names (`--config.temperature`, not `--config.sampling.temperature`)."""
    found = {}
    for field in dataclasses.fields(config_cls):
        has_factory = field.default_factory is not dataclasses.MISSING
        default = field.default_factory() if has_factory else field.default
        if dataclasses.is_dataclass(default) and not isinstance(default, type):
            found[field.name] = type(default)
    return found


def flat_fields(config: Any) -> dict[str, Any]:
    """A Config's settings as a config file spells them: its fields, a section's (`sections_of`)
    in its place by their own names."""
    sections = sections_of(type(config))
    values = {}
    for field in dataclasses.fields(config):
        value = getattr(config, field.name)
        inner = flat_fields(value) if field.name in sections else {field.name: value}
        values.update(inner)
    return values


def from_flat(config_cls: type, values: Mapping[str, Any]) -> Any:
    """`config_cls` from its flat settings (`flat_fields`'s spelling), each section built from
    the names of its fields: `from_flat(grpo.Config, {"batch_size": 4, "temperature": 0.7})`.
    A bad value raises the Config's (or the section's) one-line ConfigError."""
    values = dict(values)
    for name, section in sections_of(config_cls).items():
        own = {f.name for f in dataclasses.fields(section)}
        values[name] = from_flat(section, {k: values.pop(k) for k in own if k in values})
    return config_cls(**values)


def flat_defaults(config_cls: type) -> dict[str, Any]:
    """{flat setting: its default} of `config_cls` (no default: MISSING)."""
    defaults = {}
    sections = sections_of(config_cls)
    for field in dataclasses.fields(config_cls):
        if field.name in sections:
            defaults |= flat_defaults(sections[field.name])
        else:
            defaults[field.name] = field.default
    return defaults


def config_dict(config: Any, preset: Mapping[str, Any], **sections: Any) -> Any:
    """A config file's `get_config()` result: the algorithm Config's fields (a typed section's
    by their own names, `flat_fields`) with a preset's values, plus named sections (`run` is
    added when not given).

    `config` is a Config, or a Config class for its defaults (`flat_defaults`, the same values):
    a class is not constructed, so its validation does not run here. The control algorithms pass
    theirs: validating the default environment name imports gymnax, seconds of a script's start
    that --help or a mistyped flag need not wait for; the run validates the Config it builds."""
    flat = ml_collections.ConfigDict(
        flat_defaults(config) if isinstance(config, type) else flat_fields(config)
    )
    flat.update(dict(preset))
    for name, value in flat.items():
        if isinstance(value, list):  # ml_collections keeps tuples only if they start as tuples
            flat[name] = tuple(value)
    sections.setdefault("run", run_section())
    for name, section in sections.items():
        flat[name] = section
    return flat


def preset_of(presets: Mapping[str, Any], name: str) -> Any:
    """`presets[name]`, or one error line naming the choices (no traceback)."""
    if name not in presets:
        fail(f"--config: unknown preset {name!r}; choose one of {sorted(presets)}")
    return presets[name]


def build_config(config_cls: type, flat: ml_collections.ConfigDict, settings: tuple = ()) -> Any:
    """The frozen algorithm Config from the top-level fields of an ml_collections config.

    Sections (nested ConfigDicts: run, model, task, ...) are the script's, discovered, not listed;
    top-level scalars must be Config fields (a typed section's by their own names, `from_flat`)
    or one of the script's own `settings`. Any problem is one `error: config.<field>: ...`
    line."""
    defaults = flat_defaults(config_cls)
    fields = set(defaults)
    values = {k: v for k, v in flat.items() if k in fields}
    unknown = sorted(
        k
        for k, v in flat.items()
        if k not in fields and k not in settings and not isinstance(v, ml_collections.ConfigDict)
    )
    if unknown:
        fail(
            f"config.{unknown[0]}: not a setting of {config_cls.__module__}.Config; "
            f"valid settings are {sorted(fields)}"
        )
    for name, value in values.items():
        check_like_default(name, value, defaults[name])
    try:
        return from_flat(config_cls, values)
    except ConfigError as error:
        fail(f"config.{error}")
    except TypeError as error:
        fail(f"config: {error}; check the settings' types against the config file")


def check_like_default(name: str, value: Any, default: Any) -> None:
    """A tuple setting (layer widths, a mesh shape) given as something else, or holding another
    type of element than its default, is one line naming it: the Config's own checks compare
    its elements with numbers and would fail with Python's message instead."""
    if not isinstance(default, tuple) or not default:
        return
    kind = type(default[0])
    example = "(" + ", ".join(str(x) for x in default) + ("," if len(default) == 1 else "") + ")"
    if not isinstance(value, tuple | list):
        fail(f"config.{name}: expected a tuple such as {example}, got {value!r}; pass e.g. "
             f"--config.{name}='{example}'")  # fmt: skip
    numbers = (int, float) if kind is float else (kind,)
    bad = [
        x for x in value if not isinstance(x, numbers) or isinstance(x, bool) is not (kind is bool)
    ]
    if bad:
        fail(f"config.{name}: expected {kind.__name__}s such as {example}, got {tuple(value)!r}; "
             f"pass e.g. --config.{name}='{example}'")  # fmt: skip


RUN_COUNTS = ("num_chunks", "checkpoint_every", "keep_checkpoints", "log_every")


def check_run_settings(run: Any, num_seeds: int = 1) -> None:
    """The driver's counts (chunks, checkpoint interval, logging interval, seeds) must be >= 1."""
    if num_seeds < 1:
        fail(f"--num_seeds must be >= 1, got {num_seeds}; pass --num_seeds=1 or more")
    for name in RUN_COUNTS:
        value = run[name]
        if not isinstance(value, int) or value < 1:
            fail(f"config.run.{name} must be >= 1, got {value}; set it to 1 or more")
