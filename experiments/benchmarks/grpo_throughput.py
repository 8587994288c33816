"""GRPO training throughput on CPU: our `algos.grpo` against TRL's `GRPOTrainer` and Tunix's, on
the peers' tiny random Llama and digit-reversal task, or (--model smollm2) against TRL on the
project's real model, SmolLM2-135M-Instruct, both sides loading the same checkpoint (README.md)."""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
from pathlib import Path
from typing import Any

# The repository root, for `algos`, `envs`, `jaxrl` and the harness.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from experiments.benchmarks import harness, smollm2  # noqa: E402

MODEL_SHAPE = dict(harness.MODEL_SHAPE, head_dim=64)
PROMPTS_PER_UPDATE = 4
GROUP_SIZE = 8
COMPLETIONS_PER_UPDATE = PROMPTS_PER_UPDATE * GROUP_SIZE
MAX_NEW_TOKENS = 16
TEMPERATURE = 1.0
LEARNING_RATE = 1e-5
KL_BETA = 0.0
# Token ids of the peer tokenizer (bench_common.build_tokenizer).
PAD_ID, EOS_ID = 0, 1
NUM_SPECIAL = 4  # <pad> <eos> <bos> <unk>: dropped by decode(skip_special_tokens=True)
DIGIT_0_ID, REV_ID, EQUALS_ID = 4, 14, 15
MIN_DIGITS, MAX_DIGITS = 3, 4
PROMPT_WIDTH = MAX_DIGITS + 2  # rev d1 .. d4 =
MEAN_PROMPT_TOKENS = (MIN_DIGITS + MAX_DIGITS) / 2 + 2  # of the nominal sequence FLOPs count
# --model smollm2: sizes for a 135M model on a 2-core CPU (flags override them). Prompts are
# windows of real text (smollm2.TEXT) of exactly prompt_len tokens in SmolLM2's tokenisation,
# drawn from `rows` of them; the reward is the fraction of even token ids in a completion (a
# function of the ids both sides compute the same way); no EOS ends a completion early.
SMOLLM2_SIZES = dict(prompts_per_update=2, group_size=8, prompt_len=32, max_new_tokens=16, rows=64)


def sample_prompts(key: Any, n: int, data: Any = None) -> Any:
    """n prompts `rev d1 d2 d3 [d4] =` as an `envs.text.PromptBatch`: 3 or 4 uniform digits
    (equally likely), left-padded to PROMPT_WIDTH tokens; the answer is the digits reversed."""
    import jax
    import jax.numpy as jnp

    from envs.text import PromptBatch

    length_key, digit_key = jax.random.split(key)
    num_digits = MIN_DIGITS + jax.random.bernoulli(length_key, 0.5, (n,)).astype(jnp.int32)
    digit_ids = DIGIT_0_ID + jax.random.randint(digit_key, (n, MAX_DIGITS), 0, 10, jnp.int32)

    column = jnp.arange(PROMPT_WIDTH)[None, :]
    start = (MAX_DIGITS - num_digits)[:, None]  # the column of `rev`: 1 for 3 digits, else 0
    which_digit = jnp.clip(column - start - 1, 0, MAX_DIGITS - 1)
    tokens = jnp.where(column == PROMPT_WIDTH - 1, EQUALS_ID, 0)
    tokens = jnp.where(column == start, REV_ID, tokens)
    in_digits = (column > start) & (column < PROMPT_WIDTH - 1)
    tokens = jnp.where(in_digits, jnp.take_along_axis(digit_ids, which_digit, axis=1), tokens)
    mask = column >= start
    tokens = jnp.where(mask, tokens, PAD_ID).astype(jnp.int32)

    answer_column = jnp.arange(MAX_DIGITS)[None, :]
    reversed_index = jnp.clip(num_digits[:, None] - 1 - answer_column, 0, MAX_DIGITS - 1)
    answer = jnp.take_along_axis(digit_ids, reversed_index, axis=1)
    answer = jnp.where(answer_column < num_digits[:, None], answer, PAD_ID).astype(jnp.int32)
    return PromptBatch(tokens=tokens, mask=mask, answer_tokens=answer, answer_length=num_digits)


