"""Offline CQL gradient-step throughput on the CPU: our `algos.cql` against d3rlpy's CQL on the
same synthetic Pendulum dataset (README.md)."""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

# The repository root, for `algos` and the harness. The d3rlpy worker runs this file from its own
# venv: at module level nothing but the standard library and the harness is imported.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from experiments.benchmarks import harness  # noqa: E402

ENV_NAME = "Pendulum-v1"
ROWS, EPISODE_LEN, DATA_SEED = 100_000, 200, 0  # 99,500 transitions: 199 per timed-out episode
# Both sides: d3rlpy's CQL defaults, with the Lagrangian conservative weight.
BATCH_SIZE = 256
NUM_CRITICS = 2
NUM_ACTION_SAMPLES = 10
GAMMA = 0.99
TAU = 0.005
ACTOR_LR, CRITIC_LR, TEMPERATURE_LR = 1e-4, 3e-4, 1e-4
CONSERVATIVE_WEIGHT = 5.0
ACTION_GAP_THRESHOLD = 10.0
MULTIPLIER_LR = 1e-4
PRESAMPLED = 32  # batches the d3rlpy `update` mode reuses in turn


def pendulum_arrays(rows: int, episode_len: int, seed: int) -> dict[str, Any]:
    """Pendulum-v1 rollouts of a uniformly random policy (Gymnasium's dynamics), all episodes
    stepped at once: observations (rows, 3), torques (rows, 1) in [-2, 2], rewards (rows,), in
    time order per episode; every episode ends in a time limit."""
    import numpy as np

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
    return {"observations": obs, "torques": torque[..., None], "rewards": reward}


def build_step(params: dict[str, Any]) -> harness.Step:
    """Our side: one call is `updates` gradient steps of every seed in one program, with a no-op
    host callback every `callback_every` steps (where a user logs), as experiments/cql.py builds
    it. The only place that calls into algos/jaxrl."""
    import jax
    import numpy as np

    from algos import cql
    from jaxrl import hparams, loop
    from jaxrl.types import Transition

    config = cql.Config(
        env_name=ENV_NAME,
        batch_size=BATCH_SIZE,
        gamma=GAMMA,
        tau=TAU,
        actor_lr=ACTOR_LR,
        critic_lr=CRITIC_LR,
        alpha_lr=TEMPERATURE_LR,
        init_alpha=1.0,
        autotune_alpha=True,
        num_critics=NUM_CRITICS,
        hidden_sizes=tuple(params["hidden"]),
        activation="relu",
        cql_alpha=CONSERVATIVE_WEIGHT,
        num_action_samples=NUM_ACTION_SAMPLES,
        cql_temperature=1.0,
        lagrangian=True,
        target_action_gap=ACTION_GAP_THRESHOLD,
        cql_alpha_lr=MULTIPLIER_LR,
    )
    start = time.perf_counter()
    # The same rows as d3rlpy's: transitions t -> t + 1 inside each episode, no terminals.
    arrays = pendulum_arrays(ROWS, EPISODE_LEN, DATA_SEED)
    obs, torques, rewards = arrays["observations"], arrays["torques"], arrays["rewards"]
    flat = lambda x: x.reshape(-1, *x.shape[2:])
    rows = Transition(
        obs=flat(obs[:, :-1]),
        action=flat(torques[:, :-1]),  # environment scale: device_dataset maps it to [-1, 1]
        reward=flat(rewards[:, :-1]),
        next_obs=flat(obs[:, 1:]),
        terminated=np.zeros(obs.shape[0] * (EPISODE_LEN - 1), bool),
    )
    data = jax.block_until_ready(cql.device_dataset(rows, config))
    dataset_s = time.perf_counter() - start

    algorithm, seeds, updates = cql.make(config), params["seeds"], params["updates"]
    keys = jax.random.split(jax.random.PRNGKey(0), seeds)
    hps = jax.vmap(lambda _: hparams.hparams(config))(keys)
    states = jax.jit(jax.vmap(algorithm.init))(keys, hps)
    callbacks, last = [0], {}

    def callback(step: Any, metrics: Any) -> None:
        callbacks[0] += 1  # the metrics have arrived on the host

    every = params["callback_every"]
    chunk = loop.make_chunk(algorithm.update, updates, log_every=every, callback=callback)
    jitted = jax.jit(chunk, donate_argnums=0)
    compiled, compile_s = harness.compile_timed(jitted, states, data, hps)

    def call(states: Any, index: int) -> tuple[Any, dict[str, float]]:
        states, last["metrics"] = jax.block_until_ready(compiled(states, data, hps))
        return states, {"grad_steps": seeds * updates}

    def after(states: Any, result: dict[str, Any]) -> dict[str, Any]:
        metrics = {key: float(value.mean()) for key, value in last["metrics"].items()}
        return {"host_callbacks": callbacks[0], "last_metrics": metrics}

    info = {"dataset_s": dataset_s, "transitions": int(data.obs.shape[0])}
    return harness.Step(call, states, compile_s=compile_s, info=info, after=after)


