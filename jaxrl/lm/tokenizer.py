"""Tokenizers: a dependency-free byte tokenizer for tests and toy tasks, and Hugging Face
`tokenizer.json` files (through the `tokenizers` library, not `transformers`) for pretrained models.

Both follow one small `Tokenizer` protocol. `encode` never adds special tokens: the data pipeline
(`jaxrl.data`) decides where BOS/EOS/padding go, so that every model family is handled alike.

Chat templates: a checkpoint's Jinja template (`chat_template` in tokenizer_config.json, or a
`chat_template.jinja` file) is rendered by `HFTokenizer.apply_chat_template` (or
`render_chat_template`) in the sandboxed Jinja environment that `transformers`'
`apply_chat_template(tokenize=False)` uses, so a prompt is byte for byte the text the model was
fine-tuned on.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any, Protocol, runtime_checkable

from jaxrl import extras
from jaxrl.config import ConfigError

__all__ = [
    "ByteTokenizer",
    "HFTokenizer",
    "Tokenizer",
    "load_chat_template",
    "load_tokenizer",
    "render_chat_template",
]

TOKENIZER_CONFIG_FILE = "tokenizer_config.json"
# transformers >= 4.43 may save the template beside tokenizer_config.json instead of inside it,
# and named extra templates in a folder; a file there takes precedence over the JSON entry.
CHAT_TEMPLATE_FILE = "chat_template.jinja"
CHAT_TEMPLATE_DIR = "additional_chat_templates"
# The named special tokens transformers passes to every chat template (its special_tokens_map).
SPECIAL_TOKEN_NAMES = (
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
)

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


def _tokenizer_config(tokenizer_dir: str) -> dict[str, Any]:
    """The parsed `tokenizer_config.json` beside tokenizer.json, or {} when there is none."""
    path = os.path.join(tokenizer_dir, TOKENIZER_CONFIG_FILE)
    if not os.path.isfile(path):
        return {}
    with open(path, encoding="utf-8") as f:
        config = json.load(f)
    if not isinstance(config, dict):
        raise ValueError(f"{path}: expected a JSON object, got {type(config).__name__}")
    return config


def _configured_token(tokenizer_dir: str, key: str) -> str | None:
    """The token that a `tokenizer_config.json` beside tokenizer.json names for `key` (eos_token).

    Checkpoint directories from the Hub carry this file; it is the authority on which of several
    candidate spellings (Qwen2 has both <|endoftext|> and <|im_end|>) the model was trained with.
    """
    return _token_string(_tokenizer_config(tokenizer_dir).get(key))


def _token_string(value: Any) -> str | None:
    if isinstance(value, dict):  # {"content": "</s>", "lstrip": false, ...}
        value = value.get("content")
    return value if isinstance(value, str) else None


# --- chat templates ------------------------------------------------------------------------------

ChatTemplate = str | dict[str, str]


def _template_from_config(value: Any, source: str) -> ChatTemplate | None:
    """tokenizer_config.json's `chat_template`: a string, or a list of {"name", "template"}."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, list) and all(
        isinstance(t, dict)
        and isinstance(t.get("name"), str)
        and isinstance(t.get("template"), str)
        for t in value
    ):
        return {t["name"]: t["template"] for t in value}
    if isinstance(value, dict) and all(isinstance(t, str) for t in value.values()):
        return dict(value)
    raise ValueError(
        f"{source}: chat_template: expected a string or a list of "
        f'{{"name": ..., "template": ...}} objects, got {type(value).__name__}'
    )


def load_chat_template(directory: str | os.PathLike) -> ChatTemplate | None:
    """The chat template a checkpoint directory carries, as transformers finds it: a
    `chat_template.jinja` file (plus named ones in `additional_chat_templates/`), else the
    `chat_template` entry of tokenizer_config.json. A dict maps template names to templates.
    None when the checkpoint has none."""
    directory = os.fspath(directory)
    templates: dict[str, str] = {}
    main = os.path.join(directory, CHAT_TEMPLATE_FILE)
    if os.path.isfile(main):
        with open(main, encoding="utf-8") as f:
            templates["default"] = f.read()
    extra_dir = os.path.join(directory, CHAT_TEMPLATE_DIR)
    if os.path.isdir(extra_dir):
        for name in sorted(os.listdir(extra_dir)):
            if name.endswith(".jinja"):
                with open(os.path.join(extra_dir, name), encoding="utf-8") as f:
                    templates[name.removesuffix(".jinja")] = f.read()
    if templates:
        return templates["default"] if list(templates) == ["default"] else templates
    config_path = os.path.join(directory, TOKENIZER_CONFIG_FILE)
    return _template_from_config(
        _tokenizer_config(directory).get("chat_template"), source=config_path
    )


