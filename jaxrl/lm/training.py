"""What SFT, DPO and GRPO share: the settings and state of a run, the optimizer, sequence log-probs,
and one optimizer step with gradient accumulation, the building block of their updates.

A loss here is `loss_fn(params, micro_batch) -> (scalar, metrics dict)`. `optimizer_step` takes
one AdamW step on a batch shaped [grad_accum_steps, micro_batch, ...], averaging the gradients of
the micro-batches with a `lax.scan`. The optimizer is built from the run's `HParams` inside the
update, so the learning rate (and weight decay, gradient clip) can differ between the runs of one
program: a learning-rate sweep is one compiled program, vmapped. Chunks of updates are
`jaxrl.loop.make_chunk`; parameters and optimizer state keep the shardings they were placed with.

With `lora_rank > 0` the run trains low-rank adapters (`jaxrl.lm.lora`) instead: the state is a
`LoraTrainState` holding the frozen base parameters beside the adapters, only the adapters are
differentiated and only they have optimizer state, and its `params` are the merged parameters, so
whatever reads a finished run's `state.params` (saving, evaluation, export) sees plain ones.
`train_step` takes one optimizer step on either kind of state.

With `LengthBuckets` (GRPO's `length_buckets`), each micro-batch's rows are sorted by the length
they need and split into sub-batches, each run at the smallest of a few static lengths that holds
its longest row (`jax.lax.switch`: every length compiled, one runs), their gradients summed: the
padding-free training of TRL and verl, at fixed shapes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxrl import loop, sharding
from jaxrl.config import require, require_non_negative, require_positive
from jaxrl.hparams import HParams, swept
from jaxrl.lm import lora
from jaxrl.lm.model import ModelConfig, Transformer, head_log_probs, param_axes, stack_layers

Array = jax.Array
# loss_fn(params, micro_batch) -> (scalar loss, metrics)
LossFn = Callable[[Any, dict[str, Array]], tuple[Array, dict[str, Array]]]


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """Optimisation settings every language-model algorithm shares. Fields marked `swept` may
    differ between the runs of one program (`jaxrl.hparams.sweep`)."""

    learning_rate: float = swept(1e-4)  # constant after the warmup
    warmup_steps: int = 0  # linear warmup from 0 to learning_rate over this many optimizer steps
    weight_decay: float = swept(0.0)  # AdamW's decoupled weight decay
    # Global gradient-norm clip. Not swept: a traced clip norm changes how XLA compiles the step,
    # and so the rounding of every run, swept or not (GRPO's seed-0 learning test moves).
    max_grad_norm: float = 1.0
    batch_size: int = 8  # sequences (SFT) or preference pairs (DPO) per optimizer step
    grad_accum_steps: int = 1  # the batch is processed in this many micro-batches
    num_steps: int = 200  # updates in the run
    mesh_shape: tuple[int, int, int] = (1, 1, 1)  # (data, fsdp, tensor)
    # LoRA (jaxrl.lm.lora): rank 0 trains every parameter; > 0 trains only low-rank adapters on
    # the target weights (HF names: q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj,
    # down_proj, lm_head), scaled by lora_alpha / lora_rank (alpha 0: scale 1).
    lora_rank: int = 0
    lora_alpha: float = 0.0
    lora_dropout: float = 0.0  # drop probability of the adapters' input features
    lora_targets: tuple[str, ...] = lora.DEFAULT_TARGETS

    def __post_init__(self) -> None:
        # ml_collections hands us lists; the config must stay hashable.
        object.__setattr__(self, "mesh_shape", tuple(self.mesh_shape))
        self.validate_lora()
        require_positive(
            self, "learning_rate", "batch_size", "grad_accum_steps", "num_steps", "max_grad_norm"
        )
        require_non_negative(self, "warmup_steps", "weight_decay")
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

    def validate_lora(self) -> None:
        """Check the lora_* fields (subclasses with their own __post_init__ call this too)."""
        targets = self.lora_targets
        if isinstance(targets, str):  # "q_proj,v_proj" is a natural way to write it
            targets = [name.strip() for name in targets.split(",") if name.strip()]
        object.__setattr__(self, "lora_targets", tuple(targets))
        lora.validate(self.lora_rank, self.lora_alpha, self.lora_dropout, self.lora_targets)

    @property
    def lora(self) -> lora.LoraConfig | None:
        """The LoRA settings, or None when every parameter is trained (lora_rank 0)."""
        if self.lora_rank == 0:
            return None
        return lora.LoraConfig(
            self.lora_rank, self.lora_alpha, self.lora_dropout, self.lora_targets
        )


def check_model(config: TrainConfig, model: ModelConfig) -> None:
    """The settings checked against the model they will train (today: that every LoRA target
    names a parameter of it, e.g. no `lm_head` with tied embeddings). Raises a one-line
    ConfigError; scripts call it before they write anything (`make` repeats it)."""
    if config.lora is not None:
        lora.check_targets(param_axes(model), config.lora)


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
    """The whole state of one language-model run."""

    params: Any
    opt_state: Any  # AdamW's, over `params` (its count is the optimizer steps taken)
    key: Array  # the run's PRNG key; GRPO draws update i's randomness from fold_in(key, i)
    step: Array  # updates done (int32 scalar)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class LoraTrainState:
    """The state of a LoRA run: the frozen base parameters, the trained adapters and AdamW's
    state over the adapters only. `params` merges them, so code written for `TrainState` reads
    the model the run has trained. The base travels in the state (and its checkpoints) so that a
    finished run's state alone holds that model."""

    base: Any  # frozen; never differentiated
    adapters: Any  # {path: lora.Adapter}, float32
    opt_state: Any  # AdamW's, over `adapters`
    key: Array
    step: Array
    scale: float = dataclasses.field(metadata=dict(static=True))  # lora_alpha / lora_rank

    @property
    def params(self) -> Any:
        """The merged parameters, each in its base weight's dtype."""
        return lora.merge(self.base, self.adapters, self.scale)

    def _replace(self, **changes: Any) -> LoraTrainState:
        # The NamedTuple spelling, so updates read the same for both kinds of state.
        return dataclasses.replace(self, **changes)


