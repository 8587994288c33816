"""The runner on a toy algorithm: resume, metric rows, divergence, run-directory rules.

The toy's state is one number that grows by the swept `rate` each update, so every expected value
is known exactly; it compiles in a fraction of a second, which keeps these checks cheap.
"""

import dataclasses
import json
import os

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from flax import struct

from jaxrl import cli, hparams, loop, retention, runner
from jaxrl.checkpoint import Checkpointer
from jaxrl.config import InputError, build_config, run_section
from jaxrl.hparams import swept


@dataclasses.dataclass(frozen=True)
class ToyConfig:
    rate: float = swept(1.0)
    num_steps: int = 12
    diverge_at: int = -1  # the update whose result is NaN (-1: never)


@struct.dataclass
class ToyState:
    x: jax.Array
    key: jax.Array
    step: jax.Array


def make_toy(config: ToyConfig) -> loop.Algorithm:
    config = hparams.static(config)

    def init(key, hp):
        return ToyState(jnp.zeros(()), key, loop.zeros_step())

    def update(state, inputs, hp):
        x = state.x + hp.rate
        x = jnp.where(state.step + 1 == config.diverge_at, jnp.nan, x)
        return ToyState(x, state.key, state.step + 1), {"x": x}

    return loop.Algorithm(init, update)


def toy_job(config: ToyConfig, num_runs: int = 2) -> runner.Job:
    algorithm = make_toy(config)
    hps = hparams.sweep(config, rate=[1.0, 2.0][:num_runs])
    init_keys, _ = loop.run_keys(0, num_runs)
    return runner.Job(
        name="toy",
        description="toy",
        num_steps=config.num_steps,
        init_states=lambda: jax.vmap(algorithm.init)(init_keys, hps),
        update=algorithm.update,
        hparams=hps,
        num_runs=num_runs,
        per_run=("x",),
    )


RUN = run_section(num_chunks=3, log_every=2, tensorboard=False, progress=False)


def rows(workdir):
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


def test_runs_resume_and_log_each_step_once(tmp_path):
    workdir = str(tmp_path / "run")
    config = ToyConfig()
    run_dir = runner.open_run(workdir, {"rate": 1.0})
    result = runner.train(toy_job(config), RUN, run_dir)
    np.testing.assert_allclose(result.states.x, [12.0, 24.0])
    assert [r["step"] for r in rows(workdir)] == [2, 4, 6, 8, 10, 12]
    assert rows(workdir)[-1]["x_per_run"] == [11.5, 23.0]  # the mean over the block of 2

    # A rerun of a finished run restores the last checkpoint, runs nothing, and logs nothing twice.
    again = runner.train(toy_job(config), RUN, runner.open_run(workdir, {"rate": 1.0}))
    assert again.resumed_from_step == 12 and again.last_metrics is None
    np.testing.assert_allclose(again.states.x, [12.0, 24.0])
    assert [r["step"] for r in rows(workdir)] == [2, 4, 6, 8, 10, 12]


def test_rows_without_a_checkpoint_are_dropped_on_rerun(tmp_path):
    """A run stopped before its first checkpoint (or whose checkpoints/ was deleted) left metric
    rows behind: the rerun starts at step 0 and must not append a second copy of them."""
    workdir = str(tmp_path / "run")
    run_dir = runner.open_run(workdir, {"rate": 1.0})
    with open(run_dir.metrics_path, "w") as f:
        f.write('{"step": 2, "x": 2.0}\n{"step": 4, "x": 4.0}\n{"step": 6, "x"')  # torn last row
    runner.train(toy_job(ToyConfig()), RUN, run_dir)
    assert [r["step"] for r in rows(workdir)] == [2, 4, 6, 8, 10, 12]