def build_d3rlpy_step(params: dict[str, Any]) -> harness.Step:
    """d3rlpy's CQL (its defaults but for the shared settings), run eagerly in PyTorch on the
    CPU. compile_s is its setup (networks and optimizers). The first step (torch's lazy
    initialisation) and `d3rlpy_warmup` more run here, untimed; then one call is one gradient
    step (`loop`: sample with d3rlpy's sampler, then update, as `fit` does inside; `update`:
    presampled batches) or one whole `fit` of the timed steps (`fit`)."""
    import d3rlpy
    import numpy as np
    import torch
    from d3rlpy.constants import ActionSpace
    from d3rlpy.dataset import MDPDataset
    from d3rlpy.logging import FileAdapterFactory
    from d3rlpy.models.encoders import VectorEncoderFactory

    default_threads = torch.get_num_threads()
    if params["threads"]:
        torch.set_num_threads(params["threads"])
    d3rlpy.seed(DATA_SEED)
    start = time.perf_counter()
    arrays = pendulum_arrays(ROWS, EPISODE_LEN, DATA_SEED)
    timeouts = np.zeros((ROWS // EPISODE_LEN, EPISODE_LEN), np.float32)
    timeouts[:, -1] = 1.0
    dataset = MDPDataset(
        observations=arrays["observations"].reshape(ROWS, 3),
        actions=arrays["torques"].reshape(ROWS, 1) / 2.0,  # the policy's [-1, 1]: no scaler
        rewards=arrays["rewards"].reshape(ROWS),
        terminals=np.zeros(ROWS, np.float32),
        timeouts=timeouts.reshape(ROWS),
        action_space=ActionSpace.CONTINUOUS,
        action_size=1,
    )
    dataset_s = time.perf_counter() - start

    start = time.perf_counter()
    encoder = VectorEncoderFactory(hidden_units=list(params["hidden"]), activation="relu")
    algo = d3rlpy.algos.CQLConfig(
        batch_size=BATCH_SIZE,
        actor_encoder_factory=encoder,
        critic_encoder_factory=encoder,
        n_action_samples=NUM_ACTION_SAMPLES,
        n_critics=NUM_CRITICS,
    ).create(device="cpu:0")
    algo.build_with_dataset(dataset)
    setup_s = time.perf_counter() - start

    sample = lambda: dataset.sample_transition_batch(BATCH_SIZE)
    start = time.perf_counter()
    algo.update(sample())
    first_step_s = time.perf_counter() - start
    for _ in range(params["d3rlpy_warmup"]):
        algo.update(sample())
    start = time.perf_counter()
    batches = [sample() for _ in range(PRESAMPLED)]
    sample_ms = 1000 * (time.perf_counter() - start) / PRESAMPLED  # d3rlpy's Python sampler

    mode, steps, stamps = params["mode"], params["steps"], []
    if mode == "loop":
        call = lambda state, index: (algo.update(sample()), {"grad_steps": 1})
    elif mode == "update":
        call = lambda state, index: (algo.update(batches[index % PRESAMPLED]), {"grad_steps": 1})
    else:  # d3rlpy's one-line API, with its defaults: CSV logger, progress bar, saved model

        def call(state: Any, index: int) -> tuple[Any, dict[str, float]]:
            with tempfile.TemporaryDirectory() as log_dir:
                algo.fit(
                    dataset,
                    n_steps=steps,
                    n_steps_per_epoch=steps,
                    logger_adapter=FileAdapterFactory(root_dir=log_dir),
                    callback=lambda algo, epoch, total: stamps.append(time.perf_counter()),
                )
            return None, {"grad_steps": steps}

    def after(state: Any, result: dict[str, Any]) -> dict[str, Any]:
        more = {"last_metrics": {k: float(v) for k, v in algo.update(sample()).items()}}
        if len(stamps) > 1:  # fit's rate between its first and last step, without its overheads
            more["fit_inner_steps_per_s"] = (len(stamps) - 1) / (stamps[-1] - stamps[0])
        return more

    info = dict(
        setup_s=setup_s, first_step_s=first_step_s, dataset_s=dataset_s, sample_ms=sample_ms
    )
    info.update(transitions=int(dataset.transition_count), torch_threads=torch.get_num_threads())
    info.update(torch_default_threads=default_threads, d3rlpy=d3rlpy.__version__)
    info["torch"] = torch.__version__
    per_call = steps if mode == "fit" else 1
    return harness.Step(call, steps_per_call=per_call, compile_s=setup_s, info=info, after=after)


def variants(args: argparse.Namespace) -> list[harness.Variant]:
    """Per --hidden cell: ours with 1 seed and with --seeds vmapped (about the same gradient
    steps in all), then d3rlpy per mode and thread count."""
    cell_steps = (
        args.grad_steps * len(args.hidden) if len(args.grad_steps) == 1 else args.grad_steps
    )
    if len(cell_steps) != len(args.hidden):
        raise SystemExit("give one --grad_steps value, or one per --hidden cell")
    rows = []
    for hidden, steps in zip(args.hidden, cell_steps, strict=True):
        group = "x".join(map(str, hidden))
        for seeds in sorted({1, args.seeds} - {0}):
            # Whole blocks between host callbacks, at least one.
            per_run = max(1, steps // seeds // args.callback_every) * args.callback_every
            params = dict(hidden=hidden, seeds=seeds, updates=per_run)
            params["callback_every"] = args.callback_every
            label = "ours, 1 seed" if seeds == 1 else f"ours, {seeds} seeds vmapped"
            rows.append(harness.Variant(group, label, "ours", params))
        for threads in args.d3rlpy_threads if args.d3rlpy_python else []:
            # Several torch threads on a loaded machine can run ~1 step/s: fewer steps there.
            one = threads == 1
            count = steps if one else min(steps, args.multithread_steps)
            warmup = args.d3rlpy_warmup if one else args.multithread_warmup
            name = {0: "default threads", 1: "1 thread"}.get(threads, f"{threads} threads")
            for mode in args.d3rlpy_modes:
                params = dict(hidden=hidden, threads=threads, mode=mode, d3rlpy_warmup=warmup)
                params.update(steps=count, warmup=0)  # its warm-up runs before the first call
                label = f"d3rlpy {mode}, {name}"
                rows.append(harness.Variant(group, label, "d3rlpy", params, args.d3rlpy_python))
    return rows


def add_flags(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    hidden = lambda text: [tuple(map(int, item.split("x"))) for item in text.split(",") if item]
    add("--hidden", type=hidden, default="256x256,64x64", help="cells: hidden sizes")
    add(
        "--grad_steps",
        type=harness.comma_list(int),
        default="200,2000",
        help="gradient steps per call (ours, summed over seeds) and timed (d3rlpy), per cell",
    )
    add("--seeds", type=int, default=4, help="vmapped seeds of the extra ours row (0, 1: none)")
    add("--callback_every", type=harness.positive(int), default=50, help="ours: host callbacks")
    add("--d3rlpy_threads", type=harness.comma_list(int), default="1,0", help="0: torch's default")
    modes = harness.comma_list(str, ("loop", "update", "fit"))
    add("--d3rlpy_modes", type=modes, default="loop", help="loop, update, fit: a row each")
    add("--d3rlpy_warmup", type=int, default=20, help="untimed d3rlpy steps after the first")
    add("--multithread_steps", type=harness.positive(int), default=50, help="d3rlpy, >1 thread")
    add("--multithread_warmup", type=int, default=5, help="d3rlpy, >1 thread")


def note(args: argparse.Namespace) -> str:
    return (
        "ours: calls of one compiled chunk; d3rlpy: one timed loop after its untimed first and "
        "warm-up steps, its compile s is its setup. Ratios divide a row by a d3rlpy row of the "
        "same hidden size."
    )


WORKLOAD = harness.Workload(
    module=globals(),
    builders={"ours": build_step, "d3rlpy": build_d3rlpy_step},
    variants=variants,
    columns=[
        harness.Column("grad steps/s", "grad_steps_per_s", ".1f"),
        harness.Column("grad steps timed", "timed_grad_steps", ".0f"),
    ],
    peers={"d3rlpy": None},
    defaults=dict(steps=2, warmup=1, steps_help="ours: calls of the compiled chunk per worker"),
    add_flags=add_flags,
    note=note,
)

if __name__ == "__main__":
    harness.main(WORKLOAD)
