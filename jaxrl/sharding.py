"""Device meshes and the rules that map logical axis names onto them.

A mesh has three axes: `data` (replicas that each see part of the batch), `fsdp` (the batch is
split here too, and so is every parameter's "embed" dimension, gathered just in time by XLA) and
`tensor` (heads, MLP features and the vocabulary are split across devices). The model names its
axes logically; `RULES` says which mesh axes each name uses. Changing only the mesh shape turns the
same program into data parallel (n,1,1), FSDP (1,n,1), tensor parallel (1,1,n) or any mix.

Everything here raises `ConfigError` naming the offending field before anything compiles when a
batch or a dimension does not divide its mesh axes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from jaxrl.config import ConfigError

MESH_AXES = ("data", "fsdp", "tensor")
BATCH_AXES = ("data", "fsdp")

# Logical name -> mesh axes. Parameter names first, then activation ("act_*") names. Activations
# keep "embed" whole: the batch is already split over data x fsdp.
RULES: tuple[tuple[str, Any], ...] = (
    ("vocab", "tensor"),
    ("embed", "fsdp"),
    ("heads", "tensor"),
    ("kv_heads", "tensor"),
    ("kv", None),
    ("mlp", "tensor"),
    ("layers", None),
    ("act_batch", BATCH_AXES),
    ("act_length", None),
    ("act_embed", None),
    ("act_heads", "tensor"),
    ("act_kv_heads", "tensor"),
    ("act_mlp", "tensor"),
    ("act_vocab", "tensor"),
)


def make_mesh(
    data: int = 1, fsdp: int = 1, tensor: int = 1, devices: Sequence[Any] | None = None
) -> Mesh:
    """A (data, fsdp, tensor) mesh over the first data*fsdp*tensor devices."""
    shape = (data, fsdp, tensor)
    for name, size in zip(MESH_AXES, shape, strict=True):
        if size < 1:
            raise ConfigError(f"mesh.{name}: must be >= 1, got {size}; give every mesh axis a size")
    devices = list(jax.devices() if devices is None else devices)
    needed = math.prod(shape)
    if needed > len(devices):
        raise ConfigError(
            f"mesh: data*fsdp*tensor = {data}*{fsdp}*{tensor} = {needed} devices, but only "
            f"{len(devices)} are available; shrink the mesh to at most {len(devices)} devices"
        )
    grid = np.array(devices[:needed], dtype=object).reshape(shape)
    return Mesh(grid, MESH_AXES, axis_types=(jax.sharding.AxisType.Auto,) * 3)


def spec(axes: Sequence[str | None], rules: Sequence[tuple[str, Any]] = RULES) -> PartitionSpec:
    """The PartitionSpec for a tuple of logical axis names (unknown names stay unsharded)."""
    table = dict(rules)
    return PartitionSpec(*(table.get(name) if name is not None else None for name in axes))


def _mesh_axes_size(mesh: Mesh, mesh_axes: Any) -> int:
    if mesh_axes is None:
        return 1
    if isinstance(mesh_axes, str):
        mesh_axes = (mesh_axes,)
    return math.prod(mesh.shape[a] for a in mesh_axes)


def shardings(axes_tree: Any, mesh: Mesh, rules: Sequence[tuple[str, Any]] = RULES) -> Any:
    """A NamedSharding for every leaf of a pytree of logical-axis tuples."""
    return jax.tree.map(
        lambda axes: NamedSharding(mesh, spec(axes, rules)),
        axes_tree,
        is_leaf=lambda x: isinstance(x, tuple),
    )


def check_divisible(
    shapes: Any,
    axes_tree: Any,
    mesh: Mesh,
    rules: Sequence[tuple[str, Any]] = RULES,
    what: str = "params",
) -> None:
    """Raise ConfigError naming the first array dimension its mesh axes do not divide."""
    leaves = jax.tree_util.tree_leaves_with_path(shapes)
    axes_leaves = jax.tree.leaves(axes_tree, is_leaf=lambda x: isinstance(x, tuple))
    table = dict(rules)
    for (path, leaf), axes in zip(leaves, axes_leaves, strict=True):
        for dim, name in zip(np.shape(leaf), axes, strict=True):
            size = _mesh_axes_size(mesh, table.get(name) if name else None)
            if dim % size:
                field = f"{what}{jax.tree_util.keystr(path)}"
                raise ConfigError(
                    f"{field}: dimension '{name}' has size {dim}, which the mesh axes "
                    f"{table.get(name)} (size {size}) do not divide; choose a mesh whose "
                    f"{table.get(name)} size divides {dim}, or a model whose {name} size is a "
                    f"multiple of {size}"
                )


def batch_size_per_shard(mesh: Mesh) -> int:
    """The number of batch shards (data x fsdp): every batch size must be a multiple of it.
    (Despite the name, not the number of examples each shard holds.)"""
    return _mesh_axes_size(mesh, BATCH_AXES)


def check_batch(batch_size: int, mesh: Mesh, field: str = "batch_size") -> None:
    """The batch is split over data x fsdp: it must divide evenly."""
    shards = batch_size_per_shard(mesh)
    if batch_size % shards:
        raise ConfigError(
            f"{field}: {batch_size} does not divide over the mesh's data*fsdp = {shards} "
            f"batch shards; use a multiple of {shards}"
        )


def batch_sharding(mesh: Mesh, ndim: int = 2) -> NamedSharding:
    """Leading (batch) dimension split over data x fsdp; the rest replicated."""
    return NamedSharding(mesh, PartitionSpec(BATCH_AXES, *([None] * (ndim - 1))))


def constrain_batch(tree: Any, mesh: Mesh | None) -> Any:
    """Inside a jitted function: every array of `tree` split over the mesh along its leading
    (batch) axis, `batch_sharding`; unchanged without a mesh."""
    if mesh is None:
        return tree
    return jax.tree.map(
        lambda x: jax.lax.with_sharding_constraint(x, batch_sharding(mesh, x.ndim)), tree
    )


def replicated(mesh: Mesh) -> NamedSharding:
    """A full copy on every device of `mesh`."""
    return NamedSharding(mesh, PartitionSpec())


def shard_batch(batch: Any, mesh: Mesh) -> Any:
    """Place a pytree of host arrays with their leading dimension split over the batch axes."""
    return jax.tree.map(lambda x: jax.device_put(x, batch_sharding(mesh, np.ndim(x))), batch)


def bytes_per_device(tree: Any) -> dict[Any, int]:
    """Bytes each device holds of a pytree of (possibly sharded) jax arrays."""
    totals: dict[Any, int] = {}
    for leaf in jax.tree.leaves(tree):
        for shard in leaf.addressable_shards:
            totals[shard.device] = totals.get(shard.device, 0) + shard.data.nbytes
    return totals
