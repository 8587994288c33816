"""JAX environments: a registry over gymnax and MJX locomotion, plus the wrappers training needs.

env = envs.make("CartPole-v1")                      # single env, no auto-reset
venv = envs.make_vec("CartPole-v1", num_envs=64)     # auto-reset, stats, vectorised
env = envs.make("HalfCheetah-v5")                   # MuJoCo via MJX: pip install "jaxrl[mujoco]"
venv = envs.make_vec("gymnasium:CartPole-v1", 8)    # Gymnasium on the host, through io_callback
venv = envs.make_vec("envpool:Pong-v5", 8)           # EnvPool's C++ pool, the same way

The names below live in `envs.registry`, imported when one is first used: gymnax imports
seaborn, scipy and pandas, seconds at every start, and the language-model side (`envs.text`)
needs none of it.
"""

from __future__ import annotations

# isort: off
import jaxrl  # noqa: F401  sets XLA CPU runtime flags; must precede gymnax, which computes on import
# isort: on

from typing import Any

__all__ = [
    "AutoReset",
    "ClipAction",
    "EpisodeStatistics",
    "EpisodeStatisticsState",
    "EnvPoolVectorEnv",
    "GymnasiumVectorEnv",
    "GymnaxEnv",
    "HostEnvState",
    "HalfCheetah",
    "Hopper",
    "MujocoEnv",
    "MujocoState",
    "NormalizeObservation",
    "NormalizeObservationState",
    "NormalizeReward",
    "RunningMeanStd",
    "StepResult",
    "Vectorize",
    "Wrapper",
    "action_dim",
    "find_state",
    "is_discrete",
    "is_host_env",
    "make",
    "make_eval",
    "make_vec",
    "observation_shape",
    "parse_env_options",
    "with_reward_discount",
    "registered",
    "require_jax_env",
    "require_options",
    "require_registered",
]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from envs import registry

        return getattr(registry, name)
    raise AttributeError(f"module 'envs' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
