"""SFT presets for `experiments/sft.py`: `--config=experiments/configs/sft.py[:NAME]`."""

import ml_collections

from experiments.configs.lm import lm_config

PRESETS = {
    # Deliberately short: an SFT model that is right on some problems and wrong on many, so DPO
    # has something to improve (raise num_steps for a strong SFT model).
    "reverse_digits": dict(num_steps=150, batch_size=64, learning_rate=3e-3),
    # The starting point of GRPO's addition preset: short on purpose, partly right.
    "addition": dict(
        num_steps=300,
        batch_size=64,
        learning_rate=3e-3,
        task=dict(name="addition", num_digits=2, held_out="hash"),
    ),
}


def get_config(preset: str = "reverse_digits") -> ml_collections.ConfigDict:
    """The preset's config: `algos.sft.Config` fields and the LM sections."""
    from algos import sft
    from jaxrl import runner

    # 50 optimizer steps per compiled chunk.
    chosen = runner.preset_of(PRESETS, preset)
    return lm_config(sft.Config(), chosen, num_chunks=chosen["num_steps"] // 50)