def make_optimizer(hp: HParams, config: TrainConfig) -> optax.GradientTransformation:
    """Global-norm clipping at config.max_grad_norm, then AdamW at hp.learning_rate (ramped
    linearly from 0 over the first config.warmup_steps optimizer steps) with hp.weight_decay.

    Built from (possibly traced) hyper-parameters, so each run of a sweep has its own; the
    optimizer state's structure does not depend on them, so `init` and the update build it
    separately and agree."""

    def schedule(count: Array) -> Array:
        if config.warmup_steps == 0:
            return hp.learning_rate
        return hp.learning_rate * jnp.minimum(count / config.warmup_steps, 1.0)

    return optax.chain(
        optax.clip_by_global_norm(config.max_grad_norm),
        optax.adamw(schedule, weight_decay=hp.weight_decay),
    )


def make_init(
    params: Any, config: TrainConfig, mesh: Any = None, model: ModelConfig | None = None
) -> Callable[[Array, HParams], TrainState | LoraTrainState]:
    """`init(key, hparams) -> TrainState` starting from `params` (random or a checkpoint's), or
    a `LoraTrainState` when config.lora_rank > 0 (then `model`, the parameters' ModelConfig, is
    needed to shard the adapters; a target naming no parameter is a ConfigError here, before
    anything compiles).

    The state gets its own copy of the parameters: chunks donate the state, and the caller may
    still use `params` (as DPO's or GRPO's reference model, say). The optimizer moments are made
    like the parameters, so they inherit their shardings; with a mesh, the scalars (key, step,
    Adam's count) are replicated over it so every leaf lives on it (call `init` outside `jit`
    then, as the scripts do)."""
    lora_config = config.lora
    if lora_config is not None:
        lora.check_targets(params, lora_config)
        if model is None:
            raise ValueError("make_init: LoRA needs the model's ModelConfig (model=...)")
        axes = param_axes(model)

    def init(key: Array, hp: HParams) -> TrainState | LoraTrainState:
        own = jax.tree.map(jnp.copy, params)
        if lora_config is None:
            opt_state = make_optimizer(hp, config).init(own)
            state = TrainState(own, opt_state, key, loop.zeros_step())
        else:
            # The adapters' randomness is its own stream of the run's key.
            adapters = lora.init_adapters(jax.random.fold_in(key, ADAPTER_STREAM), own, lora_config)
            if mesh is not None:
                adapters = jax.device_put(adapters, lora.adapter_shardings(axes, adapters, mesh))
            opt_state = make_optimizer(hp, config).init(adapters)
            state = LoraTrainState(
                own, adapters, opt_state, key, loop.zeros_step(), lora_config.scale
            )
        if mesh is None:
            return state
        on_mesh = set(mesh.devices.flat)
        return jax.tree.map(
            lambda x: (
                x
                if x.sharding.device_set == on_mesh
                else jax.device_put(x, sharding.replicated(mesh))
            ),
            state,
        )

    return init


