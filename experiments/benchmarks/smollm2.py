"""What the LM drivers need to run on the project's real model, SmolLM2-135M-Instruct (README.md,
"SmolLM2 against TRL"): the Hugging Face directory both sides load, the token data both sides
train on, our side's model loading and the rows of our own TRL worker (`trl_worker.py`).

Standard library only at import time (the drivers import this module at their top); what needs
jaxrl imports it when called, in our environment (the driver's parent process and our workers).
"""

from __future__ import annotations

import argparse
import atexit
import json
import shlex
import shutil
import tempfile
from pathlib import Path
from typing import Any

from experiments.benchmarks import harness

TRL_WORKER = str(Path(__file__).resolve().parent / "trl_worker.py")
MODELS = ("tiny", "smollm2")

# Real English text, written for this benchmark, tokenised with SmolLM2's own tokenizer: the
# prompts and answers are windows of it. Plain prose, so that every window starts and ends on a
# word boundary and re-tokenises to the same ids (checked), whatever side tokenises it. The lines
# of a paragraph are joined with spaces (the wrapping below is only for this file).
_PARAGRAPHS = """\
The lighthouse at the end of the harbour was built more than a century ago, when the town still
lived from fishing and the boats went out every morning before dawn. Its keeper climbed the
spiral stairs twice a day to trim the wick, polish the lens and write the weather into a thick
book that is now kept in the small museum next to the post office. Visitors who read it today
are often surprised by how little changed from one year to the next: the same winds, the same
storms in late autumn, the same calm weeks in the middle of summer when the sea looked like
glass and the nets came back full.

When the railway reached the coast, the town began to change. Families from the cities came for
the clean air and the long beaches, and the old warehouses along the quay were turned into
hotels, shops and cafes. The fishermen sold part of their catch directly to the kitchens of
these new restaurants, and some of them gave up fishing altogether to take visitors on trips
around the bay. Children learned to swim in the shallow water behind the breakwater, and in the
evenings the promenade filled with people walking slowly, talking, and watching the light turn
on at the top of the tower.

A good loaf of bread needs only flour, water, salt and time. The baker mixes the dough in the
evening, leaves it to rest through the night in a cool room, and shapes it early in the
morning, long before the first customers arrive. During the slow rise the yeast and the
bacteria in the dough produce gas and acids that give the bread its open crumb and its slightly
sour taste. A hot oven with plenty of steam lets the loaf expand quickly in the first minutes,
and then the crust sets, darkens and starts to crackle as it cools on the rack.

Learning to play a musical instrument is mostly a matter of patience. Beginners often expect to
make progress every day, but improvement usually comes in sudden steps after long periods in
which nothing seems to happen. Teachers recommend short sessions of focused practice rather
than long hours of playing the same pieces again and again. Slowing a difficult passage down
until it can be played without mistakes, and then increasing the tempo a little at a time, is
still the most reliable method, even if it feels tedious at first.

The river that crosses the valley floods almost every spring, when the snow melts in the
mountains and the small streams that feed it swell within a few days. Farmers along its banks
have learned to live with the water: they plant late, they keep their animals on higher ground
until the end of April, and they build their barns on low stone walls. Over the years the
floods have left a thick layer of fine soil on the fields, which is the reason why the valley
produces more fruit and vegetables than any other part of the region.

In the library of the old school there is a long table by the window where students sit in the
afternoon to read and write. The shelves hold atlases, dictionaries, collections of poems and a
complete set of encyclopedias that nobody has opened for years. The librarian, who has worked
there for almost three decades, still writes every new book into a card catalogue by hand,
although the same information has long been available on the computer in the corner. She says
that writing the cards helps her remember where everything is, and most of the time she is
right.

Walking in the hills above the town takes a whole day if you follow the old path along the
ridge. It starts behind the church, climbs steeply through a forest of oak and chestnut trees,
and reaches open pasture after about two hours. From there the view opens on both sides: the sea
and the islands to the west, the mountains and the long green valley to the east. Shepherds
still bring their flocks up in the summer, and the small stone huts where they sleep are the
only buildings for miles around.
"""
TEXT = "\n\n".join(" ".join(paragraph.split()) for paragraph in _PARAGRAPHS.split("\n\n"))


