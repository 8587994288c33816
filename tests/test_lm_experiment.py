"""SFT, DPO, reward models and GRPO as a user runs them: DPO and a reward model learn on
reverse-digits, SFT and DPO train on the user's chat JSONL files, DPO and GRPO runs interrupted
in every way (Ctrl-C, SIGKILL after a checkpoint or at a random moment, damaged or deleted
checkpoints) end as uninterrupted ones, and bad settings or data fail in one line before
anything compiles. (GRPO's learning test is in test_grpo.py.)"""

import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

from tests.script_runs import (
    REPO,
    all_floats_finite,
    checkpoint_steps,
    interrupt_in_every_way,
    kill_at_random_moment,
    run_script,
    start_script,
    wait_for_first_row,
)

QUIET = ["--config.run.progress=False", "--config.run.tensorboard=False"]
# A language model's run keeps its newest checkpoint only; a damaged one is then the end of the
# run, so the interruption tests, which damage one, keep two (as many as they need).
KEEP_TWO = ["--config.run.keep_checkpoints=2"]


def run(script, *args, check=True):
    return run_script(script, *args, *QUIET, check=check)


def read_json(workdir, name="summary.json"):
    with open(os.path.join(workdir, name)) as f:
        return json.load(f)


def read_metrics(workdir):
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        rows = [json.loads(line) for line in f]
    for row in rows:
        row.pop("wall_seconds")
    steps = [row["step"] for row in rows]
    assert steps == sorted(set(steps)), f"duplicate or unordered steps: {steps}"
    return rows


def read_params(workdir):
    with ocp.StandardCheckpointer() as checkpointer:
        return jax.device_get(checkpointer.restore(os.path.join(workdir, "params")))


def assert_same_params(a, b):
    for x, y in zip(jax.tree.leaves(read_params(a)), jax.tree.leaves(read_params(b)), strict=True):
        np.testing.assert_array_equal(x, y)


def timed_run(script, workdir, *args):
    """Run to completion; seconds from the first metrics row to the end (training, the final
    evaluation and the summary), the window a random kill is drawn from."""
    with open(os.path.join(os.path.dirname(workdir), "stderr.txt"), "w") as stderr:
        process = start_script(script, *args, *QUIET, f"--workdir={workdir}", stderr=stderr)
        wait_for_first_row(process, workdir)
        start = time.time()
        assert process.wait(timeout=600) == 0, f"{script} failed; see {stderr.name}"
    return time.time() - start


@pytest.fixture(scope="module")
def sft_run(tmp_path_factory):
    workdir = str(tmp_path_factory.mktemp("runs") / "sft")
    run("sft.py", f"--workdir={workdir}")
    return workdir


def test_dpo_learns_reverse_digits_from_an_sft_model(sft_run, tmp_path):
    """DPO learns to rank held-out pairs (reward accuracy >= 0.95). Greedy task accuracy is not
    what it optimises, and from this SFT model it moves either way by seed (2026-11-23, SFT at
    0.207: seeds 0/1/2 gave 0.223 / 0.125 / 0.238; the test's SFT run, under 8 simulated devices,
    0.363 -> 0.301), so the test asks only that DPO keeps most of it."""
    sft_summary = read_json(sft_run)
    assert sft_summary["algo"] == "sft" and 0.0 < sft_summary["eval_task_accuracy"] < 0.9
    workdir = str(tmp_path / "dpo")
    run("dpo.py", f"--config.init_from={sft_run}", f"--workdir={workdir}")
    summary = read_json(workdir)
    assert summary["eval_reward_accuracy"] >= 0.95
    assert summary["sft_eval_task_accuracy"] == sft_summary["eval_task_accuracy"]
    assert summary["eval_task_accuracy"] >= summary["sft_eval_task_accuracy"] - 0.1
    for name in ("config.json", "versions.json", "metrics.jsonl", "learning_curve.png", "params"):
        assert os.path.exists(os.path.join(workdir, name)), name


