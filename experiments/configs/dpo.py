"""DPO presets for `experiments/dpo.py`: `--config=experiments/configs/dpo.py[:NAME]`."""

import ml_collections

from experiments.configs.lm import with_sections

PRESETS = {
    "reverse_digits": dict(num_steps=300, batch_size=32, learning_rate=5e-4, beta=0.5),
}


def get_config(preset: str = "reverse_digits") -> ml_collections.ConfigDict:
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; choose one of {sorted(PRESETS)}")
    from algos import dpo

    config = with_sections({**dpo.Config().__dict__, **PRESETS[preset]})
    config.eval_batch_size = 256
    return config