# fold_in tags of the run's key for LoRA's randomness (adapter init, dropout masks), chosen far
# from the small integers (update indices) the algorithms fold in.
ADAPTER_STREAM = 0x10A0
DROPOUT_STREAM = 0x10A1


def sequence_log_probs(
    model: Transformer,
    params: Any,
    tokens: Array,
    attention_mask: Array,
    loss_mask: Array,
    scored_length: int | None = None,
) -> tuple[Array, Array]:
    """Summed log-prob of the `loss_mask` tokens of each sequence, and how many there are.
    tokens/masks: [B, L] right-padded; returns ([B], [B]).

    With `scored_length` (from `scored_length(loss_masks)`: every row's scored tokens lie within
    that many positions of its first one), the head and log-softmax run on each row's window
    only, not on all L positions: the same sums, a cheaper step when answers are short. A row
    whose scored tokens do not fit the window gets NaN."""
    length = tokens.shape[1]
    if scored_length is not None and scored_length < 0:
        raise ValueError(f"scored_length: got {scored_length}; use training.scored_length(masks)")
    if scored_length is None or scored_length >= length - 1:
        hidden, _ = model.apply({"params": params}, tokens, None, attention_mask, hidden_only=True)
        # Position t predicts token t + 1; the head runs in chunks (`head_log_probs`).
        picked = head_log_probs(model.config, params, hidden[:, :-1], tokens[:, 1:]).log_probs
        per_token = picked * loss_mask[:, 1:]
        return per_token.sum(axis=-1), loss_mask.sum(axis=-1).astype(jnp.float32)
    # Window j of a row predicts token first + j from the logits at first + j - 1. A row with
    # nothing scored (argmax 0) reads a window whose mask is all False.
    first = jnp.argmax(loss_mask, axis=-1)
    window = jnp.maximum(first - 1, 0)[:, None] + jnp.arange(scored_length)
    inside = window < length - 1  # a window running past the end predicts nothing there
    window = jnp.minimum(window, length - 2)
    logits, _ = model.apply(
        {"params": params}, tokens, None, attention_mask, logit_positions=window
    )
    targets = jnp.take_along_axis(tokens, window + 1, axis=1)
    mask = jnp.take_along_axis(loss_mask, window + 1, axis=1) * inside
    log_probs = jax.nn.log_softmax(logits, axis=-1)
    picked = jnp.take_along_axis(log_probs, targets[..., None], axis=-1)[..., 0]
    counts = loss_mask.sum(axis=-1)
    # A window narrower than a row's answer would drop its last tokens silently: that row's
    # sum is NaN instead, which the runner's finiteness checks stop on.
    sums = jnp.where(mask.sum(axis=-1) == counts, (picked * mask).sum(axis=-1), jnp.nan)
    return sums, counts.astype(jnp.float32)


def score_pairs_in_batches(
    score: Callable, params: Any, arrays: dict[str, np.ndarray], batch_size: int, place=None
) -> dict:
    """Run a jitted `score(params, batch) -> dict` over every pair of a tokenised preference
    dataset (its chosen_/rejected_ arrays) in fixed-size batches (the last batch padded by
    repeating rows, then trimmed; `place` puts a batch on the devices), returning NumPy arrays of
    length N. DPO's reference pass and evaluation and the reward model's evaluation use it."""
    n = len(next(iter(arrays.values())))
    outputs: dict[str, list[np.ndarray]] = {}
    for start in range(0, n, batch_size):
        index = np.arange(start, start + batch_size) % n
        batch = {k: v[index] for k, v in arrays.items() if k.startswith(("chosen_", "rejected_"))}
        if place is not None:
            batch = place(batch)
        result = jax.device_get(score(params, batch))
        keep = min(batch_size, n - start)
        for k, v in result.items():
            outputs.setdefault(k, []).append(np.asarray(v)[:keep])
    return {k: np.concatenate(v) for k, v in outputs.items()}


