"""Tokenizers (jaxrl.lm.tokenizer) and preference / SFT data (jaxrl.data): JSONL -> TFDS round trip,
row validation, fixed-shape tokenisation with hand-checked masks, and deterministic batching."""

import itertools
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from jaxrl.config import ConfigError
from jaxrl.data import (
    PreferenceDataError,
    batches,
    build_preference_dataset,
    load_preference_split,
    tokenize_preferences,
    tokenize_sft,
)
from jaxrl.lm.tokenizer import ByteTokenizer, HFTokenizer, Tokenizer, load_tokenizer

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURE_DIR = os.path.join(REPO_ROOT, "tests", "fixtures", "hf", "tokenizer")

ROWS = [
    {"prompt": "Human: hi\n\nAssistant:", "chosen": " Hello!", "rejected": " Go away."},
    {"prompt": "Wie geht's? ü", "chosen": "Gut, danke — 😀", "rejected": "schlecht"},
    {"prompt": "", "chosen": "an answer", "rejected": "another"},
]


def write_jsonl(path, rows, extra_lines=()):
    with open(path, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps({**row, "score": 1.5}, ensure_ascii=False) + "\n")  # extra field
        for line in extra_lines:
            f.write(line + "\n")
    return str(path)


# ---------------------------------------------------------------------------------------------
# JSONL -> TFDS


def test_round_trip_reuse_and_new_data(tmp_path):
    train = write_jsonl(tmp_path / "train.jsonl", ROWS, extra_lines=[""])  # trailing blank line
    test = write_jsonl(tmp_path / "test.jsonl", ROWS[:1])
    data_dir = tmp_path / "data"

    path = build_preference_dataset({"train": train, "test": test}, data_dir)
    assert list(load_preference_split(path, "train")) == ROWS  # exactly, in file order
    rows = load_preference_split(data_dir, "test")  # the root works while it holds one dataset
    assert len(rows) == 1 and rows[0] == ROWS[0] and rows[-1] == ROWS[0]

    # Same data: the built copy is reused, not rewritten.
    record = next(f for f in os.listdir(path) if "array_record" in f)
    mtime = os.stat(os.path.join(path, record)).st_mtime_ns
    assert build_preference_dataset({"train": train, "test": test}, data_dir) == path
    assert os.stat(os.path.join(path, record)).st_mtime_ns == mtime

    # Changed data: a new dataset beside the old one; the root alone is now ambiguous.
    write_jsonl(tmp_path / "train.jsonl", ROWS[::-1])
    new_path = build_preference_dataset({"train": train}, data_dir)
    assert new_path != path
    assert list(load_preference_split(new_path, "train")) == ROWS[::-1]
    with pytest.raises(ValueError, match="holds 2 built preference datasets"):
        load_preference_split(data_dir, "train")
    with pytest.raises(KeyError, match="no split 'test'; choose one of train"):
        load_preference_split(new_path, "test")


GOOD = json.dumps(ROWS[0])


@pytest.mark.parametrize(
    "bad_line, problem",
    [
        ('{"prompt": "p", "chosen": "c", "rejected": "r"', "invalid JSON"),
        ('["p", "c", "r"]', "expected a JSON object"),
        ('{"prompt": "p", "chosen": "c"}', "missing field 'rejected'"),
        ('{"chosen": "c", "rejected": "r"}', "missing field 'prompt'"),
        (
            '{"prompt": "p", "chosen": 3, "rejected": "r"}',
            "field 'chosen' must be a string, got int",
        ),
        ('{"prompt": null, "chosen": "c", "rejected": "r"}', "field 'prompt' must be a string"),
        ('{"prompt": "p", "chosen": "", "rejected": "r"}', "field 'chosen' is empty"),
        ('{"prompt": "p", "chosen": "c", "rejected": "  "}', "field 'rejected' is empty"),
    ],
)
def test_malformed_row_names_file_and_line(tmp_path, bad_line, problem):
    train = write_jsonl(tmp_path / "train.jsonl", ROWS)
    # Line 1 good, line 2 blank (still counted), line 3 bad.
    bad = tmp_path / "test.jsonl"
    bad.write_text(f"{GOOD}\n\n{bad_line}\n{GOOD}\n", encoding="utf-8")
    data_dir = tmp_path / "data"
    with pytest.raises(PreferenceDataError) as error:
        build_preference_dataset({"train": train, "test": str(bad)}, data_dir)
    message = str(error.value)
    assert message.startswith(f"{bad}:3: ") and problem in message and "\n" not in message
    assert not data_dir.exists()  # checked before anything is written