# Not in CI: test_reward_model.py's learning tests train the same model through the trainer
def test_reward_model_learns_to_rank_pairs_from_an_sft_model(sft_run, tmp_path):
    """reward_model.py on the task's pairs, sharded over 2 devices: held-out pair accuracy from
    chance to >= 0.75 (2026-11-24, one device: 0.477 -> 0.836); its run is refused as a policy
    to start from, in one line, with nothing written; ppo_lm.py and online_dpo.py train against
    it (a few updates, sharded), and ppo_lm.py refuses a language model's run as a reward
    model."""
    workdir = str(tmp_path / "rm")
    run(
        "reward_model.py",
        f"--config.init_from={sft_run}",
        "--config.mesh_shape=(2,1,1)",
        f"--workdir={workdir}",
    )
    summary = read_json(workdir)
    assert summary["start_eval_pair_accuracy"] < 0.65, summary
    assert summary["eval_pair_accuracy"] >= 0.75, summary
    params = read_params(workdir)
    assert set(params) == {"backbone", "score_kernel", "score_bias"}
    assert all_floats_finite(params)
    result = run(
        "dpo.py", f"--config.init_from={workdir}", f"--workdir={tmp_path / 'dpo'}", check=False
    )
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1, result.stderr[-2000:]
    assert "a reward model's run (reward_model.py)" in lines[0]
    assert not os.path.exists(tmp_path / "dpo")

    # PPO against it, with a critic started from it, sharded: the run directory's contract.
    ppo = str(tmp_path / "ppo")
    run(
        "ppo_lm.py",
        f"--config.init_from={sft_run}",
        f"--config.reward_model={workdir}",
        "--config.critic=separate",
        "--config.num_steps=4",
        "--config.batch_size=16",
        "--config.run.num_chunks=2",
        "--config.mesh_shape=(2,1,1)",
        "--config.task.num_eval=32",
        f"--workdir={ppo}",
    )
    summary = read_json(ppo)
    assert summary["reward_model"] == [workdir] and summary["critic"] == "separate"
    assert all(np.isfinite(summary[k]) for k in ("final_score", "final_kl", "final_mean_reward"))
    policy = read_params(ppo)  # the policy alone: a language model later scripts start from
    assert "embedding" in policy and all_floats_finite(policy)
    for name in ("learning_curve.png", "score_curve.png", "held_out_accuracy.png", "model.json"):
        assert os.path.exists(os.path.join(ppo, name)), name
    # Online DPO ranking samples by it: the same contract.
    online = str(tmp_path / "online_dpo")
    run(
        "online_dpo.py",
        f"--config.init_from={sft_run}",
        f"--config.reward_model={workdir}",
        "--config.num_steps=2",
        "--config.batch_size=8",
        "--config.num_minibatches=1",
        "--config.run.num_chunks=1",
        "--config.mesh_shape=(2,1,1)",
        "--config.task.num_eval=32",
        f"--workdir={online}",
    )
    summary = read_json(online)
    assert summary["reward_model"] == [workdir] and np.isfinite(summary["final_score"])
    assert all_floats_finite(read_params(online))
    # A language model's run is no reward model: one line, nothing written.
    result = run(
        "ppo_lm.py",
        f"--config.init_from={sft_run}",
        f"--config.reward_model={sft_run}",
        f"--workdir={tmp_path / 'ppo_bad'}",
        check=False,
    )
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1, result.stderr[-2000:]
    assert "a language model's run, not a reward model's" in lines[0]
    assert not os.path.exists(tmp_path / "ppo_bad")


DPO_SMALL = [
    "--config.num_steps=60",
    "--config.run.num_chunks=3",
    "--config.run.log_every=5",
    "--config.mesh_shape=(2,1,1)",  # sharded over 2 of the 8 simulated devices
]
DPO_HEADLINES = ("eval_reward_accuracy", "eval_reward_margin", "eval_loss", "eval_task_accuracy")


@pytest.fixture(scope="module")
def dpo_whole(sft_run, tmp_path_factory):
    """An uninterrupted small DPO run, and its seconds from first metrics row to exit."""
    workdir = str(tmp_path_factory.mktemp("dpo") / "whole")
    seconds = timed_run("dpo.py", workdir, f"--config.init_from={sft_run}", *DPO_SMALL)
    return workdir, seconds


