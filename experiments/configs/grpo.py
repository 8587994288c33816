"""GRPO presets for `experiments/grpo.py`: `--config=experiments/configs/grpo.py[:NAME]`.

- reverse_digits: reverse 3 digits, from random initialisation (no init_from).
- addition: two-digit addition, from an SFT model (`--config.init_from=<sft run>`, made by
  `experiments/sft.py --config=experiments/configs/sft.py:addition`).
"""

import ml_collections

from experiments.configs.lm import lm_config

PRESETS = {
    "reverse_digits": dict(
        num_steps=300,
        batch_size=128,
        group_size=16,
        learning_rate=1e-3,
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
}


def get_config(preset: str = "reverse_digits") -> ml_collections.ConfigDict:
    """The preset's config: `algos.grpo.Config` fields, the LM sections, the reward settings and
    the batch size of the greedy evaluation (`eval_batch_size`)."""
    from algos import grpo
    from jaxrl import runner

    rewards = ml_collections.ConfigDict(
        dict(
            # weight of the format reward (digits, then EOS) next to the task's answer reward
            format_weight=0.0,
            # optional host Python reward "module.path:function", called as
            # f(prompts, completions, answer=[...]) -> list[float] through io_callback
            host="",
            host_weight=1.0,
        )
    )
    # 25 updates per compiled chunk.
    chosen = runner.preset_of(PRESETS, preset)
    return lm_config(
        grpo.Config(),
        chosen,
        num_chunks=chosen["num_steps"] // 25,
        rewards=rewards,
        eval_batch_size=256,
    )
