"""SFT presets for `experiments/sft.py`: `--config=experiments/configs/sft.py[:NAME]`."""

import ml_collections

from experiments.configs.lm import with_sections

PRESETS = {
    # Deliberately short: an SFT model that is right on some problems and wrong on many, so DPO
    # has something to improve (raise num_steps for a strong SFT model).
    "reverse_digits": dict(num_steps=150, batch_size=64, learning_rate=3e-3),
    # The starting point of GRPO's addition preset: short on purpose, partly right.
    "addition": dict(num_steps=300, batch_size=64, learning_rate=3e-3),
}
TASKS = {"addition": dict(name="addition", num_digits=2, held_out="hash")}


def get_config(preset: str = "reverse_digits") -> ml_collections.ConfigDict:
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; choose one of {sorted(PRESETS)}")
    from algos import sft

    config = with_sections({**sft.Config().__dict__, **PRESETS[preset]})
    config.task.update(TASKS.get(preset, {}))
    return config