def test_invalid_utf8_and_empty_file(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(GOOD.encode() + b"\n" + b'{"prompt": "\xff"}\n')
    with pytest.raises(PreferenceDataError, match=f"^{bad}:2: not valid UTF-8"):
        build_preference_dataset({"train": str(bad)}, tmp_path / "data")
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    with pytest.raises(PreferenceDataError, match="no rows"):
        build_preference_dataset({"train": str(empty)}, tmp_path / "data")


def test_missing_paths(tmp_path):
    missing = tmp_path / "nope.jsonl"
    with pytest.raises(FileNotFoundError, match=f"{missing}: no such file"):
        build_preference_dataset({"train": str(missing)}, tmp_path / "data")
    with pytest.raises(IsADirectoryError, match=f"{tmp_path}: is a directory"):
        build_preference_dataset({"train": str(tmp_path)}, tmp_path / "data")
    with pytest.raises(FileNotFoundError, match=f"{tmp_path / 'nodir'}: no such directory"):
        load_preference_split(tmp_path / "nodir", "train")
    with pytest.raises(FileNotFoundError, match="no built preference dataset"):
        load_preference_split(tmp_path, "train")
    with pytest.raises(ConfigError, match="jsonl_paths"):
        build_preference_dataset({"train/x": str(missing)}, tmp_path / "data")


def test_build_and_read_without_tensorflow(tmp_path):
    # A fresh interpreter in which TensorFlow looks uninstalled even where it is installed.
    train = write_jsonl(tmp_path / "train.jsonl", ROWS)
    script = textwrap.dedent(
        f"""
        import importlib.util
        import sys

        # Wrap every import finder so that none finds tensorflow: `import tensorflow` fails and
        # find_spec("tensorflow") is None, exactly as when it is not installed.
        class HideTensorFlow:

            def __init__(self, finder):
                self.finder = finder

            def find_spec(self, name, path=None, target=None):
                if name.partition(".")[0] == "tensorflow":
                    return None
                return self.finder.find_spec(name, path, target)

            def invalidate_caches(self):
                getattr(self.finder, "invalidate_caches", lambda: None)()

        sys.meta_path[:] = [HideTensorFlow(f) for f in sys.meta_path]
        assert importlib.util.find_spec("tensorflow") is None
        sys.path.insert(0, {REPO_ROOT!r})
        from jaxrl.data import build_preference_dataset, load_preference_split

        path = build_preference_dataset({{"train": {train!r}}}, {str(tmp_path / "data")!r})
        rows = list(load_preference_split(path, "train"))
        assert rows == {ROWS!r}, rows
        assert "tensorflow" not in sys.modules
        print("ok")
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().endswith("ok")


# ---------------------------------------------------------------------------------------------
# Tokenizers


def test_byte_tokenizer_round_trip():
    tok = ByteTokenizer()
    assert (tok.vocab_size, tok.pad_id, tok.bos_id, tok.eos_id) == (259, 0, 1, 2)
    assert tok.encode("Ab") == [65 + 3, 98 + 3]
    assert tok.encode("é") == [0xC3 + 3, 0xA9 + 3]  # two UTF-8 bytes
    text = "héllo wörld — 日本語 😀"
    ids = tok.encode(text)
    assert len(ids) == len(text.encode("utf-8")) and all(3 <= i < 259 for i in ids)
    assert tok.decode([1, *ids, 2, 0, 0]) == text  # specials dropped
    assert tok.decode(np.array([1, *ids, 2], np.int32)) == text
    assert tok.decode(tok.encode("é")[:1]) == "\ufffd"  # a cut character does not raise
    assert [tok.token_to_id(t) for t in ("<pad>", "<bos>", "<eos>", "a", "é")] == [
        0,
        1,
        2,
        100,
        None,
    ]
    with pytest.raises(ValueError, match="id 300 is outside"):
        tok.decode([300])
    assert isinstance(load_tokenizer("byte"), ByteTokenizer) and isinstance(tok, Tokenizer)


@pytest.mark.skipif(
    not os.path.isfile(os.path.join(FIXTURE_DIR, "reference.json")),
    reason="tests/fixtures/hf/tokenizer is not there",
)
def test_hf_tokenizer_matches_reference_fixture():
    with open(os.path.join(FIXTURE_DIR, "reference.json"), encoding="utf-8") as f:
        reference = json.load(f)
    tok = load_tokenizer(FIXTURE_DIR)  # the directory form
    specials = reference["special_tokens"]
    assert (tok.pad_id, tok.bos_id, tok.eos_id) == (
        specials["<pad>"],
        specials["<bos>"],
        specials["<eos>"],
    )
    assert tok.vocab_size == reference["vocab_size"]
    for case in reference["cases"]:
        assert tok.encode(case["text"]) == case["ids_no_special"], case["text"]
        assert tok.decode(case["ids"] + [tok.eos_id, tok.pad_id]) == case["decoded"]


def make_word_tokenizer(directory, specials=("<pad>", "<s>", "</s>")):
    """A word-level tokenizer.json with hand-known ids, built with the `tokenizers` library."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {token: i for i, token in enumerate([*specials, "<unk>", "hello", "world", "é", "!"])}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.add_special_tokens([*specials, "<unk>"])
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, "tokenizer.json")
    tokenizer.save(path)
    return path


def test_hf_tokenizer_special_tokens(tmp_path):
    path = make_word_tokenizer(tmp_path / "llama_like")
    tok = HFTokenizer.from_file(path)
    assert isinstance(tok, Tokenizer)
    assert (tok.vocab_size, tok.pad_id, tok.bos_id, tok.eos_id) == (8, 0, 1, 2)
    assert tok.encode("hello world é !") == [4, 5, 6, 7]  # no specials added
    assert tok.encode_batch(["hello", "world !"]) == [[4], [5, 7]]
    assert tok.decode([1, 4, 5, 2, 0, 0]) == "hello world"
    assert tok.token_to_id("world") == 5 and tok.token_to_id("nope") is None

    # Qwen-like: no BOS, no pad -> pad falls back to EOS.
    qwen = HFTokenizer.from_file(make_word_tokenizer(tmp_path / "qwen", ("<|endoftext|>",)))
    assert (qwen.pad_id, qwen.bos_id, qwen.eos_id) == (0, None, 0)

    # tokenizer_config.json beside the file picks among candidates; explicit arguments win.
    two_eos = make_word_tokenizer(tmp_path / "chat", ("<|endoftext|>", "<|im_end|>"))
    (tmp_path / "chat" / "tokenizer_config.json").write_text(
        json.dumps({"eos_token": {"content": "<|im_end|>"}, "pad_token": "<|endoftext|>"})
    )
    chat = load_tokenizer(tmp_path / "chat")
    assert (chat.pad_id, chat.eos_id) == (0, 1)
    assert load_tokenizer(two_eos, eos_token="<|endoftext|>").eos_id == 0

    no_eos = make_word_tokenizer(tmp_path / "no_eos", ("<pad>",))
    with pytest.raises(ValueError, match=f"^{no_eos}: no end-of-sequence token.*pass eos_token="):
        HFTokenizer.from_file(no_eos)
    with pytest.raises(ValueError, match=r"eos_token='<end>' is not in the vocabulary"):
        HFTokenizer.from_file(path, eos_token="<end>")
    with pytest.raises(FileNotFoundError, match="no such file or directory"):
        load_tokenizer(tmp_path / "missing")
    with pytest.raises(FileNotFoundError, match="has no tokenizer.json"):
        load_tokenizer(tmp_path)


# ---------------------------------------------------------------------------------------------
# Tokenisation (ByteTokenizer: bos 1, eos 2, pad 0, byte b -> b + 3; a=100 ... z=125)


def ids(text):
    return [b + 3 for b in text.encode()]


def test_tokenize_preferences_layout_and_masks():
    tok = ByteTokenizer()
    rows = [{"prompt": "ab", "chosen": "x", "rejected": "yz", "extra": 1}]
    out = tokenize_preferences(rows, tok, max_prompt_length=4, max_length=8)
    assert {k: (v.shape, v.dtype) for k, v in out.items()} == {
        "chosen_tokens": ((1, 8), np.int32),
        "rejected_tokens": ((1, 8), np.int32),
        "chosen_attention_mask": ((1, 8), np.bool_),
        "rejected_attention_mask": ((1, 8), np.bool_),
        "chosen_loss_mask": ((1, 8), np.bool_),
        "rejected_loss_mask": ((1, 8), np.bool_),
        "prompt_tokens": ((1, 4), np.int32),
        "prompt_mask": ((1, 4), np.bool_),
    }
    assert out["chosen_tokens"][0].tolist() == [1, 100, 101, 123, 2, 0, 0, 0]
    assert out["chosen_attention_mask"][0].tolist() == [1, 1, 1, 1, 1, 0, 0, 0]
    assert out["chosen_loss_mask"][0].tolist() == [0, 0, 0, 1, 1, 0, 0, 0]
    assert out["rejected_tokens"][0].tolist() == [1, 100, 101, 124, 125, 2, 0, 0]
    assert out["rejected_attention_mask"][0].tolist() == [1, 1, 1, 1, 1, 1, 0, 0]
    assert out["rejected_loss_mask"][0].tolist() == [0, 0, 0, 1, 1, 1, 0, 0]
    assert out["prompt_tokens"][0].tolist() == [0, 1, 100, 101]  # left-padded
    assert out["prompt_mask"][0].tolist() == [0, 1, 1, 1]


def test_tokenize_preferences_truncation():
    tok = ByteTokenizer()
    # Prompt "abcdef" keeps bos + its last 3 tokens; 3 positions are left for the response.
    rows = [{"prompt": "abcdef", "chosen": "xyz", "rejected": "xy"}]
    out = tokenize_preferences(rows, tok, max_prompt_length=4, max_length=7)
    prompt = [1, *ids("def")]
    # "xyz" + eos does not fit: the response is cut and gets no eos.
    assert out["chosen_tokens"][0].tolist() == prompt + ids("xyz")
    assert out["chosen_loss_mask"][0].tolist() == [0, 0, 0, 0, 1, 1, 1]
    assert out["chosen_attention_mask"][0].all()
    # "xy" + eos fits exactly.
    assert out["rejected_tokens"][0].tolist() == prompt + ids("xy") + [2]
    assert out["rejected_loss_mask"][0].tolist() == [0, 0, 0, 0, 1, 1, 1]
    assert out["prompt_tokens"][0].tolist() == prompt and out["prompt_mask"][0].all()

    # A long response is cut to what is left after the prompt.
    out = tokenize_preferences(
        [{"prompt": "a", "chosen": "xyzxyz", "rejected": "y"}], tok, 3, max_length=5
    )
    assert out["chosen_tokens"][0].tolist() == [1, 100, *ids("xyz")]
    assert out["rejected_tokens"][0].tolist() == [1, 100, 124, 2, 0]

    with pytest.raises(ConfigError, match="max_length"):
        tokenize_preferences(rows, tok, max_prompt_length=4, max_length=4)


class NoBosByteTokenizer(ByteTokenizer):
    def __init__(self):
        super().__init__()
        self.bos_id = None


def test_tokenize_without_bos_and_sft():
    tok = NoBosByteTokenizer()
    out = tokenize_sft(["ab", ""], ["x", "yz"], tok, max_prompt_length=2, max_length=5)
    assert set(out) == {"tokens", "attention_mask", "loss_mask", "prompt_tokens", "prompt_mask"}
    assert out["prompt_tokens"].tolist() == [[100, 101], [0, 0]]
    assert out["tokens"].tolist() == [[100, 101, 123, 2, 0], [124, 125, 2, 0, 0]]
    assert out["attention_mask"].tolist() == [[1, 1, 1, 1, 0], [1, 1, 1, 0, 0]]
    # An empty prompt without bos: position 0 has no prediction, so it is never a target.
    assert out["loss_mask"].tolist() == [[0, 0, 1, 1, 0], [0, 1, 1, 0, 0]]
    assert out["tokens"].dtype == np.int32 and out["loss_mask"].dtype == np.bool_

    # The same pairs through tokenize_preferences give the same chosen arrays.
    pref = tokenize_preferences(
        [
            {"prompt": "ab", "chosen": "x", "rejected": "x"},
            {"prompt": "", "chosen": "yz", "rejected": "z"},
        ],
        tok,
        2,
        5,
    )
    np.testing.assert_array_equal(pref["chosen_tokens"], out["tokens"])
    np.testing.assert_array_equal(pref["chosen_loss_mask"], out["loss_mask"])
    assert pref["prompt_tokens"].tolist() == [[100, 101], [0, 0]]
    with pytest.raises(ConfigError, match="completions"):
        tokenize_sft(["a"], [], tok, 2, 5)


def test_tokenize_with_hf_tokenizer(tmp_path):
    tok = HFTokenizer.from_file(make_word_tokenizer(tmp_path))
    out = tokenize_sft(["hello world"], ["é !"], tok, max_prompt_length=2, max_length=6)
    # bos + last prompt token ("world"), then é ! eos.
    assert out["tokens"].tolist() == [[1, 5, 6, 7, 2, 0]]
    assert out["loss_mask"].tolist() == [[0, 0, 1, 1, 1, 0]]


# ---------------------------------------------------------------------------------------------
# Batches


def test_batches_deterministic_fixed_shape():
    import jax

    arrays = {"x": np.arange(10), "y": np.arange(20).reshape(10, 2)}
    got = list(batches(arrays, 4, 0, epochs=2))
    assert len(got) == 4  # 2 per epoch, remainder of 2 dropped
    for batch in got:
        assert batch["x"].shape == (4,) and batch["y"].shape == (4, 2)
        np.testing.assert_array_equal(batch["y"][:, 0], 2 * batch["x"])  # rows stay aligned
    first_epoch = np.concatenate([b["x"] for b in got[:2]])
    assert len(set(first_epoch.tolist())) == 8  # no repeats within an epoch

    again = list(batches(arrays, 4, 0, epochs=2))
    assert all((a["x"] == b["x"]).all() for a, b in zip(got, again, strict=True))
    other = list(batches(arrays, 4, 1, epochs=2))
    assert any((a["x"] != b["x"]).any() for a, b in zip(got, other, strict=True))

    key = jax.random.key(3)
    from_key = [b["x"].tolist() for b in batches(arrays, 5, key, epochs=1)]
    assert from_key == [b["x"].tolist() for b in batches(arrays, 5, jax.random.key(3))]
    assert len(list(itertools.islice(batches(arrays, 5, 0, epochs=None), 7))) == 7  # endless

    with pytest.raises(ConfigError, match=r"batch_size: \(11\) exceeds the number of examples"):
        batches(arrays, 11, 0)  # raised at the call, not at the first next()
    with pytest.raises(ConfigError, match="leading sizes differ"):
        batches({"x": np.arange(3), "y": np.arange(4)}, 2, 0)


def test_step_batches_resumable_stacked_and_placed():
    from jaxrl.data.step_batches import dataset_batches, stacked_batches, step_batch_indices
    from jaxrl.lm.training import TrainConfig

    n, batch_size, seed = 10, 4, 5
    # Steps 0-1 are epoch 0 and steps 2-3 epoch 1: 8 distinct examples each, remainder dropped.
    steps = [step_batch_indices(n, batch_size, seed, s) for s in range(4)]
    for epoch in range(2):
        rows = np.concatenate(steps[2 * epoch : 2 * epoch + 2])
        assert len(rows) == 8 and len(set(rows.tolist())) == 8 and rows.max() < n
    assert steps[0].tolist() != steps[2].tolist()  # a fresh permutation per epoch
    assert step_batch_indices(n, batch_size, seed, 3).tolist() == steps[3].tolist()
    assert step_batch_indices(n, batch_size, seed + 1, 0).tolist() != steps[0].tolist()

    arrays = {"x": np.arange(n), "y": np.arange(2 * n).reshape(n, 2)}
    config = TrainConfig(batch_size=batch_size, grad_accum_steps=2)
    chunk = stacked_batches(arrays, config, seed, first_step=1, count=3)
    assert chunk["x"].shape == (3, 2, 2) and chunk["y"].shape == (3, 2, 2, 2)
    for i, step in enumerate(range(1, 4)):  # a resumed run's chunk is the same steps' batches
        np.testing.assert_array_equal(chunk["x"][i].reshape(-1), steps[step])
    np.testing.assert_array_equal(chunk["y"][..., 0], 2 * chunk["x"])  # rows stay aligned

    placed = dataset_batches(arrays, config, seed, mesh=None)(1, 3)
    np.testing.assert_array_equal(np.asarray(placed["x"]), chunk["x"])


def test_tokenize_sft_without_truncation_refuses_what_would_be_cut():
    """`truncate=False` (what sft.py uses): data that fits is packed as with truncation; a prompt
    or a sequence that would be cut is one error naming the length to raise."""
    tok = NoBosByteTokenizer()
    fits = tokenize_sft(["ab", ""], ["x", "yz"], tok, 2, 5, truncate=False)
    assert (
        fits["tokens"].tolist()
        == tokenize_sft(["ab", ""], ["x", "yz"], tok, 2, 5)["tokens"].tolist()
    )
    with pytest.raises(ConfigError, match=r"max_prompt_length: 1 of 2 prompts .* raise "
                                          r"max_prompt_length to 3"):  # fmt: skip
        tokenize_sft(["abc", ""], ["x", "yz"], tok, 2, 6, truncate=False)
    with pytest.raises(ConfigError, match=r"max_length: 1 of 2 .* raise max_length to 6"):
        tokenize_sft(["ab", ""], ["xyz", "yz"], tok, 2, 5, truncate=False)