def test_settings_are_checked_only_against_a_run_with_checkpoints(tmp_path, capsys):
    workdir = str(tmp_path / "run")
    runner.open_run(workdir, {"rate": 1.0})  # a start that failed before any checkpoint
    runner.open_run(workdir, {"rate": 3.0})  # the corrected retry is not refused
    runner.train(toy_job(ToyConfig()), RUN, runner.open_run(workdir, {"rate": 3.0}))
    with pytest.raises(InputError) as error:
        runner.open_run(workdir, {"rate": 5.0})
    assert str(error.value).startswith(f"--workdir={workdir} holds a run with")
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("keep, kept", [(1, ["12"]), (2, ["8", "12"])])
def test_the_newest_checkpoints_are_kept(tmp_path, keep, kept):
    """config.run.keep_checkpoints newest checkpoints stay (3 chunks: saved at 4, 8 and 12), and
    settings that only say what a run keeps do not stop it resuming."""
    workdir = str(tmp_path / "run")
    run = run_section(num_chunks=3, log_every=2, tensorboard=False, progress=False)
    run.keep_checkpoints = keep
    runner.train(
        toy_job(ToyConfig()), run, runner.open_run(workdir, {"rate": 1.0, "run": run.to_dict()})
    )
    assert sorted(os.listdir(os.path.join(workdir, "checkpoints")), key=int) == kept
    other = {"rate": 1.0, "run": run.to_dict() | {"keep_checkpoints": 3}}
    runner.open_run(workdir, other)  # not refused


def test_a_finished_run_without_its_final_state(tmp_path, capsys):
    """A finished run that kept no training state (keep_final_state False: its checkpoints go
    once the summary is written) is still recognised as finished with its settings, still
    refuses other settings, and a larger budget trains the longer run from step 0, ending where
    an uninterrupted one does."""
    workdir = str(tmp_path / "run")
    run_dir = runner.open_run(workdir, {"rate": 1.0, "num_steps": 12})
    runner.train(toy_job(ToyConfig()), RUN, run_dir)
    run_dir.write_summary({"steps": 12})
    end = retention.finish(run_dir, keep_final_state=False)
    # The size said is the directory's, whatever its unit (under 1 kB here on some hosts).
    on_disk = sum(
        os.path.getsize(os.path.join(root, name))
        for root, _, names in os.walk(workdir)
        for name in names
    )
    assert end == f"Run directory: {run_dir.path} ({retention.format_bytes(on_disk)})", end
    assert not os.path.exists(run_dir.checkpoint_dir)
    assert not os.path.exists(run_dir.file(retention.REMOVED))
    assert retention.finished_summary(workdir, {"rate": 1.0, "num_steps": 12}, 12) == {"steps": 12}
    assert retention.finished_summary(workdir, {"rate": 2.0, "num_steps": 12}, 12) is None
    assert retention.finished_summary(workdir, {"rate": 1.0, "num_steps": 16}, 16) is None
    with pytest.raises(InputError, match="holds a run with config.rate=1.0, not 2.0"):
        runner.open_run(workdir, {"rate": 2.0, "num_steps": 12})
    capsys.readouterr()
    longer = runner.open_run(workdir, {"rate": 1.0, "num_steps": 16})
    assert "kept no training state" in capsys.readouterr().err
    result = runner.train(toy_job(ToyConfig(num_steps=16)), RUN, longer)
    assert result.resumed_from_step == 0
    np.testing.assert_allclose(result.states.x, [16.0, 32.0])
    assert [r["step"] for r in rows(workdir)] == [2, 4, 6, 8, 10, 12, 14, 16]


def test_a_finished_run_called_again_is_its_final_checkpoint_and_summary(tmp_path, capsys):
    """`runner.finished_result`: a run whose summary.json says it finished these settings' steps
    gives its final states (restored, nothing else compiled) and its summary, in one line."""
    workdir = str(tmp_path / "run")
    runner.train(toy_job(ToyConfig()), RUN, runner.open_run(workdir, {"rate": 1.0}))
    assert runner.finished_result(workdir, {"rate": 1.0}, toy_job(ToyConfig())) is None
    runner.open_run(workdir, {"rate": 1.0}).write_summary({"steps": 12, "x": 1})
    capsys.readouterr()
    states, summary, path = runner.finished_result(workdir, {"rate": 1.0}, toy_job(ToyConfig()))
    np.testing.assert_allclose(states.x, [12.0, 24.0])
    assert (summary, path) == ({"steps": 12, "x": 1}, workdir)
    assert capsys.readouterr().out.startswith("Already finished: this run took its 12 steps")
    longer = toy_job(ToyConfig(num_steps=16))
    assert runner.finished_result(workdir, {"rate": 1.0}, longer) is None