def scored_length(*loss_masks: np.ndarray) -> int:
    """The widest span, first to last scored token, of any row of these [N, L] loss masks: the
    static window `sequence_log_probs` can restrict the head to (0 when nothing is scored)."""
    widest = 0
    for mask in loss_masks:
        mask = np.asarray(mask, bool)
        if not mask.any():
            continue
        columns = np.arange(mask.shape[1])
        last = np.where(mask, columns, -1).max(axis=1)
        first = np.where(mask, columns, mask.shape[1]).min(axis=1)
        widest = max(widest, int((last - first + 1).max()))
    return widest


class LengthBuckets(NamedTuple):
    """How to train a micro-batch at (buckets of) its rows' own lengths.

    The rows are sorted by `row_lengths` and split into `count` equal sub-batches; each runs at
    the smallest of `lengths` (static, ascending, the last one the batch's full length) that holds
    its longest row, `cut(batch, length)` giving the batch at that length. The loss of a
    sub-batch must be its share of the step's loss, so that the shares' gradients sum to the
    step's: buckets need `optimizer_step`'s `denominators`. Metrics of the sub-batches are
    summed, except those named `*_max`, whose maximum is taken (`combine_shares`)."""

    count: int
    lengths: tuple[int, ...]
    row_lengths: Callable[[dict[str, Array]], Array]  # [B] positions each row needs
    cut: Callable[[dict[str, Array], int], dict[str, Array]]
    mesh: Any = None  # sub-batches split their rows over its batch axes


def split_by_length(
    batch: dict[str, Array], buckets: LengthBuckets, count: int | None = None
) -> tuple[dict[str, Array], Array, Array]:
    """`batch`'s rows [B, ...] sorted by length and split into `count` (default
    buckets.count) sub-batches [count, B / count, ...]; also each sub-batch's index into
    buckets.lengths (the shortest that holds its rows) and the sorting order [B]."""
    count = buckets.count if count is None else count
    lengths = buckets.row_lengths(batch)
    order = jnp.argsort(lengths, stable=True)
    parts = jax.tree.map(lambda x: x[order].reshape(count, -1, *x.shape[1:]), batch)
    if buckets.mesh is not None:
        parts = jax.tree.map(
            lambda x: jax.lax.with_sharding_constraint(x, parts_sharding(buckets.mesh, x.ndim)),
            parts,
        )
    needed = lengths[order].reshape(count, -1).max(axis=1)
    index = jnp.searchsorted(jnp.asarray(buckets.lengths), needed, side="left")
    return parts, jnp.minimum(index, len(buckets.lengths) - 1), order


def at_bucket_length(
    fn: Callable[[dict[str, Array]], Any], buckets: LengthBuckets, index: Array, batch: dict
) -> Any:
    """`fn(buckets.cut(batch, buckets.lengths[index]))`: one branch per static length, the one
    `index` picks runs (its outputs must have the same shapes at every length)."""
    branches = [lambda b, n=n: fn(buckets.cut(b, n)) for n in buckets.lengths]
    return jax.lax.switch(index, branches, batch)


def combine_shares(metrics: dict[str, Array]) -> dict[str, Array]:
    """The parts' metrics [count] (length buckets, micro-batches), each its share of the
    whole's, as the whole's: sums, or maxima for `*_max`."""
    return {k: v.max(axis=0) if k.endswith("_max") else v.sum(axis=0) for k, v in metrics.items()}


# The step's denominators: `denominators(batch) -> {name: scalar}` over the optimizer step's whole
# batch [grad_accum_steps, micro_batch, ...], e.g. its kept tokens. Each is put on every row.
Denominators = Callable[[dict[str, Array]], dict[str, Array]]


