"""The learner contract and the loops every algorithm runs in.

Every `algos/<name>.py` builds its algorithm as three pure functions (optax-style):

    algorithm = ppo.make(config)
    state = algorithm.init(key, hparams)                       # the state carries key and step
    state, metrics = algorithm.update(state, inputs, hparams)  # one update of one run
    metrics = algorithm.evaluate(state, key)

`inputs` is None when the environment runs inside the update (PPO, SAC), a device dataset shared
by every update (CQL, BC), the reference parameters (GRPO), or one host batch per update (SFT,
DPO). The combinators below are the only loops: `make_chunk` compiles N updates of a batch of runs
(seeds x sweep points) with metrics streamed to the host from inside, and `make_train` is the whole
run as one program (PureJaxRL's `make_train`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax.experimental import io_callback

from jaxrl.hparams import HParams

State = Any
Metrics = dict[str, jax.Array]


class Algorithm(NamedTuple):
    """An algorithm as pure functions of one run (no runs axis; the loops add it)."""

    init: Callable[[jax.Array, HParams], State]
    update: Callable[[State, Any, HParams], tuple[State, Metrics]]
    evaluate: Callable[[State, jax.Array], Metrics] | None = None


def make_chunk(
    update: Callable[[State, Any, HParams], tuple[State, Metrics]],
    num_steps: int,
    *,
    log_every: int = 1,
    callback: Callable[[jax.Array, Metrics], None] | None = None,
    runs_axis: bool = True,
    scan_inputs: bool = False,
    keep_going: Callable[[jax.Array], bool] | None = None,
    check_every: int | None = None,
) -> Callable[[State, Any, HParams], tuple[State, Metrics]]:
    """`chunk(states, inputs, hparams) -> (states, metrics)`: `num_steps` updates in one program.

    With `runs_axis`, `states` and `hparams` carry a leading axis over runs (seeds and/or sweep
    points) and the update is vmapped inside the scan; `inputs` are shared by the runs. With
    `scan_inputs`, `inputs` has a leading [num_steps] axis and update i gets slice i (one host
    batch per update); otherwise every update gets all of `inputs`.

    The updates run in pieces of `check_every` updates (default `log_every`; it must divide
    `log_every`, which must divide `num_steps`). After each piece, `callback(step, metrics)` runs
    on the host with the piece's mean metrics of every run: one host call per piece, not per
    update, which matters when an update costs less than the call (one SAC environment step).
    `step` is the state's step counter after the piece; a metrics row (`log_every` updates) is
    the mean of its pieces (`jaxrl.logging.MetricsSink` averages them). The returned metrics are
    those piece means, stacked [num_steps // check_every, (runs,) ...].

    With `keep_going`, the host is asked `keep_going(step)` before each piece, and a piece it
    declines is skipped (the state passes through; its metrics are zeros and not streamed): this
    is how a run stops within seconds of Ctrl-C (after the running piece) instead of at the end
    of a long chunk, and how a run resumed between chunk boundaries stops at the next one. The
    caller reads where the chunk stopped from the state's step.
    """
    check_every = log_every if check_every is None else check_every
    if num_steps % log_every:
        raise ValueError(f"num_steps ({num_steps}) must be a multiple of log_every ({log_every})")
    if log_every % check_every:
        raise ValueError(
            f"log_every ({log_every}) must be a multiple of check_every ({check_every})"
        )
    num_pieces = num_steps // check_every
    one_update = jax.vmap(update, in_axes=(0, None, 0)) if runs_axis else update

    def run_piece(states, piece_inputs, hparams):
        def body(states, step_inputs):
            return one_update(states, step_inputs, hparams)

        if scan_inputs:
            states, metrics = jax.lax.scan(body, states, piece_inputs)
        else:
            states, metrics = jax.lax.scan(
                lambda s, _: body(s, piece_inputs), states, None, length=check_every
            )
        metrics = jax.tree.map(lambda m: m.mean(axis=0), metrics)
        if callback is not None:
            jax.debug.callback(callback, step_of(states), metrics)
        return states, metrics

    def step_of(states):
        return states.step[0] if runs_axis else states.step

    def piece(states, piece_inputs, hparams):
        if keep_going is None:
            return run_piece(states, piece_inputs, hparams)
        go = io_callback(keep_going, jax.ShapeDtypeStruct((), jnp.bool_), step_of(states))
        shapes = jax.eval_shape(run_piece, states, piece_inputs, hparams)[1]

        def skip(states, piece_inputs, hparams):
            return states, jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype), shapes)

        return jax.lax.cond(go, run_piece, skip, states, piece_inputs, hparams)

    def chunk(states: State, inputs: Any, hparams: HParams) -> tuple[State, Metrics]:
        if scan_inputs:
            pieces = jax.tree.map(
                lambda x: x.reshape((num_pieces, check_every, *x.shape[1:])), inputs
            )
            return jax.lax.scan(lambda s, b: piece(s, b, hparams), states, pieces)
        return jax.lax.scan(lambda s, _: piece(s, inputs, hparams), states, None, length=num_pieces)

    return chunk


def make_train(
    algorithm: Algorithm,
    num_steps: int,
    final_evaluation: bool = True,
    default_hparams: HParams | None = None,
) -> Callable[..., tuple[State, Metrics]]:
    """`train(key, hparams=default_hparams, inputs=None) -> (state, metrics)`: a whole run of one
    seed as one program (PureJaxRL's `make_train`): init, `num_steps` updates, then (if
    `final_evaluation`) the algorithm's evaluation, each of its metrics averaged (over episodes,
    say) and added under its own name, e.g. `eval_return`. Training metrics have one value per
    update; vmap `train` over keys (and hparams) for many seeds (and sweep points) in one
    program."""
    chunk = make_chunk(algorithm.update, num_steps, runs_axis=False)

    def train(
        key: jax.Array, hparams: HParams | None = None, inputs: Any = None
    ) -> tuple[State, Metrics]:
        hparams = default_hparams if hparams is None else hparams
        init_key, eval_key = jax.random.split(key)
        state = algorithm.init(init_key, hparams)
        state, metrics = chunk(state, inputs, hparams)
        if final_evaluation and algorithm.evaluate is not None:
            evaluated = algorithm.evaluate(state, eval_key)
            metrics |= {name: jnp.mean(value) for name, value in evaluated.items()}
        return state, metrics

    return train


def run_keys(seed: int, num_runs: int) -> tuple[jax.Array, jax.Array]:
    """Per-run (init, evaluation) keys: run i's come from split i of `PRNGKey(seed)`. Every
    script and every tool that rebuilds a run's state (collect.py, compare.py) uses this."""
    keys = jax.random.split(jax.random.PRNGKey(seed), num_runs)
    init_keys, eval_keys = jax.vmap(jax.random.split, out_axes=1)(keys)
    return init_keys, eval_keys


def zeros_step() -> jax.Array:
    """A fresh step counter (int32 scalar)."""
    return jnp.zeros((), jnp.int32)
