"""Small data works out of the box: the README's "From Python" calls run as written on a 36-row
prompt list, one SFT row and one preference pair. A preset's held-out size or batch size that
the rows cannot hold, left at the preset's value, is fitted to them with one line on stderr per
setting (jaxrl.trainers.data_sizes); a value the user set is kept and refused as before."""

import contextlib
import io
import json
import os
import subprocess
import sys

import pytest

from jaxrl.config import InputError, given_settings, is_given, mark_given

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The README's rows: 36 prompts.
ROWS = [
    {"prompt": f"What is {a} plus {b}? Reply with the number only.", "answer": str(a + b)}
    for a in range(2, 8)
    for b in range(3, 9)
]
SFT_ROW = {"prompt": "What is 2 plus 3?", "completion": "5"}
PAIR = {"prompt": "What is 2 plus 3?", "chosen": "5", "rejected": "6"}
GRPO_LINE = (
    "config.task.num_eval: 200 held-out rows out of 36 would leave none to train on; using 4 "
    "(10%, set it to choose)"
)


def contains_answer(prompts, completions, answer, **columns):
    return [float(a in c) for a, c in zip(answer, completions, strict=True)]


def fitted_lines(stderr: str) -> list[str]:
    """The lines saying which sizes were fitted (progress bars and the rest left out)."""
    return [line for line in stderr.splitlines() if line.startswith("config.")]


def test_assignments_and_flags_are_recorded_as_given_and_kept_by_a_copy():
    import copy

    from jaxrl.trainers import grpo
    from jaxrl.trainers.presets import grpo as presets

    config = grpo.config("word_problems")
    assert given_settings(config) == frozenset()  # the preset's values are not the user's
    config.num_steps = 2
    config.task.num_eval = 200  # the preset's own value, but set
    copied = copy.deepcopy(config)
    assert given_settings(copied) == {"num_steps", "task.num_eval"}
    copied.task.data_seed = 1  # a copy records its own assignments, the original not
    assert "task.data_seed" in given_settings(copied) - given_settings(config)
    assert is_given(frozenset({"task"}), "task.num_eval")  # a section set as a whole
    flagged = mark_given(presets.get_config("word_problems"), ["task.num_eval", "batch_size"])
    assert given_settings(copy.deepcopy(flagged)) == {"task.num_eval", "batch_size"}


def test_the_readme_grpo_rows_train_with_a_held_out_size_fitted_to_them(tmp_path, capsys):
    """The README's GRPO call (the tiny model instead of SmolLM2, 2 updates): the preset's 200
    held-out rows become 4 of the 36, said in one line; config.json records it (the same call
    resumes)."""
    from jaxrl.trainers import grpo

    config = grpo.config("word_problems")
    config.num_steps = 2
    config.init_from = ""  # the tiny random model: SmolLM2's run is the slow test below
    result = grpo.train(config, tmp_path / "run", train_data=ROWS, rewards=[contains_answer])
    assert fitted_lines(capsys.readouterr().err) == [GRPO_LINE]
    summary = result.summary
    assert summary["num_train"] == 32 and summary["num_eval"] == 4 and summary["steps"] == 2
    assert 0.0 <= summary["eval_task_accuracy"] <= 1.0
    saved = json.loads((tmp_path / "run" / "config.json").read_text())
    assert saved["task"]["num_eval"] == 4 and saved["batch_size"] == 8  # the preset's batch fits


@pytest.mark.parametrize("num_eval", [200, 36])
def test_a_held_out_size_the_user_set_is_refused_when_the_rows_cannot_hold_it(tmp_path, num_eval):
    """200 is the preset's own value: set by the user, it is theirs, so refused, not fitted."""
    from jaxrl.trainers import grpo

    config = grpo.config("word_problems")
    config.init_from = ""
    config.task.num_eval = num_eval
    with pytest.raises(InputError, match=rf"^config\.task\.num_eval: {num_eval} held-out rows "
                       "out of 36 leave none to train on; use 1 to 35"):  # fmt: skip
        grpo.train(config, tmp_path / "run", train_data=ROWS, rewards=[contains_answer])
    assert not (tmp_path / "run").exists()


def test_a_batch_size_the_user_set_is_refused_when_the_rows_cannot_hold_it(tmp_path, capsys):
    from jaxrl.trainers import sft

    config = sft.config()
    config.batch_size = 64  # the preset's value, set
    with pytest.raises(InputError, match=r"^config\.batch_size: 64 exceeds the 1 training rows"):
        sft.train(config, tmp_path / "run", train_data=[SFT_ROW])
    assert [line.split(":")[0] for line in fitted_lines(capsys.readouterr().err)] == [
        "config.task.num_eval"  # the held-out size, left to the preset, is fitted
    ]
    assert not (tmp_path / "run").exists()


def run_grpo_script(*flags: str) -> subprocess.CompletedProcess:
    prompts = "--config.task.train_jsonl=tests/fixtures/prompts/say_digit.jsonl"  # 40 rows
    command = [sys.executable, "experiments/grpo.py", prompts, *flags, "--workdir=/nonexistent"]
    return subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=REPO)