def reverse_reward(prompts: Any, completion: Any) -> Any:
    """The peer's reward in token ids: the fraction of the first len(digits) completion words
    that equal the reversed digits, where the words are the completion's tokens up to and
    including EOS without the special tokens (TRL decodes with skip_special_tokens=True)."""
    import jax.numpy as jnp

    words = completion.mask & (completion.tokens >= NUM_SPECIAL)
    word_index = jnp.cumsum(words, axis=1) - 1
    answer_width = prompts.answer_tokens.shape[1]
    target = jnp.take_along_axis(
        prompts.answer_tokens, jnp.clip(word_index, 0, answer_width - 1), axis=1
    )
    counted = words & (word_index < prompts.answer_length[:, None])
    hits = jnp.sum(counted & (completion.tokens == target), axis=1)
    return hits / prompts.answer_length


def prompt_token_count(prompts: Any, completion: Any) -> Any:
    """Each sequence's real prompt tokens, reported through a reward term of weight 0."""
    return prompts.mask.sum(axis=1).astype("float32")


def table_prompts(table: Any) -> Any:
    """A prompt sampler over a fixed [R, P] table of token ids (every prompt P real tokens):
    n distinct rows per update, uniformly, as TRL's shuffling sampler draws its dataset rows."""
    import jax
    import jax.numpy as jnp

    from envs.text import PromptBatch

    table = jnp.asarray(table, jnp.int32)

    def sample(key: Any, n: int, data: Any = None) -> Any:
        rows = jax.random.choice(key, table.shape[0], (n,), replace=False)
        tokens = table[rows]
        no_answer = jnp.zeros((n, 1), jnp.int32)  # the reward reads no answer
        return PromptBatch(tokens, jnp.ones(tokens.shape, bool), no_answer, jnp.ones(n, jnp.int32))

    return sample


def even_token_reward(prompts: Any, completion: Any) -> Any:
    """The fraction of a completion's tokens whose id is even (TRL's worker: the same over its
    returned completion ids)."""
    import jax.numpy as jnp

    even = completion.mask & (completion.tokens % 2 == 0)
    return even.sum(axis=1) / jnp.maximum(completion.mask.sum(axis=1), 1)


