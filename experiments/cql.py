"""Train CQL offline on an RLDS dataset, several seeds vmapped into one program, and compare with
behaviour cloning on the same data.

    python experiments/collect.py --policy=runs/sac-medium --mixture=medium --data_dir=data
    python experiments/cql.py --config.dataset.path=data/pendulum_v1/medium/1.0.0
    python experiments/cql.py --config=experiments/configs/cql.py:halfcheetah \\
        --config.dataset.path=d4rl_mujoco_halfcheetah/v2-medium --config.dataset.data_dir=~/tfds

Training runs in compiled chunks of gradient steps on the dataset held on the device; each chunk
ends with an evaluation of the deterministic policy in the JAX environment, inside the same program.
Between chunks the host loop checkpoints; a restarted script resumes from the newest checkpoint and
ends where an uninterrupted run would. `summary.json` reports `final_eval_return`, the D4RL
`normalized_score`, the dataset's behaviour score and (unless --config.bc.enabled=false) behaviour
cloning's score on the same data and seeds.
"""

from __future__ import annotations

import os
import signal
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import numpy as np  # noqa: E402
from absl import app, flags, logging  # noqa: E402
from ml_collections import config_flags  # noqa: E402

from algos import bc, cql, sac  # noqa: E402
from experiments._common import (  # noqa: E402
    REPO_ROOT,
    block_length,
    build_config,
    check_resumable,
    check_run_settings,
    chunk_lengths,
    fail,
)
from jaxrl.checkpoint import Checkpointer  # noqa: E402
from jaxrl.config import ConfigError  # noqa: E402
from jaxrl.data import (  # noqa: E402
    CorruptDatasetError,
    DatasetNotFoundError,
    load_dataset_info,
    load_transitions,
)
from jaxrl.logging import MetricsSink, RunDirectory, to_jsonable  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file(
    "config",
    os.path.join(REPO_ROOT, "experiments", "configs", "cql.py:pendulum"),
    "Config file and preset (pendulum, halfcheetah); override fields with --config.X=V.",
    lock_config=True,
)
_WORKDIR = flags.DEFINE_string(
    "workdir", None, "Run directory; an existing one is resumed. Default: runs/cql-<env>-<time>."
)
_NUM_SEEDS = flags.DEFINE_integer("num_seeds", 3, "Independent seeds, vmapped in one program.")
_SEED = flags.DEFINE_integer("seed", 0, "Base seed; run i uses fold i of PRNGKey(seed).")
_KILL_AFTER_CHUNK = flags.DEFINE_integer(
    "kill_after_chunk", None, "Testing aid: SIGKILL this process right after chunk K's checkpoint."
)


def load_dataset(flat, config: cql.Config) -> tuple[cql.Dataset, dict]:
    """The dataset on device and its metadata; every problem ends the script with one line."""
    section = flat.dataset
    if not section.path:
        fail(
            "config.dataset.path is required: a dataset directory printed by "
            "experiments/collect.py (e.g. --config.dataset.path=data/pendulum_v1/medium/1.0.0) "
            "or a TFDS name with --config.dataset.data_dir"
        )
    path = os.path.expanduser(section.path)
    data_dir = os.path.expanduser(section.data_dir) if section.data_dir else None
    try:
        transitions = load_transitions(path, split=section.split, data_dir=data_dir)
        info = load_dataset_info(path, data_dir=data_dir)
    except (DatasetNotFoundError, CorruptDatasetError, ImportError) as error:
        fail(f"config.dataset.path: {error}")
    metadata = dict(info.get("metadata") or {})
    env_name = metadata.get("env_name")
    if env_name and env_name != config.env_name:
        fail(
            f"config.env_name: the dataset {path} was collected on {env_name!r}, not "
            f"{config.env_name!r}; set --config.env_name={env_name}"
        )
    try:
        data = cql.device_dataset(transitions, config)
    except ValueError as error:
        fail(f"config.dataset.path ({path}): {error}")
    return data, metadata