def test_dpo_interrupted_in_every_way_ends_as_an_uninterrupted_run(sft_run, dpo_whole, tmp_path):
    """Ctrl-C before the first checkpoint, SIGKILL after a checkpoint, a damaged newest checkpoint
    and deleted checkpoints, each followed by the same command (tests/script_runs.py)."""
    whole, parts = dpo_whole[0], str(tmp_path / "parts")
    flags = [f"--config.init_from={sft_run}", *DPO_SMALL, *QUIET, *KEEP_TWO, f"--workdir={parts}"]
    interrupt_in_every_way("dpo.py", whole, *flags)
    a, b = read_json(whole), read_json(parts)
    for key in DPO_HEADLINES:
        assert a[key] == b[key], key
    assert not os.path.exists(os.path.join(whole, "damaged_checkpoints"))
    assert os.listdir(os.path.join(parts, "damaged_checkpoints"))
    assert_same_params(whole, parts)


# Not in CI: test_dpo_interrupted_in_every_way_ends_as_an_uninterrupted_run kills -9 at fixed points
def test_dpo_killed_at_a_random_moment_resumes_to_the_same_result(sft_run, dpo_whole, tmp_path):
    flags = [f"--config.init_from={sft_run}", *DPO_SMALL]
    (whole, window), parts = dpo_whole, str(tmp_path / "parts")
    kill_at_random_moment(
        "dpo.py", *flags, *QUIET, f"--workdir={parts}", seed=0, max_delay=0.9 * window
    )
    run("dpo.py", *flags, f"--workdir={parts}")
    assert read_metrics(parts) == read_metrics(whole)
    a, b = read_json(whole), read_json(parts)
    for key in DPO_HEADLINES:
        assert a[key] == b[key], key
    assert_same_params(whole, parts)


def test_bad_settings_fail_in_one_line_before_compiling(sft_run, tmp_path):
    cases = [
        ([], "config.init_from: DPO starts from an SFT model"),
        ([f"--config.init_from={sft_run}", "--config.loss_type=hinge"], "config.loss_type"),
        ([f"--config.init_from={sft_run}", "--config.mesh_shape=(3,1,1)"], "batch_size"),
        ([f"--config.init_from={tmp_path}"], "config.init_from"),
    ]
    for flags, message in cases:
        result = run("dpo.py", *flags, f"--workdir={tmp_path / 'bad'}", check=False)
        lines = result.stderr.strip().splitlines()
        assert result.returncode == 2, result.stderr[-2000:]
        assert len(lines) == 1 and message in lines[0], lines


def test_malformed_preference_row_names_file_and_line(sft_run, tmp_path):
    train = tmp_path / "train.jsonl"
    train.write_text(
        '{"prompt": "a", "chosen": "b", "rejected": "c"}\n{"prompt": "a", "chosen": "b"}\n'
    )
    result = run(
        "dpo.py",
        f"--config.init_from={sft_run}",
        f"--config.task.train_jsonl={train}",
        f"--config.task.eval_jsonl={train}",
        f"--workdir={tmp_path / 'bad'}",
        check=False,
    )
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1, result.stderr[-2000:]
    assert f"{train}:2" in lines[0] and "rejected" in lines[0]


# --- your own data: SFT and DPO on chat JSONL files ------------------------------------------


def write_jsonl(path, rows):
    with open(path, "w", encoding="utf-8") as f:
        for row in rows:
            f.write((row if isinstance(row, str) else json.dumps(row)) + "\n")
    return str(path)


def say(role, content):
    return {"role": role, "content": content}


def digit_strings(seed, count):
    """Digit strings of 2 to 6 digits: rows of different lengths."""
    rng = np.random.default_rng(seed)
    return ["".join(map(str, rng.integers(0, 10, rng.integers(2, 7)))) for _ in range(count)]


