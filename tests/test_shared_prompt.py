"""Shared-prompt log-probs (`grouped_completion_log_probs`): each group's prompt runs through the
model once, packed with its G completions, and the log-probs, entropies and gradients equal the
per-row `completion_log_probs` of today's update, with LoRA, rematerialisation and a sharded
batch; `segment_ids` of one segment is the plain causal call."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl import sharding
from jaxrl.lm import lora
from jaxrl.lm.log_probs import completion_log_probs, grouped_completion_log_probs
from jaxrl.lm.model import ModelConfig, Transformer, init_params, param_shardings

MODEL = ModelConfig(
    vocab_size=64, hidden_size=32, intermediate_size=48, num_layers=2, num_heads=4,
    num_kv_heads=2, max_position_embeddings=64,
)  # fmt: skip
TEMPERATURE = 0.7
ATOL = 1e-5


def grouped_batch(groups: int, group_size: int, prompt: int, new: int, seed: int = 0) -> dict:
    """A GRPO-shaped batch: each group's prompt left-padded to its own length and repeated over
    its G contiguous rows, then G completions that end (EOS, then padding) at random steps."""
    rng = np.random.default_rng(seed)
    rows = groups * group_size
    prompt_tokens = rng.integers(3, MODEL.vocab_size, (groups, prompt))
    real = rng.integers(1, prompt + 1, groups)
    real[0] = prompt  # one unpadded prompt
    prompt_mask = np.arange(prompt)[None, :] >= (prompt - real)[:, None]
    prompt_tokens = np.where(prompt_mask, prompt_tokens, 0)
    lengths = rng.integers(1, new + 1, rows)
    lengths[0] = new  # one completion that never ends
    completion_mask = np.arange(new)[None, :] < lengths[:, None]
    completion = np.where(completion_mask, rng.integers(3, MODEL.vocab_size, (rows, new)), 0)
    completion[np.arange(rows), lengths - 1] = np.where(lengths < new, 1, completion[:, -1])
    return {
        "tokens": np.concatenate([np.repeat(prompt_tokens, group_size, 0), completion], 1).astype(
            np.int32
        ),
        "attention_mask": np.concatenate(
            [np.repeat(prompt_mask, group_size, 0), completion_mask], 1
        ),
        "completion_mask": completion_mask,
        "advantages": rng.normal(size=rows).astype(np.float32),
    }


def make_loss(log_probs_fn):
    """A scalar of all three outputs: advantage-weighted masked log-probs plus an entropy
    bonus and a uniform-KL term."""

    def loss(params, model, batch):
        log_probs, entropy, uniform_kl = log_probs_fn(model, params, batch)
        mask = batch["completion_mask"]
        surrogate = jnp.sum(jnp.where(mask, log_probs * batch["advantages"][:, None], 0.0))
        regularisers = 0.1 * entropy - 0.05 * uniform_kl
        return surrogate + jnp.sum(jnp.where(mask, regularisers, 0.0))

    return loss


def per_row(group_size):
    return lambda model, params, batch: completion_log_probs(model, params, batch, TEMPERATURE)


def grouped(group_size):
    return lambda model, params, batch: grouped_completion_log_probs(
        model, params, batch, TEMPERATURE, group_size
    )


def outputs_and_grads(kind, group_size, params, batch, model, wrap=lambda p: p):
    """(token statistics, gradient w.r.t. params) of `kind` (per_row or grouped), jitted;
    `wrap` maps the differentiated tree to the model's parameters (LoRA's attach)."""
    fn = kind(group_size)

    @jax.jit
    def run(params, batch):
        outputs = fn(model, wrap(params), batch)
        grads = jax.grad(lambda p: make_loss(fn)(wrap(p), model, batch))(params)
        return outputs, grads

    return run(params, batch)


def assert_same(reference, candidate):
    ref_statistics, ref_grads = reference
    statistics, grads = candidate
    for got, want in zip(statistics, ref_statistics, strict=True):  # log-probs, entropy, KL
        np.testing.assert_allclose(got, want, atol=ATOL, rtol=0)
    for path, ref_g in jax.tree_util.tree_leaves_with_path(ref_grads):
        g = dict(jax.tree_util.tree_leaves_with_path(grads))[path]
        np.testing.assert_allclose(g, ref_g, atol=ATOL, rtol=1e-4, err_msg=str(path))


@pytest.fixture(scope="module")
def params():
    return init_params(MODEL, jax.random.key(0))


@pytest.mark.parametrize("group_size", [2, 4])
def test_grouped_log_probs_entropies_and_gradients_equal_per_row(params, group_size):
    batch = grouped_batch(groups=3, group_size=group_size, prompt=7, new=5, seed=group_size)
    model = Transformer(MODEL)
    reference = outputs_and_grads(per_row, group_size, params, batch, model)
    assert_same(reference, outputs_and_grads(grouped, group_size, params, batch, model))
    # The test compares something: the gradient reaches every parameter.
    assert all(np.abs(g).max() > 0 for g in jax.tree.leaves(reference[1]))


def test_grouped_equals_per_row_with_rematerialisation(params):
    batch = grouped_batch(groups=2, group_size=4, prompt=6, new=4, seed=7)
    model = Transformer(dataclasses.replace(MODEL, remat="full"))
    reference = outputs_and_grads(per_row, 4, params, batch, model)
    assert_same(reference, outputs_and_grads(grouped, 4, params, batch, model))


def test_grouped_equals_per_row_with_lora(params):
    config = lora.LoraConfig(rank=4, alpha=8.0, targets=(*lora.DEFAULT_TARGETS, "lm_head"))
    adapters = lora.init_adapters(jax.random.key(1), params, config)
    # B starts at 0, where the adapters change nothing; random B makes them count.
    keys = iter(jax.random.split(jax.random.key(2), 64))
    adapters = jax.tree.map(
        lambda x: 0.1 * jax.random.normal(next(keys), x.shape) if x.shape[0] else x,
        adapters,
    )

    def wrap(trained):
        return lora.attach(params, trained, config.scale)

    batch = grouped_batch(groups=2, group_size=4, prompt=6, new=4, seed=3)
    model = Transformer(MODEL)
    reference = outputs_and_grads(per_row, 4, adapters, batch, model, wrap)
    assert_same(reference, outputs_and_grads(grouped, 4, adapters, batch, model, wrap))


def test_grouped_on_eight_devices_equals_per_row_on_one(params):
    """The rows split over 8 simulated devices (one group each), parameters placed as the mesh
    says: the same log-probs and gradients as the per-row pass on one device."""
    group_size = 2
    batch = grouped_batch(groups=8, group_size=group_size, prompt=6, new=4, seed=11)
    reference = outputs_and_grads(per_row, group_size, params, batch, Transformer(MODEL))
    mesh = sharding.make_mesh(8, 1, 1)
    placed = jax.device_put(params, param_shardings(MODEL, mesh))
    sharded = sharding.shard_batch(batch, mesh)
    model = Transformer(MODEL, mesh=mesh)
    assert_same(reference, outputs_and_grads(grouped, group_size, placed, sharded, model))


def test_one_segment_is_the_plain_causal_call(params):
    """segment_ids all 0 (with the positions a plain call computes) is today's attention."""
    batch = grouped_batch(groups=2, group_size=2, prompt=6, new=4, seed=5)
    model = Transformer(MODEL)
    mask = batch["attention_mask"]
    positions = np.maximum(np.cumsum(mask, axis=1) - 1, 0)
    plain, _ = model.apply({"params": params}, batch["tokens"], None, mask)
    segmented, _ = model.apply(
        {"params": params},
        batch["tokens"],
        positions,
        mask,
        segment_ids=np.zeros(mask.shape, np.int32),
    )
    np.testing.assert_allclose(segmented, plain, atol=ATOL, rtol=0)


def test_grouped_refuses_rows_that_are_not_whole_groups(params):
    batch = grouped_batch(groups=2, group_size=3, prompt=4, new=3)
    with pytest.raises(ValueError, match="whole groups of group_size = 4"):
        grouped_completion_log_probs(Transformer(MODEL), params, batch, TEMPERATURE, 4)


def test_tokens_per_pass_at_the_word_problems_shape():
    """What the model computes per pass at word_problems' shape (8 prompts x 8 samples, about
    96 prompt tokens, 12 new ones): every row's prompt copy, against each prompt once."""
    groups, group_size, prompt, new = 8, 8, 96, 12
    per_row_tokens = groups * group_size * (prompt + new)
    grouped_tokens = groups * (prompt + group_size * new)
    print(
        f"\ntokens per pass: per row {per_row_tokens}, shared prompt {grouped_tokens} "
        f"({per_row_tokens / grouped_tokens:.1f}x fewer); head positions both "
        f"{groups * group_size * new}"
    )
    assert (per_row_tokens, grouped_tokens) == (6912, 1536)
