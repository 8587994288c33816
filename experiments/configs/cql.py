"""CQL presets for `experiments/cql.py`: `--config=experiments/configs/cql.py:NAME`.

The presets live in the library (`jaxrl.trainers.presets.cql`, what `jaxrl.trainers.cql.config`
returns from Python); this file is the script's `--config` path for them.
"""

from jaxrl.trainers.presets.cql import get_config

__all__ = ["get_config"]
