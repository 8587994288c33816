"""jaxrl: shared machinery (networks, checkpointing, logging, evaluation) for the algorithms in
`algos/`. Nothing here knows about a particular algorithm.

Importing jaxrl does two things, and sets no XLA flags:
- with `JAXRL_DISTRIBUTED=1` in the environment it joins JAX's multi-host runtime
  (`jaxrl.distributed`), which must happen before anything computes: `envs` and `algos` import
  jaxrl first for this, since gymnax computes when imported;
- it says in one line on stderr when the `envs` or `algos` that Python would import is not the
  one installed beside jaxrl (another installed package of the same name shadowing ours).
"""

__version__ = "0.1.0"

# No XLA flags are set here. jaxlib 0.10.2's CPU runtime could wedge forever on vmapped training
# programs, which we once worked around by turning off XLA's concurrency-optimised scheduler (at
# 10-15% of CPU throughput). The cause was a batched LAPACK QR (the orthogonal initialiser, vmapped
# over seeds) blocking on the thread pool that scheduler shares; `jaxrl.nets.orthogonal` now
# factorises one matrix at a time, and the scheduler stays on.


def _shadowed_packages() -> list[str]:
    """One line per package of ours (`envs`, `algos`) that Python would import from somewhere
    other than beside this package, naming where and how to fix it. Found without importing them
    (the core never imports the layers above it): PyPI has packages named `envs` and `algos`."""
    import importlib.util
    import os

    home = os.path.realpath(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    lines = []
    for name in ("envs", "algos"):
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            continue
        if spec is None:
            continue  # not installed at all: the core works without the layers above it
        origin = spec.origin if spec.origin and os.path.isfile(spec.origin) else None
        is_package = spec.submodule_search_locations is not None
        if origin and is_package:
            found = os.path.dirname(origin)
            if os.path.realpath(os.path.dirname(found)) == home:
                continue  # ours, beside jaxrl
        else:  # a single module or a namespace package: not ours either way
            found = origin or next(iter(spec.submodule_search_locations or []), "?")
        lines.append(_shadow_line(name, found, home))
    return lines


def _shadow_line(name: str, found: str, home: str) -> str:
    """The one line that says `name` resolves to `found` instead of jaxrl's, and the fix."""
    import os
    from importlib import metadata

    owners = [d for d in metadata.packages_distributions().get(name, []) if d != "jaxrl"]
    if owners:
        fix = f"uninstall it (pip uninstall {' '.join(owners)}) or give jaxrl a venv of its own"
        what = f"installed by {', '.join(owners)}"
    else:
        fix = "rename or move it, or take its folder off sys.path (PYTHONPATH, the current dir)"
        what = "not installed by jaxrl"
    return (
        f"jaxrl: warning: `import {name}` finds {found} ({what}), not jaxrl's {name} beside "
        f"{os.path.join(home, 'jaxrl')}; {fix}"
    )


def _say_if_shadowed() -> None:
    import sys

    for line in _shadowed_packages():
        print(line, file=sys.stderr)


_say_if_shadowed()

# Multi-host runs (JAXRL_DISTRIBUTED=1, see jaxrl/distributed.py) join JAX's multi-controller
# runtime here: it must happen before anything computes.
from jaxrl import distributed as _distributed  # noqa: E402

_distributed.initialize_from_environment()
