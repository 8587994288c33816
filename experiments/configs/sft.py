"""SFT presets for `experiments/sft.py`: `--config=experiments/configs/sft.py[:NAME]`.

The presets live in the library (`jaxrl.trainers.presets.sft`, what `jaxrl.trainers.sft.config`
returns from Python); this file is the script's `--config` path for them.
"""

from jaxrl.trainers.presets.sft import get_config

__all__ = ["get_config"]