def with_denominators(batch: dict[str, Array], denominators: Denominators) -> dict[str, Array]:
    """The step's batch [accum, micro, ...] with `denominators(batch)` repeated on every row
    (so they follow the rows into micro-batches and length buckets)."""
    rows = jax.tree.leaves(batch)[0].shape[:2]
    values = denominators(batch)
    return dict(batch, **{name: jnp.broadcast_to(v, rows) for name, v in values.items()})


def accumulated_gradient(
    loss_fn: LossFn,
    params: Any,
    batch: dict[str, Array],
    buckets: LengthBuckets | None = None,
    denominators: Denominators | None = None,
) -> tuple[Any, dict[str, Array]]:
    """The gradient of one optimizer step over a batch shaped [grad_accum_steps, micro_batch,
    ...] and its metrics (the loss function's, and `loss`).

    With `denominators`, the loss is a mean over the step's whole batch: the loss function reads
    the step's denominators from the batch (`with_denominators`) and returns each micro-batch's
    (or length bucket's) share of the step's loss and metrics, so the gradients and metrics are
    summed (`combine_shares`); accumulation then changes only the memory, never the objective.
    Without, each micro-batch's loss is its own mean and they are averaged, which equals the
    step's mean where every micro-batch has the same denominator (a fixed count of rows)."""
    grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
    if buckets is not None and denominators is None:
        raise ValueError("length buckets need the step's denominators: each bucket is a share")

    def accumulate(grads_sum, micro_batch):
        if buckets is None:
            (loss, metrics), grads = grad_fn(params, micro_batch)
            return jax.tree.map(jnp.add, grads_sum, grads), dict(metrics, loss=loss)
        parts, index, _ = split_by_length(micro_batch, buckets)

        def one_bucket(grads_sum, part_and_index):
            part, i = part_and_index
            (loss, metrics), grads = at_bucket_length(
                lambda b: grad_fn(params, b), buckets, i, part
            )
            return jax.tree.map(jnp.add, grads_sum, grads), dict(metrics, loss=loss)

        grads_sum, metrics = jax.lax.scan(one_bucket, grads_sum, (parts, index))
        return grads_sum, combine_shares(metrics)

    if denominators is not None:
        batch = with_denominators(batch, denominators)
    zeros = jax.tree.map(jnp.zeros_like, params)
    grads, metrics = jax.lax.scan(accumulate, zeros, batch)
    if denominators is not None:
        return grads, combine_shares(metrics)
    accum = jax.tree.leaves(batch)[0].shape[0]
    return jax.tree.map(lambda g: g / accum, grads), jax.tree.map(jnp.mean, metrics)


def optimizer_step(
    loss_fn: LossFn,
    params: Any,
    opt_state: Any,
    batch: dict[str, Array],
    hp: HParams,
    config: TrainConfig,
    buckets: LengthBuckets | None = None,
    denominators: Denominators | None = None,
) -> tuple[Any, Any, dict[str, Array]]:
    """One optimizer step (`make_optimizer(hp, config)`) over a batch shaped [grad_accum_steps,
    micro_batch, ...] with `accumulated_gradient`'s gradient: returns (params, opt_state,
    metrics). `metrics` are scalars: the loss function's metrics and `loss` over the step's
    batch, plus `grad_norm` of the step's gradient (before clipping).
    """
    grads, metrics = accumulated_gradient(loss_fn, params, batch, buckets, denominators)
    updates, opt_state = make_optimizer(hp, config).update(grads, opt_state, params)
    metrics["grad_norm"] = optax.tree.norm(grads)
    return optax.apply_updates(params, updates), opt_state, metrics


