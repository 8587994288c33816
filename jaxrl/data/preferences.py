"""Preference pairs (prompt, chosen, rejected) from local JSONL files, as a tensorflow-datasets
dataset, and tokenisation of preference and SFT data into fixed-shape arrays.

A row holds three strings, or (TRL's conversational format) three lists of chat messages: the
prompt's conversation, and chosen / rejected each with the assistant's reply. Chat rows are
rendered by the tokenizer's chat template (`jaxrl.data.chat`): the prompt with the generation
prompt, a response as the rest of the rendered conversation, with no BOS or EOS added (the
template spells out its own).

The dataset is written as array_record files and read back with `as_data_source()` (random access,
no TensorFlow needed at build or read time). Typical use:

    path = build_preference_dataset({"train": "train.jsonl", "test": "test.jsonl"}, "~/data")
    rows = load_preference_split(path, "train")  # rows[i]: {"prompt", "chosen", "rejected"}
    arrays = tokenize_preferences(rows, tokenizer, max_prompt_length=256, max_length=512)
    for batch in batches(arrays, batch_size=32, key_or_seed=0, epochs=1): ...

Sequence layout, shared by `tokenize_preferences`, `tokenize_sft` and `jaxrl.data.chat` (L =
max_length; BOS and EOS here are those of text rows):

    tokens          [bos] p p p r r r eos pad pad      right-padded to L
    attention_mask    1   1 1 1 1 1 1  1   0   0       real tokens
    loss_mask         0   0 0 0 1 1 1  1   0   0       response tokens, eos included

The model predicts tokens[t] from logits[t - 1], so a sequence's log-probability is the sum over
t >= 1 with loss_mask[t] of log_softmax(logits[t - 1])[tokens[t]]. Position 0 has no prediction and
is never in the loss mask (it only matters for an empty prompt on a tokenizer without BOS).

Truncation: the prompt keeps its LAST max_prompt_length tokens (the end of a conversation is what
the response answers; BOS, if added, stays first). The response then gets the remaining
max_length - len(prompt) positions. If response + eos fits, both are kept; otherwise the response
is cut on the right and NO eos is appended: the text did not end there, and scoring an eos at the
cut would teach the model to stop mid-answer. With `truncate=False` nothing is cut: a prompt or a
response that does not fit is a ConfigError naming the length to raise (a cut prompt can change
the question, e.g. "rev 123=" cut to "23=").
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import io
import json
import os
import re
import tempfile
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import tensorflow_datasets as tfds

from jaxrl.config import require
from jaxrl.data.chat import (
    ChatDataError,
    Encoded,
    GivenRows,
    check_messages,
    check_pack_lengths,
    encode_chat_responses,
    encode_texts,
    example_lengths,
    jsonl_objects,
    pack,
)
from jaxrl.lm.tokenizer import Tokenizer

__all__ = [
    "FIELDS",
    "PreferenceDataError",
    "PreferenceRows",
    "batches",
    "build_preference_dataset",
    "encode_preference_rows",
    "load_preference_split",
    "numbered_preference_rows",
    "pack_pairs",
    "pair_lengths",
    "read_preference_jsonl",
    "tokenize_preferences",
    "tokenize_sft",
]

FIELDS = ("prompt", "chosen", "rejected")
DATASET_NAME = "preference_pairs"
_SPLIT_NAME = re.compile(r"^[\w-]+$")  # what tfds accepts as a split name


class PreferenceDataError(ChatDataError):
    """A JSONL row is malformed; the message names the file, the 1-based line and the problem."""


PreferenceRow = dict[str, Any]  # prompt, chosen, rejected: three strings or three message lists


# ----------------------------------------------------------------------------------------------
# JSONL -> TFDS


def _check_file(split: str, path: str) -> None:
    if not os.path.exists(path):
        raise FileNotFoundError(
            f"{path}: no such file (split {split!r}); pass the path of an existing JSONL file"
        )
    if not os.path.isfile(path):
        raise IsADirectoryError(
            f"{path}: is a directory (split {split!r}); pass the path of a JSONL file"
        )


def _is_chat(row: PreferenceRow) -> bool:
    return isinstance(row["prompt"], list)


def _preference_row(row: Any, where: str) -> PreferenceRow:
    """One parsed JSON line as {"prompt", "chosen", "rejected"}, checked."""
    if not isinstance(row, dict):
        raise PreferenceDataError(
            f"{where}: expected a JSON object with fields {', '.join(FIELDS)}, got "
            f"{type(row).__name__}"
        )
    for field in FIELDS:
        if field not in row:
            raise PreferenceDataError(
                f"{where}: missing field {field!r}; every row needs fields {', '.join(FIELDS)} "
                "(strings, or lists of chat messages)"
            )
        if not isinstance(row[field], str | list):
            raise PreferenceDataError(
                f"{where}: field {field!r} must be a string, got {type(row[field]).__name__}; "
                'give a string, or a list of chat messages ({"role": ..., "content": ...})'
            )
    kinds = {field: "a list" if isinstance(row[field], list) else "a string" for field in FIELDS}
    if len(set(kinds.values())) > 1:
        raise PreferenceDataError(
            f"{where}: fields mix strings and message lists ("
            + ", ".join(f"{field} is {kind}" for field, kind in kinds.items())
            + "); give three strings, or three lists of chat messages"
        )
    if not _is_chat(row):
        for field in ("chosen", "rejected"):
            if not row[field].strip():
                raise PreferenceDataError(
                    f"{where}: field {field!r} is empty; drop the row or fill in the response"
                )
        return {field: row[field] for field in FIELDS}
    try:
        checked = {field: check_messages(row[field], where, field) for field in FIELDS}
    except ChatDataError as error:
        raise PreferenceDataError(str(error)) from None
    for field in ("chosen", "rejected"):
        if not any(message["role"] == "assistant" for message in checked[field]):
            raise PreferenceDataError(
                f"{where}: field {field!r} has no assistant message; write it as "
                '[{"role": "assistant", "content": "..."}]'
            )
        # As an empty string is: a response with nothing in it teaches nothing about preference.
        if not any(m["content"].strip() for m in checked[field] if m["role"] == "assistant"):
            raise PreferenceDataError(
                f"{where}: field {field!r} is an assistant message with empty content; drop the "
                "row or fill in the response"
            )
    return checked


def numbered_preference_rows(
    path: str | os.PathLike | GivenRows,
) -> Iterator[tuple[str, PreferenceRow]]:
    """Yields ("file:line", row) per non-blank line of `path`, as `read_preference_jsonl`."""
    first: tuple[str, bool] | None = None  # where the first row is, and whether it is chat
    for where, parsed in jsonl_objects(path, PreferenceDataError):
        row = _preference_row(parsed, where)
        # One format a file: its pairs are tokenised, and their lengths chosen, alike.
        if first is None:
            first = (where, _is_chat(row))
        elif _is_chat(row) != first[1]:
            kind = {True: "chat-message", False: "string"}
            raise PreferenceDataError(
                f"{where}: a {kind[_is_chat(row)]} row in a file whose first row ({first[0]}) "
                f"is a {kind[first[1]]} row; use one format in a file"
            )
        yield where, row


def read_preference_jsonl(path: str | os.PathLike | GivenRows) -> Iterator[PreferenceRow]:
    """Yields {"prompt", "chosen", "rejected"} per non-blank line of `path`, other fields dropped:
    three strings, or three lists of chat messages (every row of a file alike).

    Raises `PreferenceDataError` (file:line: problem) for invalid UTF-8 or JSON, a line that is not
    an object, a missing field or one of another type, an empty (whitespace-only) chosen/rejected
    string, a message without a known role or string content, or a chosen/rejected list without
    an assistant message. An empty prompt string is allowed: some datasets put the whole
    conversation in the responses.
    """
    for _, row in numbered_preference_rows(path):
        yield row


@dataclasses.dataclass(eq=False)
class PreferenceConfig(tfds.core.BuilderConfig):
    """One set of user files. The config name is a digest of their contents, so the same data
    reuses its built copy and changed data builds a new one beside it."""

    jsonl_paths: dict[str, str] = dataclasses.field(default_factory=dict)


class PreferencePairs(tfds.core.GeneratorBasedBuilder, skip_registration=True):
    """(prompt, chosen, rejected) text triples from local JSONL files, one file per split.

    Not registered with `tfds.builder(...)`: it is only meaningful with the user's files, given
    through `build_preference_dataset`. Reading needs no class at all (`builder_from_directory`).
    """

    name = DATASET_NAME
    # tfds looks beside a builder's source file for a download-checksums file. Working out that
    # path for a class in a package imports `importlib_resources`, which tfds 4.9.10 does not
    # declare as a dependency on Python >= 3.9 (tensorflow/datasets#11212), so building failed
    # with ModuleNotFoundError. Nothing is downloaded here: there is no code path to consult.
    code_path = None
    VERSION = tfds.core.Version("1.1.0")
    RELEASE_NOTES = {
        "1.0.0": "Prompt, chosen and rejected strings from local JSONL files.",
        "1.1.0": "Chat-message rows too, as JSON text with a `chat` flag.",
    }

    def _info(self) -> tfds.core.DatasetInfo:
        # `DatasetInfo` directly, not `dataset_info_from_configs`: that reads metadata files
        # from a per-dataset package directory, which a builder defined in a library lacks.
        return tfds.core.DatasetInfo(
            builder=self,
            description="Preference pairs from local JSONL files.",
            # A chat row's message lists are stored as JSON text, marked by `chat`.
            features=tfds.features.FeaturesDict(
                {
                    **{field: tfds.features.Text() for field in FIELDS},
                    "chat": tfds.features.Scalar(dtype=np.bool_),
                }
            ),
            # Keep file order: the rows come back exactly as they were in the JSONL file.
            disable_shuffling=True,
        )

    def _split_generators(self, dl_manager: Any) -> dict[str, Iterator[tuple[int, dict]]]:
        del dl_manager  # nothing to download: the files are local
        return {
            split: self._generate_examples(path)
            for split, path in self.builder_config.jsonl_paths.items()
        }

    def _generate_examples(self, path: str) -> Iterator[tuple[int, dict[str, Any]]]:
        for index, row in enumerate(read_preference_jsonl(path)):
            chat = _is_chat(row)
            text = {f: json.dumps(row[f], ensure_ascii=False) if chat else row[f] for f in FIELDS}
            yield index, {**text, "chat": chat}


def _digest(jsonl_paths: Mapping[str, str]) -> str:
    """Validates every file (raising before anything is written) and hashes split names + bytes."""
    digest = hashlib.sha256(f"{DATASET_NAME}:{PreferencePairs.VERSION}".encode())
    for split in sorted(jsonl_paths):
        path = jsonl_paths[split]
        rows = sum(1 for _ in read_preference_jsonl(path))
        if rows == 0:
            raise PreferenceDataError(
                f"{path}: no rows (split {split!r}); give at least one JSON object per split"
            )
        digest.update(f"\0{split}\0".encode())
        with open(path, "rb") as f:
            for chunk in iter(lambda f=f: f.read(1 << 20), b""):
                digest.update(chunk)
    return digest.hexdigest()[:16]


def build_preference_dataset(
    jsonl_paths: Mapping[str, str | os.PathLike], data_dir: str | os.PathLike
) -> str:
    """Builds (or reuses) a TFDS dataset from JSONL files, one per split; returns its directory.

    `jsonl_paths` maps split names ("train", "test", ...) to files whose lines are JSON objects with
    string fields prompt, chosen and rejected (other fields are ignored). Every file is validated
    first, so a malformed row fails with its file and line before anything is written. The result
    lives in `data_dir/preference_pairs/<content digest>/1.0.0`; building the same data again
    returns that directory without rewriting it.
    """
    require(
        len(jsonl_paths) > 0,
        "jsonl_paths",
        "is empty",
        'map at least one split to a JSONL file, e.g. {"train": "train.jsonl"}',
    )
    paths: dict[str, str] = {}
    for split, path in jsonl_paths.items():
        require(
            isinstance(split, str) and bool(_SPLIT_NAME.match(split)),
            "jsonl_paths",
            f"split name {split!r} is not letters, digits, '_' or '-'",
            "rename the split (e.g. 'train', 'validation')",
        )
        paths[split] = os.path.abspath(os.fspath(path))
        _check_file(split, paths[split])
    data_dir = os.path.abspath(os.path.expanduser(os.fspath(data_dir)))
    if os.path.exists(data_dir) and not os.path.isdir(data_dir):
        raise NotADirectoryError(f"{data_dir}: data_dir is a file; pass a directory")

    config = PreferenceConfig(name=_digest(paths), jsonl_paths=paths)
    builder = PreferencePairs(data_dir=data_dir, config=config, file_format="array_record")
    # Nothing is downloaded, but tfds creates its download directory anyway (by default under
    # ~/tensorflow_datasets); keep that out of the user's home.
    # tfds prints "Downloading and preparing dataset Unknown size ..." and "... prepared" on
    # stdout, about a download that does not happen: kept off the console.
    with tempfile.TemporaryDirectory() as download_dir, contextlib.redirect_stdout(io.StringIO()):
        builder.download_and_prepare(download_dir=download_dir)
    return os.fspath(builder.data_dir)


class PreferenceRows(Sequence[PreferenceRow]):
    """A random-access view of one split: `rows[i]` is {"prompt", "chosen", "rejected"}, three
    strings or three lists of chat messages, as in the JSONL file."""

    def __init__(self, source: Any, split: str) -> None:
        self._source = source
        self.split = split

    def __len__(self) -> int:
        return len(self._source)

    def __getitem__(self, index: int) -> PreferenceRow:  # type: ignore[override]
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]  # type: ignore[return-value]
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError(f"row {index} out of range for split {self.split!r} of {len(self)}")
        record = self._source[index]
        # tfds Text features come back as UTF-8 bytes.
        text = {field: record[field].decode("utf-8") for field in FIELDS}
        # A dataset built before chat rows (version 1.0.0) has no `chat` flag: all strings.
        chat = "chat" in record and bool(record["chat"])
        return {f: json.loads(v) for f, v in text.items()} if chat else text

    def __iter__(self) -> Iterator[PreferenceRow]:
        for i in range(len(self)):
            yield self[i]


def _find_built(data_dir: str) -> str:
    """`data_dir` if it is a built dataset, else the only one under data_dir/preference_pairs."""
    if os.path.isfile(os.path.join(data_dir, "dataset_info.json")):
        return data_dir
    root = os.path.join(data_dir, DATASET_NAME)
    built = sorted(
        os.path.join(root, config, version)
        for config in (os.listdir(root) if os.path.isdir(root) else [])
        for version in os.listdir(os.path.join(root, config))
        if os.path.isfile(os.path.join(root, config, version, "dataset_info.json"))
    )
    if len(built) == 1:
        return built[0]
    if not built:
        raise FileNotFoundError(
            f"{data_dir}: no built preference dataset here; pass the path that "
            "build_preference_dataset returned"
        )
    raise ValueError(
        f"{data_dir}: holds {len(built)} built preference datasets ({', '.join(built)}); pass the "
        "path that build_preference_dataset returned"
    )


def load_preference_split(data_dir: str | os.PathLike, split: str) -> PreferenceRows:
    """Rows of `split`, in file order, read with `as_data_source()` (array_record, no TensorFlow).

    `data_dir` is the path `build_preference_dataset` returned, or the `data_dir` given to it if
    that holds only one built dataset.
    """
    data_dir = os.path.abspath(os.path.expanduser(os.fspath(data_dir)))
    if not os.path.isdir(data_dir):
        raise FileNotFoundError(
            f"{data_dir}: no such directory; pass the path that build_preference_dataset returned"
        )
    builder = tfds.builder_from_directory(_find_built(data_dir))
    sources = builder.as_data_source()
    if split not in sources:
        raise KeyError(
            f"{builder.data_dir}: no split {split!r}; choose one of {', '.join(sorted(sources))}"
        )
    return PreferenceRows(sources[split], split)


# ----------------------------------------------------------------------------------------------
# Tokenisation to fixed shapes


def _as_str(value: Any, what: str) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8")
    if not isinstance(value, str):
        raise TypeError(f"{what} must be a string, got {type(value).__name__}")
    return value


def encode_preference_rows(
    rows: Iterable[Mapping[str, Any]],
    tokenizer: Tokenizer,
    wheres: Sequence[str] | None = None,
) -> tuple[list[Encoded], list[Encoded]]:
    """(chosen, rejected): each pair's prompt + response, tokenised, not yet packed. String rows
    are BOS + prompt + response + EOS; chat rows (message lists, which need the tokenizer's chat
    template) are rendered by it (`jaxrl.data.chat.encode_chat_responses`). Both sides of a pair
    start with the same prompt tokens. `wheres` names the rows in errors (file:line); a template
    refusing a row is a `ChatDataError`."""
    rows = list(rows)
    wheres = list(wheres) if wheres is not None else [f"row {i}" for i in range(len(rows))]
    chat: dict[int, tuple[Encoded, Encoded]] = {}
    columns: dict[str, list[str]] = {field: [] for field in FIELDS}
    for index, row in enumerate(rows):
        for field in FIELDS:
            if field not in row:
                raise KeyError(f"row {index}: missing field {field!r}; rows need {FIELDS}")
        if isinstance(row["prompt"], list):
            responses = [row["chosen"], row["rejected"]]
            if not all(isinstance(response, list) for response in responses):
                raise TypeError(
                    f"row {index}: the prompt is chat messages, so chosen and rejected must be "
                    "lists of messages too"
                )
            chosen, rejected = encode_chat_responses(
                tokenizer, row["prompt"], responses, wheres[index]
            )
            chat[index] = (chosen, rejected)
            continue
        for field in FIELDS:
            columns[field].append(_as_str(row[field], f"row {index} field {field!r}"))
    sides = {
        side: iter(encode_texts(tokenizer, columns["prompt"], columns[side]))
        for side in ("chosen", "rejected")
    }
    pairs = [
        chat[i] if i in chat else (next(sides["chosen"]), next(sides["rejected"]))
        for i in range(len(rows))
    ]
    return [c for c, _ in pairs], [r for _, r in pairs]


def pair_lengths(
    chosen: Sequence[Encoded], rejected: Sequence[Encoded]
) -> tuple[np.ndarray, np.ndarray]:
    """(prompt lengths, longer response's lengths) of tokenised pairs, for
    `jaxrl.data.chat.fit_lengths` / `check_cuts`: a pair is cut where either side is."""
    prompt, chosen_rest = example_lengths(chosen)
    _, rejected_rest = example_lengths(rejected)
    return prompt, np.maximum(chosen_rest, rejected_rest)


def pack_pairs(
    chosen: Sequence[Encoded],
    rejected: Sequence[Encoded],
    tokenizer: Tokenizer,
    max_prompt_length: int,
    max_length: int,
) -> dict[str, np.ndarray]:
    """Tokenised pairs as the arrays `tokenize_preferences` returns."""
    out: dict[str, np.ndarray] = {}
    for side, examples in (("chosen", chosen), ("rejected", rejected)):
        packed = pack(examples, tokenizer, max_prompt_length, max_length)
        out[f"{side}_tokens"] = packed["tokens"]
        out[f"{side}_attention_mask"] = packed["attention_mask"]
        out[f"{side}_loss_mask"] = packed["loss_mask"]
    out["prompt_tokens"] = packed["prompt_tokens"]  # the same for both sides
    out["prompt_mask"] = packed["prompt_mask"]
    return out


def tokenize_preferences(
    rows: Iterable[Mapping[str, Any]],
    tokenizer: Tokenizer,
    max_prompt_length: int,
    max_length: int,
) -> dict[str, np.ndarray]:
    """Fixed-shape arrays for N preference pairs (layout and truncation: module docstring).

    Returns chosen_tokens / rejected_tokens int32 [N, max_length] (right-padded with pad_id),
    chosen_attention_mask / rejected_attention_mask and chosen_loss_mask / rejected_loss_mask bool
    [N, max_length], and prompt_tokens int32 [N, max_prompt_length] LEFT-padded for generation, with
    prompt_mask bool. `rows` are mappings with prompt/chosen/rejected strings or chat-message
    lists (extra keys ignored).
    """
    check_pack_lengths(max_prompt_length, max_length)
    chosen, rejected = encode_preference_rows(rows, tokenizer)
    require(len(chosen) > 0, "rows", "is empty", "pass at least one preference pair")
    return pack_pairs(chosen, rejected, tokenizer, max_prompt_length, max_length)


def _require_fit(examples: Sequence[Encoded], max_prompt_length: int, max_length: int) -> None:
    """Refuse (one ConfigError) data that `pack` would cut: how many rows, the length needed."""
    prompt_lengths, rest = example_lengths(examples)
    over = int((prompt_lengths > max_prompt_length).sum())
    require(
        over == 0,
        "max_prompt_length",
        f"{over} of {len(examples)} prompts have more than {max_prompt_length} tokens (the "
        f"longest {prompt_lengths.max()}, BOS included) and would be cut",
        f"raise max_prompt_length to {prompt_lengths.max()}",
    )
    total = prompt_lengths + rest  # rest: the response and EOS
    over = int((total > max_length).sum())
    require(
        over == 0,
        "max_length",
        f"{over} of {len(examples)} prompt + response + EOS sequences have more than "
        f"{max_length} tokens (the longest {total.max()}) and would be cut",
        f"raise max_length to {total.max()}",
    )


def tokenize_sft(
    prompts: Sequence[str],
    completions: Sequence[str],
    tokenizer: Tokenizer,
    max_prompt_length: int,
    max_length: int,
    truncate: bool = True,
) -> dict[str, np.ndarray]:
    """Fixed-shape arrays for N (prompt, completion) pairs, laid out as in `tokenize_preferences`:
    tokens int32 [N, max_length] right-padded; attention_mask, loss_mask (completion + eos) bool;
    prompt_tokens [N, max_prompt_length] left-padded with prompt_mask, for generation. With
    `truncate=False`, data that does not fit is a ConfigError instead of being cut."""
    check_pack_lengths(max_prompt_length, max_length)
    require(
        len(prompts) == len(completions),
        "completions",
        f"has {len(completions)} entries but prompts has {len(prompts)}",
        "pass one completion per prompt",
    )
    require(len(prompts) > 0, "prompts", "is empty", "pass at least one example")
    prompt_texts = [_as_str(p, f"prompts[{i}]") for i, p in enumerate(prompts)]
    completion_texts = [_as_str(c, f"completions[{i}]") for i, c in enumerate(completions)]
    examples = encode_texts(tokenizer, prompt_texts, completion_texts)
    if not truncate:
        _require_fit(examples, max_prompt_length, max_length)
    return pack(examples, tokenizer, max_prompt_length, max_length)


# ----------------------------------------------------------------------------------------------
# Batching


def _rng(key_or_seed: Any) -> np.random.Generator:
    """A NumPy generator seeded by an int or a JAX PRNG key (typed or raw uint32)."""
    if isinstance(key_or_seed, int | np.integer):
        return np.random.default_rng(int(key_or_seed))
    import jax  # only when a key is passed: batching itself is host-side NumPy

    key = key_or_seed
    if jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key):
        key = jax.random.key_data(key)
    return np.random.default_rng(np.asarray(key).astype(np.uint32).ravel().tolist())


def batches(
    arrays: Mapping[str, np.ndarray],
    batch_size: int,
    key_or_seed: int | Any,
    *,
    epochs: int | None = 1,
) -> Iterator[dict[str, np.ndarray]]:
    """Shuffled batches of `arrays` (all with the same leading size N), `epochs` passes (None: no
    end), each a fresh permutation, the last N % batch_size examples of a pass dropped so every
    batch has the same shape (one compiled program). Deterministic given `key_or_seed`.

    Arguments are checked here, not at the first `next()`. Batches are host NumPy arrays; placing
    them on devices (and sharding them) is the caller's choice.
    """
    require(len(arrays) > 0, "arrays", "is empty", "pass the dict tokenize_* returned")
    host = {name: np.asarray(value) for name, value in arrays.items()}
    sizes = {name: len(value) for name, value in host.items()}
    n = next(iter(sizes.values()))
    require(
        all(size == n for size in sizes.values()),
        "arrays",
        f"leading sizes differ ({sizes})",
        "pass arrays with one row per example",
    )
    require(batch_size > 0, "batch_size", f"must be positive, got {batch_size}", "set it > 0")
    require(
        batch_size <= n,
        "batch_size",
        f"({batch_size}) exceeds the number of examples ({n})",
        f"use batch_size <= {n} or more data",
    )
    require(
        epochs is None or epochs > 0,
        "epochs",
        f"must be positive or None (endless), got {epochs}",
        "set epochs >= 1",
    )
    return _batches(host, batch_size, _rng(key_or_seed), epochs)


def _batches(
    arrays: dict[str, np.ndarray], batch_size: int, rng: np.random.Generator, epochs: int | None
) -> Iterator[dict[str, np.ndarray]]:
    n = len(next(iter(arrays.values())))
    epoch = 0
    while epochs is None or epoch < epochs:
        order = rng.permutation(n)
        for start in range(0, n - batch_size + 1, batch_size):
            index = order[start : start + batch_size]
            yield {name: value[index] for name, value in arrays.items()}
        epoch += 1