def build_step(params: dict[str, Any]) -> harness.Step:
    """Our side: one call is K updates (prompt sampling, KV-cache generation, reward, advantages,
    optimizer step) in one program, the metrics fetched after. Afterwards the rollout alone is
    jitted and timed, for its share of an update. The only place that calls into algos/jaxrl."""
    import jax
    import numpy as np

    # The user's XLA_FLAGS, as every side gets them: importing jaxrl (algos does) sets none.
    from algos import grpo
    from envs.text import RewardTerm, TextTask
    from jaxrl import hparams, loop
    from jaxrl.lm.model import ModelConfig, init_params
    from jaxrl.lm.sampler import Sampling

    k, seed = params["K"], params["seed"]
    calls = sum(harness.call_counts(params["steps"], params["warmup"], k))
    size = sizes(params)
    completions_per_update = size["prompts_per_update"] * size["group_size"]
    info: dict[str, Any] = {"completions_per_step": completions_per_update}
    if params.get("model", "tiny") == "tiny":
        model = ModelConfig(**MODEL_SHAPE)
        weights = init_params(model, jax.random.key(seed))
        terms = (RewardTerm("reverse", 1.0, reverse_reward),)
        task = TextTask("reverse_digits", sample_prompts, terms, EOS_ID, PAD_ID)
    else:  # the checkpoint TRL loads, in fp32, and the prompts its worker samples
        start = time.perf_counter()
        model, weights = smollm2.load_model(params["hf_dir"])
        info["load_s"] = time.perf_counter() - start
        data = smollm2.read_data(params["data"])
        table = [row["prompt_ids"] for row in data["rows"]]
        terms = (RewardTerm("even_tokens", 1.0, even_token_reward),)
        # EOS id -1, a token no sample is: every completion runs max_new_tokens (TRL's worker
        # sets min_new_tokens to the same), so both sides generate and train on the same count.
        task = TextTask("text_windows", table_prompts(table), terms, -1, data["pad_id"])
    # --dtype / --remat / --attention / --decode_unroll: the compute dtype (over fp32 weights),
    # what each layer keeps, the attention of the update's passes, the decode step's layer scan.
    model = dataclasses.replace(
        model,
        dtype=params["dtype"],
        remat=params["remat"],
        attention=params.get("attention", "auto"),
        decode_unroll=params.get("decode_unroll", 0),
    )
    # Each sequence's real prompt tokens, reported through a reward term of weight 0.
    task = task.with_reward(RewardTerm("prompt_tokens", 0.0, prompt_token_count))
    config = grpo.Config(
        batch_size=size["prompts_per_update"],
        group_size=size["group_size"],
        sampling=Sampling(max_new_tokens=size["max_new_tokens"], temperature=TEMPERATURE),
        learning_rate=LEARNING_RATE,
        kl_beta=KL_BETA,
        num_steps=calls * k,
        variant=params["variant"],
    )
    info["params"] = sum(int(x.size) for x in jax.tree.leaves(weights))
    algorithm, hp = grpo.make(config, model, task, weights), hparams.hparams(config)
    state = algorithm.init(jax.random.key(seed), hp)
    chunk = loop.make_chunk(algorithm.update, k, runs_axis=False)  # no reference model: None
    compiled, compile_s = harness.compile_timed(jax.jit(chunk, donate_argnums=0), state, None, hp)
    history: list[dict[str, float]] = []

    def call(state: Any, index: int) -> tuple[Any, dict[str, float]]:
        state, metrics = compiled(state, None, hp)
        metrics = jax.device_get(jax.block_until_ready((state, metrics))[1])
        steps = [{name: float(np.asarray(v)[i]) for name, v in metrics.items()} for i in range(k)]
        history.extend(steps)
        # Per-update means over the update's sequences, back to exact token counts.
        generated = sum(round(s["completion_length"] * completions_per_update) for s in steps)
        prompt = sum(round(s["reward_prompt_tokens"] * completions_per_update) for s in steps)
        counts = {"completions": k * completions_per_update, "gen_tokens": generated}
        return state, {**counts, "prompt_tokens": prompt, "total_tokens": generated + prompt}

    def after(state: Any, result: dict[str, Any]) -> dict[str, Any]:
        completions = result["timed_completions"]
        more = {"reward_first": history[0]["reward"], "reward_last": history[-1]["reward"]}
        more["mean_completion_len"] = result["timed_gen_tokens"] / completions
        more["mean_prompt_len"] = result["timed_prompt_tokens"] / completions
        if params["rollout_trials"]:
            rollout = jax.jit(grpo.make_rollout(config, model, task))
            key = jax.random.key(seed + 1)
            rollout, more["rollout_compile_s"] = harness.compile_timed(
                rollout, state.params, key, hp
            )
            keys = [jax.random.fold_in(key, trial) for trial in range(params["rollout_trials"] + 1)]
            jax.block_until_ready(rollout(state.params, keys[-1], hp))  # one untimed call
            seconds = []
            for key in keys[:-1]:
                begin = time.perf_counter()
                jax.device_get(jax.block_until_ready(rollout(state.params, key, hp))[1])
                seconds.append(time.perf_counter() - begin)
            more["rollout_s"] = statistics.median(seconds)
            more["rollout_share_of_step"] = more["rollout_s"] / result["steady_s_per_step"]
        return more

    return harness.Step(call, state, k, compile_s, info, after)