def test_sizes_read_as_people_write_them():
    assert [retention.format_bytes(n) for n in (512, 1_600, 350_200_000, 1_120_000_000)] == [
        "512 B", "1.6 kB", "350.2 MB", "1.1 GB"
    ]  # fmt: skip


def test_workdir_that_is_a_file_is_one_line(tmp_path, capsys):
    path = tmp_path / "file"
    path.write_text("x")
    with pytest.raises(InputError) as error:
        runner.open_run(str(path), {})
    expected = f"--workdir={path}: is a file, not a directory; pass a directory path"
    assert str(error.value) == expected


def test_divergence_stops_with_one_line_and_keeps_the_last_good_checkpoint(tmp_path, capsys):
    workdir = str(tmp_path / "run")
    config = ToyConfig(diverge_at=7)  # inside the second chunk (steps 5-8)
    run_dir = runner.open_run(workdir, {"rate": 1.0})
    with pytest.raises(InputError) as error:
        runner.train(toy_job(config), RUN, run_dir)
    err = str(error.value).splitlines()
    assert len(err) == 1
    # Stop checks after every update make the pieces single updates: the exact update is named.
    assert err[0].startswith("training: non-finite x at step 7 (NaN or inf)"), err[0]
    assert "the checkpoint of step 4 is kept" in err[0]
    checkpointer = Checkpointer(run_dir.checkpoint_dir)
    assert checkpointer.latest_step() == 4  # nothing NaN was saved
    state, meta = checkpointer.restore(toy_job(config).init_states())
    checkpointer.close()
    assert meta == {"step": 4} and np.isfinite(np.asarray(state.x)).all()


def test_sweep_refuses_unknown_and_invalid_values():
    from jaxrl.config import ConfigError

    @dataclasses.dataclass(frozen=True)
    class Checked:
        rate: float = swept(1.0)

        def __post_init__(self):
            if not self.rate > 0:
                raise ConfigError(f"rate: must be positive, got {self.rate}; set rate > 0")

    assert hparams.sweep(Checked(), rate=[1.0, 2.0]).rate.shape == (2,)
    with pytest.raises(ConfigError, match="not swept fields"):
        hparams.sweep(Checked(), gamma=[0.9])
    with pytest.raises(ConfigError, match="rate: must be positive"):
        hparams.sweep(Checked(), rate=[1.0, -1.0])


def test_build_config_discovers_sections_and_refuses_unknown_fields(capsys):
    flat = ml_collections.ConfigDict({"rate": 2.0, "run": RUN, "model": {"width": 3}})
    assert build_config(ToyConfig, flat).rate == 2.0
    flat.unknown = 1
    with pytest.raises(InputError) as error:
        build_config(ToyConfig, flat)
    assert str(error.value).startswith("config.unknown: not a setting of")


def damage(checkpoint_dir, step):
    """Delete a checkpoint's array data, as the issue's reproduction does."""
    import shutil

    state = os.path.join(checkpoint_dir, str(step), "state")
    for name in os.listdir(state):
        if name == "d" or name.startswith("manifest"):
            path = os.path.join(state, name)
            shutil.rmtree(path) if os.path.isdir(path) else os.remove(path)