@pytest.fixture(scope="module")
def chat_data(tmp_path_factory):
    """A character-level tokenizer with a ChatML template (tests/test_chat_data.py) that fits the
    tiny model's vocabulary; two-turn conversations that reverse digits, for SFT; and pairs that
    prefer the reversal to the digits as given, in TRL's conversational format, for DPO."""
    from tests.test_chat_data import write_chat_tokenizer

    root = tmp_path_factory.mktemp("chat")
    conversations = [
        {
            "messages": [
                say("system", "reverse"),
                say("user", a),
                say("assistant", a[::-1]),
                say("user", b),
                say("assistant", b[::-1]),
            ]
        }
        for a, b in zip(digit_strings(0, 240), digit_strings(1, 240), strict=True)
    ]
    pairs = [
        {
            "prompt": [say("system", "reverse"), say("user", a)],
            "chosen": [say("assistant", a[::-1])],
            "rejected": [say("assistant", a)],
        }
        for a in digit_strings(2, 240)
    ]
    return {
        "tokenizer": write_chat_tokenizer(root / "tokenizer"),
        "sft": write_jsonl(root / "sft.jsonl", conversations),
        "pairs": write_jsonl(root / "pairs.jsonl", pairs[:200]),
        "eval_pairs": write_jsonl(root / "eval_pairs.jsonl", pairs[200:]),
        "root": root,
    }


CHAT_SFT = [
    "--config.num_steps=40",
    "--config.batch_size=16",
    "--config.task.num_eval=40",
    "--config.run.num_chunks=1",
]


@pytest.fixture(scope="module")
def chat_sft(chat_data):
    workdir = str(chat_data["root"] / "sft")
    result = run(
        "sft.py",
        f"--config.task.tokenizer={chat_data['tokenizer']}",
        f"--config.task.train_jsonl={chat_data['sft']}",
        *CHAT_SFT,
        f"--workdir={workdir}",
    )
    return workdir, result.stdout


def test_sft_on_chat_messages_learns_the_assistant_turns(chat_data, chat_sft):
    from jaxrl.data.chat import encode_sft_rows, example_lengths, read_sft_jsonl
    from jaxrl.lm import load_tokenizer

    workdir, stdout = chat_sft
    summary = read_json(workdir)
    assert summary["task"] is None and summary["dataset"] == chat_data["sft"]
    assert summary["eval_task_accuracy"] is None
    # From a random model's ln(259) = 5.6 nats a token to what the digits leave uncertain.
    assert summary["eval_loss"] < 2.5 and summary["eval_token_accuracy"] > 0.3
    assert summary["initial_eval_loss"] > 5.0  # about ln(259) before training
    # Lengths from the data (length_percentile=100: the longest row), nothing cut.
    tokenizer = load_tokenizer(chat_data["tokenizer"])
    prompt, rest = example_lengths(encode_sft_rows(read_sft_jsonl(chat_data["sft"]), tokenizer))
    assert summary["max_prompt_length"] == prompt.max()
    assert summary["max_length"] == (prompt + rest).max()
    assert summary["cut_rows"] == {"train": 0, "eval": 0}
    assert "rows cut: 0 training, 0 held-out" in stdout
    assert read_json(workdir, "model.json")["tokenizer"] == "tokenizer"


