"""PPO (RLHF) presets for `experiments/ppo_lm.py`:
`--config=experiments/configs/ppo_lm.py[:NAME]`.

The presets live in the library (`jaxrl.trainers.presets.ppo_lm`, what
`jaxrl.trainers.ppo_lm.config` returns from Python); this file is the script's `--config` path
for them.
"""

from jaxrl.trainers.presets.ppo_lm import get_config

__all__ = ["get_config"]
