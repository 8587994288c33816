"""Deprecated: the Gymnasium and EnvPool environments moved to `envs.external` (and are exported
as `envs.GymnasiumVectorEnv`, `envs.make_vec("gymnasium:...")`, ...); this path still resolves."""

from typing import Any


def __getattr__(name: str) -> Any:
    import warnings

    from envs import external

    if name.startswith("__") or not hasattr(external, name):
        raise AttributeError(f"module 'envs.host' has no attribute {name!r}")
    warnings.warn(
        f"envs.host moved to envs.external; import {name} from there",
        DeprecationWarning,
        stacklevel=2,
    )
    return getattr(external, name)
