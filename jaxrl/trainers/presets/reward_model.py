"""Reward-model presets for `experiments/reward_model.py`:
`--config=experiments/configs/reward_model.py[:NAME]`."""

import ml_collections

from jaxrl.config import preset_of
from jaxrl.trainers.presets.lm import lm_config

PRESETS = {
    # The task's synthetic pairs (the right answer chosen over a plausibly wrong one); start from
    # an SFT run (--config.init_from=runs/sft), which already reads the task.
    "reverse_digits": dict(num_steps=200, batch_size=32, learning_rate=3e-4),
}


def get_config(preset: str = "reverse_digits") -> ml_collections.ConfigDict:
    """The preset's config: `algos.reward_model.Config` fields, the LM sections, and the batch
    size of the held-out evaluation (`eval_batch_size`)."""
    from algos import reward_model

    # 50 optimizer steps per compiled chunk.
    chosen = preset_of(PRESETS, preset)
    return lm_config(
        reward_model.Config(), chosen, num_chunks=chosen["num_steps"] // 50, eval_batch_size=256
    )
