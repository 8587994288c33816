"""The control environments' registry: names over gymnax, MJX locomotion and the host
environments of other libraries (`envs.external`), made into the single environments and the
training and evaluation stacks. `envs` exports these functions (`envs.make`, `envs.make_vec`, ...)
and imports this module when one is first used."""

from __future__ import annotations

import ast
import dataclasses
import difflib
from typing import Any

import gymnax

from envs import mujoco as _mujoco
from envs.core import GymnaxEnv, Wrapper
from envs.external import GymnasiumVectorEnv, is_host_env, make_host_env
from envs.mujoco import MujocoEnv
from envs.wrappers import (
    AutoReset,
    ClipAction,
    EpisodeStatistics,
    NormalizeObservation,
    NormalizeReward,
    Vectorize,
)
from jaxrl.config import ConfigError


def registered() -> list[str]:
    """All environment names `make` accepts: gymnax's, and the MuJoCo ones when mujoco-mjx is
    installed (the optional extra `jaxrl[mujoco]`)."""
    names = list(gymnax.registered_envs)
    if _mujoco.mjx_available():
        names += list(_mujoco.ENVIRONMENTS)
    return names


def make(name: str, **env_params: Any) -> GymnaxEnv | MujocoEnv | GymnasiumVectorEnv:
    """Build one environment by name; keyword arguments override its gymnax `EnvParams` fields
    (MuJoCo environments: their Gymnasium v5 constructor arguments, e.g. `ctrl_cost_weight`).

    A host environment (`gymnasium:<id>`, `envs.external`) is always batched and auto-resetting:
    this returns one copy, whose spaces and time limit describe it; `make_vec` builds the training
    set.
    An unknown name raises a ValueError listing the closest registered names; a MuJoCo name without
    the `mujoco` extra installed raises an ImportError saying what to install.
    """
    if is_host_env(name):
        return make_host_env(name, 1, **env_params)
    if name in _mujoco.ENVIRONMENTS:
        if not _mujoco.mjx_available():
            raise ImportError(f"{name} is simulated with MJX. {_mujoco.INSTALL_HINT}")
        return _mujoco.make(name, **env_params)
    names = registered()
    if name not in names:
        close = difflib.get_close_matches(name, names, n=5, cutoff=0.4)
        hint = f" Did you mean: {', '.join(close)}?" if close else ""
        raise ValueError(
            f"Unknown environment {name!r}.{hint} See envs.registered() for all {len(names)} names."
        )
    gymnax_env, params = gymnax.make(name)
    if env_params:
        fields = {f.name for f in dataclasses.fields(params)}
        unknown = sorted(set(env_params) - fields)
        if unknown:
            raise ValueError(
                f"Environment {name!r} has no parameter(s) {unknown}; its parameters are "
                f"{sorted(fields)}."
            )
        params = params.replace(**env_params)
    return GymnaxEnv(name, gymnax_env, params)


def observation_shape(name: str, options: str = "", field: str = "env_name") -> tuple[int, ...]:
    """The observation shape of `name` made with a config's `options` string
    (`parse_env_options`), or a `ConfigError` naming `field` saying why it cannot be made. Configs
    are validated often and a host environment's probe starts a simulator, so each host
    environment is made once per process for each options string."""
    key = (name, options)
    if key in _host_observation_shapes:
        return _host_observation_shapes[key]
    try:
        shape = tuple(make(name, **parse_env_options(options, field)).observation_space.shape)
    except (ValueError, TypeError, ImportError) as error:
        raise ConfigError(f"{field}: {error}") from None
    if is_host_env(name):
        _host_observation_shapes[key] = shape
    return shape


_host_observation_shapes: dict[tuple[str, str], tuple[int, ...]] = {}


def require_registered(name: str, field: str = "env_name") -> None:
    """Raise a `ConfigError` naming `field` and the closest registered names unless `make(name)`
    would succeed (what every algorithm's Config checks)."""
    if name not in registered():
        observation_shape(name, field=field)


def require_jax_env(name: str, algorithm: str, field: str = "env_name") -> None:
    """Raise a `ConfigError` if `name` is a host environment: `algorithm` needs a JAX one."""
    if is_host_env(name):
        raise ConfigError(
            f"{field}: {name!r} is a host (Gymnasium or EnvPool) environment, which {algorithm} "
            f"cannot run yet; use PPO (algos.ppo) for host environments, or a JAX environment from "
            f"envs.registered()"
        )


def make_vec(
    name: str,
    num_envs: int,
    *,
    normalize_observation: bool = False,
    normalize_reward: bool = False,
    gamma: float = 0.99,
    **env_params: Any,
) -> Wrapper:
    """The standard training stack: clipped actions, auto-reset, episode stats, `num_envs` copies,
    and optional observation / reward normalisation (`gamma`: the reward normaliser's initial
    discount; `with_reward_discount` sets a run's own on its state)."""
    env: Any
    if is_host_env(name):
        # Already batched and auto-resetting on the host: statistics count over the batch.
        env = make_host_env(name, num_envs, **env_params)
        env = EpisodeStatistics(ClipAction(env), batch_shape=(num_envs,))
    else:
        env = EpisodeStatistics(AutoReset(ClipAction(make(name, **env_params))))
        env = Vectorize(env, num_envs)
    if normalize_observation:
        env = NormalizeObservation(env)
    if normalize_reward:
        env = NormalizeReward(env, gamma)
    return env


def make_eval(name: str, num_episodes: int, **env_params: Any) -> Any:
    """What `jaxrl.evaluation.evaluate_episodes` plays `num_episodes` fresh episodes of: a single
    JAX environment with clipped actions (the episodes are vmapped), or for a host environment a
    batch of `num_episodes` copies (`batched`), each of whose first episodes counts."""
    if is_host_env(name):
        return ClipAction(make_host_env(name, num_episodes, **env_params))
    return ClipAction(make(name, **env_params))


def parse_env_options(text: str, field: str = "env_options") -> dict[str, Any]:
    """The environment options of a config's `"name=value,..."` string (e.g. EnvPool Atari's
    `"episodic_life=True,reward_clip=True"`): values are Python literals, or else strings. A
    malformed item raises a `ConfigError` naming `field`."""
    options: dict[str, Any] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, equals, value = item.partition("=")
        if not equals or not name.strip().isidentifier():
            raise ConfigError(
                f"{field}: {item!r} is not name=value; write e.g. "
                f"'episodic_life=True,reward_clip=True'"
            )
        try:
            options[name.strip()] = ast.literal_eval(value.strip())
        except (ValueError, SyntaxError):
            options[name.strip()] = value.strip()
    return options


def require_options(name: str, text: str, field: str = "env_options") -> None:
    """Raise a `ConfigError` naming `field` unless `name` can be made with the options `text`
    (`parse_env_options`): an option the environment lacks would otherwise be ignored."""
    if parse_env_options(text, field):
        observation_shape(name, text, field)
