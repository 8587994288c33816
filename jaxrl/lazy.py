"""Packages whose names import their modules at first use (`envs`, `jaxrl.data`): the modules
behind them import gymnax or tensorflow-datasets, seconds of every start that a script's --help
or a mistyped flag need not wait for."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def exports(
    package: str, modules: Mapping[str, str | tuple[str, str]]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """A package's module-level `__getattr__` and `__dir__` for `modules`: {public name: the
    submodule that defines it, or (that submodule, its name there)}. A name's submodule is
    imported when the name is first asked for."""

    def __getattr__(name: str) -> Any:
        if name not in modules:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        where = modules[name]
        module, attribute = (where, name) if isinstance(where, str) else where
        return getattr(importlib.import_module(f"{package}.{module}"), attribute)

    def __dir__() -> list[str]:
        return sorted(set(importlib.import_module(package).__dict__) | set(modules))

    return __getattr__, __dir__
