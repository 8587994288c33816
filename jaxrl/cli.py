"""The command line of every `experiments/<algo>.py`: its flags, its exit codes, and the edge
where strings become objects.

- `define_flags` declares --config (an ml_collections file and preset), --workdir and the seeds;
  `main` runs the script under absl with every flag problem as one `error: ...` line (exit 2),
  help that exits 0, and Ctrl-C outside training as one line (exit 130).
- `load_named` turns "module.path:name" or "path/to/file.py:name" into the object it names: the
  scripts' way to take a user's reward function or game class.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import sys
from collections.abc import Callable, Iterator
from typing import Any, NoReturn

import ml_collections

from jaxrl import interrupts
from jaxrl.config import InputError, fail
from jaxrl.runner import (
    Stopped,
    host_failures_as_input_errors,
    interrupted_line,
    run_scope,
)


@contextlib.contextmanager
def exit_on_input_error() -> Iterator[None]:
    """The scripts' boundary: an `InputError` raised inside becomes its one `error:` line on
    stderr and exit status 2."""
    try:
        yield
    except InputError as error:
        print(f"error: {error}", file=sys.stderr, flush=True)
        if error.abrupt:
            os._exit(2)
        sys.exit(2)


def load_named(spec: str) -> Any:
    """The object `spec` names: "module.path:name" (importable from the working directory) or
    "path/to/file.py:name" (a module of the user's anywhere, loaded from its file). Raises
    ImportError / AttributeError / ValueError with the reason."""
    module_name, _, attribute = spec.rpartition(":") if ".py:" in spec else spec.partition(":")
    if not attribute:
        raise ValueError("no ':name' after the module")
    if module_name.endswith(".py"):
        import importlib.util

        path = os.path.abspath(os.path.expanduser(module_name))
        if not os.path.isfile(path):
            raise ImportError(f"no such file {path}")
        # One module per file, under a name of its own: loading it twice reuses it.
        name = "jaxrl_user_" + re.sub(r"\W", "_", path)
        if name not in sys.modules:
            loader_spec = importlib.util.spec_from_file_location(name, path)
            if loader_spec is None or loader_spec.loader is None:
                raise ImportError(f"cannot load {path} as a Python module")
            module = importlib.util.module_from_spec(loader_spec)
            sys.modules[name] = module
            try:
                loader_spec.loader.exec_module(module)
            except BaseException:
                del sys.modules[name]
                raise
        return getattr(sys.modules[name], attribute)
    import importlib

    return getattr(importlib.import_module(module_name), attribute)


def define_flags(script: str, default_config: str, seeds: bool = True) -> dict[str, Any]:
    """The flags every script takes: --config (an ml_collections file and preset, by default
    `default_config` in the `configs` folder beside `script`, fields overridable as
    --config.X=V), --workdir and --kill_after_chunk; with `seeds`, also --num_seeds and --seed
    (control scripts, whose seeds are vmapped).

    ml_collections loads the default config and applies --config.X overrides while the flag is
    defined, so a mistyped field fails here, at import: it becomes one `error:` line."""
    from absl import flags
    from ml_collections import config_flags

    try:
        config = config_flags.DEFINE_config_file(
            "config",
            os.path.join(os.path.dirname(os.path.abspath(script)), "configs", default_config),
            "Config file and preset (FILE:PRESET); override fields with --config.X=V.",
            lock_config=True,
        )
    except Exception as error:  # noqa: BLE001  anything ml_collections raises is a bad flag
        with exit_on_input_error():  # at the script's import, before `main`
            raise InputError(flag_error_message(error)) from None
    handles = {
        "config": config,
        "workdir": flags.DEFINE_string(
            "workdir", None, "Run directory; an existing one is resumed. Default: runs/<name>."
        ),
        "kill_after_chunk": flags.DEFINE_integer(
            "kill_after_chunk", None, "Testing aid: SIGKILL right after chunk K's checkpoint."
        ),
    }
    if seeds:
        handles["num_seeds"] = flags.DEFINE_integer(
            "num_seeds", 4, "Independent seeds, vmapped in one program."
        )
        handles["seed"] = flags.DEFINE_integer(
            "seed", 0, "Base seed; run i uses split i of PRNGKey(seed)."
        )
    return handles


# Spellings a setting has elsewhere (the library's objects, TRL) that the flat configs do not
# take: the flag that does what the user meant.
ELSEWHERE = {
    "sampling": "sampling settings are flat: --config.max_new_tokens, --config.temperature, "
    "--config.top_k, --config.top_p",
    "rollout": "the rollout is --config.rollout_mode=sync|partial|async, with its settings flat "
    "(--config.rollout_budget, --config.max_staleness, ...)",
    "loss_type": "GRPO's loss is --config.variant (grpo, dr_grpo, dapo, rloo, remax, gspo, "
    "cispo); loss_type is DPO's",
}


def flag_error_message(error: BaseException) -> str:
    """One line for an error raised while parsing flags or loading the config file: the line of
    an InputError the config file raised (`fail` in its get_config: an unknown preset), which
    ml_collections and absl hand on wrapped in errors of their own, or one made from theirs."""
    chain, seen = error, set()
    while chain is not None and id(chain) not in seen:
        seen.add(id(chain))
        if isinstance(chain, InputError) and "Error whilst parsing config file" not in str(chain):
            return str(chain)
        chain = chain.__cause__ or chain.__context__
    text = " ".join(str(error).replace("\\n", " ").split())
    guess = re.search(r'Did you mean "([^"]+)" instead of "([^"]+)"', text.replace("\\", ""))
    if guess:
        wanted, typed = guess.groups()
        flag = next(
            (a.split("=")[0] for a in sys.argv[1:] if a.split("=")[0].endswith(f".{typed}")),
            f"--config.{typed}",
        )
        return f"{flag}: not a setting of this config; did you mean {flag[: -len(typed)]}{wanted}?"
    # A name with no close match reaches us as the bare KeyError: "'workdir'".
    missing = re.fullmatch(r"\"?'([\w-]+)'\"?", text)
    if missing:
        name = missing.group(1)
        flag = next(
            (a.split("=")[0] for a in sys.argv[1:] if a.split("=")[0].endswith(f".{name}")),
            f"--config.{name}",
        )
        hint = "check its spelling against the config file"
        if name in ("workdir", "kill_after_chunk"):
            hint = f"it is a flag of its own: --{name}=..."
        return f"{flag}: not a setting of this config; {ELSEWHERE.get(name, hint)}"
    unknown = re.search(r"Unknown command line flag '([^']+)'", text)
    if unknown:
        return f"--{unknown.group(1)}: unknown flag; see --helpfull for the flags this script takes"
    bad_value = re.match(r"flag (--[^=]+)=(.*?): (.*)$", text)
    if bad_value:
        flag, value, problem = bad_value.groups()
        return f"{flag}: {problem} (got {value!r}); give a value of the flag's type"
    if "No such file" in text or "Attempted" in text:
        path = next((a.split("=", 1)[1] for a in sys.argv[1:] if a.startswith("--config=")), "")
        return f"--config={path}: no such config file; pass experiments/configs/<algo>.py[:PRESET]"
    return f"flags: {text}; check the flag's spelling and value"


def repeated_overrides(args: list[str]) -> list[str]:
    """The config overrides (`--config.X`) given more than once in `args`, in order."""
    seen, repeated = set(), []
    for arg in args:
        if arg == "--":
            break
        if arg.startswith("--config."):
            name = arg.split("=", 1)[0]
            if name in seen and name not in repeated:
                repeated.append(name)
            seen.add(name)
    return repeated


@contextlib.contextmanager
def quiet_callback_logs() -> Iterator[None]:
    """JAX logs the traceback of a failing host callback before re-raising it (22-27 lines); the
    exception itself reaches the run (a user's function failing: one line, its traceback in the
    run's error.log), so that log is silenced while a run (a script's or a `train()` call's)
    is open."""
    logger = logging.getLogger("jax._src.callback")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        logger.setLevel(level)


def main(script_main: Callable[[list[str]], None], positional: bool = False) -> None:
    """`absl.app.run(script_main)` where any flag-parsing error is one `error:` line (exit 2) and
    positional arguments are refused (settings are flags) unless the script takes them."""
    from absl import app, flags
    from absl import logging as absl_logging

    def parse(argv: list[str]) -> list[str]:
        with exit_on_input_error():
            return parse_flags(argv)

    def parse_flags(argv: list[str]) -> list[str]:
        # absl exits with status 1 after --help; asking for help is no error. --helpconfig lists
        # the config's fields with their values (after the --config file, preset and overrides).
        wanted = [a for a in argv[1:] if a in HELP_FLAGS]
        if wanted and wanted[0] != "--helpconfig":
            app.usage(shorthelp=wanted[0] != "--helpfull", writeto_stdout=True)
            if wanted[0] != "--helpfull":
                print("Try --helpfull for every flag, --helpconfig for the config's fields.")
            sys.exit(0)
        argv = [a for a in argv if a != "--helpconfig"]
        try:
            rest = flags.FLAGS(argv)
            if "config" in flags.FLAGS:
                list(flags.FLAGS["config"].value.keys())  # loads the config file (and preset) now
        except SystemExit:
            raise
        except Exception as error:  # noqa: BLE001
            raise InputError(flag_error_message(error)) from None
        # A repeated override of a number or string: the last wins, as absl flags do. Of a tuple,
        # ml_collections concatenates them (hidden_sizes=(8,8) then (4,4) gives four layers).
        for name in repeated_overrides(argv[1:]):
            value = flags.FLAGS["config"].value
            for part in name.removeprefix("--config.").split("."):
                value = value[part]
            if isinstance(value, tuple | list):
                fail(
                    f"{name}: given more than once (a tuple's repeats are joined, giving "
                    f"{tuple(value)}); pass it once"
                )
        if len(rest) > 1 and not positional:
            fail(f"unexpected arguments {rest[1:]}; settings are flags, e.g. --config.seed=1")
        if wanted:
            if "config" not in flags.FLAGS:
                print("This script has no config; see --helpfull for its flags.")
            else:
                for name, value in config_fields(flags.FLAGS["config"].value):
                    print(f"--config.{name}={value!r}")
            sys.exit(0)
        return rest

    def run(argv: list[str]) -> None:
        absl_logging.set_verbosity(absl_logging.WARNING)  # orbax narrates every save at INFO
        # and warns when a save waits for the one before ("Waiting for previous save to complete
        # took 7.3 seconds"): a fact of the schedule, not something to act on.
        drop_orbax_waits()
        with quiet_callback_logs(), run_scope() as record:
            # Ctrl-C outside the training loop ends the script at once with this line
            # (`jaxrl.interrupts`; the script took the signals before its imports).
            interrupts.set_stop_line(lambda: interrupted_line(record.run_dir))
            try:
                with exit_on_input_error(), host_failures_as_input_errors():
                    script_main(argv)
            except Stopped:  # the training loop said where it stopped
                sys.exit(Stopped.code)
            except KeyboardInterrupt:  # outside training (setup, final evaluation): one line
                interrupted(record.run_dir)
            finally:  # what is left is the teardown: nothing for a signal to stop
                interrupts.finished()

    app.run(run, flags_parser=parse)


def interrupted(run_dir: Any) -> NoReturn:
    """A KeyboardInterrupt that reached the script (the scripts take SIGINT themselves, so this is
    one raised some other way): its one line, and exit status 130."""
    print(f"\n{interrupted_line(run_dir)}", file=sys.stderr)
    sys.exit(130)


HELP_FLAGS = ("--help", "-h", "-?", "--helpshort", "--helpfull", "--helpconfig")


def config_fields(config: ml_collections.ConfigDict, prefix: str = "") -> list[tuple[str, Any]]:
    """Every field of `config` as (dotted name, value), sections flattened, in order."""
    fields = []
    for name, value in config.items():
        if isinstance(value, ml_collections.ConfigDict):
            fields += config_fields(value, f"{prefix}{name}.")
        else:
            fields.append((f"{prefix}{name}", value))
    return fields


def _no_orbax_wait(record: logging.LogRecord) -> bool:
    return "Waiting for previous save" not in str(record.msg)


def drop_orbax_waits() -> None:
    """Keep orbax's "Waiting for previous save to complete took 7.3 seconds" warnings (a fact of
    the checkpoint schedule, not something to act on) off stderr, in a script and in a trainer
    called from Python alike; every other log line stays."""
    from absl import logging as absl_logging

    logger = absl_logging.get_absl_logger()
    if _no_orbax_wait not in logger.filters:
        logger.addFilter(_no_orbax_wait)
