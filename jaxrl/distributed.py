"""Multi-host runs on JAX's multi-controller runtime: one Python process per host, every process
running the same program on a mesh that spans all hosts' devices.

Set `JAXRL_DISTRIBUTED=1` in the environment of every process and `import jaxrl` (the `algos`,
`envs` and `experiments` code does) calls `jax.distributed.initialize()` before anything computes;
it must, because gymnax computes when imported. On Cloud TPU pods, SLURM, Open MPI and Kubernetes
JAX finds the coordinator, the process count and this process's index itself; elsewhere give them
as `JAX_COORDINATOR_ADDRESS=host:port`, `JAXRL_NUM_PROCESSES` and `JAXRL_PROCESS_ID`.

Only process 0 writes the run directory's metrics, TensorBoard events and summaries
(`is_main_process`); every process takes part in saving and restoring checkpoints, which orbax
coordinates, so the work directory must be on storage all hosts see (a bucket or a shared disk).
"""

from __future__ import annotations

import os

ENABLE = "JAXRL_DISTRIBUTED"
NUM_PROCESSES = "JAXRL_NUM_PROCESSES"
PROCESS_ID = "JAXRL_PROCESS_ID"


def requested() -> bool:
    """Whether the environment asks for a multi-host run (`JAXRL_DISTRIBUTED` set and not 0)."""
    return os.environ.get(ENABLE, "").strip().lower() not in ("", "0", "false", "no")


def initialize_from_environment() -> bool:
    """Join the multi-controller runtime if `requested()`; returns whether it did. Call it before
    the first JAX computation (importing jaxrl does)."""
    if not requested():
        return False
    import jax

    if jax.distributed.is_initialized():
        return True
    settings = {}
    for name, variable in (("num_processes", NUM_PROCESSES), ("process_id", PROCESS_ID)):
        if os.environ.get(variable):
            try:
                settings[name] = int(os.environ[variable])
            except ValueError:
                raise ValueError(
                    f"{variable}={os.environ[variable]!r} is not an integer; set it to this "
                    "run's process count / this process's index (0-based)"
                ) from None
    # CPU devices of different processes talk through gloo; GPUs and TPUs ignore this setting.
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(**settings)
    return True


def is_main_process() -> bool:
    """True in process 0 (and in every single-process run): the one that writes logs and files.
    Holds however the runtime was joined, through `JAXRL_DISTRIBUTED` or by the user's own call."""
    import jax

    return not jax.distributed.is_initialized() or jax.process_index() == 0


def barrier(name: str) -> None:
    """Wait until every process reaches the barrier `name` (nothing to wait for in one process):
    e.g. until process 0 has written a file the others read."""
    import jax

    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices(name)
