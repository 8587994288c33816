"""Prompt datasets for reinforcement learning on a language model (GRPO and its relatives), in the
format TRL users already have: one JSON object per line with a `prompt` column, either a string or
a list of chat messages, plus any other columns (an `answer`, a difficulty, test cases...) that
the reward functions read.

    rows = read_prompt_jsonl("train.jsonl")                 # [PromptRow(line, {"prompt": ...})]
    train, held_out = split_rows(rows, num_held_out=200, seed=0)
    table = tokenize_prompts(train, tokenizer, max_prompt_length=0)   # 0: the longest prompt

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
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from jaxrl.config import ConfigError
from jaxrl.data.chat import (
    ChatDataError,
    check_messages,
    choose_length,
    hold_out,
    jsonl_objects,
)
from jaxrl.lm.tokenizer import Tokenizer

__all__ = [
    "PromptDataError",
    "PromptRow",
    "PromptTable",
    "choose_length",  # from jaxrl.data.chat, shared with SFT and DPO
    "read_prompt_jsonl",
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


def read_prompt_jsonl(path: str | os.PathLike) -> list[PromptRow]:
    """Every non-blank line of `path` as a `PromptRow`, checked: a JSON object whose `prompt` is
    a non-empty string or a list of chat messages, with the same columns as the first row (a
    reward function must find its column in every row) and the same kind of prompt (all strings,
    or all conversations). Raises `PromptDataError` naming the file and line."""
    path = os.fspath(path)
    rows: list[PromptRow] = []
    for where, columns in jsonl_objects(path, PromptDataError):
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
        raise PromptDataError(f"{path}: no rows (the file is empty); write one JSON object a line")
    return rows


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