def reference_returns(flat, metadata: dict) -> tuple[float | None, float | None]:
    random_return = flat.reference.random_return
    expert_return = flat.reference.expert_return
    if random_return is None:
        random_return = metadata.get("reference_min_return")
    if expert_return is None:
        expert_return = metadata.get("reference_max_return")
    if (random_return is None) != (expert_return is None) or random_return == expert_return:
        fail(
            "config.reference: give both random_return and expert_return (different values), "
            "or neither to use the dataset's metadata"
        )
    return random_return, expert_return


def main(argv: list[str]) -> None:
    logging.set_verbosity(logging.WARNING)
    if len(argv) > 1:
        fail(f"unexpected arguments {argv[1:]}; settings are flags, e.g. --config.cql_alpha=1")
    flat = _CONFIG.value
    config = build_config(cql.Config, flat)
    run = flat.run
    num_seeds = _NUM_SEEDS.value
    if num_seeds < 1:
        fail(f"--num_seeds must be >= 1, got {num_seeds}")
    check_run_settings(run, ("num_chunks", "checkpoint_every", "keep_checkpoints", "log_every"))
    bc_config = None
    if flat.bc.enabled:
        try:
            bc_config = bc.Config(
                env_name=config.env_name,
                num_updates=flat.bc.num_updates,
                batch_size=config.batch_size,
                learning_rate=flat.bc.learning_rate,
                hidden_sizes=config.hidden_sizes,
                activation=config.activation,
                eval_episodes=config.eval_episodes,
            )
        except ConfigError as error:
            fail(f"config.bc.{error}")
    data, metadata = load_dataset(flat, config)
    random_return, expert_return = reference_returns(flat, metadata)

    def score(value: float) -> float | None:
        if random_return is None:
            return None
        return float(cql.normalized_score(value, random_return, expert_return))

    workdir = _WORKDIR.value or os.path.join(
        "runs", f"cql-{config.env_name}-{time.strftime('%Y%m%d-%H%M%S')}"
    )
    run_dir = RunDirectory(workdir)
    resolved = to_jsonable({**flat.to_dict(), "num_seeds": num_seeds, "seed": _SEED.value})
    check_resumable(run_dir.saved_config(), resolved, workdir)
    run_dir.write_config(resolved)

    keys = jax.random.split(jax.random.PRNGKey(_SEED.value), num_seeds)
    init_keys, eval_keys, bc_keys = jax.vmap(lambda k: jax.random.split(k, 3), out_axes=1)(keys)
    hparams = jax.tree.map(lambda x: np.broadcast_to(x, (num_seeds,)), config.hparams())
    states = jax.jit(jax.vmap(lambda k, hp: cql.init(config, k, hp)))(init_keys, hparams)

    checkpointer = Checkpointer(
        run_dir.checkpoint_dir, save_every=run.checkpoint_every, keep=run.keep_checkpoints
    )
    done = 0
    if checkpointer.latest_step() is not None:
        states, meta = checkpointer.restore(states)
        done = int(meta["updates"])
        run_dir.truncate_metrics(done)
        print(f"Resuming {workdir} from gradient step {done}/{config.num_updates}.")

    block = block_length(config.num_updates, run.log_every)
    lengths = chunk_lengths(config.num_updates, run.num_chunks, block)
    sink = MetricsSink(
        run_dir,
        total_updates=config.num_updates,
        steps_per_update=1,
        num_runs=num_seeds,
        log_every=block,
        start_update=done,
        per_run=("eval_return",),
        tensorboard=run.tensorboard,
        progress=run.progress,
        description=f"CQL {config.env_name} x{num_seeds} seeds (gradient steps)",
    )
    t0 = time.time()
    compiled = {
        length: jax.jit(
            cql.make_train_chunk(config, length, callback=sink, callback_every=block),
            donate_argnums=0,
        )
        .lower(states, hparams, data, eval_keys)
        .compile()
        for length in set(lengths)
    }
    compile_seconds = time.time() - t0

    start = time.time()
    updates = 0
    for chunk_index, length in enumerate(lengths):
        updates += length
        if updates <= done:
            continue
        chunk_eval_keys = jax.vmap(jax.random.fold_in, in_axes=(0, None))(eval_keys, chunk_index)
        states, metrics = compiled[length](states, hparams, data, chunk_eval_keys)
        returns = np.asarray(metrics["eval_return"])
        row = {"eval_return": returns}
        if random_return is not None:
            row["normalized_score"] = cql.normalized_score(returns, random_return, expert_return)
        sink(updates, row)
        is_last = chunk_index == len(lengths) - 1
        checkpointer.save(chunk_index + 1, states, {"updates": updates}, force=is_last)
        if _KILL_AFTER_CHUNK.value == chunk_index + 1:
            os.kill(os.getpid(), signal.SIGKILL)
    jax.block_until_ready(states)
    sink.close()
    checkpointer.close()
    train_seconds = time.time() - start

    # The final evaluation: the last chunk's episodes again (same keys), so a run resumed after
    # its last chunk reports the same figure.
    final_keys = jax.vmap(jax.random.fold_in, in_axes=(0, None))(eval_keys, len(lengths) - 1)
    eval_returns = np.asarray(
        jax.jit(jax.vmap(sac.make_evaluate(config)))(states, final_keys).mean(axis=-1)
    )
    final_return = float(eval_returns.mean())
    behaviour_return = metadata.get("mean_episode_return")
    summary = {
        "algo": "cql",
        "env": config.env_name,
        "dataset": os.path.expanduser(flat.dataset.path),
        "num_seeds": num_seeds,
        "wall_seconds": round(compile_seconds + train_seconds, 2),
        "compile_seconds": round(compile_seconds, 2),
        "updates": config.num_updates,
        "updates_per_second": round((config.num_updates - done) * num_seeds / train_seconds, 1),
        "dataset_transitions": int(data.size),
        "final_eval_return": final_return,
        "final_eval_return_per_seed": eval_returns.tolist(),
        "normalized_score": score(final_return),
        "behaviour_return": behaviour_return,
        "behaviour_normalized_score": (
            score(behaviour_return) if behaviour_return is not None else None
        ),
        "reference_random_return": random_return,
        "reference_expert_return": expert_return,
        "eval_episodes": config.eval_episodes,
        "resumed_from_update": done,
    }
    if bc_config is not None:
        t0 = time.time()
        bc_states = jax.vmap(lambda k: bc.init(bc_config, k))(bc_keys)
        bc_chunk = jax.jit(bc.make_train_chunk(bc_config, bc_config.num_updates))
        _, bc_metrics = bc_chunk(bc_states, data, final_keys)
        bc_returns = np.asarray(bc_metrics["eval_return"])
        summary.update(
            bc_eval_return=float(bc_returns.mean()),
            bc_eval_return_per_seed=bc_returns.tolist(),
            bc_normalized_score=score(float(bc_returns.mean())),
            bc_seconds=round(time.time() - t0, 2),
        )
    run_dir.write_summary(summary)
    run_dir.write_learning_curve(
        x="update",
        y="eval_return",
        title=f"CQL {config.env_name}",
    )

    def describe(name: str, value: float | None, normalized: float | None) -> str:
        if value is None:
            return f"{name} n/a"
        text = f"{name} {value:.1f}"
        return text + (f" (normalized {normalized:.1f})" if normalized is not None else "")

    print(
        f"CQL {config.env_name}: "
        + ", ".join(
            [
                describe("final_eval_return", final_return, summary["normalized_score"]),
                describe("behaviour", behaviour_return, summary["behaviour_normalized_score"]),
                describe(
                    "behaviour cloning",
                    summary.get("bc_eval_return"),
                    summary.get("bc_normalized_score"),
                ),
            ]
        )
        + f"; {config.num_updates:,} gradient steps x {num_seeds} seeds in "
        f"{summary['wall_seconds']:.0f}s. Run directory: {run_dir.path}"
    )


if __name__ == "__main__":
    app.run(main)