def test_dpo_on_chat_pairs_from_the_chat_sft_model(chat_data, chat_sft, tmp_path):
    from jaxrl.data import load_preference_split
    from jaxrl.data.chat import check_cuts, fit_lengths
    from jaxrl.data.preferences import encode_preference_rows, pair_lengths, read_preference_jsonl
    from jaxrl.lm import load_tokenizer

    workdir = str(tmp_path / "dpo")
    result = run(
        "dpo.py",
        f"--config.init_from={chat_sft[0]}",  # brings the tokenizer and its chat template
        f"--config.task.train_jsonl={chat_data['pairs']}",
        f"--config.task.eval_jsonl={chat_data['eval_pairs']}",
        # Shorter rows than the longest: the longest fifth of them (6 digits) are cut.
        "--config.task.length_percentile=75",
        "--config.task.max_cut_fraction=0.3",
        "--config.num_steps=20",
        "--config.batch_size=16",
        "--config.eval_batch_size=32",
        "--config.run.num_chunks=1",
        f"--workdir={workdir}",
    )
    summary = read_json(workdir)
    assert 0.0 <= summary["eval_reward_accuracy"] <= 1.0 and np.isfinite(summary["eval_loss"])
    assert summary["task"] is None and summary["eval_task_accuracy"] is None

    tokenizer = load_tokenizer(chat_data["tokenizer"])
    rows = {s: list(read_preference_jsonl(chat_data[f])) for s, f in SPLIT_FILES.items()}
    encoded = {split: encode_preference_rows(rows[split], tokenizer) for split in rows}
    prompt, rest = pair_lengths(*(sum((encoded[s][i] for s in rows), []) for i in (0, 1)))
    lengths = fit_lengths(prompt, rest, 0, 0, percentile=75)
    assert (summary["max_prompt_length"], summary["max_length"]) == lengths
    cut = {s: check_cuts(*pair_lengths(*encoded[s]), *lengths, 1.0) for s in rows}
    assert summary["cut_rows"] == cut and cut["train"] > 0
    assert f"pairs cut: {cut['train']} training, {cut['eval']} held-out" in result.stdout
    # The run keeps the pairs, messages and all, as a tensorflow-datasets dataset.
    assert list(load_preference_split(summary["dataset"], "train")) == rows["train"]


SPLIT_FILES = {"train": "pairs", "eval": "eval_pairs"}


def test_bad_data_fails_in_one_line_before_anything_is_written(chat_data, sft_run, tmp_path):
    """Malformed rows name their file and line; missing chat templates, held-out splits larger
    than the data and lengths that cut too many rows name the setting; nothing is written."""
    files = {
        "json": ['{"messages": [{"role": "user", "content": "1"}]', ""],
        "field": ['{"text": "12"}'],
        "type": ['{"prompt": "12", "completion": 21}'],
        "empty": ["", ""],
        "role": ['{"messages": [{"role": "human", "content": "12"}]}'],
        "turn": ['{"messages": [{"role": "user", "content": "12"}]}'],
        "mixed": [
            json.dumps({"prompt": "12", "completion": "21"}),
            json.dumps({"messages": [say("user", "1"), say("assistant", "1")]}),
        ],
        "pair": [
            '{"prompt": [{"role": "user", "content": "12"}], "chosen": "21", "rejected": "1"}'
        ],
    }
    paths = {name: write_jsonl(tmp_path / f"{name}.jsonl", lines) for name, lines in files.items()}
    tokenizer = f"--config.task.tokenizer={chat_data['tokenizer']}"
    chat = f"--config.task.train_jsonl={chat_data['sft']}"
    small = "--config.task.num_eval=40"
    cases = [
        ("sft.py", [f"--config.task.train_jsonl={paths['json']}"], f"{paths['json']}:1: invalid"),
        ("sft.py", [f"--config.task.train_jsonl={paths['field']}"], f"{paths['field']}:1: missing"),
        ("sft.py", [f"--config.task.train_jsonl={paths['type']}"], f"{paths['type']}:1: 'prompt'"),
        ("sft.py", [f"--config.task.train_jsonl={paths['empty']}"], f"{paths['empty']}: no rows"),
        ("sft.py", [f"--config.task.train_jsonl={paths['role']}"], f"{paths['role']}:1: 'messa"),
        ("sft.py", [f"--config.task.train_jsonl={paths['turn']}"], f"{paths['turn']}:1: 'messa"),
        ("sft.py", [f"--config.task.train_jsonl={paths['mixed']}"], f"{paths['mixed']}:2: a mes"),
        ("sft.py", [chat], "config.task.train_jsonl: "),  # the byte tokenizer: no chat template
        ("sft.py", [chat, tokenizer, "--config.task.num_eval=240"], "config.task.num_eval: 240"),
        ("sft.py", [chat, tokenizer, small, "--config.task.max_length=30"], "config.task.max_le"),
        ("sft.py", [chat, tokenizer, "--config.task.assistant_turns=first"], "config.task.assis"),
        ("sft.py", [f"--config.task.eval_jsonl={chat_data['sft']}"], "config.task.eval_jsonl: "),
        ("sft.py", ["--config.task.train_jsonl=/no/such.jsonl"], "config.task.train_jsonl: /no"),
        ("sft.py", ["--config.task.length_percentile=0"], "config.task.length_percentile: "),
        (
            "dpo.py",
            [f"--config.init_from={sft_run}", f"--config.task.train_jsonl={paths['pair']}"],
            f"{paths['pair']}:1: fields mix strings and message lists",
        ),
        (
            "dpo.py",
            [
                f"--config.init_from={sft_run}",
                f"--config.task.train_jsonl={chat_data['pairs']}",
                f"--config.task.eval_jsonl={chat_data['eval_pairs']}",
            ],
            "config.task.train_jsonl: ",  # sft_run's byte tokenizer: no chat template
        ),
    ]

    def command(index):
        script, arguments, _ = cases[index]
        path = os.path.join(REPO, "experiments", script)
        workdir = f"--workdir={tmp_path / 'runs' / str(index)}"
        return subprocess.run(
            [sys.executable, path, *arguments, *QUIET, workdir],
            capture_output=True,
            text=True,
            timeout=300,
            cwd=REPO,
        )

    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(command, range(len(cases))))
    failures = []
    for (script, arguments, expected), result in zip(cases, results, strict=True):
        lines = [line for line in result.stderr.splitlines() if line.strip()]
        if (
            result.returncode != 2
            or len(lines) != 1
            or not lines[0].startswith(f"error: {expected}")
            or "; " not in lines[0]
        ):
            failures.append(f"{script} {arguments}: rc {result.returncode}: {result.stderr[-800:]}")
    assert not failures, "\n".join(failures)
    assert not os.path.exists(tmp_path / "runs")  # no run directory


