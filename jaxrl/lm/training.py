"""What SFT, DPO and GRPO share: the optimizer, sequence log-probs, gradient accumulation, and a
compiled chunk of optimizer steps with metrics streamed to the host from inside the program.

A loss here is `loss_fn(params, micro_batch) -> (scalar, metrics dict)`. `make_train_chunk` turns
it into one jit-able function that runs K optimizer steps over K stacked batches with `lax.scan`,
each step averaging gradients over `grad_accum_steps` micro-batches (another scan), so K steps cost
one host dispatch. Params and optimizer state keep the shardings they were placed with.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxrl import sharding
from jaxrl.config import require, require_positive
from jaxrl.lm.model import Transformer, token_log_probs

Array = jax.Array
# loss_fn(params, micro_batch, extra) -> (scalar loss, metrics); `extra` is whatever the chunk
# was called with besides the batches (DPO passes the reference parameters), often None.
LossFn = Callable[[Any, dict[str, Array], Any], tuple[Array, dict[str, Array]]]


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """Optimisation settings every language-model algorithm shares."""

    learning_rate: float = 1e-4  # constant after the warmup
    warmup_steps: int = 0  # linear warmup from 0 to learning_rate over this many steps
    weight_decay: float = 0.0  # AdamW's decoupled weight decay
    max_grad_norm: float = 1.0  # global gradient-norm clip
    batch_size: int = 8  # sequences (SFT) or preference pairs (DPO) per optimizer step
    grad_accum_steps: int = 1  # the batch is processed in this many micro-batches
    num_steps: int = 200  # optimizer steps in the run
    mesh_shape: tuple[int, int, int] = (1, 1, 1)  # (data, fsdp, tensor)

    def __post_init__(self) -> None:
        require_positive(
            self, "learning_rate", "batch_size", "grad_accum_steps", "num_steps", "max_grad_norm"
        )
        require(self.warmup_steps >= 0, "warmup_steps", f"got {self.warmup_steps}", "use 0 or more")
        require(
            self.batch_size % self.grad_accum_steps == 0,
            "grad_accum_steps",
            f"{self.grad_accum_steps} does not divide batch_size={self.batch_size}",
            "choose grad_accum_steps dividing batch_size",
        )
        shards = check_mesh_shape(self.mesh_shape)
        micro = self.batch_size // self.grad_accum_steps
        require(
            micro % shards == 0,
            "batch_size",
            f"micro-batch {micro} (batch_size / grad_accum_steps) does not split over the mesh's "
            f"data*fsdp = {shards} batch shards",
            f"make batch_size / grad_accum_steps a multiple of {shards}",
        )

    @property
    def micro_batch_size(self) -> int:
        """Rows per micro-batch: batch_size // grad_accum_steps."""
        return self.batch_size // self.grad_accum_steps

    def optimizer(self) -> optax.GradientTransformation:
        """`make_optimizer` with this config's settings."""
        return make_optimizer(
            self.learning_rate, self.warmup_steps, self.weight_decay, self.max_grad_norm
        )


def check_mesh_shape(mesh_shape: tuple[int, int, int]) -> int:
    """Validate a (data, fsdp, tensor) mesh shape; return its number of batch shards."""
    require(
        len(mesh_shape) == 3 and all(int(n) >= 1 for n in mesh_shape),
        "mesh_shape",
        f"got {mesh_shape}",
        "give three sizes >= 1: (data, fsdp, tensor)",
    )
    return mesh_shape[0] * mesh_shape[1]


class TrainState(NamedTuple):
    """Optimizer steps taken (a scalar int32 array), the parameters and the optimizer state."""

    step: Array
    params: Any
    opt_state: Any


def make_optimizer(
    learning_rate: float,
    warmup_steps: int = 0,
    weight_decay: float = 0.0,
    max_grad_norm: float = 1.0,
) -> optax.GradientTransformation:
    """AdamW after global-norm clipping, with an optional linear warmup to a constant rate."""
    schedule = optax.constant_schedule(learning_rate)
    if warmup_steps > 0:
        warmup = optax.linear_schedule(0.0, learning_rate, warmup_steps)
        schedule = optax.join_schedules([warmup, schedule], [warmup_steps])
    return optax.chain(
        optax.clip_by_global_norm(max_grad_norm),
        optax.adamw(schedule, weight_decay=weight_decay),
    )


