"""DPO presets for `experiments/dpo.py`: `--config=experiments/configs/dpo.py[:NAME]`.

The presets live in the library (`jaxrl.trainers.presets.dpo`, what `jaxrl.trainers.dpo.config`
returns from Python); this file is the script's `--config` path for them.
"""

from jaxrl.trainers.presets.dpo import get_config

__all__ = ["get_config"]
