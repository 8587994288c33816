"""JAX environments: a registry over gymnax and MJX locomotion, plus the wrappers training needs.

env = envs.make("CartPole-v1")                      # single env, no auto-reset
venv = envs.make_vec("CartPole-v1", num_envs=64)     # auto-reset, stats, vectorised
env = envs.make("HalfCheetah-v5")                   # MuJoCo via MJX: pip install "jaxrl[mujoco]"
venv = envs.make_vec("gymnasium:CartPole-v1", 8)    # Gymnasium on the host, through io_callback
venv = envs.make_vec("envpool:Pong-v5", 8)           # EnvPool's C++ pool, the same way

This file is the one list of the names `envs` exports and of the module each lives in; a name's
module is imported when the name is first used: gymnax imports seaborn, scipy and pandas, seconds
at every start, and the language-model side (`envs.text`) needs none of it.
"""

from __future__ import annotations

# isort: off
# Importing jaxrl joins JAX's multi-host runtime when JAXRL_DISTRIBUTED=1 (jaxrl.distributed),
# which must happen before anything computes, and gymnax computes on import. It sets no XLA flags.
import jaxrl  # noqa: F401
# isort: on

from jaxrl import lazy

# {public name: the module of `envs` that defines it}
_MODULES = {
    "GymnaxEnv": "core",
    "StepResult": "core",
    "Wrapper": "core",
    "action_dim": "core",
    "is_discrete": "core",
    "EnvPoolVectorEnv": "external",
    "GymnasiumVectorEnv": "external",
    "HostEnvState": "external",
    "is_host_env": "external",
    "HalfCheetah": "mujoco",
    "Hopper": "mujoco",
    "MujocoEnv": "mujoco",
    "MujocoState": "mujoco",
    "make": "registry",
    "make_eval": "registry",
    "make_vec": "registry",
    "observation_shape": "registry",
    "parse_env_options": "registry",
    "registered": "registry",
    "require_jax_env": "registry",
    "require_options": "registry",
    "require_registered": "registry",
    "AutoReset": "wrappers",
    "ClipAction": "wrappers",
    "EpisodeStatistics": "wrappers",
    "EpisodeStatisticsState": "wrappers",
    "NormalizeObservation": "wrappers",
    "NormalizeObservationState": "wrappers",
    "NormalizeReward": "wrappers",
    "RunningMeanStd": "wrappers",
    "Vectorize": "wrappers",
    "find_state": "wrappers",
    "with_reward_discount": "wrappers",
}

__all__ = sorted(_MODULES)

__getattr__, __dir__ = lazy.exports(__name__, _MODULES)
