"""Offline CQL gradient-step throughput of d3rlpy (PyTorch) on the CPU, a peer for our CQL.

A standalone script for d3rlpy's own virtual environment; nothing from this repository is
imported, so it runs with that interpreter alone:

    python3 -m venv /tmp/d3rlpy
    /tmp/d3rlpy/bin/pip install torch==2.13.0          # first, so pip keeps the CPU wheel
    /tmp/d3rlpy/bin/pip install d3rlpy==2.8.1 torch==2.13.0
    /tmp/d3rlpy/bin/python experiments/benchmarks/d3rlpy_cql_worker.py            # defaults
    /tmp/d3rlpy/bin/python experiments/benchmarks/d3rlpy_cql_worker.py --threads 1
    /tmp/d3rlpy/bin/python experiments/benchmarks/d3rlpy_cql_worker.py --modes loop --steps 500

The last line printed on stdout is `RESULT_JSON {...}`; progress goes to stderr.

Dataset. A synthetic Pendulum-v1 dataset, made in numpy with the Gymnasium Pendulum dynamics
(g = 10, m = l = 1, dt = 0.05, speed clipped to +-8, torque to +-2): observations
(cos th, sin th, th_dot), reward -(th^2 + 0.1 th_dot^2 + 0.001 u^2), uniformly random torques
(a "random" dataset in D4RL's sense), episodes of `--episode_len` (200) steps that end in a time
limit (timeouts, no terminals), `--transitions` (100,000) rows in all. d3rlpy keeps
episode_len - 1 transitions of a timed-out episode (the last row has no next observation), so
100,000 rows give 99,500 sampleable transitions. The data only has to be plausible: the
throughput of a gradient step does not depend on it.

Actions. d3rlpy's CQL policy is a tanh-squashed Gaussian with outputs in [-1, 1], and its CQL
penalty draws its random actions from U[-1, 1]; without an action scaler, dataset actions must
therefore already lie in [-1, 1]. `--action_scaler none` (the default) stores the torques
divided by 2; `--action_scaler minmax` stores them in [-2, 2] and passes
`MinMaxActionScaler(minimum=-2, maximum=2)` (given explicitly, so d3rlpy does not fit it with a
Python loop over every transition). The scaler only adds two element-wise ops per batch.

Algorithm. `d3rlpy.algos.CQLConfig` with d3rlpy's defaults except the flags here: batch size
(256), encoder hidden units for actor and critics (256, 256, ReLU, which is d3rlpy's default),
`n_action_samples` (10, its default) and `n_critics` (2, its default). Learning rates (actor
1e-4, critic 3e-4, temperature 1e-4, alpha 1e-4), gamma 0.99, tau 0.005, conservative weight 5,
alpha threshold 10, initial temperature and alpha 1, Lagrangian alpha and deterministic backup
are all d3rlpy's defaults. Everything runs on the CPU in fp32; `compile_graph` is CUDA-only in
d3rlpy, so there is no compiled path to time.

What is timed. Setup (building the dataset, then `CQLConfig(...).create()` and
`build_with_dataset`, which makes the networks and optimizers) and the first gradient step
(torch's lazy initialisation) are reported apart. Then `--warmup` steps are run and dropped, and
each mode in `--modes` runs `--steps` gradient steps on the same algorithm object:

* loop:   `batch = dataset.sample_transition_batch(batch_size); algo.update(batch)`, the loop
          `fit` runs inside, without its logger, progress bar and model saving. d3rlpy's
          sampler builds a batch with a Python loop over `batch_size` transitions, so sampling
          is part of the cost a user pays; `sample_ms` reports it on its own.
* update: `algo.update(batch)` on `--presampled` (32) batches sampled beforehand and reused in
          turn: the gradient step alone (numpy-to-torch conversion included), an upper bound.
* fit:    `algo.fit(dataset, n_steps=steps, n_steps_per_epoch=steps)` with d3rlpy's defaults
          (CSV logger under a temporary folder, tqdm progress bar on stderr, model saved at the
          end of the epoch). `fit_steps_per_s` is `steps` over the whole call;
          `fit_inner_steps_per_s` uses fit's per-step callback to leave out the call's setup
          and end-of-epoch work. `fit_overhead_pct` compares the whole call with `loop`.

grad_steps_per_s (the headline) is `loop`'s when it ran, the honest rate of a user's own
training loop; `fit` is what `d3rlpy`'s one-line API gives. Peak RSS is `ru_maxrss` of this
process; `<mode>_cpu_per_wall` (process CPU seconds per wall second) and the load averages
show whether other processes were competing for the cores. Torch uses its default number of
intra-op threads (the number of cores) unless `--threads` is given.

Measured on the shared 2-core VM (d3rlpy 2.8.1, torch 2.13.0+cpu), with load averages of 4 to 7
from other jobs the whole time: with `--threads 1`, 5.3-6.5 grad steps/s (loop), 5.8-7.3
(update), 6.5-6.8 (fit), at 0.6-0.7 CPU s per wall s; with torch's default 2 threads, only
1.2-1.5 grad steps/s in every mode. On an oversubscribed machine torch's two threads stall
each other at every parallel region, so the default-thread figure is not what an idle machine
would give. Peak RSS about 510 MiB; setup 1.5-1.8 s.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import sys
import tempfile
import time
from typing import Any

RESULT_MARKER = "RESULT_JSON "
MODES = ("loop", "update", "fit")


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def peak_rss_mib() -> float:
    # Linux reports ru_maxrss in KiB.
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def pendulum_arrays(rows: int, episode_len: int, seed: int) -> dict[str, Any]:
    """Pendulum-v1 rollouts of a uniformly random policy, all episodes stepped at once.

    Returns flat arrays in time order per episode: observations (rows, 3), torques (rows, 1) in
    [-2, 2], rewards (rows,), timeouts (rows,) with a 1 at every episode's last row."""
    import numpy as np

    if rows % episode_len:
        raise ValueError(f"--transitions ({rows}) must be a multiple of --episode_len")
    episodes = rows // episode_len
    rng = np.random.default_rng(seed)
    g, m, length, dt, max_speed, max_torque = 10.0, 1.0, 1.0, 0.05, 8.0, 2.0
    th = rng.uniform(-np.pi, np.pi, episodes)
    th_dot = rng.uniform(-1.0, 1.0, episodes)
    obs = np.empty((episodes, episode_len, 3), np.float32)
    torque = rng.uniform(-max_torque, max_torque, (episodes, episode_len)).astype(np.float32)
    reward = np.empty((episodes, episode_len), np.float32)
    for t in range(episode_len):
        obs[:, t] = np.stack([np.cos(th), np.sin(th), th_dot], axis=1)
        u = torque[:, t].astype(np.float64)
        angle = ((th + np.pi) % (2 * np.pi)) - np.pi
        reward[:, t] = -(angle**2 + 0.1 * th_dot**2 + 0.001 * u**2)
        th_dot = th_dot + (3 * g / (2 * length) * np.sin(th) + 3.0 / (m * length**2) * u) * dt
        th_dot = np.clip(th_dot, -max_speed, max_speed)
        th = th + th_dot * dt
    timeouts = np.zeros((episodes, episode_len), np.float32)
    timeouts[:, -1] = 1.0
    return {
        "observations": obs.reshape(rows, 3),
        "torques": torque.reshape(rows, 1),
        "rewards": reward.reshape(rows),
        "timeouts": timeouts.reshape(rows),
    }


