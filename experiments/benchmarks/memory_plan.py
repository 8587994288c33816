"""XLA's memory plan of one GRPO update at real model sizes, without allocating or running it.

The update is the function the GRPO script compiles (`algos.grpo.make(...).update`: the rollout
with the KV-cache sampler, the loss, the gradient and the AdamW step, the state donated as the
runner donates it), on a synthetic text task whose prompts are exactly `--prompt_len` random
tokens and whose completions run `--new_tokens` tokens (EOS is an id no sample is). Parameters
and optimizer state are `jax.ShapeDtypeStruct`s (`jax.eval_shape` of the initialiser), so
nothing model-sized is allocated: the program is lowered and compiled, and
`compiled.memory_analysis()` reports XLA's buffer assignment. Beside it, the estimate of
`jaxrl.lm.memory` for the same run.

    python experiments/benchmarks/memory_plan.py                       # the three shapes below
    python experiments/benchmarks/memory_plan.py --shape 1.7b --dtype float32

Shapes: `smollm2` (SmolLM2-135M), `1.7b` (24 layers, hidden 2048, 32 heads, vocab 49,152, tied)
and `7b-lora` (Llama-2-7B's shape, untied, LoRA rank 16 on every projection), at 4 prompts x 8
samples (2 x 8 for 7b-lora) of 128 + 256 tokens, bf16 compute over fp32 weights.

Compile on the CPU backend (JAX_PLATFORMS=cpu) to reproduce the issue's figures; on a GPU the
same script reports that backend's plan (where remat shrinks it).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from experiments.benchmarks.lm_shapes import MODEL_SHAPES  # noqa: E402

GIB = 1 << 30

SHAPES: dict[str, dict[str, Any]] = {
    "smollm2": dict(model=MODEL_SHAPES["smollm2"], prompts=4, lora_rank=0),
    "1.7b": dict(model=MODEL_SHAPES["1.7b"], prompts=4, lora_rank=0),
    "7b-lora": dict(model=MODEL_SHAPES["7b"], prompts=2, lora_rank=16),
}


def fixed_length_task(prompt_len: int, vocab_size: int) -> Any:
    """Prompts of exactly `prompt_len` uniform random tokens (no padding); the reward is the
    fraction of even token ids; EOS is -1, which no sample is, so every completion is full."""
    import jax
    import jax.numpy as jnp

    from envs.text import PromptBatch, RewardTerm, TextTask

    def sample(key: Any, n: int, data: Any = None) -> PromptBatch:
        tokens = jax.random.randint(key, (n, prompt_len), 0, vocab_size, jnp.int32)
        no_answer = jnp.zeros((n, 1), jnp.int32)
        return PromptBatch(tokens, jnp.ones(tokens.shape, bool), no_answer, jnp.ones(n, jnp.int32))

    def even_tokens(prompts: PromptBatch, completion: Any) -> Any:
        even = completion.mask & (completion.tokens % 2 == 0)
        return even.sum(axis=1) / jnp.maximum(completion.mask.sum(axis=1), 1)

    return TextTask("fixed_length", sample, (RewardTerm("even", 1.0, even_tokens),), -1, 0)


def grpo_run(
    shape: str,
    dtype: str = "bfloat16",
    param_dtype: str = "float32",
    remat: str = "none",
    prompts: int | None = None,
    group_size: int = 8,
    prompt_len: int = 128,
    new_tokens: int = 256,
    grad_accum_steps: int = 1,
    lora_rank: int | None = None,
) -> tuple[Any, Any, int]:
    """The (grpo.Config, ModelConfig, prompt length) of one measured configuration."""
    from algos import grpo
    from jaxrl.lm.model import ModelConfig
    from jaxrl.lm.sampler import Sampling

    spec = SHAPES[shape]
    model = ModelConfig(**spec["model"], dtype=dtype, param_dtype=param_dtype, remat=remat)
    rank = spec["lora_rank"] if lora_rank is None else lora_rank
    config = grpo.Config(
        batch_size=prompts or spec["prompts"],
        group_size=group_size,
        sampling=Sampling(max_new_tokens=new_tokens),
        grad_accum_steps=grad_accum_steps,
        lora_rank=rank,
    )
    return config, model, prompt_len


def plan(config: Any, model: Any, prompt_len: int) -> tuple[dict[str, float], float]:
    """XLA's memory analysis of the GRPO update (bytes) and the compile's seconds."""
    import jax

    from algos import grpo
    from jaxrl import hparams
    from jaxrl.lm.model import init_params

    task = fixed_length_task(prompt_len, model.vocab_size)
    params = jax.eval_shape(lambda: init_params(model, jax.random.key(0)))
    hp = hparams.hparams(config)
    algorithm = grpo.make(config, model, task, params)
    # The state's shapes: `init` traced on abstract parameters (it copies concrete ones); in
    # partial mode it holds the carried slots too.
    state = jax.eval_shape(
        lambda p, key: grpo.make(config, model, task, p).init(key, hp),
        params,
        jax.random.key(0),
    )
    start = time.perf_counter()
    lowered = jax.jit(algorithm.update, donate_argnums=0).lower(state, None, hp)
    compiled = lowered.compile()
    seconds = time.perf_counter() - start
    return planned_bytes(compiled), seconds


def planned_bytes(compiled: Any) -> dict[str, int] | None:
    """XLA's memory plan of a compiled program in bytes (None where the backend gives none):
    its temporaries, arguments, outputs, aliased (donated) bytes, code, and `total`, what is
    live at once: arguments, plus outputs not written over donated arguments, plus the
    temporaries (the peak XLA plans for)."""
    analysis = compiled.memory_analysis()
    if analysis is None:
        return None
    fields = {
        "temp": analysis.temp_size_in_bytes,
        "argument": analysis.argument_size_in_bytes,
        "output": analysis.output_size_in_bytes,
        "alias": analysis.alias_size_in_bytes,
        "generated_code": analysis.generated_code_size_in_bytes,
    }
    fields["total"] = fields["temp"] + fields["argument"] + fields["output"] - fields["alias"]
    return fields


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", default="all", choices=("all", *SHAPES))
    parser.add_argument("--dtype", default="bfloat16", help="compute dtype")
    parser.add_argument("--param_dtype", default="float32")
    parser.add_argument("--remat", default="none", choices=("none", "save_dots", "full"))
    parser.add_argument("--prompts", type=int, default=None, help="default: the shape's")
    parser.add_argument("--group_size", type=int, default=8)
    parser.add_argument("--prompt_len", type=int, default=128)
    parser.add_argument("--new_tokens", type=int, default=256)
    parser.add_argument("--grad_accum_steps", type=int, default=1)
    parser.add_argument("--lora_rank", type=int, default=None, help="default: the shape's")
    parser.add_argument("--json", default=None, help="also write the rows to this file")
    args = parser.parse_args()
    os.environ.setdefault("JAX_PLATFORMS", "cpu")

    import jax

    from jaxrl.lm import memory

    rows = []
    for shape in SHAPES if args.shape == "all" else [args.shape]:
        config, model, prompt_len = grpo_run(
            shape,
            args.dtype,
            args.param_dtype,
            args.remat,
            args.prompts,
            args.group_size,
            args.prompt_len,
            args.new_tokens,
            args.grad_accum_steps,
            args.lora_rank,
        )
        fields, seconds = plan(config, model, prompt_len)
        estimate = memory.grpo_estimate(config, model, prompt_len)
        row = {
            "shape": shape,
            "backend": jax.default_backend(),
            "dtype": model.dtype,
            "param_dtype": model.param_dtype,
            "remat": model.remat,
            "lora_rank": config.lora_rank,
            "batch": f"{config.batch_size}x{config.group_size}x({prompt_len}+"
            f"{config.sampling.max_new_tokens})",
            "grad_accum_steps": config.grad_accum_steps,
            "compile_s": round(seconds, 1),
            **{f"xla_{k}_gib": round(v / GIB, 2) for k, v in fields.items()},
            "estimate_total_gib": round(estimate.total / GIB, 2),
            "estimate_temp_gib": round(estimate.temporaries / GIB, 2),
            "estimate_vs_xla": round(estimate.total / fields["total"], 3),
            "estimate_parts_gib": {k: round(v / GIB, 2) for k, v in estimate.parts.items()},
        }
        rows.append(row)
        print(json.dumps(row), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