def train_step(
    loss_fn: LossFn,
    state: TrainState | LoraTrainState,
    batch: dict[str, Array],
    hp: HParams,
    config: TrainConfig,
    dropout_key: Array | None = None,
    buckets: LengthBuckets | None = None,
    denominators: Denominators | None = None,
) -> tuple[TrainState | LoraTrainState, dict[str, Array]]:
    """`optimizer_step` (with `buckets` and `denominators`, if given) on what the state trains:
    its parameters, or (LoRA) its adapters, the loss then seeing the base parameters with the
    adapters applied.
    Returns the state with the new parameters (or adapters) and optimizer state, `step`
    unchanged, and the metrics.

    `dropout_key` draws LoRA's dropout masks (one per adapter for this optimizer step); None
    derives it from the state's key and step, which suits one optimizer step per update."""
    if isinstance(state, TrainState):
        params, opt_state, metrics = optimizer_step(
            loss_fn, state.params, state.opt_state, batch, hp, config, buckets, denominators
        )
        return state._replace(params=params, opt_state=opt_state), metrics

    rate = config.lora_dropout
    if rate > 0 and dropout_key is None:
        dropout_key = jax.random.fold_in(jax.random.fold_in(state.key, state.step), DROPOUT_STREAM)

    def adapted_loss(adapters: Any, micro_batch: dict[str, Array]):
        if rate > 0:
            adapters = lora.drop_inputs(adapters, dropout_key, rate)
        return loss_fn(lora.attach(state.base, adapters, state.scale), micro_batch)

    adapters, opt_state, metrics = optimizer_step(
        adapted_loss, state.adapters, state.opt_state, batch, hp, config, buckets, denominators
    )
    return state._replace(adapters=adapters, opt_state=opt_state), metrics


def make_batch_chunk(
    update: Callable[[Any, Any, HParams], tuple[Any, dict[str, Array]]],
    num_steps: int,
    *,
    log_every: int = 1,
    callback: Callable[[Array, dict[str, Array]], None] | None = None,
    keep_going: Callable[[Array], bool] | None = None,
    check_every: int | None = None,
) -> Callable[[TrainState, Any, HParams], tuple[TrainState, dict[str, Array]]]:
    """`chunk(state, (batches, shared), hparams)`: `jaxrl.loop.make_chunk` over one host batch
    per update (`batches` stacked [num_steps, grad_accum_steps, micro_batch, ...]), update i
    called as `update(state, (batch_i, shared), hparams)`. `shared` is what every update needs
    besides its batch, passed once rather than stacked: DPO's in-step reference parameters."""

    def chunk(state: TrainState, inputs: Any, hp: HParams):
        batches, shared = inputs
        with_shared = lambda s, batch, h: update(s, (batch, shared), h)  # noqa: E731
        run = loop.make_chunk(
            with_shared,
            num_steps,
            log_every=log_every,
            callback=callback,
            runs_axis=False,
            scan_inputs=True,
            keep_going=keep_going,
            check_every=check_every,
        )
        return run(state, batches, hp)

    return chunk


