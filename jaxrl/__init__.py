"""jaxrl: shared machinery (networks, checkpointing, logging, evaluation) for the algorithms in
`algos/`. Nothing here knows about a particular algorithm."""

__version__ = "0.1.0"

# No XLA flags are set here. jaxlib 0.10.2's CPU runtime could wedge forever on vmapped training
# programs, which we once worked around by turning off XLA's concurrency-optimised scheduler (at
# 10-15% of CPU throughput). The cause was a batched LAPACK QR (the orthogonal initialiser, vmapped
# over seeds) blocking on the thread pool that scheduler shares; `jaxrl.nets.orthogonal` now
# factorises one matrix at a time, and the scheduler stays on.

# Multi-host runs (JAXRL_DISTRIBUTED=1, see jaxrl/distributed.py) join JAX's multi-controller
# runtime here: it must happen before anything computes.
from jaxrl import distributed as _distributed  # noqa: E402

_distributed.initialize_from_environment()