@functools.lru_cache(maxsize=64)
def _compile_chat_template(template: str) -> Any:
    """A compiled template in transformers' environment (`_compile_jinja_template`): Jinja's
    immutable sandbox (templates come from downloaded checkpoints and are untrusted code) with
    trim_blocks and lstrip_blocks, the loop-controls extension, a `{% generation %}` tag, a
    `tojson` that does not HTML-escape, `raise_exception`, `strftime_now`, and `dict` /
    `namespace` that cannot reach underscore (interpreter-internal) attributes."""
    extras.import_module("jinja2", "lm", "chat templates")
    import jinja2
    import jinja2.ext
    import jinja2.nodes
    import jinja2.sandbox
    import jinja2.utils

    class GenerationTag(jinja2.ext.Extension):
        # `{% generation %}...{% endgeneration %}` marks assistant text for loss masks in
        # transformers; rendering text only, its body is output unchanged.
        tags = {"generation"}

        def parse(self, parser: Any) -> Any:
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            call = self.call_method("_body")
            return jinja2.nodes.CallBlock(call, [], [], body).set_lineno(lineno)

        def _body(self, caller: Any) -> str:
            return caller()

    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    def tojson(
        value: Any,
        ensure_ascii: bool = False,
        indent: int | None = None,
        separators: Any = None,
        sort_keys: bool = False,
    ) -> str:
        # Jinja's own tojson escapes <, >, & and ' for HTML, which would change the prompt.
        return json.dumps(
            value,
            ensure_ascii=ensure_ascii,
            indent=indent,
            separators=separators,
            sort_keys=sort_keys,
        )

    def strftime_now(format: str) -> str:
        return datetime.now().strftime(format)

    def check_name(name: Any) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(
                f"chat templates may not set underscore-prefixed attributes, got {name!r}"
            )

    class SafeNamespace(jinja2.utils.Namespace):
        def __init__(*args: Any, **kwargs: Any) -> None:  # Jinja's signature: `self` may be a key
            self, rest = args[0], args[1:]
            attributes = dict(*rest, **kwargs)
            for name in attributes:
                check_name(name)
            jinja2.utils.Namespace.__init__(self, attributes)

        def __setitem__(self, name: str, value: Any) -> None:
            check_name(name)
            jinja2.utils.Namespace.__setitem__(self, name, value)

    class SafeDict:
        # Only plain construction: the `dict` type itself would expose its class attributes.
        def __call__(self, *args: Any, **kwargs: Any) -> dict:
            return dict(*args, **kwargs)

        def fromkeys(self, *args: Any, **kwargs: Any) -> dict:
            return dict.fromkeys(*args, **kwargs)

    environment = jinja2.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[GenerationTag, jinja2.ext.loopcontrols],
    )
    environment.filters["tojson"] = tojson
    environment.globals.update(
        raise_exception=raise_exception,
        strftime_now=strftime_now,
        dict=SafeDict(),
        namespace=SafeNamespace,
    )
    return environment.from_string(template)


