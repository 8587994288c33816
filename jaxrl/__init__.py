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
if _SCHEDULER_FLAG not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {_SCHEDULER_FLAG}=false".strip()
