"""Reward-model training throughput on CPU: our `algos.reward_model` against TRL's
`RewardTrainer` on the project's real model, SmolLM2-135M-Instruct, both sides loading the same
Hugging Face checkpoint and training on the same token ids (README.md).

    python experiments/benchmarks/reward_model_throughput.py --model smollm2 --repeats 2

The pairs are dpo_throughput.py's (windows of real text: a prompt, a chosen and a rejected
answer); both sides score prompt + answer + EOS with a new linear head on the last token and
take AdamW steps on the Bradley-Terry loss.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from experiments.benchmarks import dpo_throughput, harness, smollm2  # noqa: E402

LEARNING_RATE = 1e-5
SMOLLM2_SIZES = dict(batch_pairs=4, prompt_len=32, completion_len=32, rows=64)


def build_step(params: dict[str, Any]) -> harness.Step:
    """Our side: one call is K optimizer steps on host-drawn batches, as a user's loop would."""
    import jax
    import numpy as np

    from algos import reward_model
    from jaxrl import hparams, loop

    k, seed, batch = params["K"], params["seed"], params["batch_pairs"]
    start = time.perf_counter()
    model, weights = smollm2.load_model(params["hf_dir"])
    info: dict[str, Any] = {"load_s": time.perf_counter() - start, "batch_pairs": batch}
    # --dtype / --remat / --attention (harness.add_lm_flags): how our model runs.
    runtime = {name: params[name] for name in ("dtype", "remat", "attention") if name in params}
    model = dataclasses.replace(model, **runtime)
    arrays = dpo_throughput.smollm2_arrays(params["data"])
    arrays = {key: value for key, value in arrays.items() if "loss_mask" not in key}
    config = reward_model.Config(
        learning_rate=LEARNING_RATE, batch_size=batch, num_steps=params["steps"]
    )
    weights = reward_model.init_params(weights, model, jax.random.key(seed))
    info["params"] = sum(int(x.size) for x in jax.tree.leaves(weights))
    algorithm, hp = reward_model.make(config, model, weights), hparams.hparams(config)
    state = algorithm.init(jax.random.key(seed), hp)
    chunk = loop.make_chunk(algorithm.update, k, runs_axis=False, scan_inputs=True)
    chunk = jax.jit(chunk, donate_argnums=0)
    draw = dpo_throughput.batch_drawer(arrays, seed, batch)
    compiled, compile_s = harness.compile_timed(chunk, state, jax.device_put(draw(k)), hp)
    draw, losses = dpo_throughput.batch_drawer(arrays, seed, batch), []
    pair_tokens = 2 * (params["prompt_len"] + params["completion_len"])  # both sequences

    def call(state: Any, index: int) -> tuple[Any, dict[str, float]]:
        state, metrics = compiled(state, jax.device_put(draw(k)), hp)
        jax.block_until_ready((state, metrics))
        losses.extend(float(x) for x in np.asarray(jax.device_get(metrics["loss"])))
        return state, {"pairs": k * batch, "tokens": k * batch * pair_tokens}

    after = lambda state, result: {"loss_first": losses[0], "loss_last": losses[-1]}
    return harness.Step(call, state, k, compile_s, info, after)


def model_flops(model: Any, batch: int, seq_len: int) -> float:
    """Model FLOPs of one step: forward FLOPs per token at the mean causal context, over the
    2 x batch sequences of seq_len tokens, times 3 (forward and backward). The head is a
    hidden-size dot product: nothing next to the transformer's layers; the LM head's FLOPs,
    which `flops_per_token` counts, are taken out."""
    per_token = model.flops_per_token((seq_len + 1) / 2) - 2 * model.hidden_size * model.vocab_size
    return per_token * 2 * batch * seq_len * 3


def variants(args: argparse.Namespace) -> list[harness.Variant]:
    """Our TRL worker's RewardTrainer row, then ours per K."""
    if args.model != "smollm2":
        raise SystemExit("--model smollm2: the reward-model comparison runs on the real model")
    size = {key: getattr(args, key) or default for key, default in SMOLLM2_SIZES.items()}
    directory = smollm2.hf_dir(args)
    data = str(Path(smollm2.scratch_dir()) / "pairs.json")
    smollm2.write_dpo_data(
        directory, data, size["rows"], size["prompt_len"], size["completion_len"], args.seed
    )
    model = smollm2.model_config(directory)
    flops = model_flops(model, size["batch_pairs"], size["prompt_len"] + size["completion_len"])
    flags = ["--model_dir", directory, "--data", data, "--batch_size", str(size["batch_pairs"])]
    flags += ["--lr", str(LEARNING_RATE)]
    expect = {"batch_pairs": size["batch_pairs"]}
    rows = smollm2.trl_rows(args, "reward", flags, flops, expect)
    for k in args.steps_per_call:
        params = dict(K=k, seed=args.seed, hf_dir=directory, data=data, **size)
        params.update(dtype=args.dtype, remat=args.remat, attention=args.attention)
        rows.append(
            harness.Variant("", f"ours K={k}", "ours", params, flops_per_step=flops, expect=expect)
        )
    return rows


def add_flags(parser: argparse.ArgumentParser) -> None:
    harness.add_lm_flags(parser)
    smollm2.add_model_flags(parser, SMOLLM2_SIZES)


def note(args: argparse.Namespace) -> str:
    size = {key: getattr(args, key) or default for key, default in SMOLLM2_SIZES.items()}
    model = smollm2.model_config(smollm2.hf_dir(args))
    flops = model_flops(model, size["batch_pairs"], size["prompt_len"] + size["completion_len"])
    return (
        f"SmolLM2-135M-Instruct (fp32, both sides from the same checkpoint), "
        f"{size['batch_pairs']} pairs/step of {size['prompt_len']}-token prompts and "
        f"{size['completion_len']}-token answers (EOS included); tokens count both sequences. "
        f"Model GFLOP/step {flops / 1e9:.2f}."
    )


WORKLOAD = harness.Workload(
    module=globals(),
    builders={"ours": build_step},
    variants=variants,
    columns=[
        harness.Column("pairs/s", "pairs_per_s", ".1f"),
        harness.Column("ms/step", "steady_s_per_step", ".1f", 1e3),
        harness.Column("tokens/s", "tokens_per_s", ",.0f"),
        harness.Column("loss first", "loss_first", ".4f"),
        harness.Column("loss last", "loss_last", ".4f"),
    ],
    peers=harness.LM_PEERS,
    defaults=dict(steps=12, warmup=2, repeats=2, timeout=900.0, steps_help="optimizer steps"),
    add_flags=add_flags,
    note=note,
)

if __name__ == "__main__":
    harness.main(WORKLOAD)
