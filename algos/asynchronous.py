"""Asynchronous GRPO on a split mesh (issue 39): generation and training as two programs that
overlap, the weights resharded from the training layout to the generation layout in between
(HybridFlow's step), with AReaL's bound on how old a sample may be.

The mode is the `Async` passed to `grpo.make` or `multiturn.make`. The devices split in two.
The training mesh (the Config's `mesh_shape`, the first devices) holds the state:
fp32 parameters in their training layout (FSDP/TP by the sharding rules), AdamW's moments, and
the batches generated ahead. The generation mesh (`generation_mesh_shape`, the devices after
them) holds only a copy of the weights in `generation_dtype` (bfloat16 by default), laid out by
the same rules over its own shape (all-data by default: a whole copy per device). With the
staleness bound k = max_staleness, update i is

    reshard    <- the weights of version i, cast to generation_dtype on the training mesh and
                  `device_put` to the generation layout (timed: reshard_seconds, reshard_bytes)
    train      <- on the training mesh: GRPO's optimizer steps on batch i
    generate   <- on the generation mesh: batch i + k, sampled by version i with update
                  i + k's keys (synchronous GRPO's rollout, `grpo.make_rollout`)

Train and generate are two compiled programs on disjoint devices and need nothing from each
other, and JAX dispatches both without waiting, so generating batch i + k runs while batch i
trains. Batch j is sampled by version max(0, j - k) and trains in update j: it is never more
than k versions old (the first k batches come from the starting weights, sampled in update 0).
The k batches ahead live in the state, moved to the training mesh once generated, so the whole
state is one pytree on one mesh: a checkpoint holds the batches in flight and a resumed run
ends where an uninterrupted one does. With k > 0 the loss is AReaL's decoupled objective: the
behaviour policy is the sampler's recorded log-prob, the proximal one the weights the update
starts from; and, since one optimizer step per batch leaves AReaL's clip (around the proximal
policy) nothing to act on, a token that has moved past the clip since it was sampled gets no
gradient (`grpo.policy_loss`'s behaviour_clip; without it, staleness 1 stalled reverse_digits).

With k = 0 generate runs before train (batch i is sampled by version i): no overlap, and with
generation_dtype float32 the samples and the parameters are synchronous GRPO's, bit for bit.
With one device both meshes are that device: the programs take turns on it and the reshard is
only the cast (the split degenerates to synchronous GRPO with a bf16 sampler for k = 0).

`update` is a host function that dispatches the programs (it cannot be one `jit`: its arrays
live on two meshes); call it, do not jit it. `make_chunk` runs updates of it for the runner.

`make_split` is the schedule over any learner (`algos.rollouts.Learner`): GRPO's single
completions, or multi-turn GRPO's whole episodes: batch i + k's conversations, every turn of
them, played on the generation mesh by version i's weights.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable
from typing import Any, ClassVar, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from algos.rollouts import (
    Learner,
    check_decode_row_buckets,
    monitor_of,
    require_decode_row_buckets,
)
from jaxrl import sharding
from jaxrl.config import ConfigError, require, require_count
from jaxrl.hparams import HParams, static
from jaxrl.lm import training
from jaxrl.lm.log_probs import log_prob_mismatch
from jaxrl.lm.model import param_shardings
from jaxrl.loop import Algorithm

Array = jax.Array
DTYPES = ("bfloat16", "float32")


@dataclasses.dataclass(frozen=True)
class Async:
    """Asynchronous rollouts: generation and training on disjoint parts of the devices, two
    programs that overlap, the weights resharded to the generation layout after every update.
    The Config's mesh_shape is the training mesh (the first devices); `generation_mesh_shape`
    the generation mesh (the next ones); `generation_dtype` the dtype of the weights copied
    there (bfloat16, HybridFlow's; float32 samples exactly as the fp32 trainer would)."""

    generation_mesh_shape: tuple[int, int, int] = (1, 1, 1)
    generation_dtype: str = "bfloat16"
    # The oldest policy a trained token may come from, in updates (AReaL's max offpolicyness).
    max_staleness: int = 0
    # The generation side's sampler decodes only its rows still sampling (`algos.rollouts.Sync`).
    decode_row_buckets: int = 0
    # `update` is a host function dispatching two programs: the runner calls it in a loop.
    host_loop: ClassVar[bool] = True

    def __post_init__(self) -> None:
        # ml_collections hands us lists; the settings must stay hashable.
        object.__setattr__(self, "generation_mesh_shape", tuple(self.generation_mesh_shape))
        require_count(
            self, "max_staleness", "use a whole number of updates, 0 (synchronous) or more"
        )
        shape = self.generation_mesh_shape
        require(
            len(shape) == 3 and all(isinstance(n, int) and n >= 1 for n in shape),
            "generation_mesh_shape",
            f"got {shape}",
            "give three sizes >= 1: (data, fsdp, tensor)",
        )
        require(
            self.generation_dtype in DTYPES,
            "generation_dtype",
            f"got {self.generation_dtype!r}",
            f"choose one of {', '.join(DTYPES)}",
        )
        require_decode_row_buckets(self)

    def check(self, config: Any) -> None:
        """These settings against the algorithm's Config (the device count is checked by
        `split_devices`, when the meshes are made)."""
        shards = self.generation_mesh_shape[0] * self.generation_mesh_shape[1]
        completions = config.batch_size * config.group_size
        require(
            config.batch_size % shards == 0,
            "generation_mesh_shape",
            f"the batch_size={config.batch_size} prompts (of {completions} completions) do not "
            f"split over the generation mesh's data*fsdp = {shards} batch shards",
            f"make batch_size a multiple of {shards}, or use fewer generation batch shards",
        )
        require(
            config.lora_rank == 0,
            "rollout_mode",
            "async mode trains every parameter for now, not LoRA adapters",
            "use rollout_mode=sync with LoRA, or lora_rank=0",
        )
        check_decode_row_buckets(self.decode_row_buckets, config)

    def split_devices(self, config: Any, devices: list | None = None) -> tuple[list, list]:
        """The training devices (the first prod(mesh_shape)) and the generation devices (the
        next prod(generation_mesh_shape)); with a single device, that device for both.
        ConfigError (one line) when the devices do not split so."""
        devices = list(jax.devices() if devices is None else devices)
        train, generate = math.prod(config.mesh_shape), math.prod(self.generation_mesh_shape)
        if len(devices) == 1 and train == generate == 1:
            return devices, devices
        if train + generate > len(devices):
            count = len(devices)
            # One device cannot be split: both meshes are then that device, taking turns.
            fix = (
                "use mesh_shape=(1,1,1) and generation_mesh_shape=(1,1,1) (the one device, "
                "shared: the programs take turns)"
                if count == 1
                else f"shrink the meshes to {count} devices in all (e.g. mesh_shape="
                f"({count // 2},1,1) and generation_mesh_shape=({count - count // 2},1,1))"
            )
            raise ConfigError(
                f"generation_mesh_shape: async mode puts the training mesh {config.mesh_shape} "
                f"and the generation mesh {self.generation_mesh_shape} on disjoint devices, "
                f"{train} + {generate} of them, but {count} are available; {fix}"
            )
        return devices[:train], devices[train : train + generate]

    def generation_mesh(self, config: Any, train_mesh: Any) -> Any:
        """The generation mesh beside `train_mesh` (None, without a training mesh: one
        device)."""
        if train_mesh is None:
            return None
        rest = [d for d in jax.devices() if d not in set(train_mesh.devices.flat)]
        if not rest:  # the single device, shared
            rest = list(train_mesh.devices.flat)
        needed = math.prod(self.generation_mesh_shape)
        if len(rest) < needed:
            self.split_devices(config)  # raises its one-line error
        return sharding.make_mesh(*self.generation_mesh_shape, devices=rest[:needed])

    def make(self, learner: Learner) -> Algorithm:
        """Asynchronous `init(key, hparams)` and a host function `update(state, inputs,
        hparams)` over the learner's rollout and optimizer steps (`make_split`). The learner's
        mesh is the training mesh, where its parameters lie; the generation mesh is made beside
        it. Update i draws its randomness from fold_in(state.key, i), as the synchronous
        update does."""
        learner.check_memory()
        # With k > 0 the clip is taken around the behaviour policy too (`grpo.policy_loss`):
        # with the proximal policy the update's own start, AReaL's clip never acts on one
        # optimizer step per batch, and stale batches without it stalled reverse_digits.
        return make_split(self, learner, learner.make_optimize(self.max_staleness > 0))


class Ahead(NamedTuple):
    """A batch generated ahead of its update: GRPO's rollout batch and metrics, and the policy
    version (update) whose weights sampled it."""

    batch: dict[str, Array]
    metrics: dict[str, Array]
    version: Array


class State(NamedTuple):
    """GRPO's `TrainState` fields plus the max_staleness batches generated ahead (the next
    update's first), all on the training mesh."""

    params: Any
    opt_state: Any
    key: Array
    step: Array
    ahead: tuple[Ahead, ...]


MISMATCH_KEYS = ("logprob_mismatch_mean", "logprob_mismatch_max")


class Reshard(NamedTuple):
    """The weights of one version in the generation layout, and what moving them cost."""

    params: Any
    seconds: float  # cast + device_put, until the copy is on the generation devices
    bytes_total: int  # bytes the generation devices hold, all of them together
    bytes_per_device: int  # the most any one generation device holds


def make_split(
    rollout: Async, learner: Learner, optimize: Callable[..., tuple[Any, dict]]
) -> Algorithm:
    """The split-mesh schedule over any learner (`algos.rollouts.Learner`: single completions,
    conversations) and its optimizer steps `optimize`:

    - `learner.make_rollout(generation_mesh, row_buckets)` -> `rollout(params, key, hparams,
      data) -> (batch, metrics)`, the synchronous update's sampling; its batch holds
      `sampler_log_probs` and `fresh_mask` over the trained tokens, read by the decoupled loss
      and the mismatch metric;
    - `optimize(state, batch, hparams, shuffle_key, policy, reference_params) -> (state,
      step_metrics)`, the synchronous update's optimizer steps on a batch (its loss reads
      `behaviour_log_probs` when present);
    - `learner.unpack_inputs(inputs) -> (reference_params, data)`, `data` the rollout's (a
      prompt table), `learner.data` its value at init (for the shapes of the batches ahead);
    - `learner.make_trainer_log_probs(generation_mesh) -> trainer_log_probs(params, batch) ->
      [B, N]`, the trainer's forward over a batch: with k > 0 the log-prob mismatch is taken on
      the generation mesh, right after sampling, under the generation copy's weights (no
      training step ever holds the weights a batch was sampled with); with k = 0 the training
      step takes it.

    Update i's rollout key and shuffle key are split from fold_in(state.key, i), as the
    synchronous update (`algos.rollouts.Sync`) splits them."""
    config, model, unpack_inputs = static(learner.config), learner.model, learner.unpack_inputs
    lag = rollout.max_staleness
    mismatch_at_generation = lag > 0
    train_mesh, gen_mesh = learner.mesh, rollout.generation_mesh(config, learner.mesh)
    generate_batch = learner.make_rollout(gen_mesh, rollout.decode_row_buckets)
    if mismatch_at_generation:
        trainer_log_probs = learner.make_trainer_log_probs(gen_mesh)

    def sample(gen_params: Any, key: Array, hp: HParams, data: Any) -> tuple[dict, dict]:
        """The rollout, and with k > 0 its sampler/trainer mismatch under its own weights."""
        batch, metrics = generate_batch(gen_params, key, hp, data)
        if mismatch_at_generation:
            trainer = trainer_log_probs(gen_params, batch)
            gap = log_prob_mismatch(batch["sampler_log_probs"], trainer, batch["fresh_mask"])
            metrics = dict(metrics, **gap)
        return batch, metrics

    params = learner.params
    base_init = training.make_init(params, config, train_mesh, model)
    dtype = jnp.dtype(rollout.generation_dtype)
    monitor = monitor_of(f"{learner.name}, async", config)

    def on(where: Any, tree: Any, batch: bool = False) -> Any:
        """`tree` placed on mesh `where` (split along its leading axis with `batch`)."""
        if where is None:
            return tree
        if batch:
            return jax.tree.map(
                lambda x: jax.device_put(x, sharding.batch_sharding(where, x.ndim)), tree
            )
        return jax.device_put(tree, sharding.replicated(where))

    generation_layout = None if gen_mesh is None else param_shardings(model, gen_mesh)

    # Compiled here, so that reshard_seconds times the copy and never a compilation.
    cast = (
        jax.jit(
            lambda params: jax.tree.map(
                lambda p: p.astype(dtype) if jnp.issubdtype(p.dtype, jnp.floating) else p, params
            )
        )
        .lower(params)
        .compile()
    )

    def reshard(params: Any) -> Reshard:
        """HybridFlow's step: the training weights cast to generation_dtype where they lie (so
        half the bytes cross for bf16), then `device_put` to the generation layout. Timed to
        the end of the copy; the training devices hold the cast copy only meanwhile."""
        jax.block_until_ready(params)
        start = time.perf_counter()
        copy = cast(params)
        if generation_layout is not None:
            copy = jax.device_put(copy, generation_layout)
        jax.block_until_ready(copy)
        seconds = time.perf_counter() - start
        held = sharding.bytes_per_device(copy)
        return Reshard(copy, seconds, sum(held.values()), max(held.values()))

    @jax.jit
    def generate(gen_params: Any, key: Array, index: Array, hp: HParams, data: Any):
        # Update `index`'s rollout key, as the synchronous update splits it.
        rollout_key = jax.random.split(jax.random.fold_in(key, index))[0]
        return sample(gen_params, rollout_key, hp, data)

    @jax.jit
    def train(state: training.TrainState, ahead: Ahead, hp: HParams, reference_params: Any):
        """The optimizer steps on one batch (as the synchronous update takes them after its
        rollout), and the staleness metrics of its tokens."""
        _, shuffle_key = jax.random.split(jax.random.fold_in(state.key, state.step))
        batch = dict(ahead.batch)
        # The log-prob mismatch compares sampler and trainer under the same weights: only a
        # batch of the current version has any (with k > 0 the generation side measured it).
        batch["fresh_mask"] = batch["fresh_mask"] & (ahead.version == state.step)
        if lag > 0:
            # AReaL's decoupled objective; with the bound at 0 the loss stays GRPO's, bit for bit.
            batch["behaviour_log_probs"] = batch["sampler_log_probs"]
        state, step_metrics = optimize(
            state, batch, hp, shuffle_key, state.params, reference_params
        )
        metrics = dict(ahead.metrics)
        if mismatch_at_generation:
            step_metrics = {k: v for k, v in step_metrics.items() if k not in MISMATCH_KEYS}
        metrics.update(jax.tree.map(jnp.mean, step_metrics))
        staleness = state.step - ahead.version
        off_policy = (staleness > 0).astype(jnp.float32)
        metrics.update(
            staleness_mean=staleness.astype(jnp.float32),
            staleness_max=staleness.astype(jnp.float32),
            offpolicy_token_fraction=off_policy,
        )
        for age in range(lag + 1):
            metrics[f"staleness_{age}"] = (staleness == age).astype(jnp.float32)
        return state._replace(step=state.step + 1), metrics

    def generate_ahead(gen_params: Any, key: Array, index: int, version: int, hp, data):
        """Batch `index`, sampled by `version`'s weights, dispatched on the generation mesh and
        moved to the training mesh (both without waiting)."""
        index_array = on(gen_mesh, jnp.asarray(index, jnp.int32))
        batch, metrics = generate(gen_params, key, index_array, hp, data)
        ahead = Ahead(batch, metrics, jnp.asarray(version, jnp.int32))
        return Ahead(
            on(train_mesh, ahead.batch, batch=True),
            on(train_mesh, ahead.metrics),
            on(train_mesh, ahead.version),
        )

    moved: dict[str, Any] = {}

    def on_generation_mesh(name: str, tree: Any) -> Any:
        """`tree` (the hyper-parameters, the prompt table) replicated on the generation mesh,
        moved once and reused while the caller passes the same object."""
        if name not in moved or moved[name][0] is not tree:
            moved[name] = (tree, on(gen_mesh, tree))
        return moved[name][1]

    def init(key: Array, hp: HParams) -> State:
        state = base_init(key, hp)
        # Placeholders of the batches ahead (update 0 generates them): zeros of their shapes.
        abstract = lambda tree: jax.tree.map(  # noqa: E731
            lambda x: jax.ShapeDtypeStruct(np.shape(x), jnp.result_type(x)), tree
        )
        shapes = jax.eval_shape(
            generate_ahead_shapes, *map(abstract, (state.params, state.key, hp, learner.data))
        )
        zeros = lambda s: jnp.zeros(s.shape, s.dtype)  # noqa: E731
        ahead = tuple(
            Ahead(
                on(train_mesh, jax.tree.map(zeros, shapes.batch), batch=True),
                on(train_mesh, jax.tree.map(zeros, shapes.metrics)),
                on(train_mesh, jnp.zeros((), jnp.int32)),
            )
            for _ in range(lag)
        )
        return State(state.params, state.opt_state, state.key, state.step, ahead)

    def generate_ahead_shapes(params, key, hp, data):
        batch, metrics = sample(params, key, hp, data)
        return Ahead(batch, metrics, jnp.zeros((), jnp.int32))

    def update(state: State, inputs: Any, hp: HParams):
        reference_params, task_data = unpack_inputs(inputs)
        # Waiting for the last update's two programs costs nothing: this update's training
        # needs the batch the last one generated, and its generation the weights it trained.
        jax.block_until_ready(state)
        step = int(state.step)
        copy = reshard(state.params)
        gen_hp = on_generation_mesh("hparams", hp)
        gen_data = on_generation_mesh("task_data", task_data)
        gen_key = on_generation_mesh("key", state.key)
        ahead = state.ahead
        if lag == 0:
            current = generate_ahead(copy.params, gen_key, step, step, gen_hp, gen_data)
        else:
            if step == 0:  # the first k batches, all from the starting weights
                ahead = tuple(
                    generate_ahead(copy.params, gen_key, j, 0, gen_hp, gen_data) for j in range(lag)
                )
            current, ahead = ahead[0], ahead[1:]
        core = training.TrainState(state.params, state.opt_state, state.key, state.step)
        core, metrics = train(core, current, hp, reference_params)
        if lag > 0:  # dispatched after training, so the two run side by side
            ahead = (
                *ahead,
                generate_ahead(copy.params, gen_key, step + lag, step, gen_hp, gen_data),
            )
        metrics = dict(
            metrics,
            reshard_seconds=np.float32(copy.seconds),
            reshard_bytes=np.float32(copy.bytes_total),
            reshard_bytes_per_device=np.float32(copy.bytes_per_device),
        )
        if monitor is not None:
            monitor(step + 1, metrics["zero_variance_fraction"])
        return State(core.params, core.opt_state, core.key, core.step, ahead), metrics

    return Algorithm(init, update)


def make_chunk(
    update: Callable[[Any, Any, HParams], tuple[Any, dict]],
    num_steps: int,
    *,
    log_every: int = 1,
    callback: Callable[[Any, dict], None] | None = None,
    keep_going: Callable[[Any], bool] | None = None,
    check_every: int | None = None,
) -> Callable[[Any, Any, HParams], tuple[Any, dict]]:
    """`chunk(state, inputs, hparams) -> (state, metrics)`: `num_steps` calls of the host
    `update`, as `jaxrl.loop.make_chunk` runs them inside one program: after every
    `check_every` updates, `callback(step, mean metrics)` and the stop check `keep_going`;
    metrics stacked [num_steps // check_every]. Not to be jitted (the runner calls it as is)."""
    check_every = log_every if check_every is None else check_every
    pieces = num_steps // check_every

    def chunk(state: Any, inputs: Any, hp: HParams):
        rows = []
        for _ in range(pieces):
            if keep_going is not None and not keep_going(state.step):
                break
            piece = []
            for _ in range(check_every):
                state, metrics = update(state, inputs, hp)
                piece.append(jax.device_get(metrics))
            mean = {k: np.mean([np.asarray(m[k]) for m in piece], axis=0) for k in piece[0]}
            if callback is not None:
                callback(state.step, mean)
            rows.append(mean)
        if not rows:  # a stop before the first piece: no metrics (the runner keeps none)
            return state, {}
        return state, {k: np.stack([r[k] for r in rows]) for k in rows[0]}

    return chunk
