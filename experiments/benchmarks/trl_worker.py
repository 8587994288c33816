"""TRL's side of the SmolLM2 comparison (README.md, "SmolLM2 against TRL"): TRL's `DPOTrainer`,
`GRPOTrainer` or `RewardTrainer` on a Hugging Face checkpoint directory, with the data file the
driver wrote, timed as the peer scripts time TRL, and one `RESULT_JSON {...}` line with their
fields.

    trl_worker.py dpo  --model_dir DIR --data dpo.json --steps 10 --warmup 2 --batch_size 4
    trl_worker.py reward --model_dir DIR --data dpo.json --steps 10 --warmup 2 --batch_size 4
    trl_worker.py grpo --model_dir DIR --data grpo.json --steps 10 --warmup 2 --batch_size 16 \
        --num_generations 8 --max_completion_length 16

It runs in TRL's environment (torch, transformers, trl, datasets), where jaxrl is not installed:
besides those it needs only the standard library and `harness.py` (standard library only when
imported). The model is loaded with `AutoModelForCausalLM` in fp32 (`--bf16` adds TRL's bf16
autocast), the tokenizer with `AutoTokenizer`; nothing touches the network.

Timing is the peer scripts': wall clock from the end of optimizer step `--warmup` to the end of the
last step, everything in between included (data collation, reference pass, generation, reward,
backward, optimizer, logging). `compile_s` is TRL's setup before its first step (building the
trainer: dataset tokenisation, accelerate's wrapping), the model's loading apart (`load_s`).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

# Never the network: the checkpoint and tokenizer are local files.
for _name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE"):
    os.environ.setdefault(_name, "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # no tokenizer threads competing
os.environ.setdefault("WANDB_DISABLED", "true")

# The repository root, for the harness (this file runs from TRL's venv, not as a package).
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from experiments.benchmarks import harness  # noqa: E402

PACKAGES = ("torch", "transformers", "trl", "accelerate", "datasets", "tokenizers", "numpy")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Common flags, then the algorithm's (`dpo` or `grpo`)."""
    common = argparse.ArgumentParser(add_help=False)
    add = common.add_argument
    add("--model_dir", required=True, help="Hugging Face directory (config.json, safetensors)")
    add("--data", required=True, help="the driver's JSON data file (texts and their token ids)")
    add("--steps", type=int, default=10, help="optimizer steps (max_steps)")
    add("--warmup", type=int, default=2, help="steps left out of the timed window")
    add("--seed", type=int, default=0)
    add("--lr", type=float, default=1e-5)
    add("--bf16", action="store_true", help="bf16 autocast (TRL's default); off: fp32")
    add("--grad_ckpt", action="store_true", help="gradient checkpointing (TRL's default)")
    add("--threads", type=int, default=0, help="torch.set_num_threads (0: torch's default)")
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    algorithms = parser.add_subparsers(dest="algorithm", required=True)
    dpo = algorithms.add_parser("dpo", parents=[common], help="DPOTrainer")
    dpo.add_argument("--batch_size", type=int, default=4, help="pairs per step")
    dpo.add_argument("--beta", type=float, default=0.1)
    dpo.add_argument("--precompute_ref", action="store_true", help="TRL's precompute_ref_log_probs")
    reward = algorithms.add_parser("reward", parents=[common], help="RewardTrainer")
    reward.add_argument("--batch_size", type=int, default=4, help="pairs per step")
    grpo = algorithms.add_parser("grpo", parents=[common], help="GRPOTrainer")
    grpo.add_argument("--batch_size", type=int, default=16, help="completions per step")
    grpo.add_argument("--num_generations", type=int, default=8)
    grpo.add_argument("--max_completion_length", type=int, default=16)
    grpo.add_argument("--temperature", type=float, default=1.0)
    grpo.add_argument("--beta", type=float, default=0.0, help="KL coefficient (0: no reference)")
    grpo.add_argument("--loss_type", default="grpo", help="TRL's loss_type (its default: dapo)")
    grpo.add_argument(
        "--allow_eos",
        action="store_true",
        help="let EOS end completions early (default: min_new_tokens = max_completion_length, "
        "so every completion has exactly max_completion_length tokens)",
    )
    args = parser.parse_args(argv)
    if not 0 <= args.warmup < args.steps:
        parser.error("--warmup must be in [0, --steps)")
    return args


