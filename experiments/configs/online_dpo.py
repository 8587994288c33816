"""Online DPO presets for `experiments/online_dpo.py`:
`--config=experiments/configs/online_dpo.py[:NAME]`.

The presets live in the library (`jaxrl.trainers.presets.online_dpo`, what
`jaxrl.trainers.online_dpo.config` returns from Python); this file is the script's `--config` path
for them.
"""

from jaxrl.trainers.presets.online_dpo import get_config

__all__ = ["get_config"]
