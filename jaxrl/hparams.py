"""Hyper-parameters that may vary inside one compiled program, declared once on each `Config`.

An algorithm's frozen `Config` marks the fields that may differ between the runs of one program
(learning rates, entropy coefficient, clip range, gamma, lambda, KL beta, ...) with `swept(...)`.
Everything else is static: it shapes the program (network sizes, batch sizes, flags). Then

    hp = hparams(config)                                   # every swept field as a float32 scalar
    hp = sweep(config, learning_rate=[1e-3, 3e-4], gamma=[0.99, 0.999])   # leading axis of 4

are the same for every algorithm, and `jax.vmap` over the leading axis makes a sweep one program.

A swept field is read only from the `HParams` inside the program, never from the config: the
algorithm constructors hold `static(config)`, which refuses to hand out a swept field, so a sweep
cannot be half applied (one part of the program reading the swept value, another the config's).
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterator, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl.config import ConfigError

_SWEPT = "swept"


def swept(default: float, **field_options: Any) -> Any:
    """A `Config` field that may vary inside one program: it reaches the program as an `HParams`
    leaf (float32), so `sweep` can give every run its own value."""
    metadata = {**field_options.pop("metadata", {}), _SWEPT: True}
    return dataclasses.field(default=default, metadata=metadata, **field_options)


def swept_fields(config: Any) -> tuple[str, ...]:
    """Names of the config's swept fields, in declaration order."""
    return tuple(f.name for f in dataclasses.fields(config) if f.metadata.get(_SWEPT, False))


@jax.tree_util.register_pytree_with_keys_class
class HParams(Mapping):
    """Named float32 arrays: the swept fields of one config (scalars), or of many runs (a leading
    runs axis). A pytree, so it passes through `jit`/`vmap`; fields read as attributes."""

    def __init__(self, values: Mapping[str, Any]):
        object.__setattr__(self, "_values", dict(values))

    def __getattr__(self, name: str) -> Any:
        try:
            return self._values[name]
        except KeyError:
            raise AttributeError(
                f"{name!r} is not a swept hyper-parameter; swept: {sorted(self._values)}"
            ) from None

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("HParams is immutable; use .replace(name=value)")

    def __getitem__(self, name: str) -> Any:
        return self._values[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __repr__(self) -> str:
        return f"HParams({self._values!r})"

    def replace(self, **values: Any) -> HParams:
        """A copy with the given fields replaced."""
        unknown = sorted(set(values) - set(self._values))
        if unknown:
            raise AttributeError(f"{unknown} are not swept hyper-parameters")
        return HParams({**self._values, **values})

    def tree_flatten_with_keys(self):
        names = sorted(self._values)
        children = [(jax.tree_util.GetAttrKey(n), self._values[n]) for n in names]
        return children, tuple(names)

    @classmethod
    def tree_unflatten(cls, names, children):
        return cls(dict(zip(names, children, strict=True)))


def hparams(config: Any) -> HParams:
    """The config's swept fields as float32 scalars (no runs axis)."""
    return HParams({name: jnp.float32(getattr(config, name)) for name in swept_fields(config)})


def sweep(config: Any, **grid: Any) -> HParams:
    """`HParams` with a leading axis over every combination (outer product) of the given values,
    in row-major order of the arguments; fields not named keep the config's value.

    `sweep(config, learning_rate=[1e-3, 3e-4], ent_coef=[0.0, 0.01])` has 4 entries. Each value
    is checked by the config's own validation, so a sweep cannot reach a value the config refuses.
    """
    names = swept_fields(config)
    unknown = sorted(set(grid) - set(names))
    if unknown:
        raise ConfigError(
            f"sweep: {unknown} are not swept fields of {type(config).__name__}; "
            f"choose among {list(names)}"
        )
    points = list(itertools.product(*[np.atleast_1d(v).tolist() for v in grid.values()]))
    for point in points:  # validate each point as a config of its own
        dataclasses.replace(config, **dict(zip(grid, point, strict=True)))
    base = hparams(config)
    columns = {
        name: jnp.asarray([point[i] for point in points], jnp.float32)
        for i, name in enumerate(grid)
    }
    size = len(points)
    return HParams(
        {name: columns.get(name, jnp.broadcast_to(base[name], (size,))) for name in names}
    )


def repeat(hp: HParams, num_runs: int) -> HParams:
    """`hp` of one config repeated along a new leading runs axis (e.g. one per seed)."""
    return jax.tree.map(lambda x: jnp.broadcast_to(x, (num_runs, *jnp.shape(x))), hp)


def num_runs(hp: HParams) -> int:
    """The length of the leading runs axis of a swept `HParams`."""
    leaves = jax.tree.leaves(hp)
    return int(jnp.shape(leaves[0])[0]) if leaves else 1


class StaticConfig:
    """A read-only view of a config without its swept fields: what the algorithm constructors
    close over. Reading a swept field from it raises, naming the field, so the program can only
    take that value from its `HParams` argument."""

    def __init__(self, config: Any):
        object.__setattr__(self, "_config", config)
        object.__setattr__(self, "_swept", frozenset(swept_fields(config)))

    def __getattr__(self, name: str) -> Any:
        if name in self._swept:
            raise AttributeError(
                f"{type(self._config).__name__}.{name} is swept: inside the program read it "
                f"from hparams, not from the config"
            )
        return getattr(self._config, name)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("configs are frozen")

    @property
    def config(self) -> Any:
        """The full config (swept fields included), for code outside the program."""
        return self._config

    def __hash__(self) -> int:
        return hash(self._config)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, StaticConfig) and other._config == self._config


def static(config: Any) -> StaticConfig:
    """`config` without its swept fields (idempotent)."""
    return config if isinstance(config, StaticConfig) else StaticConfig(config)
