"""Sample completions from a trained run, a Hugging Face checkpoint directory or a GGUF file.

    python experiments/generate.py --model=runs/sft --prompt="rev 408127="
    python experiments/generate.py --model=path/to/SmolLM2.gguf --chat \\
        --prompt="What is the capital of France?" --max_new_tokens=32
    python experiments/generate.py --model=exports/grpo --prompts_file=prompts.jsonl \\
        --temperature=0.7 --top_p=0.9 --batch_size=8 --jsonl

Prompts are --prompt strings (repeatable) or the `prompt` column of a JSONL file: a string, or a
list of chat messages ({"role": ..., "content": ...}), which are rendered through the
checkpoint's chat template with the assistant's header appended. --chat does the same to string
prompts, as one user message each. A plain string prompt starts with the tokenizer's BOS token, as
the training data do (jaxrl.data); a rendered chat prompt has whatever the template writes.

Decoding is greedy unless --temperature > 0 (then --top_k / --top_p filter the distribution),
batched --batch_size prompts at a time in one compiled program (KV cache, `jaxrl.lm.sampler`).
Each completion is printed (with --jsonl, one {"prompt", "completion"} object per line); the
generation rate in tokens/s goes to stderr.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from jaxrl import interrupts

interrupts.for_a_script()  # first: Ctrl-C during the imports below is one line too

import jax
import numpy as np
from absl import flags

from jaxrl import cli, extras, sharding
from jaxrl.config import ConfigError, fail
from jaxrl.lm import checkpoints, load_tokenizer
from jaxrl.lm.sampler import SamplingConfig, generate
from jaxrl.trainers import lm_runs

# A missing optional extra is one error line, before flags are parsed or anything compiles.
extras.require("lm", "experiments/generate.py")

_MODEL = flags.DEFINE_string("model", None, "A run directory, Hugging Face directory or .gguf.")
_PROMPT = flags.DEFINE_multi_string("prompt", [], "A prompt (repeat the flag for more).")
_PROMPTS_FILE = flags.DEFINE_string(
    "prompts_file", None, "JSONL file whose `prompt` is a string or a list of chat messages."
)
_CHAT = flags.DEFINE_bool("chat", False, "Render string prompts as a user message (chat template).")
_TOKENIZER = flags.DEFINE_string("tokenizer", None, "Tokenizer instead of the checkpoint's own.")
_MAX_NEW_TOKENS = flags.DEFINE_integer("max_new_tokens", 64, "Tokens to generate at most.")
_TEMPERATURE = flags.DEFINE_float("temperature", 0.0, "0 is greedy decoding.")
_TOP_K = flags.DEFINE_integer("top_k", 0, "Sample among the k most likely tokens (0: all).")
_TOP_P = flags.DEFINE_float("top_p", 1.0, "Nucleus sampling mass (1: off).")
_BATCH_SIZE = flags.DEFINE_integer("batch_size", 8, "Prompts decoded together.")
_SEED = flags.DEFINE_integer("seed", 0, "Sampling seed.")
_DTYPE = flags.DEFINE_enum(
    "dtype", "float32", ["float32", "bfloat16", "float16"], "Parameter and compute dtype."
)
_JSONL = flags.DEFINE_bool("jsonl", False, "Print one JSON object per completion.")


def read_prompts(path: str) -> list[Any]:
    """The `prompt` of every row of a JSONL file (a string or a list of chat messages)."""
    if not os.path.isfile(path):
        fail(f"--prompts_file={path}: no such file; pass a JSONL file with a prompt column")
    prompts = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = f"--prompts_file={path}: line {number}"
            try:
                row = json.loads(line)
            except ValueError as error:
                fail(f"{where}: not JSON ({error}); write one JSON object per line")
            prompt = row.get("prompt") if isinstance(row, dict) else None
            messages_ok = isinstance(prompt, list) and all(
                isinstance(m, dict) and isinstance(m.get("role"), str) and "content" in m
                for m in prompt
            )
            if not (isinstance(prompt, str) or (messages_ok and prompt)):
                fail(
                    f"{where}: `prompt` must be a string or a non-empty list of "
                    '{"role": ..., "content": ...} messages; fix that row'
                )
            prompts.append(prompt)
    if not prompts:
        fail(f'--prompts_file={path}: holds no rows; add lines like {{"prompt": "..."}}')
    return prompts


def prompt_ids(prompts: list[Any], tokenizer: Any) -> tuple[list[str], list[list[int]]]:
    """Each prompt's text as the model sees it and its token ids."""
    texts, ids = [], []
    for prompt in prompts:
        if isinstance(prompt, str) and not _CHAT.value:
            bos = [] if tokenizer.bos_id is None else [tokenizer.bos_id]
            texts.append(prompt)
            ids.append(bos + tokenizer.encode(prompt))
            continue
        messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
        render = getattr(tokenizer, "apply_chat_template", None)
        if render is None or getattr(tokenizer, "chat_template", None) is None:
            flag = "--chat" if isinstance(prompt, str) else "--prompts_file"
            fail(
                f"{flag}: chat messages need a chat template and the model's tokenizer has none "
                "(no chat_template in tokenizer_config.json); give plain string prompts without "
                "--chat, or a --tokenizer with a template"
            )
        try:
            text = render(messages, add_generation_prompt=True)
        except Exception as error:  # noqa: BLE001  a template's raise_exception, bad messages
            fail(f"chat template: {' '.join(str(error).split())}; fix the messages")
        texts.append(text)
        ids.append(tokenizer.encode(text))
    return texts, ids