def build_dataset(args: argparse.Namespace) -> tuple[Any, Any]:
    """The MDPDataset and the action scaler to give CQL (None for --action_scaler none)."""
    import numpy as np
    from d3rlpy.constants import ActionSpace
    from d3rlpy.dataset import MDPDataset
    from d3rlpy.preprocessing import MinMaxActionScaler

    arrays = pendulum_arrays(args.transitions, args.episode_len, args.seed)
    if args.action_scaler == "minmax":
        actions = arrays["torques"]
        scaler = MinMaxActionScaler(minimum=np.array([-2.0]), maximum=np.array([2.0]))
    else:
        actions = arrays["torques"] / 2.0  # already in the policy's [-1, 1]
        scaler = None
    dataset = MDPDataset(
        observations=arrays["observations"],
        actions=actions,
        rewards=arrays["rewards"],
        terminals=np.zeros_like(arrays["timeouts"]),
        timeouts=arrays["timeouts"],
        action_space=ActionSpace.CONTINUOUS,
        action_size=1,
    )
    return dataset, scaler


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def timed_steps(step, count: int) -> float:
    start = time.perf_counter()
    for _ in range(count):
        step()
    return time.perf_counter() - start


def time_update(algo: Any, dataset: Any, batch_size: int, steps: int, presampled: int) -> float:
    """Seconds for `steps` calls of `algo.update` on `presampled` batches sampled beforehand."""
    batches = [dataset.sample_transition_batch(batch_size) for _ in range(presampled)]
    start = time.perf_counter()
    for step in range(steps):
        algo.update(batches[step % presampled])
    return time.perf_counter() - start


