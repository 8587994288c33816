"""DPO training throughput on CPU: our `algos.dpo` against TRL's `DPOTrainer` and Tunix's, on the
peers' tiny random Llama (README.md)."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

# The repository root, for `algos`, `jaxrl` and the harness.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from experiments.benchmarks import harness  # noqa: E402

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


def make_dataset(seed: int) -> dict[str, Any]:
    """DATASET_ROWS random pairs in the layout `dpo.score_pairs` reads: prompt (32 word ids) +
    answer (31 word ids + EOS), attention on all 64 positions, the loss on the answer's 32."""
    import numpy as np

    rng = np.random.default_rng(seed)
    vocab = MODEL_SHAPE["vocab_size"]
    prompts = rng.integers(FIRST_WORD_ID, vocab, (DATASET_ROWS, PROMPT_LEN))
    eos = np.full((DATASET_ROWS, 1), EOS_ID)
    loss_mask = np.zeros((DATASET_ROWS, SEQ_LEN), bool)
    loss_mask[:, PROMPT_LEN:] = True
    arrays = {}
    for side in ("chosen", "rejected"):
        words = rng.integers(FIRST_WORD_ID, vocab, (DATASET_ROWS, COMPLETION_LEN - 1))
        arrays[f"{side}_tokens"] = np.concatenate([prompts, words, eos], axis=1).astype(np.int32)
        arrays[f"{side}_attention_mask"] = np.ones((DATASET_ROWS, SEQ_LEN), bool)
        arrays[f"{side}_loss_mask"] = loss_mask.copy()
    return arrays


def batch_drawer(arrays: dict[str, Any], seed: int) -> Callable[[int], dict[str, Any]]:
    """`draw(k)`: the next k batches of BATCH_PAIRS rows stacked [k, 1, BATCH_PAIRS, ...], each
    epoch a fresh permutation (as a shuffling data loader would)."""
    import numpy as np

    rng = np.random.default_rng(seed + 1)
    left = rng.permutation(DATASET_ROWS)  # this epoch's rows not drawn yet

    def draw(steps: int) -> dict[str, Any]:
        nonlocal left
        index = []
        for _ in range(steps):
            if len(left) < BATCH_PAIRS:
                left = rng.permutation(DATASET_ROWS)
            index.append(left[:BATCH_PAIRS])
            left = left[BATCH_PAIRS:]
        return {key: value[np.stack(index)][:, None] for key, value in arrays.items()}

    return draw


def build_step(params: dict[str, Any]) -> harness.Step:
    """Our side: one call is K optimizer steps, the batches drawn, stacked and put on the device
    on the host first, as a user's loop would, and the losses fetched after. The only place that
    calls into algos/jaxrl."""
    import jax
    import numpy as np

    # Importing jaxrl (algos does) sets its XLA_FLAGS; XLA reads them when the backend starts.
    from algos import dpo
    from jaxrl import hparams
    from jaxrl.lm import training
    from jaxrl.lm.model import ModelConfig, init_params

    reference, k, seed = params["reference"], params["K"], params["seed"]
    model = ModelConfig(**MODEL_SHAPE)
    config = dpo.Config(
        learning_rate=LEARNING_RATE,
        batch_size=BATCH_PAIRS,
        grad_accum_steps=1,
        num_steps=params["steps"],
        loss_type="sigmoid",
        beta=BETA,
        reference=reference,
    )
    weights = init_params(model, jax.random.key(seed))
    info: dict[str, Any] = {"params": sum(int(x.size) for x in jax.tree.leaves(weights))}
    algorithm, hp = dpo.make(config, model, weights), hparams.hparams(config)
    state = algorithm.init(jax.random.key(seed), hp)  # its own copy: `weights` stay the reference
    arrays, in_step = make_dataset(seed), weights
    if reference == "precomputed":  # one pass of the reference over the dataset, timed apart
        sample = {key: value[: params["ref_batch_size"]] for key, value in arrays.items()}
        score = jax.jit(dpo.make_score(model))
        score, info["ref_compile_s"] = harness.compile_timed(score, weights, sample)
        start = time.perf_counter()
        table = dpo.reference_log_probs(score, weights, arrays, params["ref_batch_size"])
        arrays, in_step = {**arrays, **table}, None
        info["ref_pass_s"] = time.perf_counter() - start

    chunk = jax.jit(training.make_batch_chunk(algorithm.update, k), donate_argnums=0)
    example = (jax.device_put(batch_drawer(arrays, seed)(k)), in_step)
    compiled, compile_s = harness.compile_timed(chunk, state, example, hp)
    del example
    draw, losses = batch_drawer(arrays, seed), []  # timing starts from the first batch again

    def call(state: Any, index: int) -> tuple[Any, dict[str, float]]:
        state, metrics = compiled(state, (jax.device_put(draw(k)), in_step), hp)
        jax.block_until_ready((state, metrics))
        losses.extend(float(x) for x in np.asarray(jax.device_get(metrics["loss"])))
        return state, {"pairs": k * BATCH_PAIRS, "tokens": k * BATCH_PAIRS * TOKENS_PER_PAIR}

    after = lambda state, result: {"loss_first": losses[0], "loss_last": losses[-1]}
    return harness.Step(call, state, k, compile_s, info, after)


def model_flops(in_step_reference: bool) -> float:
    """Model FLOPs of one step: forward FLOPs per token at the mean causal context of a 64-token
    sequence, over 2 x 8 x 64 tokens, times 4 with the reference in the step (policy forward +
    backward = 3 forwards, reference 1), times 3 with it precomputed."""
    from jaxrl.lm.model import ModelConfig

    per_token = ModelConfig(**MODEL_SHAPE).flops_per_token((SEQ_LEN + 1) / 2)
    return per_token * 2 * BATCH_PAIRS * SEQ_LEN * (4 if in_step_reference else 3)


def variants(args: argparse.Namespace) -> list[harness.Variant]:
    """TRL (and a TRL row with --trl_extra) and Tunix, then ours per reference mode and K."""
    flags = ["--batch_size", str(BATCH_PAIRS), "--prompt_len", str(PROMPT_LEN)]
    flags += ["--completion_len", str(COMPLETION_LEN)]
    rows = harness.lm_peer_rows(args, "dpo", {"trl": flags, "tunix": flags}, model_flops(True))
    for reference in args.reference:
        for k in args.steps_per_call:
            params = dict(reference=reference, K=k, seed=args.seed)
            params["ref_batch_size"] = args.ref_batch_size
            flops = model_flops(reference == "in_step")
            rows.append(
                harness.Variant("", f"ours {reference} K={k}", "ours", params, flops_per_step=flops)
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
    add("--ref_batch_size", type=harness.positive(int), default=64, help="ours: reference pass")


def note(args: argparse.Namespace) -> str:
    return (
        f"Model GFLOP/step {model_flops(True) / 1e9:.2f} with the reference in the step, "
        f"{model_flops(False) / 1e9:.2f} with it precomputed (its pass: ref_pass_s in the JSON)."
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
