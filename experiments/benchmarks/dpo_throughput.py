"""DPO training throughput on CPU: our `algos.dpo` against TRL's `DPOTrainer` and Tunix's, on the
peers' tiny random Llama, or (--model smollm2) against TRL on the project's real model,
SmolLM2-135M-Instruct, both sides loading the same checkpoint (README.md)."""

from __future__ import annotations

import argparse
import dataclasses
import shlex
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

# The repository root, for `algos`, `jaxrl` and the harness.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from experiments.benchmarks import harness, smollm2  # noqa: E402

MODEL_SHAPE = harness.MODEL_SHAPE
BATCH_PAIRS = 8
PROMPT_LEN = 32
COMPLETION_LEN = 32  # 31 words + EOS
SEQ_LEN = PROMPT_LEN + COMPLETION_LEN
TOKENS_PER_PAIR = PROMPT_LEN + 2 * COMPLETION_LEN  # counted like the peers: the prompt once
DATASET_ROWS = 512
BETA = 0.1
LEARNING_RATE = 1e-5
# Token ids as in the peer tokenizer: 0-3 are <pad> <eos> <bos> <unk>; words are drawn from 4-511.
EOS_ID = 1
FIRST_WORD_ID = 4
# --model smollm2: sizes for a 135M model on a 2-core CPU (flags override them); the pairs are
# windows of real text (smollm2.TEXT) in SmolLM2's tokenisation, answers of completion_len - 1
# tokens + EOS.
SMOLLM2_SIZES = dict(batch_pairs=4, prompt_len=32, completion_len=32, rows=64)


def sizes(params: dict[str, Any]) -> dict[str, int]:
    """A worker's batch and lengths: the tiny model's constants, or the smollm2 row's own."""
    if params.get("model", "tiny") == "tiny":
        return dict(
            batch_pairs=BATCH_PAIRS,
            prompt_len=PROMPT_LEN,
            completion_len=COMPLETION_LEN,
            rows=DATASET_ROWS,
        )
    return {key: params[key] for key in SMOLLM2_SIZES}


def pair_arrays(prompts: Any, chosen: Any, rejected: Any, eos_id: int) -> dict[str, Any]:
    """Pairs [R, P] prompt ids and [R, C - 1] answer ids, in the layout `dpo.score_pairs` reads:
    prompt + answer + EOS, attention on every position, the loss on the answer's C tokens."""
    import numpy as np

    rows, prompt_len = prompts.shape
    eos = np.full((rows, 1), eos_id)
    arrays = {}
    for side, words in (("chosen", chosen), ("rejected", rejected)):
        tokens = np.concatenate([prompts, words, eos], axis=1).astype(np.int32)
        loss_mask = np.zeros(tokens.shape, bool)
        loss_mask[:, prompt_len:] = True
        arrays[f"{side}_tokens"] = tokens
        arrays[f"{side}_attention_mask"] = np.ones(tokens.shape, bool)
        arrays[f"{side}_loss_mask"] = loss_mask
    return arrays


def make_dataset(seed: int) -> dict[str, Any]:
    """DATASET_ROWS random pairs in the layout `dpo.score_pairs` reads: prompt (32 word ids) +
    answer (31 word ids + EOS), attention on all 64 positions, the loss on the answer's 32."""
    import numpy as np

    rng = np.random.default_rng(seed)
    vocab = MODEL_SHAPE["vocab_size"]
    prompts = rng.integers(FIRST_WORD_ID, vocab, (DATASET_ROWS, PROMPT_LEN))
    chosen = rng.integers(FIRST_WORD_ID, vocab, (DATASET_ROWS, COMPLETION_LEN - 1))
    rejected = rng.integers(FIRST_WORD_ID, vocab, (DATASET_ROWS, COMPLETION_LEN - 1))
    return pair_arrays(prompts, chosen, rejected, EOS_ID)