def time_fit(algo: Any, dataset: Any, steps: int) -> tuple[float, float | None]:
    """Seconds for one `algo.fit` call of `steps` steps (one epoch), and the rate between its
    first and last step as fit's per-step callback sees it (None for a single step)."""
    from d3rlpy.logging import FileAdapterFactory

    stamps: list[float] = []

    def callback(algo_: Any, epoch: int, total_step: int) -> None:
        if total_step in (1, steps):
            stamps.append(time.perf_counter())

    with tempfile.TemporaryDirectory() as log_dir:
        start = time.perf_counter()
        algo.fit(
            dataset,
            n_steps=steps,
            n_steps_per_epoch=steps,
            logger_adapter=FileAdapterFactory(root_dir=log_dir),
            callback=callback,
        )
        seconds = time.perf_counter() - start
    inner_rate = (steps - 1) / (stamps[-1] - stamps[0]) if steps > 1 else None
    return seconds, inner_rate


def run(args: argparse.Namespace) -> dict[str, Any]:
    import_start = time.perf_counter()
    import d3rlpy
    import numpy as np
    import torch
    from d3rlpy.models.encoders import VectorEncoderFactory

    import_s = time.perf_counter() - import_start
    load_start = os.getloadavg()
    default_threads = torch.get_num_threads()
    if args.threads:
        torch.set_num_threads(args.threads)
    d3rlpy.seed(args.seed)

    start = time.perf_counter()
    dataset, action_scaler = build_dataset(args)
    dataset_s = time.perf_counter() - start
    log(
        f"dataset: {dataset.transition_count} transitions in {len(dataset.episodes)} episodes "
        f"({dataset_s:.1f} s)"
    )

    start = time.perf_counter()
    encoder = VectorEncoderFactory(hidden_units=list(args.hidden), activation="relu")
    config = d3rlpy.algos.CQLConfig(
        batch_size=args.batch_size,
        actor_encoder_factory=encoder,
        critic_encoder_factory=encoder,
        n_action_samples=args.n_action_samples,
        n_critics=args.n_critics,
        action_scaler=action_scaler,
    )
    algo = config.create(device="cpu:0")
    algo.build_with_dataset(dataset)
    setup_s = time.perf_counter() - start

    batch_size = config.batch_size
    start = time.perf_counter()
    algo.update(dataset.sample_transition_batch(batch_size))
    first_step_s = time.perf_counter() - start

    def loop_step() -> None:
        algo.update(dataset.sample_transition_batch(batch_size))

    warmup_s = timed_steps(loop_step, args.warmup)
    log(f"setup {setup_s:.2f} s, first step {first_step_s:.3f} s, warmup {warmup_s:.2f} s")

    result: dict[str, Any] = {}
    # Sampling alone (Python loop over the batch, then numpy stacking).
    sample_count = 200
    sample_s = timed_steps(lambda: dataset.sample_transition_batch(batch_size), sample_count)
    result["sample_ms"] = 1000 * sample_s / sample_count

    for mode in args.modes:
        cpu_start = cpu_seconds()
        if mode == "loop":
            seconds = timed_steps(loop_step, args.steps)
        elif mode == "update":
            seconds = time_update(algo, dataset, batch_size, args.steps, args.presampled)
        else:
            seconds, inner_rate = time_fit(algo, dataset, args.steps)
            if inner_rate is not None:
                result["fit_inner_steps_per_s"] = inner_rate
        result[f"{mode}_s"] = seconds
        result[f"{mode}_steps_per_s"] = args.steps / seconds
        # CPU seconds per wall second: about the thread count on an idle machine, lower when
        # other processes take the cores (then the rate is not this library's alone).
        result[f"{mode}_cpu_per_wall"] = (cpu_seconds() - cpu_start) / result[f"{mode}_s"]
        log(
            f"{mode}: {result[mode + '_steps_per_s']:.1f} grad steps/s "
            f"(cpu/wall {result[mode + '_cpu_per_wall']:.2f}, load {os.getloadavg()[0]:.2f})"
        )

    if "loop" in args.modes and "fit" in args.modes:
        loop_rate, fit_rate = result["loop_steps_per_s"], result["fit_steps_per_s"]
        result["fit_overhead_pct"] = 100 * (loop_rate / fit_rate - 1)
    headline = next(m for m in ("loop", "update", "fit") if m in args.modes)

    # The latest losses, to show the run is sane (finite, moving).
    metrics = algo.update(dataset.sample_transition_batch(batch_size))

    return {
        "library": "d3rlpy",
        "algo": "CQL",
        "grad_steps_per_s": result[f"{headline}_steps_per_s"],
        "headline_mode": headline,
        **result,
        "setup_s": setup_s,
        "first_step_s": first_step_s,
        "dataset_s": dataset_s,
        "import_s": import_s,
        "peak_rss_mib": peak_rss_mib(),
        "torch_threads": torch.get_num_threads(),
        "torch_default_threads": default_threads,
        "torch_interop_threads": torch.get_num_interop_threads(),
        "last_metrics": {k: float(v) for k, v in metrics.items()},
        "config": {
            "steps": args.steps,
            "warmup": args.warmup,
            "modes": list(args.modes),
            "batch_size": batch_size,
            "hidden": list(args.hidden),
            "activation": "relu",
            "n_action_samples": config.n_action_samples,
            "n_critics": config.n_critics,
            "actor_learning_rate": config.actor_learning_rate,
            "critic_learning_rate": config.critic_learning_rate,
            "temp_learning_rate": config.temp_learning_rate,
            "alpha_learning_rate": config.alpha_learning_rate,
            "gamma": config.gamma,
            "tau": config.tau,
            "conservative_weight": config.conservative_weight,
            "alpha_threshold": config.alpha_threshold,
            "soft_q_backup": config.soft_q_backup,
            "max_q_backup": config.max_q_backup,
            "action_scaler": args.action_scaler,
            "rows": args.transitions,
            "transitions": int(dataset.transition_count),
            "episode_len": args.episode_len,
            "presampled": args.presampled,
            "seed": args.seed,
            "device": "cpu",
        },
        "versions": {
            "d3rlpy": d3rlpy.__version__,
            "torch": torch.__version__,
            "numpy": np.__version__,
            "python": platform.python_version(),
        },
        "machine": {
            "platform": platform.platform(),
            "cpu_count": os.cpu_count(),
            # 1-minute load averages: above cpu_count, others were competing for the cores.
            "loadavg_start": load_start[0],
            "loadavg_end": os.getloadavg()[0],
        },
    }


