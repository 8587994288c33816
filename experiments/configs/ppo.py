"""PPO presets for `experiments/ppo.py`: `--config=experiments/configs/ppo.py:NAME`.

The presets live in the library (`jaxrl.trainers.presets.ppo`, what `jaxrl.trainers.ppo.config`
returns from Python); this file is the script's `--config` path for them.
"""

from jaxrl.trainers.presets.ppo import get_config

__all__ = ["get_config"]
