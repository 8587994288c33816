"""Tokenizers: a dependency-free byte tokenizer for tests and toy tasks, and Hugging Face
`tokenizer.json` files (through the `tokenizers` library, not `transformers`) for pretrained models.

Both follow one small `Tokenizer` protocol. `encode` never adds special tokens: the data pipeline
(`jaxrl.data`) decides where BOS/EOS/padding go, so that every model family is handled alike.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from typing import Any, Protocol, runtime_checkable

__all__ = ["ByteTokenizer", "HFTokenizer", "Tokenizer", "load_tokenizer"]

# Spellings used by common model families, most specific first. Only consulted when neither an
# explicit argument nor a `tokenizer_config.json` beside the file names the token.
PAD_CANDIDATES = ("<pad>", "<|pad|>", "[PAD]", "<|finetune_right_pad_id|>", "<|padding|>")
BOS_CANDIDATES = ("<|begin_of_text|>", "<s>", "<bos>", "<|startoftext|>", "[CLS]")
EOS_CANDIDATES = (
    "<|endoftext|>",
    "<|end_of_text|>",
    "</s>",
    "<eos>",
    "<|im_end|>",
    "<|eot_id|>",
    "<|end|>",
    "[SEP]",
)


@runtime_checkable
class Tokenizer(Protocol):
    """What the data pipeline, the sampler and the reward functions need from a tokenizer."""

    vocab_size: int
    pad_id: int
    bos_id: int | None
    eos_id: int

    def encode(self, text: str) -> list[int]:
        """Token ids of `text`, with no special tokens added."""
        ...

    def decode(self, ids: Iterable[int]) -> str:
        """Text of `ids`, with pad/bos/eos dropped."""
        ...

    def token_to_id(self, token: str) -> int | None:
        """Id of one token spelled `token`, or None if the vocabulary lacks it."""
        ...


def _as_int_list(ids: Iterable[int]) -> list[int]:
    # NumPy / JAX arrays convert in one call; iterating them element by element is slow.
    tolist = getattr(ids, "tolist", None)
    values = tolist() if tolist is not None else list(ids)
    if not isinstance(values, list):  # a 0-d array
        values = [values]
    return [int(i) for i in values]


class ByteTokenizer:
    """UTF-8 bytes as tokens: 0 = <pad>, 1 = <bos>, 2 = <eos>, byte b = b + 3; 259 ids in all."""

    SPECIALS = ("<pad>", "<bos>", "<eos>")
    OFFSET = len(SPECIALS)

    def __init__(self) -> None:
        self.pad_id = 0
        self.bos_id: int | None = 1
        self.eos_id = 2
        self.vocab_size = self.OFFSET + 256

    def encode(self, text: str) -> list[int]:
        """One id per UTF-8 byte of `text`; no special tokens."""
        return [b + self.OFFSET for b in text.encode("utf-8")]

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """`encode` of each text."""
        return [self.encode(t) for t in texts]

    def decode(self, ids: Iterable[int]) -> str:
        """Text of `ids` with pad/bos/eos dropped; invalid UTF-8 (e.g. a cut multi-byte character
        in sampled text) becomes U+FFFD rather than an error."""
        data = bytearray()
        for i in _as_int_list(ids):
            if not 0 <= i < self.vocab_size:
                raise ValueError(
                    f"ByteTokenizer.decode: id {i} is outside the vocabulary "
                    f"[0, {self.vocab_size}); give the model vocab_size={self.vocab_size}"
                )
            if i >= self.OFFSET:
                data.append(i - self.OFFSET)
        return data.decode("utf-8", errors="replace")

    def token_to_id(self, token: str) -> int | None:
        """Id of a special token name or of a single-byte (ASCII) character; otherwise None."""
        if token in self.SPECIALS:
            return self.SPECIALS.index(token)
        encoded = token.encode("utf-8")
        return encoded[0] + self.OFFSET if len(encoded) == 1 else None


def _configured_token(tokenizer_dir: str, key: str) -> str | None:
    """The token that a `tokenizer_config.json` beside tokenizer.json names for `key` (eos_token).

    Checkpoint directories from the Hub carry this file; it is the authority on which of several
    candidate spellings (Qwen2 has both <|endoftext|> and <|im_end|>) the model was trained with.
    """
    path = os.path.join(tokenizer_dir, "tokenizer_config.json")
    if not os.path.isfile(path):
        return None
    with open(path, encoding="utf-8") as f:
        value = json.load(f).get(key)
    if isinstance(value, dict):  # {"content": "</s>", "lstrip": false, ...}
        value = value.get("content")
    return value if isinstance(value, str) else None


class HFTokenizer:
    """A Hugging Face tokenizer.json (any the `tokenizers` library reads); make with `from_file`."""

    def __init__(
        self, tokenizer: Any, pad_id: int, bos_id: int | None, eos_id: int, source: str = ""
    ) -> None:
        self._tokenizer = tokenizer
        self.pad_id = pad_id
        self.bos_id = bos_id
        self.eos_id = eos_id
        self.vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)
        self.source = source
        self._specials = {pad_id, eos_id} | ({bos_id} if bos_id is not None else set())

    @classmethod
    def from_file(
        cls,
        path: str | os.PathLike,
        *,
        pad_token: str | None = None,
        bos_token: str | None = None,
        eos_token: str | None = None,
    ) -> HFTokenizer:
        """Loads `path` (a tokenizer.json). Special tokens come from the arguments, else from a
        `tokenizer_config.json` beside it, else from common spellings. EOS is required; BOS may be
        absent (Qwen2 has none); a missing pad falls back to EOS, which is harmless because every
        padded position is masked."""
        from tokenizers import Tokenizer as RawTokenizer

        path = os.fspath(path)
        if not os.path.isfile(path):
            raise FileNotFoundError(
                f"{path}: no such tokenizer.json; pass the path of a Hugging Face tokenizer.json "
                "or the directory holding it"
            )
        raw = RawTokenizer.from_file(path)
        tokenizer_dir = os.path.dirname(path)

        def find(argument: str, given: str | None, candidates: Sequence[str]) -> int | None:
            if given is not None:
                token_id = raw.token_to_id(given)
                if token_id is None:
                    raise ValueError(
                        f"{path}: {argument}={given!r} is not in the vocabulary; "
                        f"pass a token that {os.path.basename(path)} contains"
                    )
                return token_id
            configured = _configured_token(tokenizer_dir, argument)
            for token in ((configured,) if configured else ()) + tuple(candidates):
                token_id = raw.token_to_id(token)
                if token_id is not None:
                    return token_id
            return None

        eos_id = find("eos_token", eos_token, EOS_CANDIDATES)
        if eos_id is None:
            raise ValueError(
                f"{path}: no end-of-sequence token found (tried {', '.join(EOS_CANDIDATES)}); "
                "pass eos_token='<the model's EOS token>' to HFTokenizer.from_file / load_tokenizer"
            )
        bos_id = find("bos_token", bos_token, BOS_CANDIDATES)
        pad_id = find("pad_token", pad_token, PAD_CANDIDATES)
        pad_id = eos_id if pad_id is None else pad_id
        return cls(raw, pad_id=pad_id, bos_id=bos_id, eos_id=eos_id, source=path)

    def encode(self, text: str) -> list[int]:
        """Token ids of `text`, with no special tokens added (the post-processor is skipped)."""
        return self._tokenizer.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """`encode` over many texts at once, in the library's parallel Rust code."""
        encodings = self._tokenizer.encode_batch(list(texts), add_special_tokens=False)
        return [e.ids for e in encodings]

    def decode(self, ids: Iterable[int]) -> str:
        """Text of `ids` with pad/bos/eos dropped, and every other token the file marks special
        (<unk>, chat markup), as `tokenizers` and TRL decode completions by default."""
        # pad/bos/eos are filtered by id too: an explicitly chosen one may not be marked special.
        kept = [i for i in _as_int_list(ids) if i not in self._specials]
        return self._tokenizer.decode(kept, skip_special_tokens=True)

    def token_to_id(self, token: str) -> int | None:
        """Id of `token` (a vocabulary entry, e.g. "<|endoftext|>"); None if it has none."""
        return self._tokenizer.token_to_id(token)


def load_tokenizer(name_or_path: str | os.PathLike, **special_tokens: str) -> Tokenizer:
    """`ByteTokenizer` for "byte"; `HFTokenizer` for a directory holding tokenizer.json or a
    tokenizer.json path (keyword arguments pad_token / bos_token / eos_token go to `from_file`)."""
    name = os.fspath(name_or_path)
    if name == "byte":
        if special_tokens:
            raise ValueError(
                f"load_tokenizer('byte'): the byte tokenizer has fixed special tokens; "
                f"drop {', '.join(sorted(special_tokens))}"
            )
        return ByteTokenizer()
    if os.path.isdir(name):
        path = os.path.join(name, "tokenizer.json")
        if not os.path.isfile(path):
            raise FileNotFoundError(
                f"{name}: directory has no tokenizer.json; pass a directory holding one, "
                "a tokenizer.json path, or 'byte'"
            )
        return HFTokenizer.from_file(path, **special_tokens)
    if os.path.isfile(name):
        return HFTokenizer.from_file(name, **special_tokens)
    raise FileNotFoundError(
        f"{name}: no such file or directory; pass 'byte', a directory holding tokenizer.json, "
        "or a tokenizer.json path"
    )
