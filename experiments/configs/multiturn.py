"""Multi-turn RL presets for `experiments/multiturn.py`:
`--config=experiments/configs/multiturn.py[:NAME]`.

The presets live in the library (`jaxrl.trainers.presets.multiturn`, what
`jaxrl.trainers.multiturn.config` returns from Python); this file is the script's `--config` path
for them.
"""

from jaxrl.trainers.presets.multiturn import get_config

__all__ = ["get_config"]