def init_state(
    params: Any, optimizer: optax.GradientTransformation, mesh: Any = None
) -> TrainState:
    """Optimizer moments are created like the parameters, so they inherit their shardings; with a
    mesh, the scalars (step, Adam's count) are replicated over it so every leaf lives on it."""
    state = TrainState(
        step=jnp.zeros((), jnp.int32), params=params, opt_state=optimizer.init(params)
    )
    if mesh is None:
        return state
    on_mesh = set(mesh.devices.flat)
    return jax.tree.map(
        lambda x: (
            x if x.sharding.device_set == on_mesh else jax.device_put(x, sharding.replicated(mesh))
        ),
        state,
    )


def sequence_log_probs(
    model: Transformer, params: Any, tokens: Array, attention_mask: Array, loss_mask: Array
) -> tuple[Array, Array]:
    """Summed log-prob of the `loss_mask` tokens of each sequence, and how many there are.
    tokens/masks: [B, L] right-padded; returns ([B], [B])."""
    logits, _ = model.apply({"params": params}, tokens, None, attention_mask)
    per_token = token_log_probs(logits, tokens) * loss_mask
    return per_token.sum(axis=-1), loss_mask.sum(axis=-1).astype(jnp.float32)


def split_micro_batches(
    batch: dict[str, np.ndarray], grad_accum_steps: int
) -> dict[str, np.ndarray]:
    """[B, ...] -> [grad_accum_steps, B / grad_accum_steps, ...]."""
    return jax.tree.map(
        lambda x: x.reshape(grad_accum_steps, x.shape[0] // grad_accum_steps, *x.shape[1:]), batch
    )


def make_train_step(
    loss_fn: LossFn, optimizer: optax.GradientTransformation
) -> Callable[..., tuple[TrainState, dict[str, Array]]]:
    """`step(state, batch, extra=None) -> (state, metrics)`: one optimizer step over a batch
    shaped [grad_accum_steps, micro_batch, ...], gradients averaged over the micro-batches.

    `metrics` are scalars: the loss function's metrics and `loss` averaged over the micro-batches,
    plus `grad_norm` of the averaged gradient.
    """
    grad_fn = jax.value_and_grad(loss_fn, has_aux=True)

    def step(state: TrainState, batch: dict[str, Array], extra: Any = None):
        def accumulate(grads_sum, micro_batch):
            (loss, metrics), grads = grad_fn(state.params, micro_batch, extra)
            grads_sum = jax.tree.map(jnp.add, grads_sum, grads)
            return grads_sum, dict(metrics, loss=loss)

        zeros = jax.tree.map(jnp.zeros_like, state.params)
        grads_sum, metrics = jax.lax.scan(accumulate, zeros, batch)
        accum = jax.tree.leaves(batch)[0].shape[0]
        grads = jax.tree.map(lambda g: g / accum, grads_sum)
        updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        metrics = jax.tree.map(jnp.mean, metrics)
        metrics["grad_norm"] = optax.tree.norm(grads)
        return TrainState(state.step + 1, params, opt_state), metrics

    return step


def make_train_chunk(
    loss_fn: LossFn,
    optimizer: optax.GradientTransformation,
    callback: Callable[[Any, dict[str, Any]], None] | None = None,
) -> Callable[..., tuple[TrainState, dict[str, Array]]]:
    """`chunk(state, batches, extra=None) -> (state, metrics)`: K optimizer steps over batches
    stacked [K, grad_accum_steps, micro_batch, ...]; each metric has shape [K]. The metrics of
    every step also go to `callback(step, metrics)` on the host as they are computed."""
    step_fn = make_train_step(loss_fn, optimizer)

    def chunk(state: TrainState, batches: dict[str, Array], extra: Any = None):
        def one_step(state, batch):
            state, metrics = step_fn(state, batch, extra)
            if callback is not None:
                jax.debug.callback(callback, state.step, metrics)
            return state, metrics

        return jax.lax.scan(one_step, state, batches)

    return chunk


def chunk_sharding(mesh: Any, ndim: int) -> Any:
    """Stacked batches [K, accum, micro_batch, ...]: the micro-batch axis splits over the mesh."""
    spec = jax.sharding.PartitionSpec(None, None, sharding.BATCH_AXES, *([None] * (ndim - 3)))
    return jax.sharding.NamedSharding(mesh, spec)


def shard_chunk(batches: dict[str, np.ndarray], mesh: Any) -> dict[str, Array]:
    """Stacked host batches as device arrays, placed with `chunk_sharding` when `mesh` is given."""
    if mesh is None:
        return jax.tree.map(jnp.asarray, batches)
    return jax.tree.map(lambda x: jax.device_put(x, chunk_sharding(mesh, x.ndim)), batches)


def state_shardings(state: TrainState) -> Any:
    """The pytree of each leaf's current sharding (e.g. for a jit's out_shardings)."""
    return jax.tree.map(lambda x: x.sharding, state)