GRPO_SMALL = [
    "--config.num_steps=12",
    "--config.batch_size=8",
    "--config.group_size=4",
    "--config.kl_beta=0.05",  # the reference model's pass inside the step
    "--config.run.num_chunks=3",
    "--config.run.log_every=2",
    "--config.rewards.format_weight=0.5",
    "--config.mesh_shape=(2,1,1)",
]
GRPO_HEADLINES = ("final_mean_reward", "eval_task_accuracy", "initial_eval_task_accuracy")


@pytest.fixture(scope="module")
def grpo_whole(tmp_path_factory):
    """An uninterrupted small GRPO run, and its seconds from first metrics row to exit."""
    workdir = str(tmp_path_factory.mktemp("grpo") / "whole")
    return workdir, timed_run("grpo.py", workdir, *GRPO_SMALL)


def test_grpo_interrupted_in_every_way_ends_as_an_uninterrupted_run(grpo_whole, tmp_path):
    """As DPO's: Ctrl-C, SIGKILL, a damaged checkpoint and deleted checkpoints, then the same
    command each time; the rows and the result are the uninterrupted run's."""
    whole, parts = grpo_whole[0], str(tmp_path / "parts")
    interrupt_in_every_way("grpo.py", whole, *GRPO_SMALL, *QUIET, *KEEP_TWO, f"--workdir={parts}")
    rows = read_metrics(parts)
    for name in ("reward_task", "reward_format", "kl", "clip_fraction", "entropy"):
        assert name in rows[-1], name
    a, b = read_json(whole), read_json(parts)
    for key in GRPO_HEADLINES:
        assert a[key] == b[key], key
    for name in ("config.json", "metrics.jsonl", "learning_curve.png", "params"):
        assert os.path.exists(os.path.join(whole, name)), name
    assert_same_params(whole, parts)


