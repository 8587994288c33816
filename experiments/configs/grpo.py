"""GRPO presets for `experiments/grpo.py`: `--config=experiments/configs/grpo.py[:NAME]`.

The presets live in the library (`jaxrl.trainers.presets.grpo`, what `jaxrl.trainers.grpo.config`
returns from Python); this file is the script's `--config` path for them.
"""

from jaxrl.trainers.presets.grpo import get_config

__all__ = ["get_config"]