def test_the_script_fits_the_preset_s_held_out_size_and_refuses_a_flag_s():
    """Without a reward function the run stops before anything is written, after the split:
    the preset's 256 held-out rows are fitted; --config.task.num_eval=256 is the user's."""
    fitted = run_grpo_script()
    assert fitted.returncode == 2
    assert fitted_lines(fitted.stderr) == [
        "config.task.num_eval: 256 held-out rows out of 40 would leave none to train on; using "
        "4 (10%, set it to choose)"
    ]
    assert fitted.stderr.strip().splitlines()[-1].startswith("error: config.rewards.host: ")
    given = run_grpo_script("--config.task.num_eval=256")
    assert given.returncode == 2 and fitted_lines(given.stderr) == []
    refused = "error: config.task.num_eval: 256 held-out rows out of 40 leave none to train on"
    assert given.stderr.strip().splitlines()[-1].startswith(refused)


@pytest.fixture(scope="module")
def one_row_sft(tmp_path_factory):
    """docs/python.md's `sft.train(None, "runs/sft", model=..., train_data=[one row])`, on the
    tiny model: (its Result, what it printed on stderr)."""
    from jaxrl.trainers import sft

    workdir = tmp_path_factory.mktemp("small") / "sft"
    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr):
        result = sft.train(None, workdir, train_data=[SFT_ROW])
    return result, stderr.getvalue()


def test_one_sft_row_trains_evaluated_on_itself(one_row_sft):
    result, stderr = one_row_sft
    assert fitted_lines(stderr) == [
        "config.task.num_eval: 256 held-out rows out of 1 would leave none to train on; holding "
        "none out and evaluating on the training row (give eval_data, or more rows, for a "
        "held-out score)",
        "config.batch_size: 64 exceeds the 1 training row; using 1 (set it to choose)",
    ]
    summary = result.summary
    assert summary["steps"] == 150 and summary["eval_loss"] < summary["initial_eval_loss"]
    with open(os.path.join(result.run_dir, "config.json")) as f:
        saved = json.load(f)
    assert saved["task"]["num_eval"] == 0 and saved["batch_size"] == 1


def test_one_preference_pair_trains_dpo_from_the_one_row_sft_run(one_row_sft, tmp_path, capsys):
    """docs/python.md's `dpo.train(None, "runs/dpo", model="runs/sft", train_data=[one pair])`."""
    from jaxrl.trainers import dpo

    result = dpo.train(None, tmp_path / "dpo", model=one_row_sft[0].run_dir, train_data=[PAIR])
    assert fitted_lines(capsys.readouterr().err) == [
        "config.task.num_eval: 256 held-out pairs out of 1 would leave none to train on; "
        "holding none out and evaluating on the training pair (give eval_data, or more pairs, "
        "for a held-out score)",
        "config.batch_size: 32 exceeds the 1 training pair; using 1 (set it to choose)",
    ]
    summary = result.summary
    assert summary["steps"] == 300 and summary["eval_reward_accuracy"] == 1.0
    assert summary["eval_loss"] < summary["initial_eval_loss"]


def test_a_short_run_logs_every_update(one_row_sft, tmp_path):
    """An 8-update DPO run logs 8 metric rows, not one row at its end: the preset's log_every
    (10) is lowered for a run of fewer than 10 x 10 updates (lm_runs.MIN_ROWS), and recorded."""
    from jaxrl.trainers import dpo

    config = dpo.config()
    config.num_steps = 8
    result = dpo.train(config, tmp_path / "dpo", model=one_row_sft[0].run_dir, train_data=[PAIR])
    with open(os.path.join(result.run_dir, "metrics.jsonl")) as f:
        steps = [json.loads(line)["step"] for line in f if line.strip()]
    assert steps == list(range(1, 9)), steps
    with open(os.path.join(result.run_dir, "config.json")) as f:
        assert json.load(f)["run"]["log_every"] == 1


@pytest.mark.smollm2
def test_the_readme_grpo_snippet_runs_as_written_on_smollm2(tmp_path, capsys, monkeypatch):
    """The README's "From Python" GRPO snippet as written (SmolLM2), with num_steps = 2."""
    monkeypatch.chdir(tmp_path)
    # --- the README's code ---
    from jaxrl.trainers import grpo

    def contains_answer(prompts, completions, answer, **columns):
        return [float(a in c) for a, c in zip(answer, completions)]  # noqa: B905

    rows = [
        {"prompt": f"What is {a} plus {b}? Reply with the number only.", "answer": str(a + b)}
        for a in range(2, 8)
        for b in range(3, 9)
    ]
    config = grpo.config("word_problems")  # SmolLM2's settings
    config.num_steps = 2
    result = grpo.train(
        config, "runs/grpo_py", model="smollm2", train_data=rows, rewards=[contains_answer]
    )
    result.summary["eval_task_accuracy"]
    # --- end of the README's code ---
    assert fitted_lines(capsys.readouterr().err) == [GRPO_LINE]
    assert result.summary["init_from"].startswith("GGUF file")
    assert result.summary["num_train"] == 32 and result.summary["steps"] == 2
    assert 0.0 <= result.summary["eval_task_accuracy"] <= 1.0
