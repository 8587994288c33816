"""Tasks written one character per token (the digit tasks, a task of your own on short words):
the token id of each character a task writes, for encoding prompts and answers inside a
compiled program.

    tokens = character_tokens(tokenizer, "0123456789rev =", "reverse_digits")
    ids = jnp.asarray(tokens.char_ids)[codes]      # character codes (ord) -> token ids
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from jaxrl.config import require

ZERO = ord("0")


class TaskTokens(NamedTuple):
    """How a task's characters become token ids: `char_ids[ord(c)]` (-1 where unused)."""

    char_ids: np.ndarray  # [128] int32
    bos_id: int | None  # None: the tokenizer has no BOS token
    eos_id: int
    pad_id: int

    @property
    def digit_ids(self) -> np.ndarray:
        """[10] token ids of the characters "0" to "9"."""
        return self.char_ids[ZERO : ZERO + 10]


def character_tokens(tokenizer: Any, alphabet: str, task: str) -> TaskTokens:
    """The token id of every character of `alphabet` (ASCII), each of which must be a single
    token of `tokenizer`: otherwise `ConfigError` naming `tokenizer` (the task `task` then cannot
    write its prompts token by token, and a trainer scores it on the host instead)."""
    char_ids = np.full(128, -1, np.int32)
    for char in alphabet:
        ids = tokenizer.encode(char)
        require(
            len(ids) == 1,
            "tokenizer",
            f"{char!r} is {len(ids)} tokens, the {task} task needs it to be one",
            "use the byte tokenizer or one that has a single token per character",
        )
        char_ids[ord(char)] = ids[0]
    return TaskTokens(char_ids, tokenizer.bos_id, tokenizer.eos_id, tokenizer.pad_id)