def test_a_damaged_newest_checkpoint_falls_back_to_the_newest_intact_one(tmp_path, capsys):
    workdir = str(tmp_path / "run")
    config = ToyConfig()
    run_dir = runner.open_run(workdir, {"rate": 1.0})
    runner.train(toy_job(config), RUN, run_dir)
    damage(run_dir.checkpoint_dir, 12)
    capsys.readouterr()
    result = runner.train(toy_job(config), RUN, runner.open_run(workdir, {"rate": 1.0}))
    captured = capsys.readouterr()
    warnings = [line for line in captured.err.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and warnings[0].startswith("warning: checkpoint 12 is damaged")
    assert "from step 8/12" in captured.out
    assert result.resumed_from_step == 8
    np.testing.assert_allclose(result.states.x, [12.0, 24.0])
    assert [r["step"] for r in rows(workdir)] == [2, 4, 6, 8, 10, 12]
    assert os.listdir(os.path.join(workdir, "damaged_checkpoints")) == ["12"]


def test_no_intact_checkpoint_is_one_line(tmp_path, capsys):
    workdir = str(tmp_path / "run")
    run_dir = runner.open_run(workdir, {"rate": 1.0})
    runner.train(toy_job(ToyConfig()), RUN, run_dir)
    for step in (4, 8, 12):
        damage(run_dir.checkpoint_dir, step)
    capsys.readouterr()
    with pytest.raises(InputError) as error:
        runner.train(toy_job(ToyConfig()), RUN, runner.open_run(workdir, {"rate": 1.0}))
    err = str(error.value).splitlines()
    assert len(err) == 1 and "none of the 3 checkpoints" in err[0] and "is intact" in err[0]


def test_ctrl_c_inside_a_block_stops_after_the_running_update_and_resumes_exactly(tmp_path):
    """Rows of 4 updates in one chunk of 12; SIGINT arrives during update 6, inside the second
    row's block: the run stops after that update (not at the block's or chunk's end) with a
    checkpoint of step 6 holding the row's two pieces so far, and the same call again ends with
    the uninterrupted run's rows (the row of step 8 averages the updates before and after the
    stop) and state."""
    import signal
    import time

    from jax.experimental import io_callback

    config = ToyConfig()
    algorithm = make_toy(config)

    signalled = []

    def signal_at_six(step):  # called once per run (the update is vmapped): signal once
        if int(step) == 6 and not signalled:
            signalled.append(step)
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.5)  # the watcher thread reads the signal before the next check
        return np.zeros((), np.int32)

    def update(state, inputs, hp):
        state, metrics = algorithm.update(state, inputs, hp)
        tick = io_callback(signal_at_six, jax.ShapeDtypeStruct((), jnp.int32), state.step)
        return state.replace(step=state.step + tick), metrics

    run = run_section(num_chunks=1, log_every=4, tensorboard=False, progress=False)
    whole = str(tmp_path / "whole")
    plain = runner.train(toy_job(config), run, runner.open_run(whole, {"rate": 1.0}))

    parts = str(tmp_path / "parts")
    job = dataclasses.replace(toy_job(config), update=update)
    # From Python the stop is a KeyboardInterrupt (after its stop line); the scripts exit 130.
    with pytest.raises(KeyboardInterrupt) as stopped:
        runner.train(job, run, runner.open_run(parts, {"rate": 1.0}))
    assert isinstance(stopped.value, runner.Stopped) and stopped.value.code == 130
    assert "run the same command again to resume" in str(stopped.value)
    checkpointer = Checkpointer(os.path.join(parts, "checkpoints"))
    state, meta = checkpointer.restore(toy_job(config).init_states())
    checkpointer.close()
    assert meta["step"] == 6 and len(meta["pending"]) == 2, meta
    np.testing.assert_allclose(state.x, [6.0, 12.0])
    assert [r["step"] for r in rows(parts)] == [4]

    resumed = runner.train(toy_job(config), run, runner.open_run(parts, {"rate": 1.0}))
    assert resumed.resumed_from_step == 6
    np.testing.assert_array_equal(resumed.states.x, plain.states.x)
    strip = lambda rs: [{k: v for k, v in r.items() if k != "wall_seconds"} for r in rs]  # noqa: E731
    assert strip(rows(parts)) == strip(rows(whole))
    assert rows(whole)[1]["x_per_run"] == [6.5, 13.0]  # the mean of updates 5-8


def test_load_named_takes_a_module_path_or_a_file_outside_the_repository(tmp_path):
    """`--config.rewards.host=/abs/path/my_rewards.py:f` (and games) load the file as a module,
    once; "module.path:name" still imports."""
    source = tmp_path / "my_rewards.py"
    source.write_text(
        "calls = []\n\ndef f(prompts, completions):\n    return [1.0] * len(completions)\n"
    )
    f = cli.load_named(f"{source}:f")
    assert f(["p"], ["a", "b"]) == [1.0, 1.0]
    assert cli.load_named(f"{source}:f") is f
    assert cli.load_named("tests.fixtures.host_reward:digit_fraction")(None, ["1a"], None) == [0.5]
    with pytest.raises(ImportError, match="no such file"):
        cli.load_named(f"{tmp_path / 'nope.py'}:f")
    with pytest.raises(AttributeError):
        cli.load_named(f"{source}:g")
