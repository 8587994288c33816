"""Ctrl-C and SIGTERM at any moment of a run: one stop line, exit status 130, nothing half-written.

Why not Python's own handler. It raises `KeyboardInterrupt` at whatever bytecode the main thread
runs next, and inside JAX that goes wrong in two ways, both measured (issue 48):
- raised inside the garbage-collection callback jaxlib registers (`_xla_gc_callback`), CPython
  prints it as "Exception ignored" and drops it: the signal is lost and the run goes on to its
  end, exit 0 (3 of 5 tries of `experiments/sft.py` signalled at 2-14 s);
- jax compiles on XLA's thread pool while the main thread waits. An exception that unwinds to
  interpreter shutdown there tears down the XLA runtime under the running compile, which then
  reads a device the teardown freed: SIGSEGV (exit 139), the core's stack in
  `xla::ifrt::SingleDeviceSharding::Create` from `PjRtCompiler::CompileAndLoad` on a pool
  thread. A compile cannot be cancelled, so no teardown may run while one is in flight.

So the handlers here never raise. The C-level handler writes the signal's number to a pipe
(`signal.set_wakeup_fd`), which wakes a watcher thread at once, whatever the main thread is doing
(inside a compile it holds no GIL). The watcher decides:
- while a training loop runs updates that are not yet checkpointed (`Watch.safe_points`), the
  request waits for the loop's next safe point, where the loop saves and raises `Stopped`;
- in a script anywhere else (importing, loading, tokenising, compiling, evaluating, saving) it
  prints the script's stop line and ends the process at once (`os._exit(130)`): what kill -9 does,
  which a run directory survives by design (atomic checkpoints; metrics rows past the newest
  checkpoint are dropped on resume), and without the teardown that crashes;
- from Python, where ending the process would end the notebook's kernel, the request is kept and
  the trainer raises `Stopped` at its next boundary (`Watch.check`): before and after compiling,
  at the loop's next safe point, after training.
A second request ends the process at once; in a notebook's kernel, whose end would lose the
user's session, it raises `StoppedAtOnce` in the main thread instead as soon as that thread runs
Python again (a running compile ends first; no teardown runs in a kernel, so nothing crashes).

Signals belong to the process, so there is one `Watch` per process (`WATCH`); what it knows of a
run (its stop line) is given by the run that is active and forgotten when it ends.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Stopped(KeyboardInterrupt):
    """A run stopped on Ctrl-C or SIGTERM after saying so on stderr (the stop line, which is also
    the exception's message). From Python it is a `KeyboardInterrupt`, so `except
    KeyboardInterrupt` catches it; the scripts exit with status `code` (130) on it."""

    code = 130


class StoppedAtOnce(Stopped):
    """A second Ctrl-C in a notebook's kernel: raised in the main thread at once, wherever it
    is (an update left half-done is not saved; the newest checkpoint is)."""

    def __init__(self, *args: object) -> None:
        super().__init__(*(args or (AT_ONCE_IN_A_KERNEL,)))


AT_ONCE_IN_A_KERNEL = (
    "Stopped at once on a second Ctrl-C; the newest checkpoint (if any) is kept, and the same "
    "call resumes from it."
)


def _in_a_kernel() -> bool:
    """Whether this process is an IPython or Jupyter kernel (the user's session, not ours)."""
    ipython = sys.modules.get("IPython")
    return ipython is not None and getattr(ipython, "get_ipython", lambda: None)() is not None


def _raise_in_the_main_thread(error: type[BaseException]) -> None:
    """`error` raised in the main thread at its next Python bytecode (CPython's asynchronous
    exception: the way a debugger interrupts a thread)."""
    import ctypes

    main = ctypes.c_ulong(threading.main_thread().ident or 0)
    ctypes.pythonapi.PyThreadState_SetAsyncExc(main, ctypes.py_object(error))


def _before_any_run() -> str:
    return "Interrupted before any checkpoint; run the same command again to start."


class Watch:
    """The process's stop requests: `requested` once a signal came; what it does depends on the
    moment (the module's docstring)."""

    def __init__(self) -> None:
        self.requested = False
        self.script = False  # the process is one of our scripts: it may end at once
        self.stop_line: Callable[[], str] = _before_any_run
        self._safe_points = 0  # > 0 while a training loop stops only at its safe points
        self._installed = False
        self._previous: dict[int, object] = {}

    # --- installing -----------------------------------------------------------------------------
    def _install(self) -> bool:
        """Take SIGINT and SIGTERM (only the main thread may); whether this call did."""
        if self._installed or threading.current_thread() is not threading.main_thread():
            return False
        self._read, self._write = os.pipe()
        os.set_blocking(self._write, False)
        self._previous_fd = signal.set_wakeup_fd(self._write, warn_on_full_buffer=False)
        for sig in SIGNALS:
            # A Python-level handler that does nothing: the wakeup pipe is what acts.
            self._previous[sig] = signal.signal(sig, lambda signum, frame: None)
        threading.Thread(target=self._watch, name="jaxrl-stop-watch", daemon=True).start()
        self._installed = True
        return True

    def _uninstall(self) -> None:
        signal.set_wakeup_fd(self._previous_fd)
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous = {}
        os.close(self._write)  # the watcher reads end-of-file and returns
        self._installed = False
        self.requested = False
        self.stop_line = _before_any_run

    # --- the watcher thread ---------------------------------------------------------------------
    def _watch(self) -> None:
        read = self._read
        try:
            while data := os.read(read, 1):
                if data[0] in SIGNALS:
                    self._on_signal()
        finally:
            os.close(read)

    def _on_signal(self) -> None:
        if self.requested and not self.script and _in_a_kernel():
            _say(AT_ONCE_IN_A_KERNEL)
            _raise_in_the_main_thread(StoppedAtOnce)
            return
        if self.requested or (self.script and not self._safe_points):
            _say(self.stop_line())
            _end_at_once()
        self.requested = True
        if self._safe_points:
            _say(
                "Stopping at the next safe point with a checkpoint; press Ctrl-C again to stop at "
                "once."
            )
        else:
            _say(
                "Stopping when the running step returns (a compile runs to its end); press Ctrl-C "
                "again to stop at once."
            )

    # --- what runs and trainers call -------------------------------------------------------------
    @contextlib.contextmanager
    def safe_points(self) -> Iterator[Watch]:
        """While this is open, a training loop has updates to save: a request waits for the loop
        to poll `requested` at its next safe point instead of ending a script at once."""
        self._safe_points += 1
        try:
            yield self
        finally:
            self._safe_points -= 1
        # A request after the loop's last safe point (while its last save completed): a script
        # ends here, now that everything is saved; from Python the next `check` raises.
        if self.requested and self.script and not self._safe_points:
            _say(self.stop_line())
            _end_at_once()

    def check(self, line: Callable[[], str]) -> None:
        """At a boundary of a run from Python: a request that came is honoured here, with the stop
        line `line()` on stderr and `Stopped` raised."""
        if self.requested:
            text = line()
            _say(text)
            raise Stopped(text)


WATCH = Watch()


# A script's stderr as it started: the stop line goes here even while a reader silences file
# descriptor 2 (`jaxrl.lm.checkpoints.quiet_orbax`, reading a checkpoint, where a Ctrl-C ended
# `multiturn.py` with status 130 and no line in 1 of 3 tries at 8 s).
_SCRIPT_STDERR: int | None = None


def for_a_script() -> None:
    """Called by every script before its heavy imports: from here to the process's end, Ctrl-C
    and SIGTERM are the watcher's, and outside a training loop they end the script at once with
    its stop line (`set_stop_line`)."""
    global _SCRIPT_STDERR
    WATCH.script = True
    with contextlib.suppress(OSError):
        _SCRIPT_STDERR = os.dup(2)
    WATCH._install()


def finished() -> None:
    """Called by a script once its run is over (results written, or its error said): from here to
    the process's end a Ctrl-C or SIGTERM has nothing left to stop and is ignored, so the process
    ends with the run's own status. Otherwise a signal in the interpreter's teardown, whose last
    steps give the signals back to the system's defaults after the watcher thread has stopped,
    ended the process by the signal (status -2) with no line: seen when a whole tiny run took
    4 s and a Ctrl-C came at 5 s."""
    for sig in SIGNALS:
        signal.signal(sig, signal.SIG_IGN)


def set_stop_line(line: Callable[[], str]) -> None:
    """What a script says when a stop ends it outside a training loop (asked at that moment, so it
    can say whether checkpoints exist)."""
    WATCH.stop_line = line


@contextlib.contextmanager
def watching(line: Callable[[], str] | None = None) -> Iterator[Watch]:
    """The stop requests of one trainer call: installs the handlers unless a script (or an outer
    call) already did, and gives them back at the end, so that nothing of one call's requests
    carries into the next. `line` is the stop line while it is open."""
    installed = WATCH._install()
    previous = WATCH.stop_line
    if line is not None:
        WATCH.stop_line = line
    try:
        yield WATCH
    finally:
        WATCH.stop_line = previous
        if installed:
            WATCH._uninstall()


def _say(line: str) -> None:
    with contextlib.suppress(OSError, ValueError):  # a closed stream must not stop the stop
        sys.stdout.flush()
        if _SCRIPT_STDERR is None:  # from Python: the user's stderr (a notebook's cell output)
            print(f"\n{line}", file=sys.stderr, flush=True)
        else:
            sys.stderr.flush()
            os.write(_SCRIPT_STDERR, f"\n{line}\n".encode())


def _end_at_once() -> None:
    """End the process now with status 130, without the interpreter's teardown (see the module's
    docstring); what it wrote is flushed first."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(Stopped.code)