# --------------------------------------------------------------------------------------------
# Parent side: flags, the Hugging Face directory, the data both sides read


def add_model_flags(parser: argparse.ArgumentParser, sizes: dict[str, int]) -> None:
    """--model and --smollm2_dir, shared by both LM drivers, and a flag per entry of the
    driver's SmolLM2 `sizes` (unset: that default)."""
    add = parser.add_argument
    for key, default in sizes.items():
        add(
            f"--{key}",
            type=harness.positive(int),
            default=None,
            help=f"smollm2 only; unset: {default}",
        )
    add(
        "--model",
        choices=MODELS,
        default="tiny",
        help="tiny: the peers' random 3.2M Llama (TRL/Tunix peer scripts); smollm2: the "
        "project's real model, SmolLM2-135M-Instruct, ours against our TRL worker",
    )
    add(
        "--smollm2_dir",
        default=None,
        help="smollm2: a Hugging Face directory of the model (default: gguf_to_hf of the "
        "installed GGUF, converted once and cached by jaxrl.lm.gguf.smollm2_hf_dir)",
    )


def hf_dir(args: argparse.Namespace) -> str:
    """The Hugging Face directory (config.json, model.safetensors, tokenizer.json) that both sides
    load: --smollm2_dir, or SmolLM2's GGUF written out by `gguf_to_hf` once into jaxrl's cache."""
    if args.smollm2_dir:
        return str(Path(args.smollm2_dir).resolve())
    from jaxrl.lm.gguf import smollm2_hf_dir

    return smollm2_hf_dir()


def model_config(directory: str) -> Any:
    """Our `ModelConfig` of the directory's config.json (fp32)."""
    from jaxrl.lm.hf import config_from_hf

    path = Path(directory) / "config.json"
    return config_from_hf(json.loads(path.read_text()), source=str(path))


def param_count(config: Any) -> int:
    """Parameters of our model for `config`, from shapes alone (a tied LM head counts once, as
    torch's `model.parameters()` counts it)."""
    import jax

    from jaxrl.lm.model import init_params

    shapes = jax.eval_shape(lambda: init_params(config, jax.random.key(0)))
    return sum(int(x.size) for x in jax.tree.leaves(shapes))


def scratch_dir() -> str:
    """A directory for this driver run's data files, removed when the driver exits."""
    path = tempfile.mkdtemp(prefix="jaxrl-bench-smollm2-")
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path


def word_windows(tokenizer: Any, length: int) -> list[list[int]]:
    """Every window of exactly `length` tokens of TEXT that starts at a word (its first token
    begins with a space or a line break), ends right before one, and decodes to text that
    re-tokenises to the same ids: text either side can tokenise back to identical ids."""
    ids = tokenizer.encode(TEXT)
    pieces = [tokenizer.decode([i]) for i in ids]  # TEXT is ASCII: every token decodes alone
    starts = [i for i, piece in enumerate(pieces) if piece[:1].isspace()]
    boundary = set(starts) | {len(ids)}
    windows = []
    for start in starts:
        window = ids[start : start + length]
        ends_at_word = len(window) == length and start + length in boundary
        if ends_at_word and tokenizer.encode(tokenizer.decode(window)) == window:
            windows.append(window)
    return windows