def sampling_config(tokenizer: Any) -> SamplingConfig:
    """The decoding settings; top-k / top-p only mean something when sampling."""
    if _TEMPERATURE.value == 0 and (_TOP_K.value != 0 or _TOP_P.value != 1.0):
        flag = "--top_k" if _TOP_K.value != 0 else "--top_p"
        fail(f"{flag}: only applies when sampling; set --temperature > 0 (0 is greedy)")
    try:
        return SamplingConfig(
            max_new_tokens=_MAX_NEW_TOKENS.value,
            eos_id=tokenizer.eos_id,
            pad_id=tokenizer.pad_id,
            temperature=_TEMPERATURE.value,
            top_k=_TOP_K.value,
            top_p=_TOP_P.value,
        )
    except ConfigError as error:
        fail(f"--{error}")


def main(argv: list[str]) -> None:
    if not _MODEL.value:
        fail("--model: missing; pass a run directory, a Hugging Face directory or a .gguf")
    if _BATCH_SIZE.value < 1:
        fail(f"--batch_size: must be >= 1, got {_BATCH_SIZE.value}; pass 1 or more")
    if _PROMPT.value and _PROMPTS_FILE.value:
        fail("--prompt / --prompts_file: both given; pass prompts one way, not both")
    prompts = list(_PROMPT.value) or (
        read_prompts(_PROMPTS_FILE.value) if _PROMPTS_FILE.value else []
    )
    if not prompts:
        fail('--prompt: no prompts; pass --prompt="..." (repeatable) or --prompts_file')
    try:
        source = checkpoints.find_checkpoint(_MODEL.value)
    except (ConfigError, ValueError, OSError) as error:
        fail(f"--model: {error}")
    model = dataclasses.replace(source.model, dtype=_DTYPE.value, param_dtype=_DTYPE.value)
    name = _TOKENIZER.value or source.tokenizer
    if not name:
        fail(
            f"--model={_MODEL.value}: has no tokenizer.json; pass --tokenizer=<the tokenizer.json "
            "(or its directory) the model was trained with>"
        )
    try:
        tokenizer = load_tokenizer(name)
    except (ConfigError, ValueError, OSError) as error:
        fail(f"--tokenizer: {error}")
    checkpoints.check_vocabulary(tokenizer, model, source, "tokenizer")
    sampling = sampling_config(tokenizer)
    texts, ids = prompt_ids(prompts, tokenizer)
    prompt_length = max(len(row) for row in ids)
    if prompt_length + sampling.max_new_tokens > model.max_position_embeddings:
        fail(
            f"--max_new_tokens: the longest prompt ({prompt_length} tokens) + "
            f"{sampling.max_new_tokens} new ones exceed the model's max_position_embeddings="
            f"{model.max_position_embeddings}; shorten the prompts or lower --max_new_tokens"
        )

    mesh = lm_runs.make_mesh((1, 1, 1))
    params = checkpoints.load_params(source, model, mesh)
    batch = min(_BATCH_SIZE.value, len(ids))
    # Left-padded to one length, so that every batch runs the one compiled program.
    tokens = np.full((len(ids), prompt_length), tokenizer.pad_id, np.int32)
    mask = np.zeros((len(ids), prompt_length), bool)
    for row, prompt in enumerate(ids):
        tokens[row, prompt_length - len(prompt) :] = prompt
        mask[row, prompt_length - len(prompt) :] = True
    run = jax.jit(
        lambda p, t, m, k: generate(model, p, t, m, k, sampling, mesh),
        out_shardings=sharding.replicated(mesh),
    )
    key = jax.random.key(_SEED.value)
    start = time.perf_counter()
    compiled = run.lower(params, tokens[:batch], mask[:batch], key).compile()
    compile_seconds = time.perf_counter() - start

    start, generated, completions = time.perf_counter(), 0, []
    for first in range(0, len(ids), batch):
        index = np.arange(first, first + batch) % len(ids)  # the last batch wraps around
        key, sub = jax.random.split(key)
        out = jax.device_get(compiled(params, tokens[index], mask[index], sub))
        for row in range(min(batch, len(ids) - first)):
            generated += int(out.lengths[row])
            completions.append(tokenizer.decode(out.tokens[row][out.mask[row]]))
    seconds = time.perf_counter() - start

    for prompt, text, completion in zip(prompts, texts, completions, strict=True):
        if _JSONL.value:
            print(json.dumps({"prompt": prompt, "completion": completion}, ensure_ascii=False))
        else:
            print(f"### {text.strip()}\n{completion}\n")
    print(
        f"{len(completions)} completions, {generated} tokens in {seconds:.2f}s: "
        f"{generated / seconds:.1f} tokens/s (batch {batch}, {model.dtype}; compile "
        f"{compile_seconds:.1f}s) from {source.description}",
        file=sys.stderr,
    )


if __name__ == "__main__":
    cli.main(main)