def int_list(text: str) -> list[int]:
    return [int(item) for item in text.split(",") if item.strip()]


def mode_list(text: str) -> list[str]:
    modes = [item.strip() for item in text.split(",") if item.strip()]
    unknown = sorted(set(modes) - set(MODES))
    if unknown or not modes:
        raise argparse.ArgumentTypeError(f"modes must be among {', '.join(MODES)}")
    return modes


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n", 1)[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    add = parser.add_argument
    add("--steps", type=int, default=2000, help="timed gradient steps per mode")
    add("--warmup", type=int, default=20, help="untimed gradient steps after the first one")
    add(
        "--modes",
        type=mode_list,
        default="loop,update,fit",
        help="comma-separated: loop, update, fit",
    )
    add("--batch_size", type=int, default=256)
    add(
        "--hidden",
        type=int_list,
        default="256,256",
        help="encoder hidden units (actor and critics)",
    )
    add("--n_action_samples", type=int, default=10)
    add("--n_critics", type=int, default=2)
    add(
        "--transitions",
        type=int,
        default=100_000,
        help="dataset rows (a multiple of --episode_len)",
    )
    add("--episode_len", type=int, default=200)
    add("--action_scaler", choices=("none", "minmax"), default="none")
    add("--presampled", type=int, default=32, help="batches reused in turn by the update mode")
    add("--threads", type=int, default=0, help="torch intra-op threads; 0 keeps torch's default")
    add("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    sizes = (args.steps, args.batch_size, args.n_action_samples, args.n_critics, args.presampled)
    if min(sizes) <= 0:
        parser.error(
            "--steps, --batch_size, --n_action_samples, --n_critics and --presampled "
            "must be positive"
        )
    if args.episode_len < 2 or args.transitions % args.episode_len:
        parser.error("--transitions must be a multiple of --episode_len (at least 2)")
    if args.warmup < 0 or args.threads < 0:
        parser.error("--warmup and --threads must not be negative")
    return args


def main(argv: list[str] | None = None) -> None:
    result = run(parse_args(argv))
    print(RESULT_MARKER + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
