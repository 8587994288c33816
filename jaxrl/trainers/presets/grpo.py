"""GRPO presets for `experiments/grpo.py`: `--config=experiments/configs/grpo.py[:NAME]`.

- reverse_digits: reverse 3 digits, from random initialisation (no init_from).
- addition: two-digit addition, from an SFT model (`--config.init_from=<sft run>`, made by
  `experiments/sft.py --config=experiments/configs/sft.py:addition`).
- word_problems: SmolLM2-135M-Instruct (init_from "smollm2") on arithmetic word problems from
  data/word_problems.jsonl (`python -m envs.text.word_problems --out=data/word_problems.jsonl
  --num=2000 --difficulty=1 --shots=2`: two worked examples before each problem), rewarded by
  envs.text.math_answers:math_answer_reward; 200 problems held out.
"""

import ml_collections

from jaxrl.config import preset_of
from jaxrl.trainers.presets.lm import prompt_rl_config

PRESETS = {
    # From random init a seed can stall two ways (docs/results.md, "GRPO from random
    # initialisation"): the policy stops writing some digit values (their probability falls to
    # e^-10 where they are the answer, so they are never sampled again), which the uniform KL
    # (the log-barrier regulariser) undoes, as an entropy bonus does not; or it learns a
    # confident wrong copy for some digit pairs. The floored entropy bonus alone left 2 of seeds
    # 0-7 under 0.9, the uniform KL alone (0.05) one; both, the uniform KL at 0.02, none.
    "reverse_digits": dict(
        num_steps=600,
        batch_size=128,
        group_size=16,
        learning_rate=1e-3,
        uniform_kl_coef=0.02,
        entropy_coef=0.5,
        entropy_floor=0.15,
        max_new_tokens=4,
        task=dict(name="reverse_digits", num_digits=3),
    ),
    "addition": dict(
        num_steps=200,
        batch_size=64,
        group_size=8,
        learning_rate=5e-4,
        max_new_tokens=5,
        task=dict(name="addition", num_digits=2),
    ),
    # SmolLM2-135M-Instruct on arithmetic word problems (envs/text/word_problems.py), rewarded
    # by the final number; make the file first (README: "GRPO on a real model"). 12 new tokens
    # hold "14 - 8 = 6" and stop before the model starts a next "Question:" whose numbers the
    # reward would read; micro-batches of 16 completions keep the backward pass near 5 GB.
    # Each group's prompt (two worked examples, about 96 tokens against 12 new ones) runs once
    # per log-prob pass, not once per completion: 1,536 training tokens an update, not 6,912.
    "word_problems": dict(
        num_steps=20,
        batch_size=8,
        group_size=8,
        grad_accum_steps=4,
        max_new_tokens=12,
        shared_prompt=True,
        task=dict(train_jsonl="data/word_problems.jsonl", num_eval=200),
    ),
    # Long-tailed completion lengths (1 to 32 digits, mean 9.8), the task of partial rollouts
    # (--config.rollout_mode=partial --config.rollout_budget=12 --config.max_staleness=2), from
    # an SFT model (`experiments/sft.py --config=experiments/configs/sft.py:repeat_digit`). Its
    # 100 problems hold out 6 by hash.
    "repeat_digit": dict(
        num_steps=200,
        batch_size=16,
        group_size=4,
        learning_rate=1e-4,
        max_new_tokens=34,
        task=dict(name="repeat_digit", num_digits=5, held_out="hash", num_train=94, num_eval=6),
    ),
    # The same with lengths from a few tokens to hundreds: 1 to 256 digits (mean 55.5; the
    # tiny model's positions raised to hold them), from `sft.py:repeat_digit_long`.
    "repeat_digit_long": dict(
        num_steps=200,
        batch_size=16,
        group_size=4,
        learning_rate=1e-4,
        max_new_tokens=258,
        task=dict(name="repeat_digit", num_digits=8, held_out="hash", num_train=94, num_eval=6),
    ),
}
# Presets whose completions outgrow the tiny model's 64 positions: the positions they need.
POSITIONS = {"repeat_digit_long": 272}
# Settings of a preset outside the algorithm's Config: where it starts and how it is rewarded.
PRESET_SETTINGS = {
    "word_problems": dict(
        init_from="smollm2", host="envs.text.math_answers:math_answer_reward", eval_batch_size=40
    ),
}


def get_config(preset: str = "reverse_digits") -> ml_collections.ConfigDict:
    """The preset's config: `algos.grpo.Config` fields, the rollout mode's settings, the LM
    sections, the reward settings and the batch size of the greedy evaluation
    (`eval_batch_size`)."""
    from algos import grpo
    from jaxrl.trainers import rollout_modes

    chosen = preset_of(PRESETS, preset)
    settings = PRESET_SETTINGS.get(preset, {})
    # 25 updates per compiled chunk (a real model: 5).
    chunk = 5 if "init_from" in settings else 25
    config = prompt_rl_config(grpo.Config(), chosen, settings, max(1, chosen["num_steps"] // chunk))
    # How generation meets training: rollout_mode and each mode's settings, flat
    # (`jaxrl.trainers.rollout_modes` makes the rollout object of them).
    config.update(rollout_modes.defaults())
    if preset in POSITIONS:
        config.model.max_position_embeddings = POSITIONS[preset]
    if config.init_from:
        # A real model's update takes a minute or more: log each one (the learning curve) and
        # keep chunks of 5 (a metrics row per 10 updates would merge chunks of 5 into 10).
        config.run.log_every = 1
    return config
