"""DPO presets for `experiments/dpo.py`: `--config=experiments/configs/dpo.py[:NAME]`."""

import ml_collections

from jaxrl.config import preset_of
from jaxrl.trainers.presets.lm import lm_config

PRESETS = {
    "reverse_digits": dict(num_steps=300, batch_size=32, learning_rate=5e-4, beta=0.5),
}


def get_config(preset: str = "reverse_digits") -> ml_collections.ConfigDict:
    """The preset's config: `algos.dpo.Config` fields, the LM sections, and the batch size of the
    reference and evaluation passes (`eval_batch_size`)."""
    from algos import dpo

    # 50 optimizer steps per compiled chunk.
    chosen = preset_of(PRESETS, preset)
    return lm_config(
        dpo.Config(), chosen, num_chunks=chosen["num_steps"] // 50, eval_batch_size=256
    )