def smollm2_arrays(path: str) -> dict[str, Any]:
    """The driver's SmolLM2 pairs (smollm2.write_dpo_data), the token ids TRL's tokenisation of
    the same texts gives (its worker checks), as arrays."""
    import numpy as np

    data = smollm2.read_data(path)
    ids = {
        key: np.array([row[key] for row in data["rows"]])
        for key in data["rows"][0]
        if key.endswith("_ids")
    }
    return pair_arrays(ids["prompt_ids"], ids["chosen_ids"], ids["rejected_ids"], data["eos_id"])


def batch_drawer(
    arrays: dict[str, Any], seed: int, batch: int = BATCH_PAIRS
) -> Callable[[int], dict[str, Any]]:
    """`draw(k)`: the next k batches of `batch` rows stacked [k, 1, batch, ...], each epoch a
    fresh permutation (as a shuffling data loader would)."""
    import numpy as np

    rows = len(arrays["chosen_tokens"])
    rng = np.random.default_rng(seed + 1)
    left = rng.permutation(rows)  # this epoch's rows not drawn yet

    def draw(steps: int) -> dict[str, Any]:
        nonlocal left
        index = []
        for _ in range(steps):
            if len(left) < batch:
                left = rng.permutation(rows)
            index.append(left[:batch])
            left = left[batch:]
        return {key: value[np.stack(index)][:, None] for key, value in arrays.items()}

    return draw


def build_step(params: dict[str, Any]) -> harness.Step:
    """Our side: one call is K optimizer steps, the batches drawn, stacked and put on the device
    on the host first, as a user's loop would, and the losses fetched after. The only place that
    calls into algos/jaxrl."""
    import jax
    import numpy as np

    # The user's XLA_FLAGS, as every side gets them: importing jaxrl (algos does) sets none.
    from algos import dpo
    from jaxrl import hparams
    from jaxrl.lm import training
    from jaxrl.lm.model import ModelConfig, init_params

    reference, k, seed = params["reference"], params["K"], params["seed"]
    size = sizes(params)
    info: dict[str, Any] = {"batch_pairs": size["batch_pairs"]}
    if params.get("model", "tiny") == "tiny":
        model = ModelConfig(**MODEL_SHAPE)
        weights = init_params(model, jax.random.key(seed))
        arrays = make_dataset(seed)
    else:  # the checkpoint TRL loads, in fp32, and the pairs its worker trains on
        start = time.perf_counter()
        model, weights = smollm2.load_model(params["hf_dir"])
        info["load_s"] = time.perf_counter() - start
        arrays = smollm2_arrays(params["data"])
    # --dtype / --remat / --attention: the compute dtype (over fp32 weights), what each layer
    # keeps, and the attention of the step's passes.
    model = dataclasses.replace(
        model,
        dtype=params.get("dtype", "float32"),
        remat=params.get("remat", "none"),
        attention=params.get("attention", "auto"),
    )
    config = dpo.Config(
        learning_rate=LEARNING_RATE,
        batch_size=size["batch_pairs"],
        grad_accum_steps=1,
        num_steps=params["steps"],
        loss_type="sigmoid",
        beta=BETA,
        reference=reference,
    )
    info["params"] = sum(int(x.size) for x in jax.tree.leaves(weights))
    # The head on the answers only, as experiments/dpo.py runs it (TRL's fused head skips the
    # prompt's positions too).
    window = training.scored_length(arrays["chosen_loss_mask"], arrays["rejected_loss_mask"])
    algorithm, hp = dpo.make(config, model, weights, scored_length=window), hparams.hparams(config)
    state = algorithm.init(jax.random.key(seed), hp)  # its own copy: `weights` stay the reference
    in_step = weights
    if reference == "precomputed":  # one pass of the reference over the dataset, timed apart
        # Batches of at most the dataset's rows: the pass pads a short last batch to its size.
        ref_batch = min(params["ref_batch_size"], len(next(iter(arrays.values()))))
        sample = {key: value[:ref_batch] for key, value in arrays.items()}
        score = jax.jit(dpo.make_score(model, scored_length=window))
        score, info["ref_compile_s"] = harness.compile_timed(score, weights, sample)
        start = time.perf_counter()
        table = dpo.reference_log_probs(score, weights, arrays, ref_batch)
        arrays, in_step = {**arrays, **table}, None
        info["ref_pass_s"] = time.perf_counter() - start

    chunk = jax.jit(training.make_batch_chunk(algorithm.update, k), donate_argnums=0)
    batch = size["batch_pairs"]
    example = (jax.device_put(batch_drawer(arrays, seed, batch)(k)), in_step)
    compiled, compile_s = harness.compile_timed(chunk, state, example, hp)
    del example
    draw, losses = batch_drawer(arrays, seed, batch), []  # timing starts from the first batch again
    pair_tokens = size["prompt_len"] + 2 * size["completion_len"]  # the prompt once, as the peers

    def call(state: Any, index: int) -> tuple[Any, dict[str, float]]:
        state, metrics = compiled(state, (jax.device_put(draw(k)), in_step), hp)
        jax.block_until_ready((state, metrics))
        losses.extend(float(x) for x in np.asarray(jax.device_get(metrics["loss"])))
        return state, {"pairs": k * batch, "tokens": k * batch * pair_tokens}

    after = lambda state, result: {"loss_first": losses[0], "loss_last": losses[-1]}
    return harness.Step(call, state, k, compile_s, info, after)