def versions() -> dict[str, str | None]:
    import platform
    from importlib import metadata

    found: dict[str, str | None] = {"python": platform.python_version()}
    for package in PACKAGES:
        try:
            found[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            found[package] = None
    return found


def make_timer(warmup: int) -> Any:
    """A TrainerCallback recording each optimizer step's begin and end (wall clock), and the CPU
    seconds at the end of step `warmup` (where the window starts) and of the last step."""
    from transformers import TrainerCallback

    class StepTimer(TrainerCallback):
        def __init__(self) -> None:
            self.train_begin = 0.0
            self.begins: list[float] = []
            self.ends: list[float] = []
            self.cpu_at_window_start = harness.cpu_seconds()
            self.cpu_at_end = 0.0

        def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.train_begin = time.perf_counter()
            self.cpu_at_window_start = harness.cpu_seconds()

        def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.begins.append(time.perf_counter())

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.ends.append(time.perf_counter())
            self.cpu_at_end = harness.cpu_seconds()
            if len(self.ends) == warmup:
                self.cpu_at_window_start = self.cpu_at_end

    return StepTimer()


def window(timer: Any, warmup: int) -> dict[str, Any]:
    """The timed window's numbers: from the end of step `warmup` (the start of training when 0)
    to the end of the last step."""
    if len(timer.ends) <= warmup:
        raise RuntimeError(f"TRL ran {len(timer.ends)} steps, not more than --warmup {warmup}")
    start = timer.ends[warmup - 1] if warmup else timer.train_begin
    seconds = timer.ends[-1] - start
    per_step = [end - begin for begin, end in zip(timer.begins, timer.ends, strict=False)]
    timed = len(timer.ends) - warmup
    return {
        "steps": len(timer.ends),
        "warmup_steps_excluded": warmup,
        "timed_steps": timed,
        "steady_wall_s": seconds,
        "steady_s_per_step": seconds / timed,
        "median_step_s": statistics.median(per_step[warmup:]),
        "best_call_s": min(per_step[warmup:]),
        "first_step_s": per_step[0],
        "step_s_list": per_step,
        "cpu_per_wall": (timer.cpu_at_end - timer.cpu_at_window_start) / seconds,
    }


def load_model(args: argparse.Namespace) -> tuple[Any, Any, float]:
    """The model (fp32, in training mode) and tokenizer of --model_dir, and the seconds that
    loading took."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    start = time.perf_counter()
    tokenizer = AutoTokenizer.from_pretrained(args.model_dir)
    model = AutoModelForCausalLM.from_pretrained(args.model_dir, dtype=torch.float32)
    return model, tokenizer, time.perf_counter() - start


def trainer_settings(args: argparse.Namespace) -> dict[str, Any]:
    """TrainingArguments both trainers get: our optimizer's settings (AdamW, no weight decay,
    global-norm clip 1, constant learning rate: TRL's default linear decay is not ours), TRL's
    logging every step, no saving, no progress bar, no data-loader workers; the GPU when torch
    sees one (as ours runs on JAX's default device), else the CPU."""
    import torch

    return dict(
        output_dir=os.path.join(tempfile.gettempdir(), f"trl_worker_{args.algorithm}"),
        gradient_accumulation_steps=1,
        max_steps=args.steps,
        learning_rate=args.lr,
        lr_scheduler_type="constant",
        weight_decay=0.0,
        max_grad_norm=1.0,
        bf16=args.bf16,
        gradient_checkpointing=args.grad_ckpt,
        use_cpu=not torch.cuda.is_available(),
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        dataloader_num_workers=0,
        seed=args.seed,
    )


def run_dpo(args: argparse.Namespace, data: dict[str, Any]) -> dict[str, Any]:
    """DPOTrainer with an explicit reference model (a copy of the initial policy, as TRL would
    load it): counts the tokens of every collated batch and checks that TRL's tokenisation of
    the texts is the driver's ids."""
    from datasets import Dataset
    from trl import DPOConfig, DPOTrainer
    from trl.trainer.dpo_trainer import DataCollatorForPreference

    model, tokenizer, load_s = load_model(args)
    reference = copy.deepcopy(model)
    rows = data["rows"]
    dataset = Dataset.from_dict(
        {key: [r[key] for r in rows] for key in ("prompt", "chosen", "rejected")}
    )
    batch_tokens: list[int] = []
    batch_padded: list[int] = []

    class CountingCollator(DataCollatorForPreference):
        """Counts each batch's real tokens (prompt + chosen + rejected, the prompt once, as the
        peers count) and padded ones; batches are collated in step order."""

        def torch_call(self, examples: list[dict[str, Any]]) -> dict[str, Any]:
            batch_tokens.append(
                sum(
                    len(e["prompt_ids"]) + len(e["chosen_ids"]) + len(e["rejected_ids"])
                    for e in examples
                )
            )
            out = super().torch_call(examples)
            batch_padded.append(int(out["input_ids"].numel()))
            return out

    config = DPOConfig(
        **trainer_settings(args),
        per_device_train_batch_size=args.batch_size,
        beta=args.beta,
        loss_type=["sigmoid"],
        max_length=1024,
        precompute_ref_log_probs=args.precompute_ref,
    )
    timer = make_timer(args.warmup)
    start = time.perf_counter()
    trainer = DPOTrainer(
        model=model,
        ref_model=reference,
        args=config,
        train_dataset=dataset,
        processing_class=tokenizer,
        data_collator=CountingCollator(pad_token_id=tokenizer.pad_token_id, max_length=1024),
        callbacks=[timer],
    )
    setup_s = time.perf_counter() - start
    # TRL's ids against the driver's (the answers end with EOS, which TRL appends as text).
    eos = [data["eos_id"]]
    prepared = trainer.train_dataset
    same = [
        prepared[i]["prompt_ids"] == r["prompt_ids"]
        and prepared[i]["chosen_ids"] == r["chosen_ids"] + eos
        and prepared[i]["rejected_ids"] == r["rejected_ids"] + eos
        for i, r in enumerate(rows)
    ]
    result = {"compile_s": setup_s, "load_s": load_s, "ids_match_fraction": sum(same) / len(same)}
    result["rss_before_train_mib"] = harness.current_rss_mib()
    trainer.train()
    result.update(window(timer, args.warmup))
    result["peak_rss_mib"] = harness.peak_rss_mib()
    timed = slice(args.warmup, result["steps"])
    tokens, padded = sum(batch_tokens[timed]), sum(batch_padded[timed])
    pairs = result["timed_steps"] * args.batch_size
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    result.update(
        batch_pairs=args.batch_size,
        params=sum(p.numel() for p in model.parameters()),
        timed_pairs=pairs,
        timed_tokens=tokens,
        pairs_per_s=pairs / result["steady_wall_s"],
        tokens_per_s=tokens / result["steady_wall_s"],
        tokens_counted_per_pair=tokens / pairs,
        padded_seq_tokens_per_s=padded / result["steady_wall_s"],
        loss_first=losses[0] if losses else None,
        loss_last=losses[-1] if losses else None,
        precompute_ref_log_probs=args.precompute_ref,
    )
    return result


def run_reward(args: argparse.Namespace, data: dict[str, Any]) -> dict[str, Any]:
    """RewardTrainer on `AutoModelForSequenceClassification` (one label: a new linear head on
    the last real token, as TRL builds a reward model from a causal LM) over the driver's pairs,
    given as token ids (prompt + answer + EOS, as ours reads them), so both sides train on the
    same tokens."""
    import torch
    from datasets import Dataset
    from transformers import AutoModelForSequenceClassification, AutoTokenizer
    from trl import RewardConfig, RewardTrainer

    start = time.perf_counter()
    tokenizer = AutoTokenizer.from_pretrained(args.model_dir)
    model = AutoModelForSequenceClassification.from_pretrained(
        args.model_dir, num_labels=1, dtype=torch.float32
    )
    model.config.pad_token_id = tokenizer.pad_token_id
    load_s = time.perf_counter() - start
    eos, rows = [data["eos_id"]], data["rows"]
    dataset = Dataset.from_dict(
        {
            side: [r["prompt_ids"] + r[side.replace("_ids", "") + "_ids"] + eos for r in rows]
            for side in ("chosen_ids", "rejected_ids")
        }
    )
    config = RewardConfig(
        **trainer_settings(args),
        per_device_train_batch_size=args.batch_size,
        max_length=1024,
        center_rewards_coefficient=None,
    )
    timer = make_timer(args.warmup)
    start = time.perf_counter()
    trainer = RewardTrainer(
        model=model,
        args=config,
        train_dataset=dataset,
        processing_class=tokenizer,
        callbacks=[timer],
    )
    setup_s = time.perf_counter() - start
    result = {"compile_s": setup_s, "load_s": load_s, "ids_match_fraction": 1.0}
    result["rss_before_train_mib"] = harness.current_rss_mib()
    trainer.train()
    result.update(window(timer, args.warmup))
    result["peak_rss_mib"] = harness.peak_rss_mib()
    pairs = result["timed_steps"] * args.batch_size
    tokens_per_pair = statistics.mean(
        len(r["prompt_ids"]) * 2 + len(r["chosen_ids"]) + len(r["rejected_ids"]) + 2 for r in rows
    )
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    result.update(
        batch_pairs=args.batch_size,
        params=sum(p.numel() for p in model.parameters()),
        timed_pairs=pairs,
        pairs_per_s=pairs / result["steady_wall_s"],
        tokens_per_s=pairs * tokens_per_pair / result["steady_wall_s"],
        loss_first=losses[0] if losses else None,
        loss_last=losses[-1] if losses else None,
    )
    return result


def run_grpo(args: argparse.Namespace, data: dict[str, Any]) -> dict[str, Any]:
    """GRPOTrainer with `transformers.generate` (no vLLM) on the driver's prompts; the reward is
    the fraction of even token ids in a completion (a function of the ids, the same as ours);
    every completion runs the full length unless --allow_eos."""
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    model, tokenizer, load_s = load_model(args)
    rows = data["rows"]
    # TRL tokenises the prompt texts itself (`processing_class(text=prompts)`): the same call here.
    same = [tokenizer(text=r["prompt"])["input_ids"] == r["prompt_ids"] for r in rows]
    dataset = Dataset.from_dict(
        {
            "prompt": [r["prompt"] for r in rows],
            "prompt_tokens": [len(r["prompt_ids"]) for r in rows],
        }
    )
    calls: list[dict[str, int]] = []  # one per generation batch, which is one step here

    def even_token_reward(
        prompts: list[str], completions: list[str], completion_ids: list[list[int]], **columns: Any
    ) -> list[float]:
        calls.append(
            {
                "gen_tokens": sum(len(ids) for ids in completion_ids),
                "prompt_tokens": sum(columns["prompt_tokens"]),
                "n": len(completion_ids),
            }
        )
        return [sum(i % 2 == 0 for i in ids) / max(len(ids), 1) for ids in completion_ids]

    # No EOS before the last token, as ours (whose EOS id is one no token has) does not stop.
    generation = None if args.allow_eos else {"min_new_tokens": args.max_completion_length}
    config = GRPOConfig(
        **trainer_settings(args),
        per_device_train_batch_size=args.batch_size,
        num_generations=args.num_generations,
        max_completion_length=args.max_completion_length,
        temperature=args.temperature,
        beta=args.beta,
        loss_type=args.loss_type,
        use_vllm=False,
        generation_kwargs=generation,
    )
    timer = make_timer(args.warmup)
    start = time.perf_counter()
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=even_token_reward,
        args=config,
        train_dataset=dataset,
        processing_class=tokenizer,
        callbacks=[timer],
    )
    setup_s = time.perf_counter() - start
    # The rollout's share: TRL's `_generate` (prompt tokenisation, generate, EOS masking) timed.
    rollout_s: list[float] = []
    generate = trainer._generate

    def timed_generate(*a: Any, **k: Any) -> Any:
        begin = time.perf_counter()
        out = generate(*a, **k)
        rollout_s.append(time.perf_counter() - begin)
        return out

    trainer._generate = timed_generate
    result = {"compile_s": setup_s, "load_s": load_s, "ids_match_fraction": sum(same) / len(same)}
    result["rss_before_train_mib"] = harness.current_rss_mib()
    trainer.train()
    result.update(window(timer, args.warmup))
    result["peak_rss_mib"] = harness.peak_rss_mib()
    if len(calls) != result["steps"]:
        harness.log(f"warning: {len(calls)} reward calls for {result['steps']} steps")
    timed = slice(args.warmup, result["steps"])
    generated = sum(c["gen_tokens"] for c in calls[timed])
    prompt = sum(c["prompt_tokens"] for c in calls[timed])
    completions = sum(c["n"] for c in calls[timed])
    seconds = result["steady_wall_s"]
    rewards = [h["reward"] for h in trainer.state.log_history if "reward" in h]
    result.update(
        completions_per_step=args.batch_size,
        num_generations=args.num_generations,
        max_completion_length=args.max_completion_length,
        beta=args.beta,
        loss_type=args.loss_type,
        eos_allowed=args.allow_eos,
        generation_backend="transformers.generate (no vLLM)",
        params=sum(p.numel() for p in model.parameters()),
        timed_completions=completions,
        timed_gen_tokens=generated,
        timed_prompt_tokens=prompt,
        completions_per_s=completions / seconds,
        gen_tokens_per_s=generated / seconds,
        total_tokens_per_s=(generated + prompt) / seconds,
        mean_completion_len=generated / max(completions, 1),
        mean_prompt_len=prompt / max(completions, 1),
        mean_rollout_s_per_step=statistics.mean(rollout_s[timed]) if rollout_s[timed] else None,
        rollout_share_of_step=sum(rollout_s[timed]) / seconds,
        reward_first=rewards[0] if rewards else None,
        reward_last=rewards[-1] if rewards else None,
    )
    return result


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    load_start, start = os.getloadavg()[0], time.perf_counter()
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    data = json.loads(Path(args.data).read_text())
    run = {"dpo": run_dpo, "reward": run_reward, "grpo": run_grpo}[args.algorithm]
    result: dict[str, Any] = {"library": "trl", "algorithm": args.algorithm, "status": "ok"}
    result.update(
        run(args, data),
        precision="bf16-autocast" if args.bf16 else "fp32",
        gradient_checkpointing=args.grad_ckpt,
        model_dir=args.model_dir,
        torch_num_threads=torch.get_num_threads(),
        device=torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
        total_script_s=time.perf_counter() - start,
        loadavg_start=load_start,
        loadavg_end=os.getloadavg()[0],
        versions=versions(),
    )
    print(harness.MARKER + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
