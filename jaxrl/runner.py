"""The run loop every trainer drives its algorithm with (the scripts call the trainers).

A script validates everything (its config, its data, its model), then hands the runner a `Job`:
how to make fresh states, how to build a compiled chunk of updates, and where each update's inputs
come from. The runner does the rest the same way for every algorithm:

  run directory (nothing written before the settings are valid; a directory is only resumed with
  the settings it was started with) -> restore the newest checkpoint, if any, and cut the metrics
  logged after it -> compile each distinct chunk length ahead -> the chunk loop, streaming metrics
  from inside the compiled program and checkpointing between chunks -> the summary's common fields.

A run killed at any moment (SIGKILL included) and started again ends where an uninterrupted run
ends: the state resumes from the newest checkpoint and every metric row logged after it is
dropped, so the re-run logs it again. Ctrl-C (SIGINT) or SIGTERM stops after the running update
(or piece of `Job.check_every` updates, for updates that cost less than asking) with a checkpoint
and a line telling how to resume, whatever `run.log_every` is; a second one stops at once.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
import json
import os
import signal
import socket
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any, NoReturn

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from jaxrl import host, hparams, interrupts, loop, retention
from jaxrl.checkpoint import Checkpointer, DamagedCheckpointError
from jaxrl.config import ConfigError, InputError, check_run_settings, fail
from jaxrl.interrupts import Stopped
from jaxrl.logging import MetricsSink, RunDirectory, to_jsonable


@contextlib.contextmanager
def config_errors() -> Iterator[None]:
    """A check of the config against what only the run knows (the devices, the game): a
    `ConfigError` raised inside stops the run as `fail("config.<field>: ...")`, one line."""
    try:
        yield
    except ConfigError as error:
        fail(f"config.{error}")


@dataclasses.dataclass
class RunRecord:
    """What one run (a script's, or one trainer call's) has reached, for the lines that end it:
    the run directory it opened (where a failing function's traceback is logged) and the chunk
    that failed."""

    run_dir: RunDirectory | None = None
    failed: tuple[int, int, int | None] | None = None  # first and last update, checkpoint kept


_record: contextvars.ContextVar[RunRecord | None] = contextvars.ContextVar(
    "jaxrl_run_record", default=None
)


@contextlib.contextmanager
def run_scope() -> Iterator[RunRecord]:
    """The scope of one run: its `RunRecord`, forgotten when the scope ends, so that nothing
    carries from one trainer call to the next. A scope inside another (a script's, around the
    trainer it calls) shares the outer one's record."""
    outer = _record.get()
    if outer is not None:
        yield outer
        return
    token = _record.set(RunRecord())
    try:
        yield _record.get()
    finally:
        _record.reset(token)


@contextlib.contextmanager
def host_failures_as_input_errors() -> Iterator[RunRecord]:
    """One run's scope (`run_scope`), in which a user's function that failed inside a compiled
    program (a host callback), reaching here as the exception JAX wraps it in, becomes the one
    line `report_host_failure` says."""
    with run_scope() as record:
        try:
            yield record
        except InputError:
            raise
        except Exception:
            failure = host.take_failure()  # user code called from inside a compiled program
            if failure is None:
                raise
            report_host_failure(failure, record)


# --------------------------------------------------------------------------------------------
# The run directory's settings


def check_same_script(run_dir: RunDirectory, workdir: str) -> None:
    """A run directory is resumed only by the script that started it (versions.json records its
    command line): another script's settings differ in some field, and naming that field would
    hide that the directory holds another algorithm's run."""
    try:
        with open(run_dir.file("versions.json")) as f:
            earlier = os.path.basename(str(json.load(f)["argv"][0]))
    except (OSError, ValueError, KeyError, IndexError, TypeError):
        return  # no record: the settings' comparison decides
    current = os.path.basename(sys.argv[0])
    # The scripts beside the one running (experiments/); from Python, whatever runs it.
    here = os.path.dirname(os.path.abspath(sys.argv[0]))
    scripts = os.listdir(here) if os.path.isdir(here) else []
    if earlier != current and earlier in scripts and current in scripts:
        algo = earlier.removesuffix(".py").upper().replace("_LM", "-LM").replace("_", " ")
        fail(
            f"--workdir={workdir} holds a {algo} run (experiments/{earlier}), not a "
            f"{current} one; pass a new --workdir"
        )


# The settings that only set how long a run is: a finished run restarted on its workdir with a
# larger one continues from its newest checkpoint (an extension) instead of being refused.
BUDGET_FIELDS = ("num_steps", "total_timesteps")


def budget_dependence(saved: dict[str, Any]) -> str | None:
    """Why the run recorded as `saved` cannot be extended to a larger budget (None: it can): a
    schedule or a shape that the budget sets would differ from the one its steps were taken
    with. The language-model trainers' learning rate is constant after an absolute warm-up, so
    they always can."""
    if saved.get("anneal_lr"):
        return (
            "its learning rate decays to zero over the whole budget (anneal_lr), so a longer "
            "run has another schedule from the first step; pass a new --workdir (start runs "
            "meant to be extended with --config.anneal_lr=False)"
        )
    buffer_size, total = saved.get("buffer_size"), saved.get("total_timesteps")
    if buffer_size is not None and total is not None and total < buffer_size:
        return (
            f"its replay buffer holds min(buffer_size, total_timesteps) = {total} transitions, "
            "so a longer run needs a larger buffer than the checkpoint's; pass a new --workdir "
            "(start runs meant to be extended with --config.buffer_size <= total_timesteps)"
        )
    return None


def check_resumable(saved: dict[str, Any] | None, current: dict[str, Any], workdir: str) -> None:
    """A workdir holding a checkpoint may only be resumed with the settings it was started with
    (what it keeps aside: `retention.KEEPING`), except a larger budget (`BUDGET_FIELDS`), which
    extends the run where no schedule or shape depends on the budget (`budget_dependence`);
    otherwise one line says why not."""
    if saved is None:
        return
    saved, current = retention.compared(saved), retention.compared(current)
    changed = [k for k in sorted(set(saved) | set(current)) if saved.get(k) != current.get(k)]
    budget = [k for k in changed if k in BUDGET_FIELDS]
    if budget and len(budget) == len(changed):
        k, old, new = budget[0], saved.get(budget[0]), current.get(budget[0])
        if not isinstance(old, int) or not isinstance(new, int) or new < old:
            fail(
                f"--workdir={workdir} holds a run with config.{k}={old!r}, not {new!r}: a run "
                "continues with the same budget or a larger one; pass a new --workdir for a "
                "shorter run"
            )
        reason = budget_dependence(saved)
        if reason is not None:
            fail(
                f"--workdir={workdir}: config.{k}={new} would extend its run of {old}, but {reason}"
            )
        return
    if changed:
        k = changed[0]
        fail(
            f"--workdir={workdir} holds a run with config.{k}={saved.get(k)!r}, not "
            f"{current.get(k)!r}; resume with the same settings or pass a new --workdir"
        )


@dataclasses.dataclass(frozen=True)
class Seeds:
    """The vmapped seeds of a control run: run i's keys are split i of PRNGKey(base)."""

    count: int
    base: int
    init_keys: Any
    eval_keys: Any

    def record(self, flat: ml_collections.ConfigDict) -> dict[str, Any]:
        """The settings a run directory records: the config plus the seeds."""
        return {**flat.to_dict(), "num_seeds": self.count, "seed": self.base}


def make_seeds(count: int, base: int, run: Any) -> Seeds:
    """`count` seeds from `base`, with the run section's counts checked (one error line)."""
    check_run_settings(run, count)
    init_keys, eval_keys = loop.run_keys(base, count)
    return Seeds(count, base, init_keys, eval_keys)


def seeded_job(
    name: str, description: str, algorithm: Any, config: Any, seeds: Seeds, **fields: Any
) -> Job:
    """The `Job` of a control algorithm whose seeds are vmapped: every run starts from its own key
    with the config's hyper-parameters (`fields` are the rest of the Job's)."""
    hps = hparams.repeat(hparams.hparams(config), seeds.count)
    return Job(
        name=name,
        description=f"{description} x{seeds.count} seeds",
        num_steps=config.num_steps,
        num_runs=seeds.count,
        init_states=lambda: jax.jit(jax.vmap(algorithm.init))(seeds.init_keys, hps),
        update=algorithm.update,
        hparams=hps,
        **fields,
    )


# --------------------------------------------------------------------------------------------
# Chunking


def block_length(total: int, log_every: int) -> int:
    """Updates between metric rows: the largest divisor of `total` not above `log_every`, so that
    chunks can be whole numbers of blocks."""
    return max(d for d in range(1, min(total, log_every) + 1) if total % d == 0)


def chunk_lengths(total: int, num_chunks: int, block: int = 1) -> list[int]:
    """`total` updates (a multiple of `block`) in near-equal chunks of whole blocks, at most
    `num_chunks` of them: at most two distinct lengths, so at most two programs to compile."""
    num_blocks = total // block
    bounds = np.linspace(0, num_blocks, min(num_chunks, num_blocks) + 1).round().astype(int)
    return [int(b - a) * block for a, b in zip(bounds[:-1], bounds[1:], strict=True) if b > a]


# --------------------------------------------------------------------------------------------
# The job and the loop


@dataclasses.dataclass
class Job:
    """What a script hands the runner: everything particular to its algorithm.

    The runner compiles chunks of the algorithm's `update` with `jaxrl.loop.make_chunk` (or calls
    `make_chunk(length, log_every, sink, keep_going, check_every)` for a custom chunk, which
    passes the last three on to `loop.make_chunk`). A stop request (Ctrl-C) is looked at every
    `check_every` updates at most (the largest divisor of the block not above it): 1 where an
    update takes long enough that asking costs nothing (the default), more where an update is
    microseconds (SAC's one environment step). `inputs_for(first, count)` gives the inputs of
    updates [first, first + count) (None when the environment runs inside). After each chunk,
    `after_chunk(states, step, chunk_index)` may return extra metric rows for the sink (an
    evaluation, say)."""

    name: str  # "ppo", "grpo", ...: the summary's `algo`
    description: str  # the progress bar's
    num_steps: int  # updates in the run
    init_states: Callable[[], Any]  # fresh states (with a leading runs axis when num_runs > 1)
    hparams: Any
    update: Callable | None = None  # the algorithm's update: the runner makes the chunks
    scan_inputs: bool = False  # inputs_for gives one input per update (host batches)
    make_chunk: Callable[[int, int, MetricsSink, Callable | None], Callable] | None = None  # or
    units_per_step: int = 1  # environment steps (sequences, pairs, ...) per update, per run
    units_name: str = "env_steps"  # what metrics.jsonl calls step x units_per_step
    num_runs: int = 1
    runs_axis: bool = True  # whether states carry a leading runs axis
    inputs_for: Callable[[int, int], Any] = lambda first, count: None
    per_run: tuple[str, ...] = ("episode_return",)  # metrics also logged for every run
    after_chunk: Callable[[Any, int, int], Mapping[str, Any] | None] | None = None
    out_shardings: Any = None  # of (states, metrics), for sharded states
    check_every: int = 1  # updates between stop checks, at most
    # make_chunk's chunks are host loops that dispatch compiled programs of their own (GRPO's
    # async mode, whose state and programs span two meshes): called piece by piece, not jitted.
    host_loop: bool = False


@dataclasses.dataclass
class RunResult:
    """The end of the chunk loop."""

    states: Any
    compile_seconds: float
    train_seconds: float
    resumed_from_step: int
    last_metrics: Any  # stacked piece metrics of the last chunk run here (None if none ran)


def open_run(workdir: str, resolved_config: Mapping[str, Any]) -> RunDirectory:
    """Create (or reopen) the run directory and record the config: call this only once every
    setting is valid. A directory holding checkpoints, or a finished run, is resumed only with the
    same settings (or a larger budget); one without (a start that failed or was stopped before
    its first checkpoint) is started afresh."""
    if os.path.exists(workdir) and not os.path.isdir(workdir):
        fail(f"--workdir={workdir}: is a file, not a directory; pass a directory path")
    try:
        run_dir = RunDirectory(workdir)
        # One probe per process: in a multi-host run every process checks the shared directory,
        # and a shared name lets one process remove the probe another is about to remove.
        probe = run_dir.file(f".write_test.{socket.gethostname()}.{os.getpid()}")
        with open(probe, "w"):
            pass
        os.remove(probe)
    except OSError as error:
        fail(f"--workdir={workdir}: cannot write there ({error.strerror}); pass a writable path")
    resolved = to_jsonable(dict(resolved_config))
    held = has_checkpoint(run_dir)
    # A finished run holds a run even where it kept no checkpoint (`retention.finish`): other
    # settings are refused as for any run; a larger budget trains the longer run from step 0.
    if held or retention.has_summary(run_dir):
        check_same_script(run_dir, workdir)
        check_resumable(run_dir.saved_config(), resolved, workdir)
        if not held:
            print(
                f"{workdir}: its finished run kept no training state "
                "(config.run.keep_final_state=False), so this run trains from step 0",
                file=sys.stderr,
            )
    run_dir.write_config(resolved)
    record = _record.get()
    if record is not None:
        record.run_dir = run_dir
    return run_dir


def finished_result(
    workdir: str, resolved_config: Mapping[str, Any], job: Job
) -> tuple[Any, dict[str, Any], str] | None:
    """(final states, summary, run directory) of the run in `workdir` where it finished `job`
    with these settings (`retention.finished_summary`), after one line saying so: the states
    restored from its final checkpoint, nothing compiled, nothing evaluated. None where it has
    not finished (or kept no final checkpoint)."""
    summary = retention.finished_summary(workdir, resolved_config, job.num_steps)
    if summary is None:
        return None
    run_dir = RunDirectory(workdir)
    if not has_checkpoint(run_dir):
        return None
    checkpointer = Checkpointer(run_dir.checkpoint_dir)
    try:
        if checkpointer.latest_step() != job.num_steps:
            return None
        # Restored into the states' shapes (traced, not compiled); an empty leaf (which orbax
        # does not save) made here.
        states, _ = checkpointer.restore(jax.eval_shape(job.init_states))
    finally:
        checkpointer.close()
    states = jax.tree.map(
        lambda x: jnp.zeros(x.shape, x.dtype) if isinstance(x, jax.ShapeDtypeStruct) else x, states
    )
    retention.report_finished(run_dir, job.num_steps)
    return states, summary, run_dir.path


def has_checkpoint(run_dir: RunDirectory) -> bool:
    """Whether the run directory holds a checkpoint to resume from."""
    return os.path.isdir(run_dir.checkpoint_dir) and any(
        name.isdigit() for name in os.listdir(run_dir.checkpoint_dir)
    )


def report_host_failure(failure: host.HostFailure, record: RunRecord | None = None) -> NoReturn:
    """One line naming the user's function and its exception; the traceback goes to the run
    directory's `error.log` (appended, so every failure of a run is kept), where this run opened
    one. "Resume" is said only of a run that has a directory to resume."""
    record = record or _record.get() or RunRecord()
    where = ""
    if record.run_dir is not None and record.run_dir.writes:
        log = record.run_dir.file("error.log")
        with open(log, "a") as f:
            f.write(f"--- {time.strftime('%Y-%m-%d %H:%M:%S')} {failure.function}\n")
            f.write(failure.traceback)
        where = f"; traceback in {log}"
    problem = failure.summary()
    if record.failed is not None:
        first, last, kept = record.failed
        kept = f"the checkpoint of step {kept} is kept" if kept is not None else "no checkpoint yet"
        where = f" (in updates {first}-{last}; {kept}){where}"
    if isinstance(failure.error, host.HostFunctionError):
        fail(problem + where)  # its message ends with the fix
    again = "to resume" if record.run_dir is not None else "to start"
    fail(f"{problem}; fix the function and run the same command again {again}{where}")


def interrupted_line(run_dir: RunDirectory | None) -> str:
    """The line a run interrupted outside its training loop ends with: whether checkpoints are
    kept, and what to do; or, once its summary is written (its last steps close files), that
    it had finished."""
    if run_dir is not None and os.path.isfile(run_dir.file("summary.json")):
        return f"Interrupted after the run finished; its results are in {run_dir.path}."
    if run_dir is not None and has_checkpoint(run_dir):
        return (
            f"Interrupted; the checkpoints in {run_dir.checkpoint_dir} are kept: run the same "
            "command again to resume."
        )
    return "Interrupted before any checkpoint; run the same command again to start."


def train(
    job: Job, run: Any, run_dir: RunDirectory, kill_after_chunk: int | None = None
) -> RunResult:
    """Run `job` as compiled chunks with checkpoints, resuming from the newest one."""
    states = job.init_states()
    checkpointer = Checkpointer(run_dir.checkpoint_dir, keep=run.keep_checkpoints)
    done, pending = 0, []
    try:
        restored = checkpointer.restore_newest_intact(states, run_dir.file("damaged_checkpoints"))
    except DamagedCheckpointError as error:
        checkpointer.close()
        fail(f"--workdir={run_dir.path}: {error}")
    if restored is not None:
        states, meta, notes = restored
        for note in notes:
            print(f"warning: {note}; moved to damaged_checkpoints/", file=sys.stderr)
        done = int(meta["step"])
        pending = meta.get("pending", [])  # a stop between rows: the row's pieces so far
        # Flushed: a pipe buffers stdout, and the line matters most when the run dies again.
        print(f"Resuming {run_dir.path} from step {done}/{job.num_steps}.", flush=True)
    # Rows logged after the checkpoint (or at all, without one) are logged again by this run.
    run_dir.truncate_metrics(done)

    block = block_length(job.num_steps, run.log_every)
    lengths = chunk_lengths(job.num_steps, run.num_chunks, block)
    if done % block and not pending:
        # An extended run whose old end falls inside a row of the new one's (3 then 5 updates
        # with log_every=3): its rows, and the pieces the program runs, would straddle it.
        checkpointer.close()
        fail(
            f"--workdir={run_dir.path}: the run ended at update {done}, inside a metrics row of "
            f"{block} updates of the longer run; extend it to a multiple of {done} updates, or "
            "use a config.run.log_every that divides both budgets from the start"
        )
    sink = MetricsSink(
        run_dir,
        total_steps=job.num_steps,
        units_per_step=job.units_per_step,
        units_name=job.units_name,
        num_runs=job.num_runs,
        log_every=block,
        start_step=done,
        per_run=job.per_run,
        tensorboard=run.tensorboard,
        progress=run.progress,
        description=job.description,
    )
    sink.restore_pending(pending)
    # Asked before every piece of `check` updates inside the compiled chunk: a stop request (or,
    # after a resume between chunk boundaries, the chunk's scheduled end) skips the remaining
    # pieces. Runs whose state is spread over several devices are driven piece by piece from
    # here instead (one program of `check` updates, called until the chunk's end or a stop): a
    # host callback that returns a value inside a multi-device CPU program can deadlock jaxlib
    # 0.10's runtime.
    stop = interrupts.WATCH
    control = {"end": 0}
    one_device = len({d for x in jax.tree.leaves(states) for d in x.devices()}) == 1
    one_device = one_device and not job.host_loop
    check = block_length(block, job.check_every)
    programs = sorted(set(lengths)) if one_device else [check]

    def keep_going(step: Any) -> bool:
        return not stop.requested and int(step) < control["end"]

    def chunk_program(length: int) -> Callable:
        # A piece program (several devices) is shorter than a row: the sink gathers its rows.
        row = block if one_device else check
        if job.make_chunk is not None:
            return job.make_chunk(length, row, sink, keep_going if one_device else None, check)
        return loop.make_chunk(
            job.update,
            length,
            log_every=row,
            callback=sink,
            runs_axis=job.runs_axis,
            scan_inputs=job.scan_inputs,
            keep_going=keep_going if one_device else None,
            check_every=check,
        )

    # From before compiling, so that Ctrl-C there is one line too (`jaxrl.interrupts`).
    line = functools.partial(interrupted_line, run_dir)
    with interrupts.watching(line):
        stop.check(line)  # a request during the trainer's set-up, from Python
        t0 = time.time()
        compiled = {}
        for length in programs:
            if job.host_loop:  # its programs compile when first called
                compiled[length] = chunk_program(length)
                continue
            jit_options = {"donate_argnums": 0}
            if job.out_shardings is not None:
                jit_options["out_shardings"] = job.out_shardings
            program = jax.jit(chunk_program(length), **jit_options)
            lowered = program.lower(states, job.inputs_for(0, length), job.hparams)
            compiled[length] = lowered.compile()
        compile_seconds = time.time() - t0
        if stop.requested:  # Ctrl-C while compiling: nothing new to save
            _stop_before_training(checkpointer, sink, done, job, run_dir)

        # Updates run from here: a stop request waits for the next safe point, where the
        # loop saves what it trained (`keep_going`, below), until the last save is complete.
        with stop.safe_points():
            start = time.time()
            last_metrics = None
            step = done
            ends = np.cumsum(lengths).tolist()
            for index, (length, end) in enumerate(zip(lengths, ends, strict=True)):
                if end <= step:
                    continue  # done before the interruption
                control["end"] = end
                try:
                    if one_device:
                        inputs = job.inputs_for(step, length)
                        states, last_metrics = compiled[length](states, inputs, job.hparams)
                    else:
                        states, last_metrics = _run_pieces(
                            compiled[check], check, states, step, end, job, stop
                        )
                    reached = int(np.asarray(states.step).reshape(-1)[0])
                except Exception:  # a host callback failed: keep what was logged, save nothing
                    record = _record.get()
                    if record is not None:
                        record.failed = (step + 1, end, checkpointer.latest_step())
                    sink.close()
                    checkpointer.close()
                    raise
                pieces_run = (reached - step) // check
                last_metrics = jax.tree.map(lambda m, n=pieces_run: m[:n], last_metrics)
                if not all_finite(states):  # never checkpoint (or continue from) a diverged state
                    message = divergence_message(last_metrics, step, check, checkpointer)
                    sink.close()
                    checkpointer.close()
                    fail(message)
                step = reached
                if step < end:  # stopped within the chunk
                    _stop_with_checkpoint(checkpointer, sink, states, step, job, run_dir)
                if job.after_chunk is not None:
                    row = job.after_chunk(states, end, index)
                    if row:
                        sink(end, row)
                is_last = index == len(lengths) - 1
                if is_last or stop.requested or (index + 1) % run.checkpoint_every == 0:
                    checkpointer.save(end, states, {"step": end})
                if kill_after_chunk == index + 1:
                    os.kill(os.getpid(), signal.SIGKILL)
                if stop.requested:  # after the last chunk too: the final evaluation can wait
                    _stop_with_checkpoint(checkpointer, sink, states, step, job, run_dir)
            jax.block_until_ready(states)
            sink.close()
            checkpointer.close()
    last_metrics = None if last_metrics is None else jax.device_get(last_metrics)
    return RunResult(states, compile_seconds, time.time() - start, done, last_metrics)


def _run_pieces(program, count, states, step, end, job, stop) -> tuple[Any, Any]:
    """Updates `step` to `end` as calls of `program` (`count` updates each), stopping after the
    piece during which a stop was requested; the pieces' metrics concatenated as one chunk's."""
    pieces = []
    while True:
        states, metrics = program(states, job.inputs_for(step, count), job.hparams)
        pieces.append(metrics)
        step += count
        if step >= end or stop.requested:
            break
    return states, jax.tree.map(lambda *m: jnp.concatenate(m), *pieces)


def _stop_before_training(checkpointer, sink, done, job, run_dir) -> NoReturn:
    """Stopped before this process trained: the run is where its newest checkpoint left it."""
    sink.close()
    checkpointer.close()
    where = f"at step {done}/{job.num_steps}" if done else "before training started"
    line = f"Stopped {where}; run the same command again to resume ({run_dir.path})."
    print(line, file=sys.stderr)
    raise Stopped(line)


def _stop_with_checkpoint(checkpointer, sink, states, step, job, run_dir) -> NoReturn:
    """Save `states` at `step` (unless that checkpoint exists) with the pieces of the metrics row
    it stopped inside, say how to resume, raise `Stopped`."""
    if checkpointer.latest_step() != step:
        pending = sink.pending()
        checkpointer.save(step, states, {"step": step} | ({"pending": pending} if pending else {}))
    sink.close()
    checkpointer.close()
    line = (
        f"Stopped at step {step}/{job.num_steps} with a checkpoint; run the same command again "
        f"to resume ({run_dir.path})."
    )
    print(line, file=sys.stderr)
    raise Stopped(line)


@jax.jit
def _leaf_finiteness(tree: Any) -> jax.Array:
    leaves = [x for x in jax.tree.leaves(tree) if jnp.issubdtype(x.dtype, jnp.inexact)]
    return jnp.stack([jnp.isfinite(x).all() for x in leaves]) if leaves else jnp.ones((1,), bool)


def all_finite(tree: Any) -> bool:
    """Whether every floating-point value of `tree` is finite (one small compiled reduction)."""
    return bool(np.asarray(_leaf_finiteness(tree)).all())


def divergence_message(metrics: Any, first_step: int, block: int, checkpointer: Any) -> str:
    """The one line a diverged run stops with: the first non-finite metric and its step, and the
    checkpoint that is kept."""
    where = "the training state"
    for name, values in sorted(jax.device_get(metrics).items()):
        bad = ~np.isfinite(np.asarray(values, np.float64).reshape(len(values), -1)).all(axis=1)
        if bad.any():
            where = f"{name} at step {first_step + (int(np.argmax(bad)) + 1) * block}"
            break
    kept = checkpointer.latest_step()
    keeps = f"the checkpoint of step {kept} is kept" if kept is not None else "no checkpoint yet"
    return (
        f"training: non-finite {where} (NaN or inf); stopped without saving it, {keeps}: lower "
        f"the learning rate, or check the reward and the data"
    )


def evaluate_seeds(
    evaluate: Callable[[Any, jax.Array], Any], states: Any, keys: jax.Array, host_env: bool = False
) -> Any:
    """`evaluate(state, key)` of every seed's final state, compiled: vmapped over the seeds, or for
    a host environment (`host_env`) one seed after another, since its episodes run in a while loop
    whose steps are callbacks, which JAX cannot vmap (its predicate would be batched)."""
    if host_env:
        return jax.jit(lambda s, k: jax.lax.map(lambda args: evaluate(*args), (s, k)))(states, keys)
    return jax.jit(jax.vmap(evaluate))(states, keys)


def compile_note(summary: dict[str, Any]) -> str:
    """The end line's compile time: its seconds, or where it went when not timed apart."""
    if summary.get("compile_seconds") is None:
        return "compiled within the first updates"
    return f"compile {summary['compile_seconds']:.0f}s"


def summary_fields(job: Job, result: RunResult, eval_seconds: float = 0.0) -> dict[str, Any]:
    """The summary keys every script writes: algo, num_seeds, wall and compile time, steps and
    their rate (of this process, excluding what a resumed run had done before), resume point."""
    ran = job.num_steps - result.resumed_from_step
    seconds = max(result.train_seconds, 1e-9)
    return {
        "algo": job.name,
        "num_seeds": job.num_runs,
        "wall_seconds": round(result.compile_seconds + result.train_seconds + eval_seconds, 2),
        # A host loop's programs compile inside its first updates: not timed apart (null).
        "compile_seconds": None if job.host_loop else round(result.compile_seconds, 2),
        "steps": job.num_steps,
        "steps_per_second": round(ran * job.num_runs / seconds, 3),
        "resumed_from_step": result.resumed_from_step,
    }
