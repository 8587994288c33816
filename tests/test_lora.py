"""LoRA (jaxrl.lm.lora) in SFT, DPO and GRPO: only adapters train and only they have optimizer
state, merging equals the unmerged model (a NumPy forward that applies x @ W + s * (x @ A) @ B),
adapters are sharded like their base weights, LoRA and full fine-tuning learn the same small task,
the state checkpoints, and bad settings are one-line ConfigErrors naming the field."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from algos import dpo, grpo, sft
from envs.text import make_task
from jaxrl import hparams, loop, sharding
from jaxrl.checkpoint import Checkpointer
from jaxrl.config import ConfigError
from jaxrl.lm import lora, training
from jaxrl.lm.model import (
    ModelConfig,
    Transformer,
    init_params,
    param_axes,
    param_shardings,
    unstack_layers,
)
from jaxrl.lm.sampler import Sampling
from jaxrl.lm.tokenizer import ByteTokenizer

# One layer holds every kind of target; a second would only double the compile times.
MODEL = ModelConfig(
    vocab_size=32, hidden_size=32, intermediate_size=64, num_layers=1, num_heads=4,
    num_kv_heads=2, max_position_embeddings=16,
)  # fmt: skip
ALL_TARGETS = (*lora.DEFAULT_TARGETS, "lm_head")


def memorise_batch(num=8, prompt=4, completion=4, seed=0):
    """A fixed SFT batch: random prompts and completions, the completion tokens as targets."""
    tokens = np.random.default_rng(seed).integers(3, MODEL.vocab_size, (num, prompt + completion))
    loss_mask = np.zeros(tokens.shape, np.float32)
    loss_mask[:, prompt:] = 1.0
    return {
        "tokens": tokens.astype(np.int32),
        "attention_mask": np.ones(tokens.shape, bool),
        "loss_mask": loss_mask,
    }


def train_sft(config, steps, params=None, mesh=None, batch=None, model=MODEL):
    """`steps` SFT updates on one fixed batch in one compiled chunk: (final state, metrics)."""
    params = init_params(model, jax.random.key(0)) if params is None else params
    batch = memorise_batch() if batch is None else batch
    algorithm = sft.make(config, model, params, mesh)
    hp = hparams.hparams(config)
    if mesh is not None:
        hp = jax.device_put(hp, sharding.replicated(mesh))
    state = algorithm.init(jax.random.key(1), hp)
    stacked = {k: np.broadcast_to(v[None, None], (steps, 1, *v.shape)) for k, v in batch.items()}
    stacked = training.shard_chunk(stacked, mesh)
    chunk = loop.make_chunk(algorithm.update, steps, runs_axis=False, scan_inputs=True)
    if mesh is None:
        return jax.jit(chunk)(state, stacked, hp)
    out = (training.state_shardings(state), sharding.replicated(mesh))
    return jax.jit(chunk, out_shardings=out)(state, stacked, hp)


def leaves_equal(a, b):
    """Bit-identical pytrees (typed PRNG keys compared by their data)."""
    data = lambda x: jax.random.key_data(x) if jnp.issubdtype(x.dtype, jax.dtypes.prng_key) else x  # noqa: E731
    return all(
        np.array_equal(data(x), data(y))
        for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True)
    )


def count(tree):
    return sum(int(np.prod(x.shape)) for x in jax.tree.leaves(tree))


# --- (a) only the adapters train --------------------------------------------------------------

LORA_SFT = sft.Config(batch_size=8, learning_rate=1e-2, lora_rank=4, lora_dropout=0.1)


@pytest.fixture(scope="module")
def lora_run():
    """Five LoRA SFT steps (with dropout) from init_params(MODEL, key 0): (params, state,
    metrics)."""
    params = init_params(MODEL, jax.random.key(0))
    state, metrics = train_sft(LORA_SFT, 5, params)
    return params, state, metrics


def test_lora_sft_changes_only_the_adapters(lora_run):
    params, state, metrics = lora_run
    config = LORA_SFT
    assert isinstance(state, training.LoraTrainState)
    assert leaves_equal(state.base, params)  # the frozen base is bit-identical after 5 steps
    fresh = lora.init_adapters(jax.random.fold_in(jax.random.key(1), 0x10A0), params, config.lora)
    for path, (a, b) in lora._adapters(state.adapters):
        assert not np.array_equal(b, lora._get(fresh, path).b), path  # every B moved from 0
        assert a.dtype == b.dtype == jnp.float32
    # The optimizer state holds moments of the adapters and nothing else.
    moments = [x for x in jax.tree.leaves(state.opt_state) if x.ndim > 0]
    assert count(moments) == 2 * lora.num_adapter_params(state.adapters)
    # The merged parameters (what scripts save) are plain, base-shaped, and moved.
    merged = state.params
    assert jax.tree.structure(merged) == jax.tree.structure(params)
    q = ("layers", "attention", "q_kernel")
    assert not np.array_equal(lora._get(merged, q), lora._get(params, q))
    assert np.array_equal(merged["embedding"], params["embedding"])  # not a target
    assert metrics["loss"][-1] < metrics["loss"][0]


# --- (b) merging equals the unmerged model ---------------------------------------------------


def numpy_logits(params, adapters, scale, tokens):
    """The decoder in float64 NumPy with each adapted weight applied UNMERGED: x @ W + scale *
    (x @ A) @ B, the inputs flattened over the weight's input dimensions."""
    # Layer by layer, as `layer_i` entries: the model stacks them on a leading axis.
    p = jax.tree.map(lambda x: np.asarray(x, np.float64), unstack_layers(params))
    ad = {path: jax.tree.map(lambda x: np.asarray(x, np.float64), a)
          for path, a in lora._adapters(unstack_layers(adapters))}  # fmt: skip
    c = MODEL

    def linear(x, path, weight):
        n_in = lora.INPUT_DIMS[path[-1]]
        lead = x.shape[: x.ndim - n_in]
        flat_x = x.reshape(*lead, -1)
        out_shape = weight.shape[n_in:]
        y = flat_x @ weight.reshape(flat_x.shape[-1], -1)
        if path in ad:
            a, b = ad[path]
            y = y + scale * (flat_x @ a.reshape(flat_x.shape[-1], -1)) @ b.reshape(b.shape[0], -1)
        return y.reshape(*lead, *out_shape)

    def rms(x, w):
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + c.rms_norm_eps) * w

    def rope(x):  # [T, H, D], rotate_half convention
        d = x.shape[-1]
        inv = 1.0 / c.rope_theta ** (np.arange(0, d, 2) / d)
        angles = np.arange(x.shape[0])[:, None] * inv
        cos, sin = np.cos(angles)[:, None], np.sin(angles)[:, None]
        x1, x2 = x[..., : d // 2], x[..., d // 2 :]
        return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)

    out = []
    for row in np.asarray(tokens):
        x = p["embedding"][row]
        length, groups = len(row), c.num_heads // c.num_kv_heads
        for i in range(c.num_layers):
            name, lp = f"layer_{i}", p[f"layer_{i}"]
            h = rms(x, lp["input_norm"]["scale"])
            at = lambda k, name=name: (name, "attention", k)  # noqa: E731
            q = rope(linear(h, at("q_kernel"), lp["attention"]["q_kernel"]))
            k = rope(linear(h, at("k_kernel"), lp["attention"]["k_kernel"]))
            v = linear(h, at("v_kernel"), lp["attention"]["v_kernel"])
            heads = []
            for head in range(c.num_heads):
                scores = q[:, head] @ k[:, head // groups].T / math.sqrt(c.dims_per_head)
                scores = np.where(np.tri(length, dtype=bool), scores, -np.inf)
                weights = np.exp(scores - scores.max(-1, keepdims=True))
                heads.append(weights / weights.sum(-1, keepdims=True) @ v[:, head // groups])
            x = x + linear(np.stack(heads, 1), at("o_kernel"), lp["attention"]["o_kernel"])
            h = rms(x, lp["post_attention_norm"]["scale"])
            mlp = lambda k, name=name: (name, "mlp", k)  # noqa: E731
            gate = linear(h, mlp("gate_kernel"), lp["mlp"]["gate_kernel"])
            up = linear(h, mlp("up_kernel"), lp["mlp"]["up_kernel"])
            hidden = gate / (1 + np.exp(-gate)) * up
            x = x + linear(hidden, mlp("down_kernel"), lp["mlp"]["down_kernel"])
        x = rms(x, p["final_norm"]["scale"])
        out.append(linear(x, ("lm_head",), p["lm_head"]))
    return np.stack(out)


def test_merged_params_give_the_unmerged_models_logits():
    params = init_params(MODEL, jax.random.key(0))
    config = lora.LoraConfig(rank=4, alpha=8.0, targets=ALL_TARGETS)
    adapters = lora.init_adapters(jax.random.key(2), params, config)
    # Random B (a fresh adapter's B is 0, which would make the check vacuous), large enough that
    # the adapters move the logits by far more than the tolerance.
    keys = iter(jax.random.split(jax.random.key(3), 100))
    adapters = jax.tree.map(
        lambda x: x if x.shape[0] != 4 else 0.05 * jax.random.normal(next(keys), x.shape),
        adapters,
    )
    tokens = memorise_batch()["tokens"][:3]
    merged = lora.merge(params, adapters, config)
    forward = jax.jit(lambda p: Transformer(MODEL).apply({"params": p}, tokens)[0])
    logits = forward(merged)
    unmerged = numpy_logits(params, adapters, config.scale, tokens)
    base = numpy_logits(params, {}, config.scale, tokens)
    error = np.max(np.abs(np.asarray(logits, np.float64) - unmerged))
    print(f"max |merged - unmerged| logit error: {error:.2e}")
    assert error < 1e-5
    assert np.max(np.abs(unmerged - base)) > 1e-2  # the adapters do change the model
    # Training's forward (`apply`) is the merged model's too.
    applied = forward(lora.apply(params, adapters, config.scale))
    np.testing.assert_allclose(applied, logits, atol=1e-6)


# --- (c) optimizer state size ------------------------------------------------------------------

SMOLLM2 = ModelConfig(
    vocab_size=49152, hidden_size=576, intermediate_size=1536, num_layers=30, num_heads=9,
    num_kv_heads=3, tie_embeddings=True,
)  # fmt: skip


@pytest.mark.parametrize(
    "model, rank, bound",
    [(MODEL, 4, 0.25), (SMOLLM2, 8, 0.02), (SMOLLM2, 16, 0.04)],
    ids=["tiny-r4", "smollm2-r8", "smollm2-r16"],
)
def test_optimizer_state_is_a_small_fraction_of_full_fine_tuning(model, rank, bound):
    """Abstract shapes only (jax.eval_shape): SmolLM2-135M's sizes cost nothing to count."""
    hp = hparams.hparams(sft.Config())
    params = jax.eval_shape(lambda: init_params(model, jax.random.key(0)))

    def optimizer_state_size(config):
        init = lambda p: sft.make(config, model, p).init(jax.random.key(0), hp)  # noqa: E731
        return count(jax.eval_shape(init, params).opt_state)

    full, with_lora = (
        optimizer_state_size(sft.Config()),
        optimizer_state_size(sft.Config(lora_rank=rank)),
    )
    ratio = with_lora / full
    print(f"optimizer state LoRA/full, rank {rank}: {ratio:.4f} ({with_lora:,} / {full:,})")
    assert ratio < bound


# --- (d) both learn the same task --------------------------------------------------------------


def test_lora_and_full_fine_tuning_both_memorise_the_same_completions():
    """8 random 4-token completions of random 4-token prompts (vocab 32): chance is a loss of
    ln 32 = 3.47. Both must reach loss < 0.05 (mean probability of each right token > 0.95) and
    greedy accuracy 1.0 on every completion token. Measured after 80 steps: full ~1e-3 (lr 1e-2),
    LoRA rank 4 on every linear map and the head ~2e-3 (lr 1e-2, alpha 8)."""
    batch = memorise_batch()
    loss_fn = sft.make_loss(Transformer(MODEL))
    results = {}
    for name, config in {
        "full": sft.Config(batch_size=8, learning_rate=1e-2),
        "lora": sft.Config(
            batch_size=8, learning_rate=1e-2, lora_rank=4, lora_alpha=8.0, lora_targets=ALL_TARGETS
        ),
    }.items():
        state, _ = train_sft(config, 80, batch=batch)
        loss, metrics = loss_fn(state.params, batch)  # the merged parameters, evaluated after
        results[name] = (float(loss), float(metrics["token_accuracy"]))
    print("final (loss, token accuracy):", results)
    for name, (loss, accuracy) in results.items():
        assert loss < 0.05, name
        assert accuracy == 1.0, name


# --- (e) sharding ------------------------------------------------------------------------------


def test_adapters_are_sharded_like_their_base_weights_and_the_step_matches():
    """A 2-device tensor-parallel mesh splits heads, MLP features and the vocabulary: inputs of
    some weights (o_kernel, down_kernel), outputs of the others, so both A and B are split."""
    mesh_shape = (1, 1, 2)
    params = init_params(MODEL, jax.random.key(0))
    config = sft.Config(batch_size=8, learning_rate=1e-2, lora_rank=4, lora_targets=ALL_TARGETS)
    want, want_metrics = train_sft(config, 2, params)

    mesh = sharding.make_mesh(*mesh_shape)
    placed = jax.device_put(params, param_shardings(MODEL, mesh))
    sharded = sft.Config(**{**config.__dict__, "mesh_shape": mesh_shape})
    got, got_metrics = train_sft(sharded, 2, placed, mesh)

    bases = param_shardings(MODEL, mesh)
    for path, (a, b) in lora._adapters(got.adapters):
        lead = 1 if path[0] == "layers" else 0  # the stacked layers' axis, kept by both
        n_in = lead + lora.INPUT_DIMS[path[-1]]
        base_spec = tuple(lora._get(bases, path).spec) + (None,) * 3
        a_spec, b_spec = tuple(a.sharding.spec) + (None,) * 3, tuple(b.sharding.spec) + (None,) * 3
        assert a_spec[:n_in] == base_spec[:n_in], path  # A: the input axes
        out_dims = b.ndim - 1 - lead
        assert b_spec[:lead] == base_spec[:lead], path
        assert b_spec[lead + 1 : lead + 1 + out_dims] == base_spec[n_in : n_in + out_dims], path
    # Something is actually split on this mesh, and the Adam moments follow the adapters.
    specs = [x.sharding.spec for x in jax.tree.leaves(got.adapters)]
    assert any(any(axis is not None for axis in spec) for spec in specs)
    mu = got.opt_state[1][0].mu
    for m, x in zip(jax.tree.leaves(mu), jax.tree.leaves(got.adapters), strict=True):
        assert m.sharding.is_equivalent_to(x.sharding, x.ndim)
    assert got.base["embedding"].sharding == bases["embedding"]

    np.testing.assert_allclose(got_metrics["loss"], want_metrics["loss"], rtol=1e-5)
    # Adam moves a weight with a near-zero gradient by up to the learning rate on rounding alone
    # (one of 64 moved 3.3e-6 on an AVX-512 CPU): 1% of the learning rate anywhere, and close
    # agreement on average.
    for x, y in zip(
        jax.tree.leaves(jax.device_get(got.adapters)),
        jax.tree.leaves(jax.device_get(want.adapters)),
        strict=True,
    ):
        np.testing.assert_allclose(x, y, rtol=1e-4, atol=1e-4)
        assert np.abs(x - y).mean() < 1e-6


# --- DPO, GRPO, mixed precision, checkpoints -----------------------------------------------------


def test_lora_dpo_step_trains_only_the_adapters():
    params = init_params(MODEL, jax.random.key(0))
    rng = np.random.default_rng(0)
    batch = {}
    for side in ("chosen", "rejected"):
        tokens = rng.integers(3, MODEL.vocab_size, (4, 8)).astype(np.int32)
        loss_mask = np.zeros(tokens.shape, np.float32)
        loss_mask[:, 4:] = 1.0
        batch |= {f"{side}_tokens": tokens, f"{side}_attention_mask": np.ones(tokens.shape, bool),
                  f"{side}_loss_mask": loss_mask}  # fmt: skip
    # Reference log-probs of 0 stand in for a precomputed reference pass.
    batch |= {
        "reference_chosen": np.zeros(4, np.float32),
        "reference_rejected": np.zeros(4, np.float32),
    }
    config = dpo.Config(batch_size=4, learning_rate=1e-2, lora_rank=2, lora_dropout=0.1)
    algorithm = dpo.make(config, MODEL, params)
    hp = hparams.hparams(config)
    state = algorithm.init(jax.random.key(0), hp)
    step = jax.jit(algorithm.update)
    for _ in range(3):
        state, metrics = step(state, (jax.tree.map(lambda x: x[None], batch), None), hp)
    assert leaves_equal(state.base, params)
    assert metrics["reward_margin"] > 0  # the adapters moved the policy towards the chosen


def test_lora_grpo_update_trains_only_the_adapters():
    task = make_task("reverse_digits", num_digits=3).text_task(ByteTokenizer())
    tiny = ModelConfig(vocab_size=259, hidden_size=32, intermediate_size=64, num_layers=1,
                       num_heads=4, num_kv_heads=2, max_position_embeddings=32)  # fmt: skip
    params = init_params(tiny, jax.random.key(0))
    config = grpo.Config(
        batch_size=4, group_size=4, sampling=Sampling(max_new_tokens=4), learning_rate=1e-2,
        num_minibatches=2, num_epochs=1, lora_rank=2, lora_dropout=0.1,
    )  # fmt: skip
    algorithm = grpo.make(config, tiny, task, params)
    hp = hparams.hparams(config)
    state = algorithm.init(jax.random.key(0), hp)
    state, metrics = jax.jit(algorithm.update)(state, None, hp)
    assert isinstance(state, training.LoraTrainState) and int(state.step) == 1
    assert leaves_equal(state.base, params)
    assert np.isfinite(metrics["loss"])
    assert count(jax.tree.leaves(state.opt_state)) < count(params)


def test_bf16_compute_over_fp32_master_weights():
    """model.dtype=bfloat16 with param_dtype=float32 (the mixed-precision setting): the base
    stays fp32 and untouched, the adapters are fp32, the merged parameters fp32."""
    model = ModelConfig(**{**MODEL.__dict__, "dtype": "bfloat16", "param_dtype": "float32"})
    params = init_params(model, jax.random.key(0))
    config = sft.Config(batch_size=8, learning_rate=1e-2, lora_rank=4)
    state, metrics = train_sft(config, 3, params, model=model)
    assert leaves_equal(state.base, params)
    assert {x.dtype for x in jax.tree.leaves(state.adapters)} == {jnp.dtype("float32")}
    assert {x.dtype for x in jax.tree.leaves(state.params)} == {jnp.dtype("float32")}
    assert np.all(np.isfinite(metrics["loss"])) and metrics["loss"][-1] < metrics["loss"][0]
    # A base stored in bf16 merges back to bf16 (the adapters themselves stay fp32).
    bf16 = jax.tree.map(lambda x: x.astype(jnp.bfloat16), params)
    merged = lora.merge(bf16, state.adapters, state.scale)
    assert {x.dtype for x in jax.tree.leaves(merged)} == {jnp.dtype("bfloat16")}


def test_lora_state_checkpoints_and_restores(tmp_path, lora_run):
    params, state, _ = lora_run
    config = LORA_SFT
    checkpointer = Checkpointer(str(tmp_path / "ckpt"))
    checkpointer.save(5, state, {"step": 5})
    like = sft.make(config, MODEL, params).init(jax.random.key(1), hparams.hparams(config))
    restored, metadata = checkpointer.restore(like)
    checkpointer.close()
    assert isinstance(restored, training.LoraTrainState) and restored.scale == state.scale
    assert leaves_equal(restored, state) and metadata["step"] == 5


def test_adapter_axes_follow_the_base_weights():
    axes = param_axes(MODEL)
    adapters = lora.init_adapters(
        jax.random.key(0),
        init_params(MODEL, jax.random.key(0)),
        lora.LoraConfig(2, targets=ALL_TARGETS),
    )
    names = lora.adapter_axes(axes, adapters)
    # One adapter per layer, stacked like the layers' weights.
    assert names["layers"]["attention"]["o_kernel"] == lora.Adapter(
        ("layers", "heads", "kv", None), ("layers", None, "embed")
    )
    assert names["layers"]["attention"]["q_kernel"] == lora.Adapter(
        ("layers", "embed", None), ("layers", None, "heads", "kv")
    )
    assert names["lm_head"] == lora.Adapter(("embed", None), (None, "vocab"))


# --- (f) bad settings --------------------------------------------------------------------------

BAD = [
    (dict(lora_rank=4, lora_targets=("q_proj", "attn")), "lora_targets", "q_proj, k_proj"),
    (dict(lora_rank=4, lora_targets=()), "lora_targets", "q_proj"),
    (dict(lora_alpha=16.0), "lora_alpha", "lora_rank > 0"),
    (dict(lora_rank=-1, lora_alpha=16.0), "lora_rank", ">= 0"),
    (dict(lora_rank=0, lora_dropout=0.1), "lora_dropout", "lora_rank > 0"),
    (dict(lora_rank=4, lora_dropout=1.0), "lora_dropout", "[0, 1)"),
    (dict(lora_rank=4, lora_dropout=-0.1), "lora_dropout", "[0, 1)"),
    (dict(lora_rank=4, lora_alpha=float("nan")), "lora_alpha", "finite"),
    (dict(lora_targets=("q_proj",)), "lora_targets", "lora_rank > 0"),
]


@pytest.mark.parametrize("algo", [sft, dpo, grpo], ids=["sft", "dpo", "grpo"])
@pytest.mark.parametrize(
    "settings, field, hint", BAD, ids=[f"{b[1]}-{i}" for i, b in enumerate(BAD)]
)
def test_bad_lora_settings_are_one_line_errors_naming_the_field(algo, settings, field, hint):
    with pytest.raises(ConfigError) as error:
        algo.Config(**settings)
    message = str(error.value)
    assert message.startswith(f"{field}: ") and "\n" not in message and hint in message


def test_a_target_naming_no_parameter_fails_before_compiling():
    tied = ModelConfig(**{**MODEL.__dict__, "tie_embeddings": True})
    config = sft.Config(lora_rank=4, lora_targets=("q_proj", "lm_head"))
    with pytest.raises(ConfigError) as error:
        sft.make(config, tied, init_params(tied, jax.random.key(0)))
    message = str(error.value)
    assert message.startswith("lora_targets: 'lm_head' names no parameter") and "\n" not in message
    assert "q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj" in message
    # Scripts ask the same question of the ModelConfig alone, before writing anything.
    with pytest.raises(ConfigError, match="^lora_targets: 'lm_head' names no parameter"):
        training.check_model(config, tied)
    training.check_model(config, MODEL)  # untied: fine
    assert sft.Config(lora_rank=4, lora_targets="q_proj, v_proj").lora_targets == (
        "q_proj",
        "v_proj",
    )