def model_flops(
    in_step_reference: bool,
    model: Any = None,
    batch: int = BATCH_PAIRS,
    seq_len: int = SEQ_LEN,
) -> float:
    """Model FLOPs of one step: forward FLOPs per token at the mean causal context of a
    `seq_len`-token sequence, over 2 x batch x seq_len tokens, times 4 with the reference in the
    step (policy forward + backward = 3 forwards, reference 1), times 3 with it precomputed.
    `model`: a ModelConfig (default the tiny one)."""
    from jaxrl.lm.model import ModelConfig

    model = ModelConfig(**MODEL_SHAPE) if model is None else model
    per_token = model.flops_per_token((seq_len + 1) / 2)
    return per_token * 2 * batch * seq_len * (4 if in_step_reference else 3)


def smollm2_setup(args: argparse.Namespace) -> dict[str, Any]:
    """--model smollm2: the sizes, the Hugging Face directory both sides load, the pairs written
    for both (a file in a directory removed at exit), our ModelConfig and its parameter count."""
    size = {key: getattr(args, key) or default for key, default in SMOLLM2_SIZES.items()}
    directory = smollm2.hf_dir(args)
    data = str(Path(smollm2.scratch_dir()) / "dpo_pairs.json")
    smollm2.write_dpo_data(
        directory, data, size["rows"], size["prompt_len"], size["completion_len"], args.seed
    )
    model = smollm2.model_config(directory)
    return dict(size, hf_dir=directory, data=data, config=model, params=smollm2.param_count(model))