def into_minibatches(
    batch: dict[str, Array],
    shuffle_key: Array | None,
    num_minibatches: int,
    grad_accum_steps: int,
    mesh: Any = None,
    group_size: int = 1,
) -> dict[str, Array]:
    """An on-policy batch [B, ...] (inside jit) as [num_minibatches, grad_accum_steps,
    micro_batch, ...] for a scan of optimizer steps, its rows shuffled by `shuffle_key` (None:
    in order) and each micro-batch split over the mesh's batch axes. With `group_size` G > 1
    the shuffle moves contiguous groups of G rows whole, each in its own order."""
    if shuffle_key is not None:
        rows = jax.tree.leaves(batch)[0].shape[0]
        if group_size == 1:
            order = jax.random.permutation(shuffle_key, rows)
        else:
            groups = jax.random.permutation(shuffle_key, rows // group_size)
            order = (groups[:, None] * group_size + jnp.arange(group_size)).reshape(-1)
        batch = jax.tree.map(lambda x: x[order], batch)
    shape = (num_minibatches, grad_accum_steps, -1)
    batch = jax.tree.map(lambda x: x.reshape(*shape, *x.shape[1:]), batch)
    if mesh is None:
        return batch
    return jax.tree.map(
        lambda x: jax.lax.with_sharding_constraint(x, chunk_sharding(mesh, x.ndim)), batch
    )


def minibatch_epochs(
    loss_fn: LossFn,
    state: TrainState | LoraTrainState,
    batch: dict[str, Array],
    hp: HParams,
    config: TrainConfig,
    shuffle_key: Array,
    num_epochs: int,
    num_minibatches: int,
    mesh: Any = None,
    dropout_key: Array | None = None,
    buckets: LengthBuckets | None = None,
    group_size: int = 1,
    denominators: Denominators | None = None,
) -> tuple[TrainState | LoraTrainState, dict[str, Array]]:
    """The RL algorithms' optimisation on one rollout (inside jit): num_epochs passes over the
    batch [B, ...], each in its own order from `shuffle_key` (in order with one minibatch;
    whole groups of `group_size` rows moved together), of num_minibatches `train_step`s (each
    micro-batch in length buckets, with `buckets`; losses over the step's batch with
    `denominators`, `accumulated_gradient`'s). With config.lora_dropout > 0, optimizer
    step i draws its masks from fold_in(dropout_key, i). Returns the state and the steps'
    metrics stacked [num_epochs, num_minibatches]."""

    def optimizer_step(carry, minibatch_and_index):
        minibatch, index = minibatch_and_index
        key = jax.random.fold_in(dropout_key, index) if config.lora_dropout > 0 else None
        return train_step(loss_fn, carry, minibatch, hp, config, key, buckets, denominators)

    def epoch(carry, epoch_and_key):
        index, epoch_key = epoch_and_key
        shuffle = epoch_key if num_minibatches > 1 else None
        steps = index * num_minibatches + jnp.arange(num_minibatches)
        minibatches = into_minibatches(
            batch, shuffle, num_minibatches, config.grad_accum_steps, mesh, group_size
        )
        return jax.lax.scan(optimizer_step, carry, (minibatches, steps))

    epochs = (jnp.arange(num_epochs), jax.random.split(shuffle_key, num_epochs))
    return jax.lax.scan(epoch, state, epochs)


def restore_params(path: str, like: Any) -> Any:
    """Restore parameters saved with orbax at `path` as `like` (a tree of ShapeDtypeStructs with
    shardings) describes them.

    Runs saved before the decoder's layers were stacked hold `layer_0` ... entries; those are
    restored as saved (on the default device), stacked (`model.stack_layers`) and placed as
    `like` says, so older run directories stay usable as `init_from`."""
    import orbax.checkpoint as ocp

    device = jax.sharding.SingleDeviceSharding(jax.devices()[0])

    def as_saved(tree: Any) -> Any:
        """orbax's metadata tree (a mapping, not a dict) as plain dicts of ShapeDtypeStructs."""
        if hasattr(tree, "items"):
            return {key: as_saved(value) for key, value in tree.items()}
        return jax.ShapeDtypeStruct(tree.shape, tree.dtype, sharding=device)

    with ocp.StandardCheckpointer() as checkpointer:
        saved = as_saved(checkpointer.metadata(path).item_metadata)

        def per_layer(tree: Any) -> bool:
            return isinstance(tree, dict) and (
                "layer_0" in tree or any(per_layer(value) for value in tree.values())
            )

        if not per_layer(saved):
            return checkpointer.restore(path, like)
        restored = checkpointer.restore(path, saved)

    def stack(tree: Any) -> Any:
        if not isinstance(tree, Mapping):
            return tree
        return stack_layers({key: stack(value) for key, value in tree.items()})

    return jax.tree.map(
        lambda x, want: jax.device_put(x.astype(want.dtype), want.sharding), stack(restored), like
    )


def chunk_sharding(mesh: Any, ndim: int) -> Any:
    """Stacked batches [K, accum, micro_batch, ...]: the micro-batch axis splits over the mesh."""
    spec = jax.sharding.PartitionSpec(None, None, sharding.BATCH_AXES, *([None] * (ndim - 3)))
    return jax.sharding.NamedSharding(mesh, spec)


def parts_sharding(mesh: Any, ndim: int) -> Any:
    """Length-bucketed sub-batches [count, rows, ...]: the rows split over the mesh."""
    spec = jax.sharding.PartitionSpec(None, sharding.BATCH_AXES, *([None] * (ndim - 2)))
    return jax.sharding.NamedSharding(mesh, spec)


def shard_chunk(batches: dict[str, np.ndarray], mesh: Any) -> dict[str, Array]:
    """Stacked host batches as device arrays, placed with `chunk_sharding` when `mesh` is given."""
    if mesh is None:
        return jax.tree.map(jnp.asarray, batches)
    return jax.tree.map(lambda x: jax.device_put(x, chunk_sharding(mesh, x.ndim)), batches)


def state_shardings(state: TrainState) -> Any:
    """The pytree of each leaf's current sharding (e.g. for a jit's out_shardings)."""
    return jax.tree.map(lambda x: x.sharding, state)
