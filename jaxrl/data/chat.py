"""Supervised fine-tuning data from a user's JSONL file, in the formats TRL users have, and what
SFT and preference data share: chat messages checked, conversations rendered with the
checkpoint's chat template and tokenised with a loss mask over the assistant's turns, sequence
lengths chosen from the data, and fixed-shape packing in the layout `jaxrl.data.preferences`
documents.

One JSON object per line (other fields are ignored), every row of a file in one format:

    {"prompt": "rev 12=", "completion": "21"}                             text
    {"prompt": [{"role": "user", "content": "rev 12="}],
     "completion": [{"role": "assistant", "content": "21"}]}              conversational
    {"messages": [{"role": "user", ...}, {"role": "assistant", ...}, ...]}  a whole conversation

    rows = read_sft_jsonl("train.jsonl")
    train, held_out = hold_out(rows, num_held_out=64, seed=0)
    examples = encode_sft_rows(train, tokenizer, assistant_turns="all")
    prompt, rest = example_lengths(examples)
    max_prompt_length, max_length = fit_lengths(prompt, rest, 0, 0, percentile=100)
    cut = check_cuts(prompt, rest, max_prompt_length, max_length, max_cut_fraction=0.05)
    arrays = pack(examples, tokenizer, max_prompt_length, max_length)

A text row is BOS + prompt + completion + EOS with the loss on the completion and EOS, as
`tokenize_sft`. A conversation is rendered whole by the tokenizer's chat template and tokenised as
one text, the way the model reads it after training; the template spells out its own special
tokens (BOS, end-of-turn), so nothing is added. The loss covers the assistant's turns: all of them
(`assistant_turns="all"`) or the last one ("last"); in a prompt/completion row only the
completion's.

Where a turn's tokens are: the template is rendered for the conversation up to the turn with the
generation prompt (the assistant's text starts where that ends) and through the turn (it ends
there, end-of-turn marker included, so the model learns to stop). Both must be prefixes of the
whole rendering, otherwise the turn cannot be located and the row is refused (templates that
render an earlier turn differently once the conversation goes on, e.g. dropping its reasoning, do
this; train on the last turn then). Character positions become token positions without needing
the tokenizer's offsets: the tokens the whole text shares with the tokenised text before the turn
come before the turn, and those it shares at its end with the tokenised text after the turn come
after it. Where a token straddles a boundary (tokenizers that merge across it), it joins the
loss, the way TRL's assistant-only loss marks every token touching an assistant character.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np

from jaxrl import extras
from jaxrl.config import ConfigError, require
from jaxrl.lm.tokenizer import Tokenizer

__all__ = [
    "ASSISTANT_TURNS",
    "ROLES",
    "ChatDataError",
    "Encoded",
    "SftRow",
    "check_cuts",
    "check_length_settings",
    "check_messages",
    "choose_length",
    "encode_chat_responses",
    "encode_conversation",
    "encode_sft_rows",
    "encode_texts",
    "example_lengths",
    "fit_lengths",
    "has_chat_template",
    "hold_out",
    "pack",
    "read_sft_jsonl",
    "render",
    "require_chat_template",
]

# The roles chat templates know (OpenAI's "developer" is a system message to newer templates).
ROLES = ("system", "developer", "user", "assistant", "tool")
ASSISTANT_TURNS = ("all", "last")


class ChatDataError(ValueError):
    """A JSONL row is unusable; the message names the file, the 1-based line, the problem and the
    fix."""


# ----------------------------------------------------------------------------------------------
# Rows


def check_messages(value: Any, where: str, field: str) -> list[dict[str, Any]]:
    """`value` as a conversation: a non-empty list of {"role": one of ROLES, "content": str}
    objects (other keys, such as tool_calls or reasoning_content, go to the template as they
    are). Raises `ChatDataError` naming `where` and `field` otherwise."""
    if not isinstance(value, list):
        raise ChatDataError(
            f"{where}: {field!r} must be a list of chat messages, got {type(value).__name__}; "
            'write [{"role": "user", "content": "..."}, ...]'
        )
    if not value:
        raise ChatDataError(f"{where}: {field!r} is an empty list; give at least one message")
    for i, message in enumerate(value):
        if not isinstance(message, dict):
            raise ChatDataError(
                f"{where}: {field!r} message {i} is a {type(message).__name__}, not an object; "
                'write messages as {"role": "user", "content": "..."}'
            )
        role = message.get("role")
        if role not in ROLES:
            raise ChatDataError(
                f"{where}: {field!r} message {i} has role {role!r}; use one of {', '.join(ROLES)}"
            )
        if "content" not in message:
            raise ChatDataError(
                f"{where}: {field!r} message {i} ({role}) has no 'content'; give it the "
                "message's text"
            )
        if not isinstance(message["content"], str):
            raise ChatDataError(
                f"{where}: {field!r} message {i} ({role}): 'content' is "
                f"{type(message['content']).__name__}, not a string; give it the message's text"
            )
    return [dict(message) for message in value]


def _has_assistant(messages: Sequence[Mapping[str, Any]]) -> bool:
    return any(message["role"] == "assistant" for message in messages)


@dataclasses.dataclass(frozen=True)
class SftRow:
    """One SFT example: a text (prompt, completion) pair, or a conversation whose assistant
    messages from `completion_start` on are trained on (0 for a "messages" row; the prompt's
    length for a conversational prompt/completion row, whose prompt is only context)."""

    where: str  # file:line, for errors found later (rendering)
    prompt: str = ""
    completion: str = ""
    messages: tuple[dict[str, Any], ...] | None = None
    completion_start: int = 0

    @property
    def conversational(self) -> bool:
        """Whether the row is chat messages (rendered by a chat template)."""
        return self.messages is not None

    @property
    def kind(self) -> str:
        """The row's format, for error messages: text, messages or conversational
        prompt/completion."""
        if self.messages is None:
            return "text"
        return "messages" if self.completion_start == 0 else "conversational prompt/completion"


def _sft_row(row: Any, where: str) -> SftRow:
    """One parsed JSON line as an `SftRow`, every problem a `ChatDataError`."""
    if not isinstance(row, dict):
        raise ChatDataError(
            f"{where}: expected a JSON object with 'prompt' and 'completion' or 'messages', got "
            f"{type(row).__name__}; write one JSON object per line"
        )
    if "messages" in row:
        messages = check_messages(row["messages"], where, "messages")
        if not _has_assistant(messages):
            raise ChatDataError(
                f"{where}: 'messages' has no assistant turn, so nothing to learn; add the "
                "assistant's reply or drop the row"
            )
        return SftRow(where, messages=tuple(messages))
    for field in ("prompt", "completion"):
        if field not in row:
            raise ChatDataError(
                f"{where}: missing field {field!r} (fields: {', '.join(sorted(row)) or 'none'}); "
                "every row needs 'prompt' and 'completion', or 'messages'"
            )
    prompt, completion = row["prompt"], row["completion"]
    if isinstance(prompt, str) and isinstance(completion, str):
        if not completion.strip():
            raise ChatDataError(
                f"{where}: 'completion' is empty; drop the row or fill in the completion"
            )
        return SftRow(where, prompt=prompt, completion=completion)
    if isinstance(prompt, list) and isinstance(completion, list):
        prompt_messages = check_messages(prompt, where, "prompt")
        completion_messages = check_messages(completion, where, "completion")
        if not _has_assistant(completion_messages):
            raise ChatDataError(
                f"{where}: 'completion' has no assistant message; write it as "
                '[{"role": "assistant", "content": "..."}]'
            )
        return SftRow(
            where,
            messages=tuple(prompt_messages + completion_messages),
            completion_start=len(prompt_messages),
        )
    raise ChatDataError(
        f"{where}: 'prompt' is a {type(prompt).__name__} and 'completion' a "
        f"{type(completion).__name__}; give two strings, or two lists of chat messages"
    )


@dataclasses.dataclass(frozen=True, eq=False)
class GivenRows:
    """Rows a trainer was given in memory (`train_data=[{...}, ...]`), read where a JSONL file
    would be: each row as JSON gives it back (NumPy values as plain lists and numbers), named as
    the user gave it ("train_data[3]"). `description` is what the run directory records of them:
    their count and the digest of their JSON, so the same rows given again resume the run."""

    rows: tuple[Any, ...]
    part: str  # the trainer's argument: "train_data" or "eval_data"
    digest: str

    @classmethod
    def of(cls, rows: Sequence[Mapping[str, Any]], part: str) -> GivenRows:
        """`rows` (dicts of JSON values; NumPy scalars and arrays become their Python values) as
        they would come back from a JSONL file. Raises TypeError / ValueError naming the row
        that is not JSON."""
        lines = []
        for index, row in enumerate(rows):
            try:
                lines.append(json.dumps(dict(row), default=_plain))
            except (TypeError, ValueError) as error:
                raise ValueError(f"row {index}: {error}") from None
        text = "\n".join(lines)
        digest = hashlib.sha256(text.encode()).hexdigest()[:16]
        return cls(tuple(json.loads(line) for line in lines), part, digest)

    @property
    def description(self) -> str:
        return f"{self.part}: {len(self.rows)} rows given from Python (sha256 {self.digest})"


def _plain(value: Any) -> Any:
    """A NumPy scalar or array (what a dataset's rows may hold) as its Python value, for JSON."""
    if callable(getattr(value, "tolist", None)):
        return value.tolist()
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def source_name(source: str | os.PathLike | GivenRows) -> str:
    """What summaries call a data source: a file's name, or the trainer argument of rows."""
    return source.part if isinstance(source, GivenRows) else os.path.basename(source)


def jsonl_exists(source: str | os.PathLike | GivenRows) -> bool:
    """Whether `source` is rows to read: rows given in memory, or a file."""
    return isinstance(source, GivenRows) or os.path.isfile(source)


def jsonl_objects(
    source: str | os.PathLike | GivenRows, error: type[ChatDataError] = ChatDataError
) -> Iterator[tuple[str, Any]]:
    """("file:line", parsed JSON) per non-blank line of a JSONL file, or ("train_data[i]", row)
    per row given in memory, for the readers of SFT rows, preference pairs and prompt files,
    which check the rows themselves. Raises `error` naming the file (missing, a directory) or the
    line (invalid UTF-8 or JSON)."""
    if isinstance(source, GivenRows):
        for index, row in enumerate(source.rows):
            yield f"{source.part}[{index}]", row
        return
    path = os.fspath(source)
    if not jsonl_exists(path):
        problem = "is a directory" if os.path.isdir(path) else "no such file"
        raise error(f"{path}: {problem}; pass the path of a JSONL file")
    with open(path, "rb") as f:
        for line_number, raw in enumerate(f, start=1):
            where = f"{path}:{line_number}"
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise error(
                    f"{where}: not valid UTF-8 ({e.reason} at byte {e.start}); re-encode the file "
                    "as UTF-8"
                ) from None
            if not line.strip():
                continue  # blank lines (a trailing newline) carry no row
            try:
                parsed = json.loads(line)
            except json.JSONDecodeError as e:
                raise error(
                    f"{where}: invalid JSON ({e.msg} at column {e.colno}); each line must be one "
                    "JSON object"
                ) from None
            yield where, parsed


def read_sft_jsonl(path: str | os.PathLike | GivenRows) -> list[SftRow]:
    """Every non-blank line of `path` (or row given in memory) as an `SftRow`, checked: valid
    UTF-8 and JSON, an object with string or message-list 'prompt' and 'completion', or a
    'messages' conversation with an assistant turn; known roles; every row in the first row's
    format. Raises `ChatDataError` naming the file and line (or the file, when it is missing or
    has no rows)."""
    rows: list[SftRow] = []
    for where, parsed in jsonl_objects(path):
        row = _sft_row(parsed, where)
        # One format a file: the loss and the lengths mean one thing for all its rows.
        if rows and row.kind != rows[0].kind:
            raise ChatDataError(
                f"{where}: a {row.kind} row in a file whose first row ({rows[0].where}) is "
                f"{rows[0].kind}; use one format in a file"
            )
        rows.append(row)
    if not rows:
        raise ChatDataError(
            f"{path.part if isinstance(path, GivenRows) else path}: no rows (the file is "
            "empty); write one JSON object a line"
        )
    return rows


def hold_out(
    rows: Sequence[Any], num_held_out: int, seed: int, field: str = "num_eval"
) -> tuple[list[Any], list[Any]]:
    """(train, held_out): `num_held_out` rows drawn at random (deterministic in `seed`) are held
    out and never trained on; both keep the file's order. At least one row must remain on each
    side: otherwise a ConfigError naming `field`."""
    require(
        0 < num_held_out < len(rows),
        field,
        f"{num_held_out} held-out rows out of {len(rows)} leave "
        f"{'nothing to evaluate on' if num_held_out <= 0 else 'none to train on'}",
        f"use 1 to {len(rows) - 1}, or give a separate held-out file (eval_jsonl)"
        if len(rows) > 1
        else "give more rows, or a separate held-out file (eval_jsonl)",
    )
    held = np.zeros(len(rows), bool)
    held[np.random.default_rng(seed).choice(len(rows), num_held_out, replace=False)] = True
    train = [row for row, h in zip(rows, held, strict=True) if not h]
    return train, [row for row, h in zip(rows, held, strict=True) if h]


# ----------------------------------------------------------------------------------------------
# Chat templates


def has_chat_template(tokenizer: Tokenizer) -> bool:
    """Whether `tokenizer` can render conversations (the byte tokenizer cannot)."""
    return callable(getattr(tokenizer, "apply_chat_template", None)) and (
        getattr(tokenizer, "chat_template", None) is not None
    )


def require_chat_template(tokenizer: Tokenizer, field: str, path: str) -> None:
    """ConfigError naming `field` unless `tokenizer` has a usable chat template for the chat rows
    of `path`."""
    what = getattr(tokenizer, "source", "") or "the byte tokenizer"
    require(
        has_chat_template(tokenizer),
        field,
        f"{path} holds chat messages but the tokenizer ({what}) has no chat template to render "
        "them",
        "start from a checkpoint whose tokenizer has one (init_from, or task.tokenizer=<a "
        "directory with tokenizer.json and a chat_template>), or give the rows as strings",
    )
    choose = getattr(tokenizer, "get_chat_template", None)
    try:  # named templates without a default: the choice is the user's
        if choose is not None:
            choose()
    except ConfigError as error:
        raise ConfigError(f"{field}: {path} holds chat messages: {error}") from None


def render(
    tokenizer: Tokenizer,
    messages: Sequence[Mapping[str, Any]],
    where: str,
    add_generation_prompt: bool = False,
) -> str:
    """`messages` rendered by the tokenizer's chat template; a template that refuses them (its
    `raise_exception`, e.g. "roles must alternate") is a `ChatDataError` naming `where`."""
    jinja2 = extras.import_module("jinja2", "lm", "chat templates")

    try:
        return tokenizer.apply_chat_template(  # type: ignore[attr-defined]
            list(messages), add_generation_prompt=add_generation_prompt
        )
    except jinja2.exceptions.TemplateError as error:
        raise ChatDataError(
            f"{where}: the chat template refused the conversation ({error}); change the row's "
            "messages to what the template accepts"
        ) from None


# ----------------------------------------------------------------------------------------------
# Tokenising


class Encoded(NamedTuple):
    """One tokenised sequence before packing: its ids and the [start, end) token ranges in the
    loss, in order. What precedes the first range is the prompt (the generation prompt)."""

    ids: list[int]
    spans: tuple[tuple[int, int], ...]

    @property
    def prompt_length(self) -> int:
        """Tokens before the first loss token."""
        return self.spans[0][0] if self.spans else len(self.ids)


def _encode_all(tokenizer: Tokenizer, texts: Sequence[str]) -> list[list[int]]:
    # HF tokenizers encode a batch in parallel Rust; the protocol only promises `encode`.
    encode_batch = getattr(tokenizer, "encode_batch", None)
    if encode_batch is not None:
        return [list(ids) for ids in encode_batch(list(texts))]
    return [list(tokenizer.encode(text)) for text in texts]


def encode_texts(
    tokenizer: Tokenizer, prompts: Sequence[str], responses: Sequence[str]
) -> list[Encoded]:
    """Text pairs as BOS (when the tokenizer has one) + prompt + response + EOS, the loss on the
    response and EOS. Prompt and response are tokenised apart, so the prompt's tokens are those
    generation starts from."""
    bos = [] if tokenizer.bos_id is None else [tokenizer.bos_id]
    prompt_ids = _encode_all(tokenizer, prompts)
    response_ids = _encode_all(tokenizer, responses)
    out = []
    for prompt, response in zip(prompt_ids, response_ids, strict=True):
        ids = bos + prompt + response + [tokenizer.eos_id]
        out.append(Encoded(ids, ((len(bos) + len(prompt), len(ids)),)))
    return out


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def _common_suffix(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(reversed(a), reversed(b), strict=False):
        if x != y:
            break
        n += 1
    return n


def encode_conversation(
    tokenizer: Tokenizer,
    messages: Sequence[Mapping[str, Any]],
    targets: Sequence[int],
    where: str,
) -> Encoded:
    """The conversation rendered by the chat template and tokenised whole, the loss on the
    messages at indices `targets` (assistant turns); how their tokens are found: module
    docstring. Raises `ChatDataError` naming `where` when a turn cannot be located."""
    full = render(tokenizer, messages, where)
    boundaries = []
    for i in targets:
        if i == 0:
            raise ChatDataError(
                f"{where}: the conversation opens with the assistant, so no prompt precedes its "
                "turn; put the user's (or a system) message first"
            )
        before = render(tokenizer, messages[:i], where, add_generation_prompt=True)
        through = render(tokenizer, messages[: i + 1], where)
        located = full.startswith(before) and full.startswith(through)
        if not located or len(before) > len(through):
            raise ChatDataError(
                f"{where}: the chat template renders assistant message {i} differently inside "
                "the conversation than when the conversation ends with it, so its tokens cannot "
                "be located; train on the last assistant turn only (assistant_turns='last'), or "
                "split the conversation into one row per turn"
            )
        boundaries.append((len(before), len(through)))
    # One batch: the whole text, the text before each turn and the text after each turn.
    pieces = [full, *(full[:start] for start, _ in boundaries)]
    pieces += [full[end:] for _, end in boundaries]
    encoded = _encode_all(tokenizer, pieces)
    ids, befores, afters = encoded[0], encoded[1 : 1 + len(targets)], encoded[1 + len(targets) :]
    spans = []
    for before_ids, after_ids in zip(befores, afters, strict=True):
        start = _common_prefix(ids, before_ids)
        end = len(ids) - _common_suffix(ids, after_ids)
        if end > start:
            spans.append((start, end))
    if not spans:
        raise ChatDataError(
            f"{where}: the assistant turns render to no tokens; give them content or drop the row"
        )
    return Encoded(ids, tuple(spans))


def encode_chat_responses(
    tokenizer: Tokenizer,
    prompt: Sequence[Mapping[str, Any]],
    responses: Sequence[Sequence[Mapping[str, Any]]],
    where: str,
) -> list[Encoded]:
    """Each response (messages, e.g. one assistant message) after the chat `prompt`: the prompt
    rendered with the generation prompt, the response the rest of the rendered conversation, the
    loss on all of it (end-of-turn marker included). Every result starts with the same prompt
    tokens, those generation starts from (preference pairs share them). The response's tokens
    are the whole conversation's after the prompt's where the prompt's tokens begin it (a clean
    boundary, as with byte-level BPE and special-token markers), else the response text
    tokenised on its own, as TRL does."""
    prompt_text = render(tokenizer, prompt, where, add_generation_prompt=True)
    fulls = [render(tokenizer, [*prompt, *response], where) for response in responses]
    if not all(full.startswith(prompt_text) for full in fulls):
        raise ChatDataError(
            f"{where}: the chat template renders the prompt differently once a response follows "
            "it, so the response cannot be located; end the prompt with the user's turn"
        )
    rests = [full[len(prompt_text) :] for full in fulls]
    encoded = _encode_all(tokenizer, [prompt_text, *fulls, *rests])
    prompt_ids, full_encodings = encoded[0], encoded[1 : 1 + len(fulls)]
    out = []
    for full_ids, rest_ids in zip(full_encodings, encoded[1 + len(fulls) :], strict=True):
        clean = full_ids[: len(prompt_ids)] == prompt_ids
        response = full_ids[len(prompt_ids) :] if clean else rest_ids
        ids = prompt_ids + response
        out.append(Encoded(ids, ((len(prompt_ids), len(ids)),)))
    return out


def _target_turns(row: SftRow, assistant_turns: str) -> list[int]:
    assert row.messages is not None
    turns = [
        i
        for i, message in enumerate(row.messages)
        if i >= row.completion_start and message["role"] == "assistant"
    ]
    return turns if assistant_turns == "all" else turns[-1:]


def encode_sft_rows(
    rows: Sequence[SftRow], tokenizer: Tokenizer, assistant_turns: str = "all"
) -> list[Encoded]:
    """Tokenised SFT rows: text rows by `encode_texts`, conversations by `encode_conversation`
    with the loss on every assistant turn ("all") or the last ("last") of each (of the
    completion, for prompt/completion rows). Conversations need a chat template (check with
    `require_chat_template` first, to name the setting)."""
    require(
        assistant_turns in ASSISTANT_TURNS,
        "assistant_turns",
        f"got {assistant_turns!r}",
        f"use one of {', '.join(ASSISTANT_TURNS)}",
    )
    text = [row for row in rows if not row.conversational]
    encoded_text = iter(
        encode_texts(tokenizer, [r.prompt for r in text], [r.completion for r in text])
    )
    out = []
    for row in rows:
        if row.messages is None:
            out.append(next(encoded_text))
        else:
            turns = _target_turns(row, assistant_turns)
            out.append(encode_conversation(tokenizer, row.messages, turns, row.where))
    return out


# ----------------------------------------------------------------------------------------------
# Lengths


def choose_length(lengths: Sequence[int] | np.ndarray, percentile: float) -> int:
    """The `percentile`-th percentile of `lengths` (nearest rank: the shortest of them that at
    least `percentile` % of them do not exceed; 100: the longest). Fixed shapes need one length;
    a percentile below 100 trades a few cut rows (at most 100 - percentile %) for much shorter
    padded ones when a dataset has a long tail."""
    require(
        0 < percentile <= 100,
        "length_percentile",
        f"got {percentile}",
        "use a value in (0, 100] (100: the longest row)",
    )
    return int(np.percentile(np.asarray(lengths), percentile, method="inverted_cdf"))


def check_length_settings(
    max_prompt_length: int, max_length: int, length_percentile: float, max_cut_fraction: float
) -> None:
    """The length settings on their own (0 lengths: from the data); ConfigError naming the
    field otherwise."""
    for field, value in (("max_prompt_length", max_prompt_length), ("max_length", max_length)):
        require(
            isinstance(value, int) and value >= 0,
            field,
            f"got {value}",
            "give a number of tokens, or 0 to take it from the data",
        )
    require(
        not (max_prompt_length and max_length) or max_length > max_prompt_length,
        "max_length",
        f"({max_length}) must exceed max_prompt_length ({max_prompt_length}) so a response fits",
        "raise max_length, lower max_prompt_length, or set 0 to take it from the data",
    )
    require(
        0 < length_percentile <= 100,
        "length_percentile",
        f"got {length_percentile}",
        "use a value in (0, 100] (100: the longest row)",
    )
    require(
        0 <= max_cut_fraction <= 1,
        "max_cut_fraction",
        f"got {max_cut_fraction}",
        "use a fraction of the rows in [0, 1]",
    )


def example_lengths(examples: Sequence[Encoded]) -> tuple[np.ndarray, np.ndarray]:
    """(prompt lengths, lengths of the rest) of tokenised examples, what `fit_lengths` and
    `check_cuts` take. Preference pairs pass their prompt's and the longer response's."""
    prompt = np.array([e.prompt_length for e in examples], np.int64)
    rest = np.array([len(e.ids) for e in examples], np.int64) - prompt
    return prompt, rest


def fit_lengths(
    prompt_lengths: np.ndarray,
    rest_lengths: np.ndarray,
    max_prompt_length: int,
    max_length: int,
    percentile: float = 100.0,
) -> tuple[int, int]:
    """(max_prompt_length, max_length): the given ones, or where 0 the `percentile`-th percentile
    of the rows' prompt lengths and of their sequence lengths with the prompt as long as it will
    be (cut to max_prompt_length). Either leaves room for at least one response token."""
    prompt_length = max_prompt_length or max(1, choose_length(prompt_lengths, percentile))
    if max_length:
        # A prompt length from the data leaves a given max_length room for a response.
        if not max_prompt_length:
            prompt_length = max(1, min(prompt_length, max_length - 1))
        return prompt_length, max_length
    totals = np.minimum(prompt_lengths, prompt_length) + rest_lengths
    return prompt_length, max(choose_length(totals, percentile), prompt_length + 1)


def _cut(
    prompt_lengths: np.ndarray, rest_lengths: np.ndarray, max_prompt_length: int, max_length: int
) -> tuple[np.ndarray, np.ndarray]:
    """Which rows lose prompt tokens, and which lose tokens at the end."""
    totals = np.minimum(prompt_lengths, max_prompt_length) + rest_lengths
    return prompt_lengths > max_prompt_length, totals > max_length


def check_cuts(
    prompt_lengths: np.ndarray,
    rest_lengths: np.ndarray,
    max_prompt_length: int,
    max_length: int,
    max_cut_fraction: float,
    rows: str = "rows",
    given: tuple[bool, bool] = (True, True),
) -> int:
    """The number of rows `pack` cuts at these lengths. More than `max_cut_fraction` of them is a
    ConfigError naming the setting to change: max_prompt_length or max_length where `given` says
    it was set (not taken from the data), else length_percentile; with the length that fits
    every row and the one that cuts few enough. `rows` names them ("training rows")."""
    n = len(prompt_lengths)
    prompt_cut, end_cut = _cut(prompt_lengths, rest_lengths, max_prompt_length, max_length)
    cut = int((prompt_cut | end_cut).sum())
    if cut <= max_cut_fraction * n:
        return cut
    what = (
        f"{cut} of {n} {rows} ({cut / n:.1%}) would be cut at max_prompt_length="
        f"{max_prompt_length}, max_length={max_length}, more than max_cut_fraction="
        f"{max_cut_fraction}"
    )
    # Enough rows fit at the (1 - max_cut_fraction) quantile: see `choose_length`.
    keep = 100.0 * (1.0 - max_cut_fraction)

    def lengths_to_fit(lengths: np.ndarray) -> tuple[int, int]:
        return int(lengths.max()), choose_length(lengths, keep) if keep > 0 else int(lengths.max())

    if given[0] and prompt_cut.sum() > max_cut_fraction * n:
        longest, enough = lengths_to_fit(prompt_lengths)
        also = " (and max_length above it)" if longest >= max_length else ""
        raise ConfigError(
            f"max_prompt_length: {what}; set max_prompt_length={longest}{also} to fit every "
            f"prompt (or {enough} to cut at most max_cut_fraction of them), 0 to take it from "
            "the data, or raise max_cut_fraction"
        )
    if given[1]:
        # With the prompts as long as they will be: the given length, or all of a chosen one.
        prompt = np.minimum(prompt_lengths, max_prompt_length) if given[0] else prompt_lengths
        longest, enough = lengths_to_fit(prompt + rest_lengths)
        raise ConfigError(
            f"max_length: {what}; set max_length={longest} to fit every row (or {enough} to cut "
            "at most max_cut_fraction of them), 0 to take it from the data, or raise "
            "max_cut_fraction"
        )
    raise ConfigError(
        f"length_percentile: {what} (lengths taken from the data at this percentile); raise "
        "length_percentile (100 fits every row) or max_cut_fraction"
    )


# ----------------------------------------------------------------------------------------------
# Packing


def _prompt_end(prompt: list[int], max_prompt_length: int, bos_id: int | None) -> list[int]:
    """The prompt's last max_prompt_length tokens (a conversation ends with what the response
    answers), a leading BOS kept first: models attend to it as the sequence's start."""
    if len(prompt) <= max_prompt_length:
        return prompt
    bos = prompt[:1] if bos_id is not None and prompt[0] == bos_id else []
    keep = max_prompt_length - len(bos)
    return bos + (prompt[len(prompt) - keep :] if keep > 0 else [])


def check_pack_lengths(max_prompt_length: int, max_length: int) -> None:
    """A ConfigError unless 0 < max_prompt_length < max_length (room for a response)."""
    require(
        max_prompt_length > 0,
        "max_prompt_length",
        f"must be positive, got {max_prompt_length}",
        "set max_prompt_length > 0",
    )
    require(
        max_length > max_prompt_length,
        "max_length",
        f"({max_length}) must exceed max_prompt_length ({max_prompt_length}) so a response fits",
        "raise max_length or lower max_prompt_length",
    )


def pack(
    examples: Sequence[Encoded], tokenizer: Tokenizer, max_prompt_length: int, max_length: int
) -> dict[str, np.ndarray]:
    """Fixed-shape arrays in the layout of `jaxrl.data.preferences`: tokens int32 [N, max_length]
    right-padded, attention_mask and loss_mask bool; prompt_tokens [N, max_prompt_length]
    left-padded with prompt_mask, for generation. A prompt longer than max_prompt_length keeps
    its last tokens (BOS first); what then exceeds max_length is cut on the right, so a cut
    response loses its EOS (the text did not end there)."""
    check_pack_lengths(max_prompt_length, max_length)
    n = len(examples)
    tokens = np.full((n, max_length), tokenizer.pad_id, np.int32)
    attention_mask = np.zeros((n, max_length), bool)
    loss_mask = np.zeros((n, max_length), bool)
    prompt_tokens = np.full((n, max_prompt_length), tokenizer.pad_id, np.int32)
    prompt_mask = np.zeros((n, max_prompt_length), bool)
    for i, example in enumerate(examples):
        start = example.prompt_length
        prompt = _prompt_end(example.ids[:start], max_prompt_length, tokenizer.bos_id)
        shift = len(prompt) - start
        sequence = (prompt + example.ids[start:])[:max_length]
        tokens[i, : len(sequence)] = sequence
        attention_mask[i, : len(sequence)] = True
        for span_start, span_end in example.spans:
            loss_mask[i, span_start + shift : min(span_end + shift, max_length)] = True
        if prompt:
            prompt_tokens[i, max_prompt_length - len(prompt) :] = prompt
            prompt_mask[i, max_prompt_length - len(prompt) :] = True
    loss_mask[:, 0] = False  # nothing predicts position 0
    return {
        "tokens": tokens,
        "attention_mask": attention_mask,
        "loss_mask": loss_mask,
        "prompt_tokens": prompt_tokens,
        "prompt_mask": prompt_mask,
    }