def sizes(params: dict[str, Any]) -> dict[str, int]:
    """A worker's (or the driver's, from its flags) batch and lengths: the tiny model's
    constants, or the smollm2 ones."""
    if params.get("model", "tiny") == "tiny":
        return dict(
            prompts_per_update=PROMPTS_PER_UPDATE,
            group_size=GROUP_SIZE,
            max_new_tokens=MAX_NEW_TOKENS,
        )
    return {key: params.get(key) or default for key, default in SMOLLM2_SIZES.items()}


def model_flops(
    model: Any = None,
    prompt_tokens: float = MEAN_PROMPT_TOKENS,
    new_tokens: int = MAX_NEW_TOKENS,
    completions: int = COMPLETIONS_PER_UPDATE,
) -> dict[str, float]:
    """Model FLOPs of one update (README.md): KV-cache generation of a (nominal) prompt of
    `prompt_tokens` and `new_tokens` tokens, then forward + backward over both, for every
    completion. `model`: a ModelConfig (default the tiny one)."""
    from jaxrl.lm.model import ModelConfig

    f = (ModelConfig(**MODEL_SHAPE) if model is None else model).flops_per_token
    p, n = prompt_tokens, new_tokens
    generation = (p * f((p + 1) / 2) + (n - 1) * f(p + n / 2)) * completions
    training = 3 * (p + n) * f((p + n + 1) / 2) * completions
    return {"generation": generation, "training": training, "total": generation + training}


def smollm2_flops(args: argparse.Namespace) -> dict[str, float]:
    """model_flops for --model smollm2 at the driver's sizes: every prompt is prompt_len tokens."""
    size = sizes(vars(args))
    model = smollm2.model_config(smollm2.hf_dir(args))
    completions = size["prompts_per_update"] * size["group_size"]
    return model_flops(model, size["prompt_len"], size["max_new_tokens"], completions)


# TRL's loss_type for our variant: the same aggregation (TRL has no RLOO loss; its default then).
TRL_LOSS_TYPES = {"grpo": "grpo", "dr_grpo": "dr_grpo", "dapo": "dapo", "rloo": "dapo"}


def variants(args: argparse.Namespace) -> list[harness.Variant]:
    """TRL (and a TRL row with --trl_extra) and Tunix, then ours per K; with --model smollm2,
    our TRL worker on the real model, then ours on it."""
    given = [key for key in SMOLLM2_SIZES if getattr(args, key) is not None]
    if args.model == "tiny" and given:
        raise SystemExit(f"--{', --'.join(given)}: only with --model smollm2")
    if args.model == "tiny":
        shared = ["--num_generations", str(GROUP_SIZE)]
        shared += ["--max_completion_length", str(MAX_NEW_TOKENS)]
        shared += ["--beta", str(KL_BETA), "--lr", str(LEARNING_RATE)]
        flags = {
            "trl": ["--batch_size", str(COMPLETIONS_PER_UPDATE), *shared],
            "tunix": ["--prompts_per_step", str(PROMPTS_PER_UPDATE), *shared],
        }
        flops = model_flops()["total"]
        rows = harness.lm_peer_rows(args, "grpo", flags, flops)
        extra: dict[str, Any] = {}
        expect: dict[str, Any] = {}
    else:
        size = sizes(vars(args))
        directory = smollm2.hf_dir(args)
        data = str(Path(smollm2.scratch_dir()) / "grpo_prompts.json")
        smollm2.write_grpo_data(directory, data, size["rows"], size["prompt_len"])
        flops = smollm2_flops(args)["total"]
        completions = size["prompts_per_update"] * size["group_size"]
        expect = {"params": smollm2.param_count(smollm2.model_config(directory))}
        expect["completions_per_step"] = completions
        flags = ["--model_dir", directory, "--data", data, "--batch_size", str(completions)]
        flags += ["--num_generations", str(size["group_size"])]
        flags += ["--max_completion_length", str(size["max_new_tokens"])]
        flags += ["--temperature", str(TEMPERATURE), "--beta", str(KL_BETA)]
        flags += ["--lr", str(LEARNING_RATE), "--loss_type", TRL_LOSS_TYPES[args.variant]]
        trl_expect = {**expect, "ids_match_fraction": 1.0}  # TRL tokenised the texts to our ids
        rows = smollm2.trl_rows(args, "grpo", flags, flops, trl_expect)
        extra = dict(size, model="smollm2", hf_dir=directory, data=data)
    for k in args.steps_per_call:
        params = dict(K=k, seed=args.seed, variant=args.variant, **extra)
        params.update(dtype=args.dtype, remat=args.remat, attention=args.attention)
        params["decode_unroll"] = args.decode_unroll
        params["rollout_trials"] = args.rollout_trials
        label = f"ours {args.variant} K={k}"
        rows.append(harness.Variant("", label, "ours", params, flops_per_step=flops, expect=expect))
    return rows


