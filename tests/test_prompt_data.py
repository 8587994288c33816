"""GRPO on a user's prompt file: reading and tokenising the file (jaxrl.data.prompts), sampling it
inside the compiled update with every column reaching the host rewards, and the script learning
from it end to end."""

import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest
import tensorflow_datasets as tfds

from algos import grpo
from envs.text.prompt_dataset import prompt_dataset_task
from envs.text.reward_terms import host_reward
from jaxrl import hparams, loop
from jaxrl.config import ConfigError
from jaxrl.data.prompts import (
    PromptDataError,
    choose_length,
    read_prompt_jsonl,
    read_prompt_tfds,
    split_rows,
    tokenize_prompts,
)
from jaxrl.lm.model import ModelConfig, init_params
from jaxrl.lm.sampler import Sampling
from jaxrl.lm.tokenizer import ByteTokenizer, load_tokenizer

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES = os.path.join(REPO, "tests", "fixtures")
SAY_DIGIT = os.path.join(FIXTURES, "prompts", "say_digit.jsonl")
SAY_DIGIT_CHAT = os.path.join(FIXTURES, "prompts", "say_digit_chat.jsonl")
BYTES = ByteTokenizer()
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def chat_tokenizer_dir(tmp_path):
    """The 128-id fixture tokenizer with a ChatML-style chat template beside it."""
    directory = tmp_path / "tokenizer"
    directory.mkdir()
    with open(os.path.join(FIXTURES, "hf", "tokenizer", "tokenizer.json")) as f:
        (directory / "tokenizer.json").write_text(f.read())
    (directory / "tokenizer_config.json").write_text(json.dumps({"chat_template": CHATML}))
    return str(directory)


# --- reading, splitting, tokenising ------------------------------------------------------------


def test_rows_keep_every_column_and_split_deterministically():
    rows = read_prompt_jsonl(SAY_DIGIT)
    assert len(rows) == 40 and set(rows[0].columns) == {"prompt", "answer", "level"}
    assert rows[0].where.endswith("say_digit.jsonl:1") and not rows[0].conversational
    train, held_out = split_rows(rows, 8, seed=0)
    again, _ = split_rows(rows, 8, seed=0)
    assert [r.where for r in train] == [r.where for r in again]
    assert len(train) == 32 and len(held_out) == 8
    assert not {r.where for r in train} & {r.where for r in held_out}
    with pytest.raises(ConfigError, match="num_eval: 40 held-out rows out of 40"):
        split_rows(rows, 40, seed=0)


def test_prompts_are_left_padded_whole_strings_with_bos():
    rows = read_prompt_jsonl(SAY_DIGIT)[:3]
    table = tokenize_prompts(rows, BYTES)
    # "say 7:" is 6 bytes, plus BOS: every row is 7 tokens, so no padding at 100%.
    assert table.tokens.shape == (3, 7) and table.mask.all() and table.cut == 0
    assert list(table.tokens[0]) == [BYTES.bos_id, *BYTES.encode(rows[0].prompt)]
    wider = tokenize_prompts(rows, BYTES, max_prompt_length=10)
    assert not wider.mask[:, :3].any() and wider.mask[:, 3:].all()  # padding on the left
    assert table.column_names() == ["answer", "level"]


def test_length_from_a_percentile_cuts_the_tail_and_counts_it():
    assert choose_length([3, 4, 5, 100], 100) == 100
    assert choose_length([3, 4, 5, 100], 75) == 5
    rows = read_prompt_jsonl(os.path.join(FIXTURES, "prompts", "long_prompt.jsonl"))
    rows = rows + read_prompt_jsonl(SAY_DIGIT)[:6]
    table = tokenize_prompts(rows, BYTES, length_percentile=75, max_cut_fraction=0.5)
    assert table.max_prompt_length == 7 and table.cut == 2 and table.longest > 100
    # A cut prompt keeps its end, where the question is.
    assert BYTES.decode(table.tokens[0]).endswith("words :")
    with pytest.raises(ConfigError, match="max_prompt_length: 2 of 8 prompts have more than 7"):
        tokenize_prompts(rows, BYTES, length_percentile=75, max_cut_fraction=0.1)