# Not in CI: test_grpo_interrupted_in_every_way_ends_as_an_uninterrupted_run kills -9 at fixed
# points
def test_grpo_killed_at_a_random_moment_resumes_to_the_same_result(grpo_whole, tmp_path):
    (whole, window), parts = grpo_whole, str(tmp_path / "parts")
    kill_at_random_moment(
        "grpo.py", *GRPO_SMALL, *QUIET, f"--workdir={parts}", seed=1, max_delay=0.9 * window
    )
    run("grpo.py", *GRPO_SMALL, f"--workdir={parts}")
    assert read_metrics(parts) == read_metrics(whole)
    a, b = read_json(whole), read_json(parts)
    for key in GRPO_HEADLINES:
        assert a[key] == b[key], key
    assert_same_params(whole, parts)


# A host reward on one device: on a multi-device CPU mesh one hung once (see
# envs.text.reward_terms.host_reward).
GRPO_ONE_DEVICE = [f for f in GRPO_SMALL if not f.startswith("--config.mesh_shape")]


def error_lines(stderr):
    return [line for line in stderr.splitlines() if line.startswith("error:")]


def test_grpo_reward_turning_nan_stops_in_one_line_keeping_the_last_good_checkpoint(tmp_path):
    """A host reward that returns NaN from its seventh call (update 7, in the second chunk): the
    run stops in one line naming the function and the problem, with the traceback in the run's
    error.log; the checkpoint of step 4 is kept and finite, and nothing NaN was saved."""
    workdir = str(tmp_path / "nan")
    flags = [*GRPO_ONE_DEVICE, *QUIET, f"--workdir={workdir}"]
    reward = "--config.rewards.host=tests.fixtures.host_reward:nan_after_six_calls"
    result = run_script("grpo.py", *flags, reward, check=False)
    assert result.returncode == 2, result.stderr[-3000:]
    [line] = error_lines(result.stderr)
    assert line.startswith(
        "error: reward function tests.fixtures.host_reward:nan_after_six_calls: returned nan "
        "for completion 0 of 32 (32 non-finite in all); return finite floats (in updates 5-8; "
        "the checkpoint of step 4 is kept); traceback in "
    ), line
    assert "Traceback" not in result.stderr
    with open(os.path.join(workdir, "error.log")) as f:
        assert "HostFunctionError: returned nan for completion 0" in f.read()
    assert checkpoint_steps(workdir) == [4]
    with ocp.StandardCheckpointer() as checkpointer:
        state = checkpointer.restore(os.path.join(workdir, "checkpoints", "4", "state"))
    assert all_floats_finite(state)
    assert not os.path.exists(os.path.join(workdir, "params"))


def test_grpo_reward_raising_is_one_line_with_the_traceback_in_the_run_directory(tmp_path):
    workdir = str(tmp_path / "raises")
    flags = [*GRPO_ONE_DEVICE, *QUIET, f"--workdir={workdir}"]
    reward = "--config.rewards.host=tests.fixtures.host_reward:raises_key_error"
    result = run_script("grpo.py", *flags, reward, check=False)
    assert result.returncode == 2, result.stderr[-3000:]
    log = os.path.join(workdir, "error.log")
    assert error_lines(result.stderr) == [
        "error: reward function tests.fixtures.host_reward:raises_key_error: raised KeyError: "
        "'score'; fix the function and run the same command again to resume (in updates 1-4; "
        f"no checkpoint yet); traceback in {log}"
    ]
    with open(log) as f:
        text = f.read()
    assert "Traceback" in text and 'return [row["score"]]' in text


def test_bad_grpo_settings_fail_in_one_line(tmp_path):
    cases = [
        (["--config.variant=ppo"], "config.variant"),
        (["--config.rewards.host=no_such_module:f"], "config.rewards.host"),
        (["--config.mesh_shape=(3,1,1)"], "batch_size"),
        (["--config.max_new_tokens=100"], "config.max_new_tokens"),
        (["--config.task.name=multiply"], "config.task"),
    ]
    for flags, message in cases:
        result = run("grpo.py", *flags, f"--workdir={tmp_path / 'bad'}", check=False)
        lines = result.stderr.strip().splitlines()
        assert result.returncode == 2, result.stderr[-2000:]
        assert len(lines) == 1 and message in lines[0], lines