def add_flags(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    harness.add_lm_flags(parser)
    add(
        "--variant",
        default="grpo",
        choices=("grpo", "dr_grpo", "dapo", "rloo"),
        help="ours: algos.grpo variant (TRL's default loss_type is dapo; same compute)",
    )
    add("--rollout_trials", type=int, default=5, help="ours: timed rollout calls (0: skip)")
    add(
        "--decode_unroll",
        type=int,
        default=0,
        help="ours: ModelConfig.decode_unroll (0: auto, the step unrolled on a GPU; 1: scan)",
    )
    smollm2.add_model_flags(parser, SMOLLM2_SIZES)


def note(args: argparse.Namespace) -> str:
    size = sizes(vars(args))
    prompts, group, new = size["prompts_per_update"], size["group_size"], size["max_new_tokens"]
    if args.model == "tiny":
        flops = {key: value / 1e9 for key, value in model_flops().items()}
        what = ""
    else:
        flops = {key: value / 1e9 for key, value in smollm2_flops(args).items()}
        what = (
            f"SmolLM2-135M-Instruct (fp32, both sides from the same checkpoint), prompts of "
            f"{size['prompt_len']} tokens, every completion exactly {new} tokens (no EOS). "
        )
    return what + (
        f"A step is an update of {prompts * group} completions ({prompts} "
        f"prompts x {group}) of at most {new} tokens; model GFLOP/update "
        f"{flops['total']:.2f} (generation {flops['generation']:.2f}, training "
        f"{flops['training']:.2f}). rollout %: share of an update spent generating (TRL: its "
        f"timed _generate; ours: the rollout jitted alone, median of {args.rollout_trials})."
    )


WORKLOAD = harness.Workload(
    module=globals(),
    builders={"ours": build_step},
    variants=variants,
    columns=[
        harness.Column("completions/s", "completions_per_s", ".2f"),
        harness.Column("s/update", "steady_s_per_step", ".3f"),
        harness.Column("median s/update", "median_step_s", ".3f"),
        harness.Column("gen tok/s", "gen_tokens_per_s", ",.0f"),
        harness.Column("total tok/s", "total_tokens_per_s", ",.0f"),
        harness.Column("mean gen len", "mean_completion_len", ".2f"),
        harness.Column("rollout %", "rollout_share_of_step", ".0f", 100),
        harness.Column("reward first", "reward_first", ".3f"),
        harness.Column("reward last", "reward_last", ".3f"),
    ],
    peers=harness.LM_PEERS,
    defaults=dict(steps=10, warmup=2, repeats=3, timeout=900.0, steps_help="updates per worker"),
    add_flags=add_flags,
    note=note,
    expect={"params": harness.EXPECTED_PARAMS},
)

if __name__ == "__main__":
    harness.main(WORKLOAD)
