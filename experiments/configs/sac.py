"""SAC presets for `experiments/sac.py`: `--config=experiments/configs/sac.py:NAME`.

The presets live in the library (`jaxrl.trainers.presets.sac`, what `jaxrl.trainers.sac.config`
returns from Python); this file is the script's `--config` path for them.
"""

from jaxrl.trainers.presets.sac import get_config

__all__ = ["get_config"]
