"""The optional extras of the `jaxrl` distribution, and the one-line error for a missing one.

The core install (`pip install jaxrl`) carries what every control algorithm and the runner need.
Language models, multi-agent environments, EnvPool and MuJoCo live in extras (pyproject.toml), and
their packages are imported where first used, never when `jaxrl`, `algos` or `envs` is imported.
Where one is missing, `import_module` raises a `MissingExtraError` whose message is one line
naming the extra to install; scripts call `require` first, which turns that into the usual
`error: ...; ...` line and exit status 2 before anything compiles or is written.
"""

from __future__ import annotations

import importlib
import importlib.util
from types import ModuleType

# The import names each extra provides (pyproject.toml's [project.optional-dependencies]).
EXTRAS: dict[str, tuple[str, ...]] = {
    "lm": ("tokenizers", "safetensors", "jinja2", "gguf", "math_verify"),
    "marl": ("jaxmarl",),
    "envpool": ("envpool",),
    "mujoco": ("mujoco", "mujoco.mjx"),
}


class MissingExtraError(ImportError):
    """A package of an optional extra is not installed; the message says which extra to install."""


def install_line(extra: str) -> str:
    """How to install `extra` (jaxrl installs from a clone); pip keeps the installed jax."""
    return f"pip install -e '.[{extra}]' in the jaxrl clone"


def message(extra: str, module: str, what: str) -> str:
    """`what` needs `module`, from the extra `extra`: one line naming the install command."""
    return f"{what}: needs {module}, from the optional extra jaxrl[{extra}]; {install_line(extra)}"


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package missing, or a broken half-import
        return False


def missing(extra: str) -> str | None:
    """The first import name of `extra` that is not installed, None if all are."""
    return next((name for name in EXTRAS[extra] if not _installed(name)), None)


def import_module(module: str, extra: str, what: str) -> ModuleType:
    """`importlib.import_module(module)`, or a one-line `MissingExtraError` naming `extra` where
    the package is absent (an ImportError from inside an installed package is passed on)."""
    try:
        return importlib.import_module(module)
    except ImportError as error:
        top = module.split(".")[0]
        if error.name is not None and error.name.split(".")[0] != top:
            raise
        raise MissingExtraError(message(extra, module, what)) from None


def require(extra: str, what: str) -> None:
    """For scripts: exit with `error: <what>: ...; pip install ...` (status 2) unless every
    package of `extra` is installed."""
    name = missing(extra)
    if name is not None:
        from jaxrl.cli import exit_on_input_error
        from jaxrl.config import fail

        with exit_on_input_error():  # called at a script's import, outside `cli.main`
            fail(message(extra, name, what))
