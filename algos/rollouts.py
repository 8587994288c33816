"""How generation meets training in GRPO and multi-turn GRPO: the rollout is a part passed to the
algorithm, the way Tunix's learner takes a rollout engine.

    grpo.make(config, model, task, params, mesh)                      # Sync()
    grpo.make(config, model, task, params, mesh, rollout=Partial(rollout_budget=4,
              max_staleness=1))                                      # algos.partial
    multiturn.make(config, model, env, params, eos_id, pad_id, mesh,
                   rollout=Async(max_staleness=1))                   # algos.asynchronous

A rollout mode is a frozen dataclass of its own settings, validated on construction, with
`check(config)` (its settings against the algorithm's Config: the batch, the mesh, what the mode
does not support yet) and `make(learner) -> Algorithm`. The algorithm hands it a `Learner`: the
pieces every mode assembles in its own schedule (the synchronous rollout, the optimizer steps on a
batch, the inputs' unpacking, the trainer's log-probs). This module holds that contract and the
synchronous mode, `Sync`: every update samples its batch to the end, then trains on it, in one
program.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, ClassVar, NamedTuple

import jax
import jax.numpy as jnp

from algos.dynamic_sampling import no_signal_monitor
from jaxrl.config import require, require_count
from jaxrl.hparams import HParams, static
from jaxrl.lm import lora, training
from jaxrl.lm.model import ModelConfig
from jaxrl.lm.sampler import SamplingConfig
from jaxrl.loop import Algorithm

Array = jax.Array
# rollout(params, key, hparams, data) -> (the batch an update trains on, the rollout's metrics)
Rollout = Callable[..., tuple[dict[str, Array], dict[str, Array]]]
# optimize(state, batch, hparams, shuffle_key, policy, reference_params) -> (state, step metrics)
Optimize = Callable[..., tuple[Any, dict[str, Array]]]


class Learner(NamedTuple):
    """What an algorithm hands its rollout mode: its settings, model and starting parameters, and
    the pieces each mode assembles in its own schedule."""

    name: str  # how warnings name the run, e.g. "GRPO (dapo)"
    config: Any  # the algorithm's Config
    model: ModelConfig
    params: Any  # the starting parameters, placed on `mesh`
    mesh: Any  # the training mesh (None: one device)
    source: Any  # what episodes come from: a TextTask's prompts, or a text game
    sampling: SamplingConfig  # the sampler's settings for the source's tokens
    # (mesh, decode_row_buckets) -> the synchronous rollout on that mesh
    make_rollout: Callable[[Any, int], Rollout]
    # behaviour_clip -> the optimizer steps on one batch (`grpo.policy_loss`'s behaviour_clip,
    # which modes whose samples may be older than the proximal policy turn on)
    make_optimize: Callable[[bool], Optimize]
    # an update's inputs -> (reference parameters or None, the rollout's data or None)
    unpack_inputs: Callable[[Any], tuple[Any, Any]]
    # mesh -> trainer_log_probs(params, batch) -> [B, N], the trainer's log-probs of the
    # sampled tokens (async mode measures the sampler/trainer gap on the generation mesh)
    make_trainer_log_probs: Callable[[Any], Callable[[Any, dict], Array]]
    check_memory: Callable[[], None]  # refuses an update the device cannot hold
    data: Any = None  # the rollout's data at init (a prompt table), for shapes


def check_decode_row_buckets(buckets: int, config: Any, groups: int = 0) -> None:
    """decode_row_buckets against the rows one sampler call decodes ((groups or batch_size) x
    group_size) and the training mesh that splits them."""
    if buckets == 0:
        return
    rows = (groups or config.batch_size) * config.group_size
    shards = training.check_mesh_shape(config.mesh_shape)
    require(
        rows % (buckets * shards) == 0,
        "decode_row_buckets",
        f"{buckets} buckets of the {rows} rows a rollout decodes do not split evenly over "
        f"the mesh's data*fsdp = {shards} batch shards",
        f"choose a number of buckets that divides {rows // shards}",
    )


def require_decode_row_buckets(rollout: Any) -> None:
    """`decode_row_buckets` is a count (0: off)."""
    require_count(rollout, "decode_row_buckets", "use 0 (off) or a number of row buckets")


def sampled_and_policy(state: Any, model: ModelConfig) -> tuple[Any, Any]:
    """The parameters the sampler reads and those the old log-probs are taken under: the state's
    own, or with LoRA the adapters merged straight into the sampler's copy in the compute dtype,
    one layer at a time, and base plus adapters read as the loss reads them (`lora.attach`), so
    no fp32 merged copy of the model is made."""
    if isinstance(state, training.LoraTrainState):
        sampled = lora.merge(state.base, state.adapters, state.scale, dtype=model.dtype)
        return sampled, lora.attach(state.base, state.adapters, state.scale)
    return state.params, state.params


def monitor_of(name: str, config: Any) -> Callable[[Any, Any], None] | None:
    """The no-signal warning of `config.warn_no_signal_updates` (None when 0)."""
    if config.warn_no_signal_updates == 0:
        return None
    return no_signal_monitor(name, config.warn_no_signal_updates, dynamic=config.dynamic_sampling)


@dataclasses.dataclass(frozen=True)
class Sync:
    """Synchronous rollouts: every update samples its completions (or plays its episodes) to the
    end, then takes its optimizer steps on them, all in one compiled program.

    decode_row_buckets: 0 decodes every row until the last one ends (rows that ended compute
    padding). k > 0 gathers the rows still sampling into the smallest of rows x 1/k, 2/k, ...,
    1 that holds them (`sampler.decode_live_rows`): the same samples, up to the rounding of a
    smaller matmul. It pays where a decode step costs about its rows (a CPU); on a GPU a step
    mostly reads the weights, whatever its rows. Single completions only (GRPO)."""

    decode_row_buckets: int = 0
    # The runner drives the update inside one compiled chunk (async mode's is a host loop).
    host_loop: ClassVar[bool] = False

    def __post_init__(self) -> None:
        require_decode_row_buckets(self)

    def check(self, config: Any) -> None:
        """These settings against the algorithm's Config."""
        check_decode_row_buckets(self.decode_row_buckets, config)

    def make(self, learner: Learner) -> Algorithm:
        """The algorithm as `init(key, hparams)` and `update(state, inputs, hparams)`: update i
        draws its rollout and shuffle keys from fold_in(state.key, i), so a resumed run repeats
        exactly what an uninterrupted one does."""
        config = static(learner.config)
        learner.check_memory()
        rollout = learner.make_rollout(learner.mesh, self.decode_row_buckets)
        monitor = monitor_of(learner.name, config)
        optimize = learner.make_optimize(False)

        def update(state: Any, inputs: Any, hp: HParams):
            reference_params, data = learner.unpack_inputs(inputs)
            rollout_key, shuffle_key = jax.random.split(jax.random.fold_in(state.key, state.step))
            sampled, policy = sampled_and_policy(state, learner.model)
            batch, metrics = rollout(sampled, rollout_key, hp, data)
            state, step_metrics = optimize(state, batch, hp, shuffle_key, policy, reference_params)
            metrics.update(jax.tree.map(jnp.mean, step_metrics))
            if monitor is not None:
                jax.debug.callback(monitor, state.step, metrics["zero_variance_fraction"])
            return state._replace(step=state.step + 1), metrics

        init = training.make_init(learner.params, config, learner.mesh, learner.model)
        return Algorithm(init, update)
