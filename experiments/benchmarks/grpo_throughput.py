"""GRPO training throughput on CPU: our `algos.grpo` against TRL's `GRPOTrainer`, side by side.

Both sides train the same tiny random Llama (vocab 512, hidden 256, MLP 688, 4 layers, 4 query
heads of 64, 2 kv heads, untied LM head: 3,164,416 parameters) in fp32 on the peers' toy task:
the prompt is `rev d1 d2 d3 [d4] =` (3 or 4 uniform random digits, equally likely), the reward is
the fraction of the first len(digits) completion words that equal the digits reversed. Every
update samples 4 prompts x 8 completions = 32, at most 16 new tokens, temperature 1 (no top-k or
top-p), scores them, and takes one AdamW step (lr 1e-5, grad-norm clip 1, no weight decay) on the
clipped surrogate with group-normalised advantages (std-scaled), kl_beta 0: no reference model.

Token ids are the peer tokenizer's (`bench_common.build_tokenizer`, word level, one word = one
token): <pad> 0, <eos> 1, <bos> 2, <unk> 3, digits 0-9 -> 4-13, `rev` 14, `=` 15, filler words
16-511. No BOS is added to the prompt (the peer's tokenizer has no post-processor), so a prompt is
5 or 6 tokens; ours are left-padded to 6. Our prompt sampler and reward (below) are pure JAX
functions that reproduce the peer's in token ids: the reward, like TRL's decode with
skip_special_tokens, drops <pad> <eos> <bos> <unk> from a completion before comparing words.

Rows of the table (each a fresh worker process per repeat, so no side warms the other):

* trl:   /work/shared/peers/trl_grpo_bench.py with the TRL venv (`--trl_python`), fp32,
         `transformers.generate` (no vLLM). `--trl_extra "--bf16 --grad_ckpt"` adds a second TRL
         row with those flags (TRL's own defaults).
* ours:  this script re-invoked as `--worker ours`, for every `--steps_per_call` K (default 1 and
         10): `jax.jit(grpo.make_train_chunk(...), donate_argnums=0)` called as
         `chunk(state, arange(first, first + K), None)`, each update = prompt sampling, KV-cache
         generation, reward, advantages and the optimizer step, all in one XLA program. K = 1 is
         one host dispatch per update, like TRL's loop; K = 10 runs 10 updates as one `lax.scan`.

Differences that stay: TRL 1.16's default `loss_type` is "dapo" (one token-level mean over the
batch, symmetric clip 0.2, no dynamic filtering); ours runs `--variant grpo` (each sequence's
token mean, then the mean over sequences) unless told otherwise; the compute is the same. TRL's
learning rate decays linearly to 0 over the run (the Trainer's default schedule), ours stays
constant; neither changes the timing. TRL draws its prompts from a fixed 512-row dataset made
with Python's `random`; ours samples fresh prompts inside the program from the same distribution.
Neither side's weights favour EOS, so nearly every completion runs the full 16 tokens on both
(the table shows the mean).

What is measured, as the peer script does it:

* s/update, completions/s, gen tok/s, total tok/s: wall clock from the end of update `--warmup`
  to the end of the last update, everything in between included: for ours, building the index
  vector, the call, `jax.block_until_ready`, and fetching all the per-update metrics to the host
  (TRL logs every step). Generated tokens are the completion tokens actually returned, EOS
  included and nothing after it (our `Completion.lengths`, read back from the per-update mean
  "completion_length" metric); prompt tokens are the real (unpadded) prompt tokens, 5 or 6 each,
  read back from a zero-weight reward term whose value is the prompt length (metric
  "reward_prompt_tokens"; weight 0 leaves the reward unchanged). total = prompt + generated, over
  all 32 sequences of every timed update. With K > 1 the warm-up is rounded up to whole calls and
  at least `--steps - --warmup` updates are timed.
* median s/update: the median of the timed steps' own durations (TRL: the peer's
  `median_step_s`; ours: the median timed call over K), less sensitive than the window to a
  step stalled by another process; every throughput column uses the window.
* rollout share: the fraction of an update spent on the rollout. TRL: the peer's own timing of
  `GRPOTrainer._generate` (prompt tokenisation, `generate`, EOS masking), summed over the timed
  steps over the timed wall clock. Ours: after the timed run, `grpo.make_rollout` (prompt
  sampling, generation, reward, advantages) is jitted on its own and timed over
  `--rollout_trials` calls with fresh keys (median, block_until_ready and metrics fetched), over
  the run's s/update; the rest of the update is the policy's forward/backward
  and AdamW. Its compilation and calls come after the peak RSS is read.
* compile s: ours, `jax.jit(chunk, donate_argnums=0).lower(...).compile()` (the persistent
  compilation cache is off); TRL has no compile step (its slower first steps are in the JSON,
  `first_step_s` and `step_s_list`; ours has `first_call_s` and `call_s_list`).
* peak RSS: `ru_maxrss` of the worker process (ours: read right after the timed run).
* MFU: model FLOPs per second over this machine's fp32 matmul peak, measured by a separate JAX
  worker (`--worker peak`, once per repeat, best over repeats) timing jitted `jnp.dot` of
  `--peak_n`-square fp32 matrices. Model FLOPs per update, from the forward FLOPs per token
  f(c) = `ModelConfig.flops_per_token(c)` (c: keys a query sees), for the nominal sequence of a
  mean prompt of P = 5.5 tokens and a full completion of N = 16 tokens, times 32 completions:
  generation = P f((P + 1) / 2) (prefill, causal) + (N - 1) f(P + N / 2) (each sampled token but
  the last is fed back through the model with a KV cache; mean context P + N / 2), and training =
  3 (P + N) f((P + N + 1) / 2) (forward + backward over prompt and completion, causal). TRL's
  generation also uses a KV cache (`generate` with its default DynamicCache), so the same count
  applies to its row (for a `--bf16` row that is still the fp32 peak). The count leaves out
  padding to the batch's longest prompt, our sampler's extra work (attention over the whole
  fixed-size cache, a forward pass after the last token) and TRL's saving in training of the LM
  head on prompt positions (`logits_to_keep`; the head is 4% of the forward's FLOPs).

Each side uses its default threads (torch's default; XLA's default). Ours runs with the XLA_FLAGS
that importing `jaxrl` sets, as our users run it. A side that fails is reported as failed (its
error goes to stderr) and the other rows are still measured.

From the repository root:

    python experiments/benchmarks/grpo_throughput.py --out grpo_throughput.json
    python experiments/benchmarks/grpo_throughput.py --repeats 1 --steps 6 --warmup 2   # quick
    python experiments/benchmarks/grpo_throughput.py --trl_extra "--bf16 --grad_ckpt"

Throughput on a shared machine is noisy (the peer README saw 5-15% between runs; on a loaded
machine TRL steps of 0.23 s and of 1.5-14 s were seen in one run): run it with the machine idle and
`--repeats 3` or more; the table shows medians over repeats and the range. Another busy process
hurts torch's two OpenMP threads far more than XLA, so numbers from a loaded machine flatter us.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import resource
import shlex
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
# Run directly, the script's folder is on sys.path, not the repository root.
sys.path.insert(0, str(REPO_ROOT))

from experiments.benchmarks._shared import (  # noqa: E402
    DEFAULT_PEER_DIR,
    EXPECTED_PARAMS,
    MODEL_SHAPE,
    TRL_MARKER,
    comma_list,
    count_backend_compiles,
    current_rss_mib,
    fmt,
    log,
    median_of,
    run_peak,
    run_process,
)

HEAD_DIM = 64
PROMPTS_PER_UPDATE = 4
GROUP_SIZE = 8
COMPLETIONS_PER_UPDATE = PROMPTS_PER_UPDATE * GROUP_SIZE
MAX_NEW_TOKENS = 16
TEMPERATURE = 1.0
LEARNING_RATE = 1e-5
KL_BETA = 0.0
# Token ids of the peer tokenizer (bench_common.build_tokenizer).
PAD_ID, EOS_ID, BOS_ID, UNK_ID = 0, 1, 2, 3
NUM_SPECIAL = 4  # <pad> <eos> <bos> <unk>: dropped by decode(skip_special_tokens=True)
DIGIT_0_ID = 4
REV_ID = 14
EQUALS_ID = 15
MIN_DIGITS, MAX_DIGITS = 3, 4
PROMPT_WIDTH = MAX_DIGITS + 2  # rev d1 .. d4 =
# The nominal sequence the model FLOPs count (module docstring).
MEAN_PROMPT_TOKENS = (MIN_DIGITS + MAX_DIGITS) / 2 + 2

DEFAULT_STEPS = 10
DEFAULT_WARMUP = 2
DEFAULT_REPEATS = 3
DEFAULT_TIMEOUT_S = 900
DEFAULT_PEAK_N = 2048
DEFAULT_ROLLOUT_TRIALS = 5

RESULT_MARKER = "GRPO_THROUGHPUT_RESULT "


# --------------------------------------------------------------------------------------------
# Worker side: ours. The task in token ids, as pure JAX functions.


def sample_prompts(key: Any, n: int) -> Any:
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
    import jax.numpy as jnp

    return prompts.mask.sum(axis=1).astype(jnp.float32)


def reward_terms() -> list[Any]:
    from algos import grpo

    return [
        grpo.RewardTerm("reverse", 1.0, reverse_reward),
        grpo.RewardTerm("prompt_tokens", 0.0, prompt_token_count),
    ]


def run_ours(
    steps_per_call: int, steps: int, warmup: int, seed: int, variant: str, rollout_trials: int
) -> dict[str, Any]:
    """Build, compile and time our GRPO in this process; returns the measurements."""
    t_script = time.perf_counter()
    import jax
    import numpy as np

    # Importing jaxrl (algos does) sets its XLA_FLAGS; XLA reads them when the backend starts.
    from algos import grpo
    from jaxrl.lm import training
    from jaxrl.lm.model import ModelConfig, init_params

    jax.config.update("jax_enable_compilation_cache", False)
    compiles = count_backend_compiles()

    warmup_calls = math.ceil(warmup / steps_per_call)
    timed_calls = math.ceil(max(steps - warmup, 1) / steps_per_call)
    n_calls = warmup_calls + timed_calls
    model_config = ModelConfig(**MODEL_SHAPE, head_dim=HEAD_DIM)
    config = grpo.Config(
        batch_size=PROMPTS_PER_UPDATE,
        group_size=GROUP_SIZE,
        max_new_tokens=MAX_NEW_TOKENS,
        temperature=TEMPERATURE,
        learning_rate=LEARNING_RATE,
        kl_beta=KL_BETA,
        num_steps=n_calls * steps_per_call,
        variant=variant,
    )
    params = init_params(model_config, jax.random.key(seed))
    n_params = sum(int(x.size) for x in jax.tree.leaves(params))
    assert n_params == model_config.num_params() == EXPECTED_PARAMS, n_params
    state = training.init_state(params, config.optimizer())
    terms = reward_terms()

    result: dict[str, Any] = {"side": "ours", "K": steps_per_call, "variant": variant}
    result["rss_after_setup_mib"] = current_rss_mib()
    chunk = grpo.make_train_chunk(model_config, config, sample_prompts, terms, EOS_ID, PAD_ID, seed)
    chunk = jax.jit(chunk, donate_argnums=0)

    def indices(call: int) -> Any:
        # From NumPy: jnp.arange would compile small programs of its own on the first calls.
        first = call * steps_per_call
        return jax.device_put(np.arange(first, first + steps_per_call, dtype=np.int32))

    start = time.perf_counter()
    compiled = chunk.lower(state, indices(0), None).compile()
    result["compile_s"] = time.perf_counter() - start
    result["rss_before_train_mib"] = current_rss_mib()

    compiles_before = compiles()
    history: list[dict[str, float]] = []
    call_end, call_s = [], []
    t_train = time.perf_counter()
    for call in range(n_calls):
        begin = time.perf_counter()
        state, metrics = compiled(state, indices(call), None)
        jax.block_until_ready((state, metrics))
        metrics = jax.device_get(metrics)
        for k in range(steps_per_call):
            history.append({name: float(np.asarray(v)[k]) for name, v in metrics.items()})
        end = time.perf_counter()
        call_end.append(end)
        call_s.append(end - begin)
    window_start = call_end[warmup_calls - 1] if warmup_calls else t_train
    steady_s = call_end[-1] - window_start
    peak_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    compiles_while_training = compiles() - compiles_before

    timed = history[warmup_calls * steps_per_call :]
    timed_updates = len(timed)
    # Per-update means over the 32 sequences, back to exact integer counts.
    gen_tokens = sum(round(h["completion_length"] * COMPLETIONS_PER_UPDATE) for h in timed)
    prompt_tokens = sum(round(h["reward_prompt_tokens"] * COMPLETIONS_PER_UPDATE) for h in timed)
    completions = timed_updates * COMPLETIONS_PER_UPDATE
    s_per_update = steady_s / timed_updates
    result.update(
        {
            "status": "ok",
            "params": n_params,
            "steps": n_calls * steps_per_call,
            "warmup_steps_excluded": warmup_calls * steps_per_call,
            "timed_steps": timed_updates,
            "steady_wall_s": steady_s,
            "steady_s_per_step": s_per_update,
            "gen_tokens_per_s": gen_tokens / steady_s,
            "total_tokens_per_s": (gen_tokens + prompt_tokens) / steady_s,
            "completions_per_s": completions / steady_s,
            "mean_completion_len": gen_tokens / completions,
            "mean_prompt_len": prompt_tokens / completions,
            "median_step_s": statistics.median(call_s[warmup_calls:]) / steps_per_call,
            "first_call_s": call_s[0],
            "call_s_list": call_s,
            "compiles_while_training": compiles_while_training,
            "peak_rss_mib": peak_rss,
            "reward_first": history[0]["reward"],
            "reward_last": history[-1]["reward"],
            "history": history,
        }
    )

    if rollout_trials > 0:
        rollout = grpo.make_rollout(model_config, config, sample_prompts, terms, EOS_ID, PAD_ID)
        rollout = jax.jit(rollout)
        base_key = jax.random.key(seed + 1)
        start = time.perf_counter()
        compiled_rollout = rollout.lower(state.params, base_key).compile()
        result["rollout_compile_s"] = time.perf_counter() - start
        keys = [jax.random.fold_in(base_key, trial) for trial in range(rollout_trials + 1)]
        jax.block_until_ready(compiled_rollout(state.params, keys[-1]))  # one untimed call
        rollout_s = []
        for key in keys[:-1]:
            begin = time.perf_counter()
            out = compiled_rollout(state.params, key)
            jax.block_until_ready(out)
            jax.device_get(out[1])
            rollout_s.append(time.perf_counter() - begin)
        result["rollout_s_list"] = rollout_s
        result["rollout_s"] = statistics.median(rollout_s)
        result["rollout_share_of_step"] = result["rollout_s"] / s_per_update

    result.update(
        {
            "total_script_s": time.perf_counter() - t_script,
            "backend": jax.default_backend(),
            "jax_version": jax.__version__,
            "xla_flags": os.environ.get("XLA_FLAGS", ""),
        }
    )
    return result


# --------------------------------------------------------------------------------------------
# Parent side: workers, FLOPs, the table


def flops_per_update() -> dict[str, float]:
    """Model FLOPs of one update, generation and training (module docstring)."""
    from jaxrl.lm.model import ModelConfig

    f = ModelConfig(**MODEL_SHAPE, head_dim=HEAD_DIM).flops_per_token
    p, n = MEAN_PROMPT_TOKENS, MAX_NEW_TOKENS
    generation = p * f((p + 1) / 2) + (n - 1) * f(p + n / 2)
    training = 3 * (p + n) * f((p + n + 1) / 2)
    return {
        "generation": generation * COMPLETIONS_PER_UPDATE,
        "training": training * COMPLETIONS_PER_UPDATE,
        "total": (generation + training) * COMPLETIONS_PER_UPDATE,
    }


def variants(args: argparse.Namespace) -> list[dict[str, Any]]:
    rows = [{"name": "trl fp32", "side": "trl", "extra": []}]
    if args.trl_extra:
        extra = shlex.split(args.trl_extra)
        rows.append({"name": f"trl {' '.join(extra)}", "side": "trl", "extra": extra})
    for k in args.steps_per_call:
        rows.append({"name": f"ours {args.variant} K={k}", "side": "ours", "K": k})
    return rows


def command_for(variant: dict[str, Any], args: argparse.Namespace) -> list[str]:
    if variant["side"] == "trl":
        script = str(Path(args.peer_dir) / "trl_grpo_bench.py")
        return [
            args.trl_python,
            script,
            *("--steps", str(args.steps), "--warmup", str(args.warmup)),
            *("--batch_size", str(COMPLETIONS_PER_UPDATE), "--num_generations", str(GROUP_SIZE)),
            *("--max_completion_length", str(MAX_NEW_TOKENS), "--beta", str(KL_BETA)),
            *("--lr", str(LEARNING_RATE), "--seed", str(args.seed)),
            *variant["extra"],
        ]
    return [
        sys.executable,
        str(Path(__file__).resolve()),
        *("--worker", "ours", "--steps_per_call", str(variant["K"])),
        *("--steps", str(args.steps), "--warmup", str(args.warmup), "--seed", str(args.seed)),
        *("--variant", args.variant, "--rollout_trials", str(args.rollout_trials)),
    ]


def describe(result: dict[str, Any]) -> str:
    if result["status"] != "ok":
        return f"FAILED ({result['status']}): {result.get('message', '')}"
    if result["side"] == "peak":
        return f"fp32 matmul peak {result['peak_flops_per_s'] / 1e9:.1f} GFLOP/s"
    text = (
        f"{result['steady_s_per_step']:.3f} s/update, {result['completions_per_s']:.1f} "
        f"completions/s, {result['gen_tokens_per_s']:.0f} gen tok/s, "
        f"peak RSS {result['peak_rss_mib']:.0f} MiB"
    )
    if "compile_s" in result:
        text += f", compile {result['compile_s']:.1f} s, first call {result['first_call_s']:.2f} s"
    if result.get("rollout_share_of_step") is not None:
        text += f", rollout {100 * result['rollout_share_of_step']:.0f}%"
    if result.get("compiles_while_training"):
        text += f", {result['compiles_while_training']} compiles while training"
    return text


MEDIAN_KEYS = (
    "steady_s_per_step",
    "median_step_s",
    "completions_per_s",
    "gen_tokens_per_s",
    "total_tokens_per_s",
    "mean_completion_len",
    "mfu",
    "rollout_share_of_step",
    "compile_s",
    "peak_rss_mib",
    "model_flops_per_s",
)


def summarise(rows: list[dict[str, Any]], peak: float | None) -> None:
    """Adds MFU to every ok run and a `median` dict to every row."""
    flops = flops_per_update()["total"]
    for row in rows:
        row["model_flops_per_update"] = flops
        ok = [r for r in row["runs"] if r["status"] == "ok"]
        for run in ok:
            run["model_flops_per_s"] = flops / run["steady_s_per_step"]
            run["mfu"] = run["model_flops_per_s"] / peak if peak else None
        row["median"] = {key: median_of(ok, key) for key in MEDIAN_KEYS}
        row["ok_runs"] = len(ok)


def format_table(rows: list[dict[str, Any]]) -> str:
    baseline = next((r for r in rows if r["name"] == "trl fp32"), None)
    base = baseline["median"]["completions_per_s"] if baseline and baseline["ok_runs"] else None
    header = ["run", "ok", "s/update", "median s/update", "completions/s", "completions/s range"]
    header += ["gen tok/s"]
    header += ["total tok/s", "mean gen len", "MFU %", "rollout %", "compile s", "peak RSS MiB"]
    header += ["reward first -> last", "completions/s vs trl fp32"]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    for row in rows:
        m = row["median"]
        ok = [r for r in row["runs"] if r["status"] == "ok"]
        reward = "-"
        if ok and ok[0].get("reward_first") is not None:
            reward = f"{ok[0]['reward_first']:.3f} -> {ok[0]['reward_last']:.3f}"
        rates = [r["completions_per_s"] for r in ok]
        spread = f"{min(rates):.2f}-{max(rates):.2f}" if rates else "-"
        ratio = m["completions_per_s"] / base if base and m["completions_per_s"] else None
        cells = [
            row["name"],
            f"{row['ok_runs']}/{len(row['runs'])}",
            fmt(m["steady_s_per_step"], ".3f"),
            fmt(m["median_step_s"], ".3f"),
            fmt(m["completions_per_s"], ".2f"),
            spread,
            fmt(m["gen_tokens_per_s"], ",.0f"),
            fmt(m["total_tokens_per_s"], ",.0f"),
            fmt(m["mean_completion_len"], ".2f"),
            fmt(m["mfu"], ".2f", 100),
            fmt(m["rollout_share_of_step"], ".0f", 100),
            fmt(m["compile_s"], ".1f"),
            fmt(m["peak_rss_mib"], ".0f"),
            reward,
            "-" if ratio is None else f"{ratio:.2f}",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def run_benchmark(args: argparse.Namespace) -> None:
    rows = variants(args)
    for row in rows:
        row["runs"] = []
    peaks: list[dict[str, Any]] = []
    peak_command = [sys.executable, str(Path(__file__).resolve()), "--worker", "peak"]
    peak_command += ["--peak_n", str(args.peak_n)]
    for repeat in range(args.repeats):
        for row in rows:
            command = command_for(row, args)
            marker = TRL_MARKER if row["side"] == "trl" else RESULT_MARKER
            result = {"side": row["side"], **run_process(command, marker, args.timeout)}
            result["command"] = shlex.join(command)
            row["runs"].append(result)
            log(f"[{repeat + 1}/{args.repeats}] {row['name']}: {describe(result)}")
            if result["status"] == "ok" and result.get("params") != EXPECTED_PARAMS:
                log(f"  warning: {result.get('params')} params, not {EXPECTED_PARAMS}")
        result = run_process(peak_command, RESULT_MARKER, args.timeout)
        peaks.append(result)
        log(f"[{repeat + 1}/{args.repeats}] peak: {describe(result)}")

    ok_peaks = [p["peak_flops_per_s"] for p in peaks if p["status"] == "ok"]
    peak = max(ok_peaks) if ok_peaks else None
    summarise(rows, peak)
    print(format_table(rows))
    flops = flops_per_update()
    peak_text = f"{peak / 1e9:.1f} GFLOP/s" if peak else "unmeasured"
    print(
        f"\nMedians over {args.repeats} repeat(s); {args.steps} updates, first {args.warmup} "
        f"excluded; {COMPLETIONS_PER_UPDATE} completions ({PROMPTS_PER_UPDATE} prompts x "
        f"{GROUP_SIZE}) of at most {MAX_NEW_TOKENS} tokens per update; fp32 matmul peak "
        f"{peak_text} (jnp.dot {args.peak_n}^2, best of all runs); model GFLOP/update "
        f"{flops['total'] / 1e9:.2f} (generation {flops['generation'] / 1e9:.2f}, training "
        f"{flops['training'] / 1e9:.2f}). rollout %: share of an update spent generating "
        f"(TRL: its timed _generate; ours: the rollout jitted alone, median of "
        f"{args.rollout_trials})."
    )
    for row in rows:
        for index, run in enumerate(row["runs"]):
            if run["status"] != "ok":
                log(f"{row['name']} run {index + 1} failed ({run['status']}): {run.get('message')}")
    if args.out:
        report = {
            "settings": {
                "model": {**MODEL_SHAPE, "head_dim": HEAD_DIM},
                "params": EXPECTED_PARAMS,
                "prompts_per_update": PROMPTS_PER_UPDATE,
                "group_size": GROUP_SIZE,
                "max_new_tokens": MAX_NEW_TOKENS,
                "temperature": TEMPERATURE,
                "learning_rate": LEARNING_RATE,
                "kl_beta": KL_BETA,
                "variant": args.variant,
                "steps": args.steps,
                "warmup": args.warmup,
                "repeats": args.repeats,
                "seed": args.seed,
                "rollout_trials": args.rollout_trials,
                "flops_mean_prompt_tokens": MEAN_PROMPT_TOKENS,
                "model_flops_per_update": flops,
                "trl_python": args.trl_python,
                "peer_dir": str(args.peer_dir),
                "trl_extra": args.trl_extra,
            },
            "machine": {"platform": platform.platform(), "cpu_count": os.cpu_count()},
            "peak_flops_per_s": peak,
            "peak_runs": peaks,
            "rows": rows,
        }
        Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
        log(f"wrote {args.out}")


# --------------------------------------------------------------------------------------------
# Command line


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n", 1)[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    add = parser.add_argument
    add("--steps", type=int, default=DEFAULT_STEPS, help="updates (optimizer steps) per run")
    add("--warmup", type=int, default=DEFAULT_WARMUP, help="updates left out of the timed window")
    add("--repeats", type=int, default=DEFAULT_REPEATS, help="fresh-process runs of every row")
    add(
        "--steps_per_call",
        type=comma_list(int),
        default=[1, 10],
        help="ours: comma-separated updates per dispatch, one row each (empty: TRL only)",
    )
    add(
        "--variant",
        default="grpo",
        choices=("grpo", "dr_grpo", "dapo", "rloo"),
        help="ours: algos.grpo variant (TRL's default loss_type is dapo; same compute)",
    )
    add(
        "--rollout_trials",
        type=int,
        default=DEFAULT_ROLLOUT_TRIALS,
        help="ours: timed calls of the rollout jitted alone, for the rollout share (0: skip)",
    )
    add("--trl_python", default="/tmp/trl/bin/python", help="python of a venv with TRL")
    add("--peer_dir", default=str(DEFAULT_PEER_DIR), help="folder of trl_grpo_bench.py")
    add("--trl_extra", default="", help='flags for a second TRL row, e.g. "--bf16 --grad_ckpt"')
    add("--peak_n", type=int, default=DEFAULT_PEAK_N, help="matrix size of the matmul peak")
    add("--seed", type=int, default=0)
    add("--timeout", type=float, default=DEFAULT_TIMEOUT_S, help="seconds before killing a worker")
    add("--out", default=None, help="write every raw run and the medians to this JSON file")
    # Internal: one measurement in this process.
    add("--worker", choices=("ours", "peak"), default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if min(args.steps, args.repeats, args.peak_n, *args.steps_per_call) <= 0:
        parser.error("--steps, --repeats, --steps_per_call, --peak_n must be > 0")
    if args.rollout_trials < 0:
        parser.error("--rollout_trials must be >= 0")
    if not 0 <= args.warmup < args.steps:
        parser.error("--warmup must be in [0, --steps)")
    if args.worker == "ours" and len(args.steps_per_call) != 1:
        parser.error("--worker ours measures one row: one --steps_per_call")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.worker == "ours":
        result = run_ours(
            args.steps_per_call[0],
            args.steps,
            args.warmup,
            args.seed,
            args.variant,
            args.rollout_trials,
        )
    elif args.worker == "peak":
        result = run_peak(args.peak_n)
    else:
        run_benchmark(args)
        return
    print(RESULT_MARKER + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