def _plain(value: Any, where: str) -> Any:
    """`value` rebuilt from plain JSON-like types, so the sandbox only ever sees str/int/float/
    bool/None, lists, tuples and dicts (subclasses such as enums or numpy scalars carry methods
    the sandbox does not know to block)."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, Mapping):
        return {_plain(k, where): _plain(v, where) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v, where) for v in value]
    if isinstance(value, tuple):
        return tuple(_plain(v, where) for v in value)
    item = getattr(value, "item", None)
    if callable(item) and getattr(value, "shape", None) == ():  # a NumPy / JAX scalar
        return _plain(item(), where)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name), where) for f in dataclasses.fields(value)}
    raise TypeError(
        f"{where}: a chat template only receives JSON-like values (str, numbers, bool, None, "
        f"lists, dicts); got {type(value).__name__}"
    )


# Names a message's reasoning may come under; templates read `reasoning_content` (and gpt-oss
# ones `thinking`), so each is filled from whichever the caller used, as transformers does.
_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")


def render_chat_template(
    template: str,
    messages: Sequence[Mapping[str, Any]],
    add_generation_prompt: bool = False,
    *,
    tools: Sequence[Mapping[str, Any]] | None = None,
    documents: Sequence[Mapping[str, Any]] | None = None,
    **kwargs: Any,
) -> str:
    """Renders one conversation with a Jinja chat `template` exactly as transformers'
    `apply_chat_template(..., tokenize=False)` does.

    `messages` are dicts with "role" and "content" (keys whose value is None are dropped, as
    transformers does, because templates test for a key's presence). `tools` are JSON schemas;
    `kwargs` become template variables (bos_token, eos_token, date_string, enable_thinking, ...).
    A template's `raise_exception(...)` raises `jinja2.exceptions.TemplateError`.
    """
    if isinstance(messages, Mapping | str) or not isinstance(messages, Sequence):
        raise TypeError(
            f"messages: expected a list of {{'role': ..., 'content': ...}} dicts, got "
            f"{type(messages).__name__}"
        )
    if not messages:
        raise ValueError("messages: the conversation is empty; give at least one message")
    chat = []
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise TypeError(
                f"messages[{i}]: expected a {{'role': ..., 'content': ...}} dict, got "
                f"{type(message).__name__}"
            )
        message = {k: v for k, v in _plain(message, f"messages[{i}]").items() if v is not None}
        reasoning = next((message[k] for k in _REASONING_FIELDS if k in message), None)
        if reasoning is not None:
            message = {"thinking": reasoning, **message, "reasoning_content": reasoning}
        chat.append(message)
    variables = _plain(kwargs, "template variables")
    return _compile_chat_template(template).render(
        messages=chat,
        tools=_plain(tools, "tools"),
        documents=_plain(documents, "documents"),
        add_generation_prompt=add_generation_prompt,
        **variables,
    )


class HFTokenizer:
    """A Hugging Face tokenizer.json (any the `tokenizers` library reads); make with `from_file`."""

    def __init__(
        self,
        tokenizer: Any,
        pad_id: int,
        bos_id: int | None,
        eos_id: int,
        source: str = "",
        chat_template: ChatTemplate | None = None,
        special_tokens: Mapping[str, str] | None = None,
    ) -> None:
        self._tokenizer = tokenizer
        self.pad_id = pad_id
        self.bos_id = bos_id
        self.eos_id = eos_id
        self.vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)
        self.source = source
        self._specials = {pad_id, eos_id} | ({bos_id} if bos_id is not None else set())
        # The checkpoint's Jinja chat template (a dict: named templates), or None.
        self.chat_template = chat_template
        # Named special tokens as strings (bos_token, eos_token, ...), passed to chat templates.
        if special_tokens is None:
            special_tokens = {}
            for name, token_id in (
                ("bos_token", bos_id),
                ("eos_token", eos_id),
                ("pad_token", pad_id),
            ):
                if token_id is not None and tokenizer.id_to_token(token_id) is not None:
                    special_tokens[name] = tokenizer.id_to_token(token_id)
        self.special_tokens = dict(special_tokens)

    @classmethod
    def from_file(
        cls,
        path: str | os.PathLike,
        *,
        pad_token: str | None = None,
        bos_token: str | None = None,
        eos_token: str | None = None,
        chat_template: str | Mapping[str, str] | None = None,
    ) -> HFTokenizer:
        """Loads `path` (a tokenizer.json). Special tokens come from the arguments, else from a
        `tokenizer_config.json` beside it, else from common spellings. EOS is required; BOS may be
        absent (Qwen2 has none); a missing pad falls back to EOS, which is harmless because every
        padded position is masked.

        `chat_template` (a Jinja template, or named templates) replaces the checkpoint's; by
        default it is read from the directory (`load_chat_template`), None if it has none."""
        RawTokenizer = extras.import_module("tokenizers", "lm", "tokenizer.json files").Tokenizer

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

        # Template variables are tokenizer_config.json's named special tokens, as transformers'
        # special_tokens_map (a token set to null or left out there stays absent); without that
        # file, the BOS/EOS/pad chosen above. An explicit argument always wins.
        config = _tokenizer_config(tokenizer_dir)
        if config:
            special_tokens = {
                name: token
                for name in SPECIAL_TOKEN_NAMES
                if (token := _token_string(config.get(name))) is not None
            }
        else:
            chosen = {"bos_token": bos_id, "eos_token": eos_id, "pad_token": pad_id}
            special_tokens = {
                name: raw.id_to_token(token_id)
                for name, token_id in chosen.items()
                if token_id is not None
            }
        explicit = {"bos_token": bos_token, "eos_token": eos_token, "pad_token": pad_token}
        special_tokens.update({k: v for k, v in explicit.items() if v is not None})

        if chat_template is None:
            template = load_chat_template(tokenizer_dir)
        elif isinstance(chat_template, str):
            template = chat_template
        else:
            template = dict(chat_template)
        return cls(
            raw,
            pad_id=pad_id,
            bos_id=bos_id,
            eos_id=eos_id,
            source=path,
            chat_template=template,
            special_tokens=special_tokens,
        )

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

    def get_chat_template(
        self, chat_template: str | None = None, tools: Sequence[Any] | None = None
    ) -> str:
        """The template `apply_chat_template` renders, chosen as transformers chooses it: the
        argument (a template, or the name of one of the checkpoint's), else the checkpoint's;
        of named templates, "tool_use" when tools are given and it exists, else "default"."""
        templates = self.chat_template
        if isinstance(templates, dict):
            if chat_template is not None:
                return templates.get(chat_template, chat_template)
            if tools is not None and "tool_use" in templates:
                return templates["tool_use"]
            if "default" in templates:
                return templates["default"]
            raise ConfigError(
                f"{self.source}: chat_template: the checkpoint has named chat templates "
                f"({', '.join(sorted(templates))}) and no 'default'; pass chat_template=<one of "
                "those names or a Jinja template>"
            )
        if chat_template is not None:
            return chat_template
        if templates is None:
            raise ConfigError(
                f"{self.source or 'tokenizer'}: chat_template: the checkpoint has no chat template "
                f"(no chat_template in {TOKENIZER_CONFIG_FILE}, no {CHAT_TEMPLATE_FILE}); pass "
                "one, e.g. apply_chat_template(messages, chat_template=TEMPLATE) or "
                "load_tokenizer(path, chat_template=TEMPLATE)"
            )
        return templates

    def apply_chat_template(
        self,
        messages: Sequence[Mapping[str, Any]],
        add_generation_prompt: bool = False,
        *,
        chat_template: str | None = None,
        tools: Sequence[Mapping[str, Any]] | None = None,
        documents: Sequence[Mapping[str, Any]] | None = None,
        **kwargs: Any,
    ) -> str:
        """The conversation `messages` as prompt text, rendered with the checkpoint's chat
        template exactly as transformers' `apply_chat_template(..., tokenize=False)` renders it.

        The named special tokens (bos_token, eos_token, ...) are template variables, and so are
        `kwargs`, which override them. `add_generation_prompt` appends the header that opens the
        assistant's reply. Raises `ConfigError` when there is no template (pass `chat_template`).
        Encode the result with `encode`: templates spell out special tokens such as BOS.
        """
        template = self.get_chat_template(chat_template, tools)
        return render_chat_template(
            template,
            messages,
            add_generation_prompt,
            tools=tools,
            documents=documents,
            **{**self.special_tokens, **kwargs},
        )


def load_tokenizer(name_or_path: str | os.PathLike, **special_tokens: Any) -> Tokenizer:
    """`ByteTokenizer` for "byte"; `HFTokenizer` for a directory holding tokenizer.json or a
    tokenizer.json path (keyword arguments pad_token / bos_token / eos_token / chat_template go to
    `from_file`)."""
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