def test_chat_prompts_render_with_the_generation_prompt(tmp_path):
    tokenizer = load_tokenizer(chat_tokenizer_dir(tmp_path))
    rows = read_prompt_jsonl(SAY_DIGIT_CHAT)[:2]
    table = tokenize_prompts(rows, tokenizer)
    assert rows[0].conversational and table.conversational
    want = f"<|im_start|>user\n{rows[0].prompt[0]['content']}<|im_end|>\n<|im_start|>assistant\n"
    # The whole rendered string is encoded at once; no BOS is added to a rendered template.
    assert list(table.tokens[0][table.mask[0]]) == tokenizer.encode(want)
    with pytest.raises(ConfigError, match="byte tokenizer has no chat template"):
        tokenize_prompts(rows, BYTES)


def test_a_malformed_file_names_its_line(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text('{"prompt": "a", "x": 1}\n\n{"prompt": "b"}\n')
    with pytest.raises(PromptDataError, match=r"p.jsonl:3: lacks column\(s\) \['x'\]"):
        read_prompt_jsonl(path)


def build_prompt_tfds(data_dir, splits, chat=False):
    """A TFDS dataset in array_record format, as `tfds build` would prepare one, of the say-digit
    rows: a "question" Text feature (chat: a Sequence of {"role", "content"} messages), an
    "answer" and an integer "level"; `splits` maps split names to rows of the fixture file."""

    class SayDigit(tfds.core.GeneratorBasedBuilder, skip_registration=True):
        name = "say_digit_chat" if chat else "say_digit"
        code_path = None  # nothing to download (see jaxrl.data.preferences.PreferencePairs)
        VERSION = tfds.core.Version("1.0.0")

        def _info(self):
            message = tfds.features.Sequence(
                {"role": tfds.features.Text(), "content": tfds.features.Text()}
            )
            question = message if chat else tfds.features.Text()
            features = {"question": question, "answer": tfds.features.Text()}
            features["level"] = tfds.features.Scalar(dtype=np.int32)
            features = tfds.features.FeaturesDict(features)
            return tfds.core.DatasetInfo(builder=self, features=features, disable_shuffling=True)

        def _split_generators(self, dl_manager):
            return {split: self._generate_examples(rows) for split, rows in splits.items()}

        def _generate_examples(self, rows):
            for index, row in enumerate(rows):
                columns = dict(row.columns)
                question = columns.pop("prompt")
                if chat:
                    question = {k: [m[k] for m in question] for k in ("role", "content")}
                yield index, {"question": question, **columns}

    builder = SayDigit(data_dir=str(data_dir), file_format="array_record")
    builder.download_and_prepare(download_dir=str(data_dir / "downloads"))
    return str(builder.data_dir)


@pytest.mark.parametrize("chat", [False, True], ids=["strings", "chat"])
def test_a_tfds_dataset_gives_the_rows_a_jsonl_file_gives(tmp_path, chat):
    """A built TFDS dataset (array_record, read with as_data_source) gives the same rows as the
    JSONL file it was made from, its `question` feature read as the prompt (`prompt_column`),
    Text as strings and a Sequence of messages as chat messages; by path or by name."""
    rows = read_prompt_jsonl(SAY_DIGIT_CHAT if chat else SAY_DIGIT)
    path = build_prompt_tfds(tmp_path, {"train": rows[:30], "test": rows[30:]}, chat)
    train = read_prompt_tfds(path, "train", prompt_column="question")
    name = "say_digit_chat" if chat else "say_digit"
    test = read_prompt_tfds(f"{name}:1.0.0", "test", tmp_path, prompt_column="question")
    assert [r.columns for r in train + test] == [r.columns for r in rows]
    assert train[0].where == f"{path}[train][0]" and train[0].conversational == chat
    with pytest.raises(PromptDataError, match=r"no split 'eval'; choose one of test, train"):
        read_prompt_tfds(path, "eval", prompt_column="question")
    with pytest.raises(PromptDataError, match=r"no feature 'prompt' to read prompts from"):
        read_prompt_tfds(path, "train")
    with pytest.raises(PromptDataError, match=r"no built dataset 'nope'.*tfds build NAME"):
        read_prompt_tfds("nope", "train", tmp_path)


# --- every column reaches the host rewards, inside the compiled update --------------------------

TINY = ModelConfig(
    vocab_size=259, hidden_size=32, intermediate_size=64, num_layers=1, num_heads=2,
    num_kv_heads=1, max_position_embeddings=32,
)  # fmt: skip


def test_every_column_reaches_each_weighted_host_reward():
    rows = read_prompt_jsonl(SAY_DIGIT)
    table = tokenize_prompts(rows, BYTES)
    seen = []

    def record(prompts, completions, answer, level, **columns):
        seen.append((list(prompts), list(answer), list(level), dict(columns)))
        return [float(len(c)) for c in completions]

    def ones(prompts, completions, **columns):
        return [1.0] * len(completions)

    task = prompt_dataset_task("say_digit", table, BYTES)
    task = task.with_reward(host_reward(record, BYTES, "length", 0.5, table=table))
    task = task.with_reward(host_reward(ones, BYTES, "ones", 2.0, table=table))
    config = grpo.Config(batch_size=4, group_size=2, sampling=Sampling(max_new_tokens=3))
    algorithm = grpo.make(config, TINY, task, init_params(TINY, jax.random.key(0)))
    hp = hparams.hparams(config)
    state = algorithm.init(jax.random.key(1), hp)
    chunk = jax.jit(loop.make_chunk(algorithm.update, 1, runs_axis=False))
    _, metrics = chunk(state, grpo.Inputs(task_data=task.data), hp)
    prompts, answers, levels, others = seen[0]
    assert len(prompts) == 8 and others == {}  # batch_size x group_size completions
    by_prompt = {row.prompt: row.columns for row in rows}
    assert all(by_prompt[p]["answer"] == a for p, a in zip(prompts, answers, strict=True))
    assert levels == [1] * 8  # columns keep their JSON types
    assert prompts[0] == prompts[1]  # a group's completions share their prompt
    # Each term is logged on its own; the reward is their weighted sum.
    np.testing.assert_allclose(metrics["reward_ones"], 1.0)
    np.testing.assert_allclose(metrics["reward"], 0.5 * metrics["reward_length"] + 2.0, rtol=1e-6)


# --- the script: a prompt file and a reward function of the user's own -------------------------


def grpo_script(workdir, *flags):
    command = [
        sys.executable, "experiments/grpo.py", f"--workdir={workdir}",
        "--config.run.progress=False",
        "--config.rewards.host=tests.fixtures.host_reward:says_answer", *flags,
    ]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, cwd=REPO, timeout=900)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    with open(os.path.join(workdir, "summary.json")) as f:
        return json.load(f)


