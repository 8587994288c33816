"""Multi-agent PPO presets for `experiments/mappo.py`: `--config=experiments/configs/mappo.py:NAME`.

The presets live in the library (`jaxrl.trainers.presets.mappo`, what `jaxrl.trainers.mappo.config`
returns from Python); this file is the script's `--config` path for them.
"""

from jaxrl.trainers.presets.mappo import get_config

__all__ = ["get_config"]
