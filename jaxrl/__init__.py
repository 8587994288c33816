"""jaxrl: shared machinery (networks, checkpointing, logging, evaluation) for the algorithms in
`algos/`. Nothing here knows about a particular algorithm."""

import os

__version__ = "0.1.0"

# XLA's CPU runtime (jaxlib 0.10.2) can wedge forever, every worker thread idle, on programs that
# scan over vmapped PPO updates (e.g. 16 envs x 4 seeds x 2 updates). Its concurrency-optimised
# scheduler is the trigger: with it off, every shape we found hanging completes. XLA reads the flag
# when the CPU backend starts, so importing jaxrl (envs and algos do) before computing anything
# applies it. Set the flag yourself in XLA_FLAGS to override.
_SCHEDULER_FLAG = "--xla_cpu_enable_concurrency_optimized_scheduler"


def with_cpu_workarounds(xla_flags: str) -> str:
    """`xla_flags` plus our XLA CPU runtime workaround, unless that flag is already set there."""
    if _SCHEDULER_FLAG in xla_flags:
        return xla_flags
    return f"{xla_flags} {_SCHEDULER_FLAG}=false".strip()


os.environ["XLA_FLAGS"] = with_cpu_workarounds(os.environ.get("XLA_FLAGS", ""))

# Multi-host runs (JAXRL_DISTRIBUTED=1, see jaxrl/distributed.py) join JAX's multi-controller
# runtime here, for the same reason: it must happen before anything computes.
from jaxrl import distributed as _distributed  # noqa: E402

_distributed.initialize_from_environment()