def test_grpo_learns_from_a_prompt_file_with_a_host_reward(tmp_path):
    """A random tiny model learns to say the digit each prompt names ("say 7:" -> "7"), rewarded
    by a function in the user's own module reading the file's `answer` column. Held-out
    accuracy (greedy, 50 prompts never trained on) must reach 0.6 from about 0.1 (one digit in
    ten by chance), with a paired bootstrap 95% interval of the change above zero. Seeds 0 and 1
    both reached 0.82 when this was written (at 16 prompts per update and lr 3e-3, 0.26-0.72)."""
    rng = np.random.default_rng(0)
    path = tmp_path / "train.jsonl"
    with open(path, "w") as f:
        for digit in rng.integers(0, 10, 300):
            f.write(json.dumps({"prompt": f"say {digit}:", "answer": str(digit), "level": 1}))
            f.write("\n")
    summary = grpo_script(
        tmp_path / "run", f"--config.task.train_jsonl={path}", "--config.task.num_eval=50",
        "--config.num_steps=150", "--config.run.num_chunks=3", "--config.eval_every=1",
        "--config.batch_size=32", "--config.group_size=8", "--config.max_new_tokens=2",
        "--config.learning_rate=2e-3",
    )  # fmt: skip
    assert summary["num_train"] == 250 and summary["num_eval"] == 50
    assert summary["eval_task_accuracy"] >= 0.6, summary
    assert summary["eval_accuracy_change_ci95"][0] > 0, summary
    assert summary["eval_reward_says_answer"] == pytest.approx(summary["eval_task_accuracy"])
    # The held-out curve: evaluations after chunks 1 and 2 with their intervals, plotted with
    # the first and the last.
    with open(tmp_path / "run" / "metrics.jsonl") as f:
        evals = [row for row in map(json.loads, f) if "eval_task_accuracy" in row]
    assert [row["step"] for row in evals] == [50, 100]
    assert all(r["eval_task_accuracy_low"] <= r["eval_task_accuracy"] for r in evals)
    assert all(r["eval_task_accuracy"] <= r["eval_task_accuracy_high"] for r in evals)
    assert (tmp_path / "run" / "held_out_accuracy.png").stat().st_size > 10_000