def write_dpo_data(
    directory: str, path: str, rows: int, prompt_len: int, completion_len: int, seed: int
) -> dict[str, Any]:
    """`rows` preference pairs of windows of TEXT: a `prompt_len`-token prompt and chosen and
    rejected answers of `completion_len - 1` tokens (EOS is appended by both sides, as TRL does),
    each prompt + answer checked to tokenise as the concatenation of their ids. Written to
    `path` as JSON with the texts (TRL's input) and ids (ours); returns the contents."""
    import numpy as np

    from jaxrl.lm.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(directory)
    prompts = word_windows(tokenizer, prompt_len)
    answers = word_windows(tokenizer, completion_len - 1)
    rng = np.random.default_rng(seed)
    data: dict[str, Any] = {"eos_id": tokenizer.eos_id, "pad_id": tokenizer.pad_id, "rows": []}
    for _ in range(100 * rows):  # a bounded number of tries
        if len(data["rows"]) == rows:
            break
        prompt = prompts[rng.integers(len(prompts))]
        chosen, rejected = (answers[i] for i in rng.choice(len(answers), 2, replace=False))
        row = {"prompt_ids": prompt, "chosen_ids": chosen, "rejected_ids": rejected}
        row.update({key[:-4]: tokenizer.decode(ids) for key, ids in list(row.items())})
        # TRL tokenises prompt + answer as one text: keep the pair only if that splits cleanly.
        if all(
            tokenizer.encode(row["prompt"] + row[side]) == prompt + row[f"{side}_ids"]
            for side in ("chosen", "rejected")
        ):
            data["rows"].append(row)
    if len(data["rows"]) < rows:
        raise SystemExit(f"could not make {rows} pairs of windows of TEXT that tokenise cleanly")
    Path(path).write_text(json.dumps(data))
    return data


def write_grpo_data(directory: str, path: str, rows: int, prompt_len: int) -> dict[str, Any]:
    """`rows` prompts of exactly `prompt_len` tokens (windows of TEXT, evenly spread over it),
    written to `path` as JSON with their texts (TRL's input) and ids (ours); returns it."""
    from jaxrl.lm.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(directory)
    windows = word_windows(tokenizer, prompt_len)
    if len(windows) < rows:
        raise SystemExit(f"TEXT has only {len(windows)} {prompt_len}-token prompts; ask for fewer")
    picked = [windows[i * len(windows) // rows] for i in range(rows)]
    data = {
        "eos_id": tokenizer.eos_id,
        "pad_id": tokenizer.pad_id,
        "rows": [{"prompt": tokenizer.decode(ids), "prompt_ids": ids} for ids in picked],
    }
    Path(path).write_text(json.dumps(data))
    return data


def trl_rows(
    args: argparse.Namespace,
    algorithm: str,
    flags: list[str],
    flops: float,
    expect: dict[str, Any],
    extra_flops: float | None = None,
) -> list[harness.Variant]:
    """Our TRL worker's rows (`trl_worker.py <algorithm>`) with --trl_python: TRL fp32, plus a
    row with --trl_extra, whose FLOPs per step are `extra_flops` where its flags change the work
    (DPO's --precompute_ref takes the reference's forward out of the step). Tunix cannot load a
    checkpoint in its peer script: no Tunix row."""
    if getattr(args, "tunix_python", None):
        harness.log(
            "tunix: its peer script builds a random model only; no row with --model smollm2"
        )
    if not args.trl_python:
        return []
    common = ["--steps", str(args.steps), "--warmup", str(args.warmup), "--seed", str(args.seed)]
    extras = [[]] + ([shlex.split(args.trl_extra)] if args.trl_extra else [])
    if getattr(args, "skip_trl_fp32", False):
        extras = extras[1:]
    return [
        harness.Variant(
            "",
            f"trl {' '.join(extra) or 'fp32'}",
            "trl",
            python=args.trl_python,
            script=TRL_WORKER,
            args=[algorithm, *common, *flags, *extra],
            flops_per_step=flops if not extra or extra_flops is None else extra_flops,
            expect=expect,
        )
        for extra in extras
    ]


# --------------------------------------------------------------------------------------------
# Our workers


def load_model(directory: str) -> tuple[Any, Any]:
    """(ModelConfig, fp32 parameters on the device) of the directory: the very weights TRL loads."""
    import jax

    from jaxrl.lm.hf import load_hf_checkpoint

    config, params = load_hf_checkpoint(directory, dtype="float32")
    return config, jax.device_put(params)


def read_data(path: str) -> dict[str, Any]:
    return json.loads(Path(path).read_text())