def variants(args: argparse.Namespace) -> list[harness.Variant]:
    """TRL (and a TRL row with --trl_extra) and Tunix, then ours per reference mode and K; with
    --model smollm2, our TRL worker on the real model, then ours on it."""
    given = [key for key in SMOLLM2_SIZES if getattr(args, key) is not None]
    if args.model == "tiny" and given:
        raise SystemExit(f"--{', --'.join(given)}: only with --model smollm2")
    if args.model == "tiny":
        flags = ["--batch_size", str(BATCH_PAIRS), "--prompt_len", str(PROMPT_LEN)]
        flags += ["--completion_len", str(COMPLETION_LEN)]
        rows = harness.lm_peer_rows(args, "dpo", {"trl": flags, "tunix": flags}, model_flops(True))
        extra: dict[str, Any] = {}
        flops = {mode: model_flops(mode == "in_step") for mode in ("in_step", "precomputed")}
        expect: dict[str, Any] = {}
    else:
        setup = smollm2_setup(args)
        seq_len = setup["prompt_len"] + setup["completion_len"]
        flops = {
            mode: model_flops(mode == "in_step", setup["config"], setup["batch_pairs"], seq_len)
            for mode in ("in_step", "precomputed")
        }
        expect = {"params": setup["params"], "batch_pairs": setup["batch_pairs"]}
        flags = ["--model_dir", setup["hf_dir"], "--data", setup["data"]]
        flags += ["--batch_size", str(setup["batch_pairs"]), "--beta", str(BETA)]
        flags += ["--lr", str(LEARNING_RATE)]
        trl_expect = {**expect, "ids_match_fraction": 1.0}  # TRL tokenised the texts to our ids
        precomputing = "--precompute_ref" in shlex.split(args.trl_extra or "")
        rows = smollm2.trl_rows(
            args,
            "dpo",
            flags,
            flops["in_step"],
            trl_expect,
            extra_flops=flops["precomputed"] if precomputing else None,
        )
        extra = {key: setup[key] for key in ("hf_dir", "data", *SMOLLM2_SIZES)}
        extra["model"] = "smollm2"
    for reference in args.reference:
        for k in args.steps_per_call:
            params = dict(reference=reference, K=k, seed=args.seed, **extra)
            params.update(dtype=args.dtype, remat=args.remat, attention=args.attention)
            # The reference pass's logits are [2 x batch, 64, vocab] fp32: 400 MB for SmolLM2 at 16.
            params["ref_batch_size"] = args.ref_batch_size or (64 if args.model == "tiny" else 16)
            label, flops_per_step = f"ours {reference} K={k}", flops[reference]
            rows.append(
                harness.Variant(
                    "", label, "ours", params, flops_per_step=flops_per_step, expect=expect
                )
            )
    return rows


def add_flags(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    harness.add_lm_flags(parser)
    add(
        "--reference",
        type=harness.comma_list(str, ("in_step", "precomputed")),
        default="in_step,precomputed",
        help="ours: reference modes, a row each (empty: peers only)",
    )
    add(
        "--ref_batch_size",
        type=harness.positive(int),
        default=None,
        help="ours: pairs per batch of the reference pass (default 64; smollm2 16)",
    )
    smollm2.add_model_flags(parser, SMOLLM2_SIZES)


def note(args: argparse.Namespace) -> str:
    if args.model == "tiny":
        in_step, precomputed = model_flops(True), model_flops(False)
        what = ""
    else:
        model = smollm2.model_config(smollm2.hf_dir(args))
        size = {key: getattr(args, key) or default for key, default in SMOLLM2_SIZES.items()}
        seq_len = size["prompt_len"] + size["completion_len"]
        in_step = model_flops(True, model, size["batch_pairs"], seq_len)
        precomputed = model_flops(False, model, size["batch_pairs"], seq_len)
        what = (
            f"SmolLM2-135M-Instruct (fp32, both sides from the same checkpoint), "
            f"{size['batch_pairs']} pairs/step of {size['prompt_len']}-token prompts and "
            f"{size['completion_len']}-token answers (EOS included). "
        )
    return what + (
        f"Model GFLOP/step {in_step / 1e9:.2f} with the reference in the step, "
        f"{precomputed / 1e9:.2f} with it precomputed (its pass: ref_pass_s in the JSON)."
    )


WORKLOAD = harness.Workload(
    module=globals(),
    builders={"ours": build_step},
    variants=variants,
    columns=[
        harness.Column("pairs/s", "pairs_per_s", ".1f"),
        harness.Column("ms/step", "steady_s_per_step", ".1f", 1e3),
        harness.Column("tokens/s", "tokens_per_s", ",.0f"),
        harness.Column("ref pass s", "ref_pass_s", ".2f"),
        harness.Column("loss first", "loss_first", ".4f"),
        harness.Column("loss last", "loss_last", ".4f"),
    ],
    peers=harness.LM_PEERS,
    defaults=dict(steps=20, warmup=2, repeats=3, timeout=900.0, steps_help="optimizer steps"),
    add_flags=add_flags,
    note=note,
    expect={"params": harness.EXPECTED_PARAMS},
)

if __name__ == "__main__":
    harness.main(WORKLOAD)