def test_grpo_on_chat_prompts_with_the_checkpoint_template(tmp_path):
    """The same file with TRL-style conversational prompts: rendered by the tokenizer's chat
    template, completions reach the reward as assistant messages. A few updates check the
    pipeline; the string-prompt test above is the learning one."""
    summary = grpo_script(
        tmp_path / "run", f"--config.task.train_jsonl={SAY_DIGIT_CHAT}",
        f"--config.task.tokenizer={chat_tokenizer_dir(tmp_path)}", "--config.model.vocab_size=128",
        "--config.task.num_eval=8", "--config.num_steps=4", "--config.run.num_chunks=2",
        "--config.batch_size=4", "--config.group_size=2", "--config.max_new_tokens=2",
        "--config.eval_every=1", "--config.run.log_every=1",
    )  # fmt: skip
    assert summary["num_train"] == 32 and 0 <= summary["eval_task_accuracy"] <= 1
    assert summary["eval_examples"][0]["prompt"].startswith("say ")
    with open(tmp_path / "run" / "metrics.jsonl") as f:
        rows = [json.loads(line) for line in f]
    assert any("eval_task_accuracy" in row for row in rows)  # the mid-run evaluation
    assert all("reward_says_answer" in row for row in rows if "reward" in row)


def test_grpo_on_a_tfds_dataset_with_a_held_out_split(tmp_path):
    """The prompts from a built TFDS dataset instead of a file: its "question" feature is the
    prompt, its "test" split the held-out one; every column reaches the reward as from JSONL. A
    few updates check the pipeline."""
    rows = read_prompt_jsonl(SAY_DIGIT)
    path = build_prompt_tfds(tmp_path / "tfds", {"train": rows[:30], "test": rows[30:]})
    summary = grpo_script(
        tmp_path / "run", f"--config.task.train_tfds={path}", "--config.task.eval_split=test",
        "--config.task.prompt_column=question", "--config.num_steps=4",
        "--config.run.num_chunks=1", "--config.batch_size=4", "--config.group_size=2",
        "--config.max_new_tokens=2",
    )  # fmt: skip
    assert summary["num_train"] == 30 and summary["num_eval"] == 10, summary
    assert summary["eval_examples"][0]["prompt"].startswith("say ")
    assert 0 <= summary["eval_task_accuracy"] <= 1


def test_a_digit_task_runs_on_a_tokenizer_without_digit_tokens(tmp_path):
    """The fixture tokenizer writes "0" as two tokens, so the reverse-digits task cannot be drawn
    and scored in JAX: its problems become a prompt table, tokenised as whole strings, scored by
    the task on the host. A pipeline check of a few updates."""
    summary = grpo_script(
        tmp_path / "run", "--config.init_from=tests/fixtures/hf/tiny_llama",
        "--config.task.tokenizer=tests/fixtures/hf/tokenizer", "--config.rewards.host=",
        "--config.task.num_eval=16", "--config.num_steps=2", "--config.run.num_chunks=1",
        "--config.batch_size=4", "--config.group_size=2",
    )  # fmt: skip
    tokenizer = load_tokenizer(os.path.join(FIXTURES, "hf", "tokenizer"))
    prompt = summary["eval_examples"][0]["prompt"]
    assert prompt.startswith("rev ") and summary["task"] == "reverse_digits"
    assert summary["prompt_length"] >= len(tokenizer.encode(prompt))
    assert summary["num_eval"] == 16 and 0 <= summary["eval_task_accuracy"] <= 1
