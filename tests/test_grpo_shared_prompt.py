"""GRPO's update with shared prompts (`grpo.Config.shared_prompt`): each group's prompt runs
through the model once in the loss's pass and in the old-policy and reference passes, and the
update equals today's (every row's own prompt) within the tolerance of the pass's own test
(tests/test_shared_prompt.py): for every variant, with the KL penalty and the entropy bonus,
epochs, LoRA, gradient accumulation, length buckets and 8 simulated devices; and partial and
async modes at staleness 0 still equal synchronous GRPO with it.

Where today's numbers cannot be reproduced: with num_minibatches > 1 today's update shuffles rows
into minibatches, the shared one whole groups (a different draw of which completions step
together); there the test holds the shared pass to the per-row pass over the same group-shuffled
minibatches."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from algos import grpo, optimizer_steps
from algos.asynchronous import Async
from algos.partial import Partial
from algos.rollouts import Sync
from jaxrl import hparams, loop, sharding
from jaxrl.config import ConfigError, from_flat
from jaxrl.lm import memory, training
from jaxrl.lm.log_probs import PER_ROW, LogProbPass
from jaxrl.lm.model import Transformer, init_params, param_shardings
from jaxrl.lm.sampler import Sampling
from tests.test_async_rollouts import _async_updates
from tests.test_partial_rollouts import TEXT_TASK, TINY, _updates
from tests.test_shared_prompt import grouped_batch

ATOL = 1e-5  # tests/test_shared_prompt.py's, for log-probs and gradients
# Small enough that Adam's steps keep rounding differences of the gradient below ATOL in the
# parameters (Adam turns a gradient element near 0 into a step of up to the learning rate, in
# the direction of its sign: at 1e-3 the two passes' parameters differed by 1.05e-5 after 3
# updates), large enough that every update moves them by many ATOLs.
LEARNING_RATE = 1e-4
BASE = dict(batch_size=4, group_size=4, max_new_tokens=5, learning_rate=LEARNING_RATE)


def _three_updates(config, params, reference=None, mesh=None):
    """Three updates of `config` from `params` on TEXT_TASK (reverse_digits prompts, the dense
    even-token reward), one compiled chunk: the parameters after them and their metrics."""
    if mesh is not None:
        params = jax.device_put(params, param_shardings(TINY, mesh))
        reference = None if reference is None else params
    algorithm = grpo.make(config, TINY, TEXT_TASK, params, mesh)
    hp = hparams.hparams(config)
    state = algorithm.init(jax.random.PRNGKey(3), hp)
    chunk = jax.jit(loop.make_chunk(algorithm.update, 3, runs_axis=False))
    state, metrics = chunk(state, grpo.Inputs(reference), hp)
    return jax.device_get(state.params), jax.device_get(metrics)


def _assert_shared_equals_per_row(settings, mesh_shape=(1, 1, 1)):
    """The update with shared_prompt equals today's (shared_prompt False): the same samples
    (rewards, lengths), losses, KL, entropies, gradient norms, and parameters within ATOL; and
    the updates moved the parameters by far more than that."""
    params = init_params(TINY, jax.random.key(0))
    reference = params if settings.get("kl_beta") else None
    mesh = sharding.make_mesh(*mesh_shape) if mesh_shape != (1, 1, 1) else None
    today = from_flat(grpo.Config, BASE | settings | dict(mesh_shape=mesh_shape))
    shared = dataclasses.replace(today, shared_prompt=True)
    assert optimizer_steps.log_prob_pass(shared) == LogProbPass(today.group_size)
    assert optimizer_steps.log_prob_pass(today) == PER_ROW
    want_params, want = _three_updates(today, params, reference, mesh)
    got_params, got = _three_updates(shared, params, reference, mesh)
    for name in ("reward", "completion_length"):
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)
    for name in ("loss", "entropy", "kl", "grad_norm", "clip_fraction", "logprob_mismatch_mean"):
        if name in want:
            np.testing.assert_allclose(got[name], want[name], atol=ATOL, rtol=1e-5, err_msg=name)
    for (path, w), g in zip(
        jax.tree_util.tree_leaves_with_path(want_params), jax.tree.leaves(got_params), strict=True
    ):
        np.testing.assert_allclose(g, w, atol=ATOL, rtol=0, err_msg=jax.tree_util.keystr(path))
    leaves = zip(jax.tree.leaves(want_params), jax.tree.leaves(params), strict=True)
    moved = max(np.abs(w - p).max() for w, p in leaves)
    assert moved > 10 * ATOL  # the updates moved the parameters: the equality is not vacuous


# gspo and cispo differ from grpo only when the ratio is not 1: two epochs, so the old
# policy's pass runs (shared too) and the second epoch's ratios move.
@pytest.mark.parametrize(
    "settings",
    [
        dict(variant="grpo", kl_beta=0.05, entropy_coef=0.01, uniform_kl_coef=0.02),
        dict(variant="dr_grpo", kl_beta=0.05),
        dict(variant="dapo", num_epochs=2, entropy_coef=0.01),
        dict(variant="rloo", kl_beta=0.05),
        dict(variant="remax"),
        dict(variant="gspo", num_epochs=2, clip_low=3e-4, clip_high=4e-4),
        dict(variant="cispo", num_epochs=2, kl_beta=0.05),
    ],
    ids=["grpo", "dr_grpo", "dapo", "rloo", "remax", "gspo", "cispo"],
)
def test_shared_update_equals_todays_for_every_variant(settings):
    _assert_shared_equals_per_row(settings)


@pytest.mark.parametrize(
    "settings",
    [
        # LoRA (with dropout: the same masks in both) over 2 micro-batches of 2 groups each
        dict(variant="dr_grpo", lora_rank=2, lora_dropout=0.1, grad_accum_steps=2, kl_beta=0.05),
        # 2 micro-batches, each in 2 length buckets of one group (sorted by its longest row);
        # two epochs, so the old policy's and the reference's passes run in buckets too
        dict(variant="dapo", grad_accum_steps=2, length_buckets=2, num_epochs=2, kl_beta=0.05),
    ],
    ids=["lora_accumulation", "length_buckets"],
)
def test_shared_update_equals_todays_with_lora_accumulation_and_buckets(settings):
    _assert_shared_equals_per_row(settings)


@pytest.mark.xla_defaults  # atol 1e-5 on the gradients: 2.1e-5 at the tests' compile settings
def test_shared_update_equals_todays_on_8_devices():
    """A (2, 2, 2) mesh of 8 simulated devices, 8 groups of 2 (two whole groups per batch
    shard), two epochs and the reference: shared equals per row on the same mesh."""
    _assert_shared_equals_per_row(
        dict(variant="grpo", batch_size=8, group_size=2, num_epochs=2, kl_beta=0.05),
        mesh_shape=(2, 2, 2),
    )


def _grouped_batch(groups, group_size, prompt, new, seed=0):
    """test_shared_prompt's rollout-shaped batch (prompts left-padded and repeated over their
    group's rows, completions ending at random steps), on the device, with GRPO's weights."""
    batch = grouped_batch(groups, group_size, prompt, new, seed)
    batch = {name: jnp.asarray(value) for name, value in batch.items()}
    return batch | {"weights": jnp.ones(groups * group_size, jnp.float32)}


def test_minibatches_of_whole_groups_equal_the_per_row_pass_over_them():
    """num_minibatches = 2: the shared update shuffles whole groups into minibatches (today's
    shuffles rows: not the same minibatches, so not today's numbers). Over the same group-
    shuffled minibatches the per-row pass gives the same parameters and metrics."""
    config = from_flat(grpo.Config, BASE | dict(num_minibatches=2, num_epochs=2, kl_beta=0.05))
    config = dataclasses.replace(config, shared_prompt=True)
    batch = _grouped_batch(config.batch_size, config.group_size, prompt=6, new=5)
    params = init_params(TINY, jax.random.key(7))
    model = Transformer(TINY)
    hp = hparams.hparams(config)
    group = config.group_size

    def optimize_with_pass(log_prob_pass):
        loss_fn = grpo.make_loss(model, config, log_prob_pass=log_prob_pass)

        def no_grad(p, b):
            temperature = config.sampling.temperature
            return jax.lax.stop_gradient(log_prob_pass(model, p, b, temperature)[0])

        # Both shuffle whole groups of G rows; only the pass differs.
        return optimizer_steps.optimize_with(
            loss_fn, no_grad, config, None, None, group, denominators=optimizer_steps.normalisers
        )

    init = training.make_init(params, config)
    results = []
    for log_prob_pass in (PER_ROW, LogProbPass(group)):
        optimize = optimize_with_pass(log_prob_pass)
        state = init(jax.random.key(1), hp)
        run = jax.jit(lambda s, o=optimize: o(s, batch, hp, jax.random.key(2), s.params, params))
        results.append(jax.device_get(run(state)))
    (want_state, want), (got_state, got) = results
    for name in want:
        np.testing.assert_allclose(got[name], want[name], atol=ATOL, rtol=1e-5, err_msg=name)
    for w, g in zip(*map(jax.tree.leaves, (want_state.params, got_state.params)), strict=True):
        np.testing.assert_allclose(g, w, atol=ATOL, rtol=0)
    # The group shuffle keeps each group's rows together and in order.
    order = training.into_minibatches(
        {"row": jnp.arange(16)}, jax.random.key(0), 2, 1, group_size=4
    )["row"].reshape(-1, 4)
    np.testing.assert_array_equal(order - order[:, :1], np.tile(np.arange(4), (4, 1)))
    assert sorted(order[:, 0].tolist()) == [0, 4, 8, 12]


def test_length_buckets_sort_whole_groups():
    """A shared pass's length buckets sort groups by their longest completion; a stable sort
    keeps each group's rows contiguous and in order."""
    mask = np.zeros((8, 6), bool)
    for row, length in enumerate([1, 2, 6, 1, 3, 3, 1, 1]):
        mask[row, :length] = True
    extent = optimizer_steps.group_extent(jnp.asarray(mask), 2)
    np.testing.assert_array_equal(extent, [2, 2, 6, 6, 3, 3, 1, 1])
    np.testing.assert_array_equal(jnp.argsort(extent, stable=True), [6, 7, 0, 1, 4, 5, 2, 3])
    np.testing.assert_array_equal(
        optimizer_steps.group_extent(jnp.asarray(mask), 1), [1, 2, 6, 1, 3, 3, 1, 1]
    )


def test_shared_prompt_refused_where_a_pass_would_split_a_group():
    cases = [
        dict(grad_accum_steps=4),  # micro-batches of 4 rows, groups of 8
        dict(length_buckets=4),  # buckets of 4 rows
        dict(mesh_shape=(4, 1, 1)),  # 16 rows over 4 batch shards: 4 per shard
    ]
    for settings in cases:
        with pytest.raises(ConfigError, match="^shared_prompt: .*; .*") as error:
            grpo.Config(batch_size=2, group_size=8, shared_prompt=True, **settings)
        assert "\n" not in str(error.value)
    grpo.Config(batch_size=2, group_size=8, shared_prompt=True, grad_accum_steps=2)
    # Off, or groups of one (ReMax), there is nothing to split.
    grpo.Config(batch_size=2, group_size=8, grad_accum_steps=4)
    remax = grpo.Config(batch_size=2, group_size=1, variant="remax", shared_prompt=True)
    assert optimizer_steps.log_prob_pass(remax) == PER_ROW


def test_memory_estimate_counts_each_prompt_once():
    """The estimate's activations follow the tokens the step runs: word_problems' shape (a
    micro-batch of 2 groups of 8, 96 + 12 tokens) runs 2 x (96 + 8 x 12) = 384 tokens instead
    of 16 x 108 = 1,728; the head's positions stay 16 x 12."""
    from jaxrl.lm.model import ModelConfig

    model = ModelConfig(
        vocab_size=49_152, hidden_size=576, intermediate_size=1536, num_layers=30,
        num_heads=9, num_kv_heads=3, tie_embeddings=True,
    )  # fmt: skip
    config = grpo.Config(
        batch_size=8, group_size=8, grad_accum_steps=4, sampling=Sampling(max_new_tokens=12)
    )
    today = memory.grpo_estimate(config, model, 96)
    shared = memory.grpo_estimate(dataclasses.replace(config, shared_prompt=True), model, 96)
    ratio = shared.parts["kept_activations"] / today.parts["kept_activations"]
    assert ratio == pytest.approx(384 / 1728)
    assert shared.parts["head_chunks"] == pytest.approx(today.parts["head_chunks"])
    assert shared.total < today.total
    assert LogProbPass(8).tokens(16, 96, 12) == 384 and PER_ROW.tokens(16, 96, 12) == 1728


def test_memory_estimate_of_the_shared_update_is_within_15_percent_of_xlas_plan():
    """test_memory's calibration shape (SmolLM2, 4 prompts x 8 x (128 + 256) tokens, bf16 over
    fp32), shared: completions twice the prompt's length, where the packed attention's scores
    (counted for one layer) are most of what sharing adds. Compile only, nothing allocated."""
    from experiments.benchmarks import memory_plan

    config, model, prompt_length = memory_plan.grpo_run("smollm2")
    config = dataclasses.replace(config, shared_prompt=True)
    plan, _ = memory_plan.plan(config, model, prompt_length)
    estimate = memory.grpo_estimate(config, model, prompt_length)
    assert estimate.parts["attention_scores"] > 0
    assert estimate.total == pytest.approx(plan["total"], rel=0.15)
    assert estimate.temporaries == pytest.approx(plan["temp"], rel=0.15)


# --- partial and async modes: carried rows train through the same (shared) passes ------------

SHARED = grpo.Config(
    batch_size=4, group_size=4, sampling=Sampling(max_new_tokens=6), learning_rate=3e-3,
    shared_prompt=True,
)  # fmt: skip


def test_partial_with_bound_zero_equals_synchronous_grpo_with_shared_prompts():
    """Partial rollouts at staleness 0 with shared prompts: the same parameters and losses, bit
    for bit, as synchronous GRPO with shared prompts (the groups it trains, carried or not, are
    whole and in order, their prompts kept in the slots; each runs its prompt once per pass)."""
    sync_states, sync_metrics = _updates(SHARED, 2)
    partial_states, partial_metrics = _updates(SHARED, 2, rollout=Partial())
    for want, got, m_want, m_got in zip(
        sync_states, partial_states, sync_metrics, partial_metrics, strict=True
    ):
        for a, b in zip(*map(jax.tree.leaves, (want.params, got.params)), strict=True):
            np.testing.assert_array_equal(jax.device_get(a), jax.device_get(b))
        assert m_got["loss"] == m_want["loss"]


def test_async_with_bound_zero_equals_synchronous_grpo_with_shared_prompts():
    """Async at staleness 0 (fp32 generation copy, one device) with shared prompts: the same
    parameters and losses, bit for bit, as synchronous GRPO with them."""
    config = SHARED
    sync_states, sync_metrics = _updates(config, 2, rollout=Sync())
    async_states, async_metrics = _async_updates(
        config, 2, rollout=Async(generation_dtype="float32")
    )
    for want, got, m_want, m_got in zip(
        sync_states, async_states, sync_metrics, async_metrics, strict=True
    ):
        for a, b in zip(*map(jax.tree.leaves, (want.params, got.params)), strict=True):
            np.testing.assert_array_equal(jax.device_get(a), jax.device_get(b))
        for name in ("reward", "loss", "completion_length"):
            assert m_got[name] == m_want[name], name
