"""GRPO presets for `experiments/grpo.py`: `--config=experiments/configs/grpo.py[:NAME]`.

- reverse_digits: reverse 3 digits, from random initialisation (no init_from).
- addition: two-digit addition, from an SFT model (`--config.init_from=<sft run>`, made by
  `experiments/sft.py --config=experiments/configs/sft.py:addition`).
"""

import ml_collections

from experiments.configs.lm import with_sections

PRESETS = {
    "reverse_digits": dict(
        algo=dict(
            num_steps=300, batch_size=128, group_size=16, learning_rate=1e-3, max_new_tokens=4
        ),
        task=dict(name="reverse_digits", num_digits=3),
    ),
    "addition": dict(
        algo=dict(num_steps=200, batch_size=64, group_size=8, learning_rate=5e-4, max_new_tokens=5),
        task=dict(name="addition", num_digits=2),
    ),
}


def get_config(preset: str = "reverse_digits") -> ml_collections.ConfigDict:
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; choose one of {sorted(PRESETS)}")
    from algos import grpo

    config = with_sections({**grpo.Config().__dict__, **PRESETS[preset]["algo"]})
    config.task.update(PRESETS[preset]["task"])
    config.rewards = ml_collections.ConfigDict(
        dict(
            # weight of the format reward (digits, then EOS) next to the task's answer reward
            format_weight=0.0,
            # optional host Python reward "module.path:function", called as
            # f(prompts, completions, answer=[...]) -> list[float] through io_callback
            host="",
            host_weight=1.0,
        )
    )
    config.run.steps_per_chunk = 25
    config.eval_batch_size = 256
    return config
