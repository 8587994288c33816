"""Reward-model presets for `experiments/reward_model.py`:
`--config=experiments/configs/reward_model.py[:NAME]`.

The presets live in the library (`jaxrl.trainers.presets.reward_model`, what
`jaxrl.trainers.reward_model.config` returns from Python); this file is the script's `--config` path
for them.
"""

from jaxrl.trainers.presets.reward_model import get_config

__all__ = ["get_config"]
