"""Prompt datasets for reinforcement learning on a language model (GRPO and its relatives), in the
format TRL users already have: one JSON object per line with a `prompt` column, either a string or
a list of chat messages, plus any other columns (an `answer`, a difficulty, test cases...) that
the reward functions read; or one split of a built TFDS dataset (array_record, read with
`as_data_source()`, e.g. gsm8k prepared by `tfds build gsm8k`) whose prompt feature is named.

    rows = read_prompt_jsonl("train.jsonl")                 # [PromptRow(line, {"prompt": ...})]
    train, held_out = split_rows(rows, num_held_out=200, seed=0)
    table = tokenize_prompts(train, tokenizer, max_prompt_length=0)   # 0: the longest prompt
    rows = read_prompt_tfds("gsm8k", "train", prompt_column="question")   # the same rows

A `PromptTable` holds every prompt tokenised ONCE into a fixed shape, left-padded so that each
prompt ends where generation starts, with its rows kept beside it: the token arrays go to the
device and are sampled inside the compiled program, and a sampled row's index brings its columns
back to the host reward functions. Chat prompts are rendered by the checkpoint's chat template
with the generation prompt (the header that opens the assistant's turn) appended, as TRL does; a
plain string prompt gets the tokenizer's BOS, as our other data does. Prompts are tokenised as
whole strings: any tokenizer works, not just one with a token per character.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from jaxrl.config import ConfigError
from jaxrl.data.chat import (
    ChatDataError,
    GivenRows,
    check_messages,
    choose_length,
    hold_out,
    jsonl_objects,
)
from jaxrl.data.locate import (
    CorruptDatasetError,
    DatasetNotFoundError,
    dataset_path,
    file_format,
    open_builder,
)
from jaxrl.lm.tokenizer import Tokenizer

__all__ = [
    "PromptDataError",
    "PromptRow",
    "PromptTable",
    "choose_length",  # from jaxrl.data.chat, shared with SFT and DPO
    "read_prompt_jsonl",
    "read_prompt_tfds",
    "split_rows",
    "tokenize_prompts",
]


class PromptDataError(ChatDataError):
    """A prompt file is unusable; the message starts with `file:line:` and ends with the fix."""


@dataclasses.dataclass(frozen=True)
class PromptRow:
    """One row of a prompt file: where it came from (`file:line`) and its columns."""

    where: str
    columns: Mapping[str, Any]

    @property
    def prompt(self) -> str | list[dict[str, Any]]:
        """The `prompt` column: a string, or chat messages."""
        return self.columns["prompt"]

    @property
    def conversational(self) -> bool:
        """Whether the prompt is a list of chat messages."""
        return isinstance(self.prompt, list)


def _checked_rows(objects: Iterable[tuple[str, Any]], source: str) -> list[PromptRow]:
    """("where", columns) pairs as `PromptRow`s, checked: a mapping whose `prompt` is a non-empty
    string or a list of chat messages, with the same columns as the first row (a reward function
    must find its column in every row) and the same kind of prompt (all strings, or all
    conversations). Raises `PromptDataError` naming the row; no rows at all name `source`."""
    rows: list[PromptRow] = []
    for where, columns in objects:
        if not isinstance(columns, dict):
            raise PromptDataError(
                f"{where}: a line is a JSON {type(columns).__name__}; write one JSON object "
                'per line, e.g. {"prompt": "...", "answer": "..."}'
            )
        if "prompt" not in columns:
            raise PromptDataError(
                f"{where}: no 'prompt' column (columns: {', '.join(sorted(columns)) or 'none'})"
                "; give every row a 'prompt', a string or a list of chat messages"
            )
        prompt = columns["prompt"]
        if isinstance(prompt, list):
            check_messages(prompt, where, "prompt")
        elif not isinstance(prompt, str) or not prompt.strip():
            raise PromptDataError(
                f"{where}: 'prompt' is {'empty' if prompt == '' else type(prompt).__name__}; "
                "give a non-empty string or a list of chat messages"
            )
        row = PromptRow(where, columns)
        if rows:
            first = rows[0]
            if set(columns) != set(first.columns):
                missing = sorted(set(first.columns) - set(columns))
                extra = sorted(set(columns) - set(first.columns))
                problem = f"lacks column(s) {missing}" if missing else f"adds {extra}"
                raise PromptDataError(
                    f"{where}: {problem} that {first.where} has; give every row the same columns"
                )
            if row.conversational != first.conversational:
                raise PromptDataError(
                    f"{where}: mixes a {'chat' if row.conversational else 'string'} prompt "
                    f"with {first.where}'s {'chat' if first.conversational else 'string'} "
                    "one; use one kind in a file"
                )
        rows.append(row)
    if not rows:
        raise PromptDataError(f"{source}: no rows (it is empty); give at least one prompt")
    return rows


def _renamed(objects: Iterable[tuple[str, Any]], prompt_column: str) -> Iterator[tuple[str, Any]]:
    """The rows with their `prompt_column` renamed `prompt`. A row lacking that column, or having
    a `prompt` column too (one of the two would be lost), is a `PromptDataError`."""
    for where, columns in objects:
        if prompt_column != "prompt" and isinstance(columns, dict):
            if prompt_column not in columns:
                raise PromptDataError(
                    f"{where}: no {prompt_column!r} column (prompt_column; columns: "
                    f"{', '.join(sorted(columns)) or 'none'}); set prompt_column to the column "
                    "holding the prompt"
                )
            if "prompt" in columns:
                raise PromptDataError(
                    f"{where}: has a 'prompt' column besides prompt_column {prompt_column!r}, "
                    "which would replace it; set prompt_column to 'prompt'"
                )
            columns = dict(columns)
            columns["prompt"] = columns.pop(prompt_column)
        yield where, columns


def read_prompt_jsonl(
    source: str | os.PathLike | GivenRows, prompt_column: str = "prompt"
) -> list[PromptRow]:
    """Every non-blank line of a JSONL file (or row given in memory) as a `PromptRow`, checked
    (`_checked_rows`), its `prompt_column` renamed `prompt`. Raises `PromptDataError` naming the
    file and line (or the row)."""
    objects = jsonl_objects(source, PromptDataError)
    named = source.part if isinstance(source, GivenRows) else os.fspath(source)
    return _checked_rows(_renamed(objects, prompt_column), named)


def _tfds_value(value: Any) -> Any:
    """A feature value as `as_data_source()` returns it, as JSON would hold it: Text features
    (UTF-8 bytes) as str, arrays as lists, a Sequence of {"role", "content"} (a dict of arrays)
    as a list of chat messages."""
    if isinstance(value, bytes):
        return value.decode("utf-8")
    if isinstance(value, np.ndarray):
        return [_tfds_value(item) for item in value] if value.ndim else value.item()
    if isinstance(value, list | tuple):
        return [_tfds_value(item) for item in value]
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, Mapping):
        columns = {key: _tfds_value(item) for key, item in value.items()}
        lists = [item for item in columns.values() if isinstance(item, list)]
        if {"role", "content"} <= columns.keys() and len(lists) == len(columns):  # messages
            turns = zip(*lists, strict=True)
            return [dict(zip(columns, turn, strict=True)) for turn in turns]
        return columns
    return value


_HOW_TO_PREPARE = (
    "prepare it with `tfds build NAME --data_dir=DATA_DIR --file_format=array_record` (or your "
    "own builder's download_and_prepare), or pass its directory"
)


def read_prompt_tfds(
    name_or_path: str | os.PathLike,
    split: str,
    data_dir: str | os.PathLike | None = None,
    prompt_column: str = "prompt",
) -> list[PromptRow]:
    """The rows of one split of a built TFDS dataset in array_record format (a catalog dataset
    prepared with `tfds build NAME`, or your own builder's), read with `as_data_source()` (no
    TensorFlow), checked as a JSONL file's rows are. `name_or_path` is `NAME[/CONFIG][:X.Y.Z]`
    under `data_dir` (TFDS's default) or a dataset directory; `prompt_column` is the feature
    that holds the prompt (e.g. gsm8k's "question"), renamed `prompt`. Text features arrive as
    strings, and a Sequence of {"role", "content"} as chat messages. Raises `PromptDataError`."""
    given = os.fspath(name_or_path)
    try:
        # Prompts come from `tfds build`, not from collect.py as episode datasets do.
        path = dataset_path(given, data_dir, kind="dataset", how_to_create=_HOW_TO_PREPARE)
        builder = open_builder(path)
    except (DatasetNotFoundError, CorruptDatasetError) as error:
        raise PromptDataError(str(error)) from None
    fmt = file_format(builder.info)
    if fmt != "array_record":
        raise PromptDataError(
            f"{path}: stored as {fmt}, which only TensorFlow reads; rebuild it as array_record "
            f"(`tfds build {builder.info.name} --file_format=array_record`)"
        )
    splits = builder.info.splits
    if split not in splits:
        raise PromptDataError(
            f"{path}: no split {split!r}; choose one of {', '.join(sorted(splits))}"
        )
    source = builder.as_data_source(split=split)
    features = list(builder.info.features.keys())
    if prompt_column not in features:
        raise PromptDataError(
            f"{path}: no feature {prompt_column!r} to read prompts from (features: "
            f"{', '.join(features)}); set prompt_column to one of them"
        )

    def objects() -> Iterator[tuple[str, Any]]:
        for index in range(len(source)):
            columns = {key: _tfds_value(value) for key, value in source[index].items()}
            yield f"{given}[{split}][{index}]", columns

    return _checked_rows(_renamed(objects(), prompt_column), f"{given}[{split}]")


def split_rows(
    rows: Sequence[PromptRow], num_held_out: int, seed: int, field: str = "num_eval"
) -> tuple[list[PromptRow], list[PromptRow]]:
    """(train, held_out): `num_held_out` rows drawn at random (by `seed`) are held out for
    evaluation and never trained on, as SFT and DPO hold out theirs (`jaxrl.data.chat.hold_out`);
    a held-out split leaving nothing to train on is a ConfigError naming `field`."""
    return hold_out(rows, num_held_out, seed, field)


@dataclasses.dataclass(frozen=True)
class PromptTable:
    """Prompts as fixed-shape token arrays (left-padded to `max_prompt_length`) and their rows.

    `tokens` / `mask` are [num_rows, max_prompt_length]; `rows[i]` holds row i's columns. `cut`
    counts prompts longer than the length, which keep their last tokens (the question, which a
    chat prompt ends with) and lose their start; `longest` is the longest prompt's length."""

    tokens: np.ndarray
    mask: np.ndarray
    rows: tuple[PromptRow, ...]
    cut: int
    longest: int

    @property
    def conversational(self) -> bool:
        """Whether the prompts are chat messages (completions then reach rewards as messages)."""
        return self.rows[0].conversational

    @property
    def max_prompt_length(self) -> int:
        """The table's width in tokens."""
        return self.tokens.shape[1]

    def column_names(self) -> list[str]:
        """The columns besides `prompt`, which reach reward functions as keyword arguments."""
        return [name for name in self.rows[0].columns if name != "prompt"]


def prompt_text(row: PromptRow, tokenizer: Tokenizer, field: str = "train_jsonl") -> str:
    """The text a row's prompt is tokenised from: chat messages rendered by the tokenizer's chat
    template with the generation prompt; a string as it is. A tokenizer without a chat template
    given chat prompts is a ConfigError naming `field`."""
    if not row.conversational:
        return row.prompt
    try:
        return tokenizer.apply_chat_template(row.prompt, add_generation_prompt=True)
    except AttributeError:
        raise ConfigError(
            f"{field}: {row.where} has chat-message prompts and the byte tokenizer has no chat "
            "template; use a checkpoint whose tokenizer has one (init_from), or string prompts"
        ) from None
    except ConfigError as error:
        raise ConfigError(f"{field}: {row.where} has chat-message prompts: {error}") from None


def tokenize_prompts(
    rows: Sequence[PromptRow],
    tokenizer: Tokenizer,
    max_prompt_length: int = 0,
    *,
    length_percentile: float = 100.0,
    max_cut_fraction: float = 0.0,
    field: str = "train_jsonl",
) -> PromptTable:
    """The rows' prompts as a `PromptTable`. `max_prompt_length` 0 takes the length from the data
    (`choose_length` at `length_percentile`); prompts longer than it keep their last tokens and
    are counted in `cut`. More than `max_cut_fraction` of the rows cut is a ConfigError naming
    max_prompt_length and the length that would hold them all."""
    texts = [prompt_text(row, tokenizer, field) for row in rows]
    encode_batch = getattr(tokenizer, "encode_batch", None)
    encoded = encode_batch(texts) if encode_batch is not None else map(tokenizer.encode, texts)
    ids = []
    for row, text_ids in zip(rows, encoded, strict=True):
        # A rendered chat template spells out its own BOS; a plain string gets the tokenizer's.
        bos = [] if row.conversational or tokenizer.bos_id is None else [tokenizer.bos_id]
        ids.append(bos + list(text_ids))
    lengths = np.array([len(x) for x in ids])
    longest = int(lengths.max())
    length = max_prompt_length or choose_length(lengths, length_percentile)
    cut = int((lengths > length).sum())
    if cut > max_cut_fraction * len(rows):
        raise ConfigError(
            f"max_prompt_length: {cut} of {len(rows)} prompts have more than {length} tokens (the "
            f"longest {longest}) and would lose their start, more than max_cut_fraction="
            f"{max_cut_fraction}; set max_prompt_length={longest} (or 0 with "
            "length_percentile=100), or allow more cuts"
        )
    tokens = np.full((len(rows), length), tokenizer.pad_id, np.int32)
    mask = np.zeros((len(rows), length), bool)
    for i, row_ids in enumerate(ids):
        kept = row_ids[-length:]
        tokens[i, length - len(kept) :] = kept
        mask[i, length - len(kept) :] = True
    return PromptTable(tokens, mask, tuple(rows), cut, longest)
