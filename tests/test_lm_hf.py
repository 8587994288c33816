"""Hugging Face checkpoint import/export: logits match `transformers` on the committed fixtures
(made by `tests/fixtures/make_hf_fixtures.py`), export/import round-trips bit for bit, and every
unsupported config or mismatched tensor is refused with a message naming it."""

import json
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import safetensors.numpy

from jaxrl.config import ConfigError
from jaxrl.lm.hf import config_from_hf, config_to_hf, load_hf_checkpoint, save_hf_checkpoint
from jaxrl.lm.model import (
    ModelConfig,
    Transformer,
    init_cache,
    init_params,
    rope_frequencies,
)

FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "hf")
MODELS = {
    "tiny_llama": "llama",
    "tiny_qwen2": "qwen2",
    "tiny_llama32": "llama",  # Llama 3.x: rope_type llama3, tied embeddings
    "tiny_qwen3": "qwen3",  # q/k norms, head_dim 16 != hidden 32 / 4 heads
    "tiny_qwen2_yarn": "qwen2",  # rope_type yarn with its attention factor
}
TOLERANCE = 1e-4  # max abs logit difference, fp32; achieved ~1.5e-6

SMALL = dict(vocab_size=128, hidden_size=32, intermediate_size=64, num_layers=2)
# What each fixture's config.json must load as (everything not named keeps its default).
EXPECTED = {
    "tiny_llama": ModelConfig(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=96,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        max_position_embeddings=128,
    ),
    "tiny_qwen2": ModelConfig(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=96,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        max_position_embeddings=128,
        rope_theta=1e6,
        tie_embeddings=True,
        qkv_bias=True,
    ),
    "tiny_llama32": ModelConfig(
        **SMALL,
        num_heads=4,
        num_kv_heads=2,
        max_position_embeddings=1024,
        tie_embeddings=True,
        rope_type="llama3",
        rope_factor=8.0,
        rope_original_max_position_embeddings=128,
        rope_low_freq_factor=1.0,
        rope_high_freq_factor=4.0,
    ),
    "tiny_qwen3": ModelConfig(
        **SMALL,
        num_heads=4,
        num_kv_heads=2,
        head_dim=16,
        max_position_embeddings=256,
        rope_theta=1e6,
        qk_norm=True,
    ),
    "tiny_qwen2_yarn": ModelConfig(
        **SMALL,
        num_heads=2,
        num_kv_heads=1,
        max_position_embeddings=1024,
        tie_embeddings=True,
        qkv_bias=True,
        rope_type="yarn",
        rope_factor=4.0,
        rope_original_max_position_embeddings=256,
    ),
}


def fixture_dir(name):
    return os.path.join(FIXTURES, name)


def read_config(name):
    with open(os.path.join(fixture_dir(name), "config.json")) as f:
        return json.load(f)


def read_tensors(directory):
    return safetensors.numpy.load_file(os.path.join(directory, "model.safetensors"))


def copy_fixture(name, destination, config=None, tensors=None):
    """The fixture checkpoint under `destination`, optionally with its config.json / tensors
    replaced."""
    os.makedirs(destination, exist_ok=True)
    with open(os.path.join(destination, "config.json"), "w") as f:
        json.dump(read_config(name) if config is None else config, f)
    path = os.path.join(destination, "model.safetensors")
    if tensors is None:
        shutil.copyfile(os.path.join(fixture_dir(name), "model.safetensors"), path)
    else:
        safetensors.numpy.save_file(tensors, path)
    return destination


@pytest.fixture(scope="module", params=sorted(MODELS))
def loaded(request):
    name = request.param
    config, params = load_hf_checkpoint(fixture_dir(name))
    return name, config, params


def assert_trees_equal(a, b):
    assert jax.tree.structure(a) == jax.tree.structure(b)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        assert x.shape == y.shape and x.dtype == y.dtype
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


# --- parity with transformers ------------------------------------------------------------------


def test_config_from_fixture(loaded):
    name, config, params = loaded
    assert config == EXPECTED[name]
    assert config.num_params() == sum(x.size for x in jax.tree.leaves(params))


def test_rope_frequencies_match_transformers_buffers(loaded):
    """The fixtures' own rotary buffers (inv_freq, attention_scaling) from transformers."""
    name, config, _ = loaded
    ref = np.load(os.path.join(fixture_dir(name), "reference.npz"))
    if "rope_inv_freq" not in ref:
        pytest.skip(f"{name} predates the rotary buffers in reference.npz")
    frequencies, scale = rope_frequencies(config)
    np.testing.assert_allclose(frequencies, ref["rope_inv_freq"], rtol=1e-6, atol=0)
    assert scale == pytest.approx(float(ref["rope_attention_scaling"]), rel=1e-6)


def read_rope_cases():
    with open(os.path.join(FIXTURES, "rope_reference.json")) as f:
        return json.load(f)["cases"]


@pytest.mark.parametrize("case", read_rope_cases(), ids=lambda case: case["name"])
def test_rope_frequencies_match_transformers(case):
    """Real-model settings (Llama 3.1 / 3.2, Qwen2.5 / Qwen3 YaRN) and every optional YaRN key,
    read through config_from_hf, against transformers' ROPE_INIT_FUNCTIONS."""
    config = config_from_hf(case["config"])
    frequencies, scale = rope_frequencies(config)
    assert frequencies.dtype == np.float32
    np.testing.assert_allclose(frequencies, case["inv_freq"], rtol=2e-6, atol=0)
    assert scale == pytest.approx(case["attention_factor"], rel=1e-9)
    # ...and the config survives config_to_hf -> config_from_hf unchanged.
    assert config_from_hf(config_to_hf(config)) == config


def test_logits_match_transformers(loaded):
    name, config, params = loaded
    ref = np.load(os.path.join(fixture_dir(name), "reference.npz"))
    model = Transformer(config)

    logits, _ = model.apply({"params": params}, jnp.asarray(ref["input_ids"]))
    error = np.abs(np.asarray(logits) - ref["logits"]).max()
    assert error <= TOLERANCE, f"{name} unpadded: max abs logit error {error:.3e}"

    # Left padding, with the fixture's own mask and position ids; pad positions are undefined.
    mask = ref["padded_attention_mask"].astype(bool)
    logits, _ = model.apply(
        {"params": params},
        jnp.asarray(ref["padded_input_ids"]),
        jnp.asarray(ref["padded_position_ids"]),
        jnp.asarray(mask),
    )
    error = np.abs(np.asarray(logits) - ref["padded_logits"])[mask].max()
    assert error <= TOLERANCE, f"{name} left-padded: max abs logit error {error:.3e}"

    if "long_input_ids" in ref:  # longer than original_max_position_embeddings
        logits, _ = model.apply({"params": params}, jnp.asarray(ref["long_input_ids"]))
        kept = ref["long_logits"].shape[1]
        error = np.abs(np.asarray(logits)[:, -kept:] - ref["long_logits"]).max()
        assert error <= TOLERANCE, f"{name} long sequence: max abs logit error {error:.3e}"


@pytest.mark.parametrize("name", ["tiny_qwen3", "tiny_qwen2_yarn"])
def test_cached_decoding_matches_full_forward(name):
    """Prefill then one token at a time through the KV cache: q/k norms and scaled RoPE act on
    the cached path exactly as on the full sequence."""
    config, params = load_hf_checkpoint(fixture_dir(name))
    tokens = jnp.asarray(np.load(os.path.join(fixture_dir(name), "reference.npz"))["input_ids"])
    model = Transformer(config)
    full, _ = model.apply({"params": params}, tokens)
    batch, length = tokens.shape
    cache = init_cache(config, batch, length)
    prefill = 8
    positions = jnp.broadcast_to(jnp.arange(length), (batch, length))
    mask = jnp.ones((batch, length), bool)
    step, cache = model.apply(
        {"params": params}, tokens[:, :prefill], positions[:, :prefill], mask[:, :prefill], cache
    )
    pieces = [step]
    for t in range(prefill, length):
        step, cache = model.apply(
            {"params": params},
            tokens[:, t : t + 1],
            positions[:, t : t + 1],
            mask[:, t : t + 1],
            cache,
        )
        pieces.append(step)
    np.testing.assert_allclose(np.concatenate(pieces, axis=1), full, atol=1e-5, rtol=0)


# --- round trips -------------------------------------------------------------------------------


def test_export_of_import_reproduces_fixture_tensors(loaded, tmp_path):
    name, config, params = loaded
    save_hf_checkpoint(tmp_path, config, params)  # the model_type is inferred from the config
    original, exported = read_tensors(fixture_dir(name)), read_tensors(tmp_path)
    assert sorted(exported) == sorted(original)
    for key, value in original.items():
        assert exported[key].shape == value.shape and exported[key].dtype == value.dtype, key
        np.testing.assert_array_equal(exported[key], value, err_msg=key)
    # The written config.json reads back as the same ModelConfig, and says what transformers
    # wrote: same model_type, architectures, head_dim and RoPE settings (both spellings).
    with open(tmp_path / "config.json") as f:
        written = json.load(f)
    assert config_from_hf(written) == config
    fixture = read_config(name)
    for key in ("model_type", "architectures", "rope_parameters", "tie_word_embeddings"):
        assert written[key] == fixture[key], key
    assert written["model_type"] == MODELS[name]
    assert written["head_dim"] == config.dims_per_head
    scaling = {k: v for k, v in fixture["rope_parameters"].items() if k != "rope_theta"}
    assert written["rope_scaling"] == (None if scaling["rope_type"] == "default" else scaling)
    if name == "tiny_qwen3":
        assert written["attention_bias"] is False and "self_attn.q_norm" in " ".join(exported)


LLAMA3_ROPE = dict(
    rope_type="llama3",
    rope_factor=32.0,
    rope_original_max_position_embeddings=64,
    rope_low_freq_factor=1.0,
    rope_high_freq_factor=4.0,
)
YARN_ROPE = dict(
    rope_type="yarn",
    rope_factor=2.0,
    rope_original_max_position_embeddings=64,
    rope_beta_fast=16.0,
    rope_beta_slow=2.0,
    rope_truncate=False,
    rope_attention_factor=1.2,
)


@pytest.mark.parametrize(
    "model_type, overrides",
    [
        ("llama", {}),
        ("llama", {"tie_embeddings": True, "head_dim": 8}),  # head_dim != hidden / heads
        ("qwen2", {"qkv_bias": True, "tie_embeddings": True, "rope_theta": 1e6}),
        ("llama", {"tie_embeddings": True, **LLAMA3_ROPE}),
        ("qwen3", {"qk_norm": True, "head_dim": 8}),
        ("qwen3", {"qk_norm": True, **YARN_ROPE}),
        ("qwen2", {"qkv_bias": True, **YARN_ROPE}),
        (None, {"qkv_bias": True}),  # inferred: qwen2
    ],
)
def test_export_then_import_is_identity(tmp_path, model_type, overrides):
    config = ModelConfig(
        vocab_size=40,
        hidden_size=24,
        intermediate_size=36,
        num_layers=2,
        num_heads=6,
        num_kv_heads=2,
        **overrides,
    )
    params = init_params(config, jax.random.key(0))
    # Non-trivial norm scales and biases, so a swapped or transposed tensor cannot pass.
    params = jax.tree.map(lambda x: x + jax.random.normal(jax.random.key(1), x.shape), params)
    save_hf_checkpoint(tmp_path, config, params, model_type, extra_config={"eos_token_id": 2})
    loaded_config, loaded_params = load_hf_checkpoint(tmp_path)
    assert loaded_config == config
    assert_trees_equal(loaded_params, jax.device_get(params))
    with open(tmp_path / "config.json") as f:
        assert json.load(f)["eos_token_id"] == 2
    assert sorted(os.listdir(tmp_path)) == ["config.json", "model.safetensors"]  # no temp files


def test_sharded_checkpoint_and_bfloat16(tmp_path):
    tensors = read_tensors(fixture_dir("tiny_qwen2"))
    names = sorted(tensors)
    shards = {f"model-0000{i + 1}-of-00002.safetensors": names[i::2] for i in range(2)}
    weight_map = {}
    for file, members in shards.items():
        safetensors.numpy.save_file({n: tensors[n] for n in members}, tmp_path / file)
        weight_map.update(dict.fromkeys(members, file))
    with open(tmp_path / "model.safetensors.index.json", "w") as f:
        json.dump({"metadata": {}, "weight_map": weight_map}, f)
    shutil.copyfile(
        os.path.join(fixture_dir("tiny_qwen2"), "config.json"), tmp_path / "config.json"
    )

    _, expected = load_hf_checkpoint(fixture_dir("tiny_qwen2"))
    _, sharded = load_hf_checkpoint(tmp_path)
    assert_trees_equal(sharded, expected)

    config, half = load_hf_checkpoint(tmp_path, dtype="bfloat16")
    assert config.param_dtype == "bfloat16" and config.dtype == "bfloat16"
    assert_trees_equal(half, jax.tree.map(lambda x: x.astype(jnp.bfloat16), expected))


def test_rope_theta_spellings():
    new = read_config("tiny_llama")
    old = {k: v for k, v in new.items() if k != "rope_parameters"}
    old.update(rope_theta=10_000.0, rope_scaling=None)
    assert config_from_hf(old) == config_from_hf(new)
    assert config_from_hf({**old, "rope_theta": 500_000.0}).rope_theta == 500_000.0


def test_qwen_configs_as_published():
    """Qwen2.5 (sliding window off, YaRN in the legacy rope_scaling spelling) and Qwen3 (its
    head_dim default) config.json fields as the Hub publishes them."""
    qwen25 = {
        **read_config("tiny_qwen2"),
        "use_sliding_window": False,
        "sliding_window": 32768,
        "max_window_layers": 21,
        "rope_theta": 1e6,
        "rope_scaling": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32},
    }
    del qwen25["layer_types"], qwen25["rope_parameters"]
    config = config_from_hf(qwen25)
    assert (config.rope_type, config.rope_factor) == ("yarn", 4.0)
    assert (
        config.rope_original_max_position_embeddings == 32 and config.rope_attention_factor is None
    )
    assert rope_frequencies(config)[1] == pytest.approx(0.1 * np.log(4.0) + 1.0)

    qwen3 = {k: v for k, v in read_config("tiny_qwen3").items() if k != "head_dim"}
    assert config_from_hf(qwen3).dims_per_head == 128  # Qwen3Config's default, not hidden/heads


# --- errors ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name, change, field",
    [
        (
            "tiny_llama",
            {"rope_parameters": {"rope_type": "longrope", "rope_theta": 5e5}},
            "rope_type='longrope'",
        ),
        ("tiny_llama", {"rope_scaling": {"type": "dynamic", "factor": 2.0}}, "rope_scaling"),
        (
            "tiny_llama32",
            {"rope_parameters": {"rope_type": "llama3", "rope_theta": 1e4, "factor": 8.0}},
            "rope_parameters.low_freq_factor",
        ),
        (
            "tiny_llama32",
            {
                "rope_parameters": {
                    **read_config("tiny_llama32")["rope_parameters"],
                    "high_freq_factor": 1.0,
                }
            },
            "rope_high_freq_factor",
        ),
        (
            "tiny_qwen2_yarn",
            {"rope_parameters": {**read_config("tiny_qwen2_yarn")["rope_parameters"], "mrope": 1}},
            "rope_parameters.mrope",
        ),
        (
            "tiny_qwen2_yarn",
            {"rope_scaling": {"rope_type": "yarn", "factor": 2.0}},
            "rope_scaling=.*disagrees",
        ),
        ("tiny_qwen3", {"attention_bias": True}, "attention_bias"),
        ("tiny_qwen3", {"partial_rotary_factor": 0.5}, "partial_rotary_factor"),
        (
            "tiny_qwen3",
            {
                "layer_types": None,
                "use_sliding_window": True,
                "sliding_window": 64,
                "max_window_layers": 0,
            },
            r"use_sliding_window.*layers \[0, 1\]",
        ),
        ("tiny_llama", {"rope_scaling": {"type": "linear", "factor": 2.0}}, "rope_scaling"),
        ("tiny_llama", {"mlp_bias": True}, "mlp_bias"),
        ("tiny_llama", {"attention_bias": True}, "attention_bias"),
        ("tiny_llama", {"hidden_act": "gelu"}, "hidden_act"),
        ("tiny_llama", {"model_type": "mistral"}, "model_type"),
        ("tiny_llama", {"architectures": ["LlamaForSequenceClassification"]}, "architectures"),
        ("tiny_qwen2", {"layer_types": ["full_attention", "sliding_attention"]}, "sliding"),
        ("tiny_llama", {"num_key_value_heads": 3}, "num_kv_heads"),
    ],
)
def test_unsupported_config_is_refused(tmp_path, name, change, field):
    directory = copy_fixture(name, tmp_path, config={**read_config(name), **change})
    with pytest.raises(ConfigError, match=field) as error:
        load_hf_checkpoint(directory)
    assert str(directory / "config.json") in str(error.value)


def test_old_style_sliding_window_is_refused():
    config = {k: v for k, v in read_config("tiny_qwen2").items() if k != "layer_types"}
    config_from_hf({**config, "use_sliding_window": False, "sliding_window": 4096})  # off: fine
    config.update(use_sliding_window=True, sliding_window=4096, max_window_layers=1)
    with pytest.raises(ConfigError, match=r"use_sliding_window.*layers \[1\]"):
        config_from_hf(config)


@pytest.mark.parametrize(
    "overrides, field",
    [
        ({"rope_type": "ntk"}, "rope_type"),
        ({"rope_factor": 2.0}, "rope_factor: is not used by rope_type 'default'"),
        ({"rope_type": "yarn", "rope_factor": 2.0}, "rope_original_max_position_embeddings"),
        ({**LLAMA3_ROPE, "rope_beta_fast": 8.0}, "rope_beta_fast: is not used"),
        ({**YARN_ROPE, "rope_attention_factor": -1.0}, "rope_attention_factor"),
        ({**YARN_ROPE, "rope_factor": 0.0}, "rope_factor"),
    ],
)
def test_rope_fields_are_validated(overrides, field):
    with pytest.raises(ConfigError, match=field):
        ModelConfig(**SMALL, num_heads=4, num_kv_heads=2, **overrides)


def test_export_refuses_a_family_that_computes_something_else(tmp_path):
    config = ModelConfig(**SMALL, num_heads=4, num_kv_heads=2, qk_norm=True)
    shapes = jax.eval_shape(lambda: init_params(config, jax.random.key(0)))  # no compile
    params = jax.tree.map(lambda x: np.zeros(x.shape, x.dtype), shapes)
    for wrong in ("llama", "qwen2"):
        with pytest.raises(ConfigError, match="export it as model_type='qwen3'"):
            save_hf_checkpoint(tmp_path, config, params, model_type=wrong)
    with pytest.raises(ConfigError, match="model_type: 'gemma' is not supported"):
        config_to_hf(config, "gemma")
    assert not os.listdir(tmp_path)


def test_missing_extra_and_misshapen_tensors_are_listed(tmp_path):
    tensors = read_tensors(fixture_dir("tiny_llama"))
    missing = dict(tensors)
    del missing["model.layers.1.mlp.up_proj.weight"]
    with pytest.raises(
        ValueError, match=r"missing tensors: model\.layers\.1\.mlp\.up_proj\.weight"
    ):
        load_hf_checkpoint(copy_fixture("tiny_llama", tmp_path / "a", tensors=missing))

    extra = {**tensors, "model.layers.0.self_attn.o_proj.bias": np.zeros(64, np.float32)}
    with pytest.raises(ValueError, match=r"unexpected tensors: .*o_proj\.bias"):
        load_hf_checkpoint(copy_fixture("tiny_llama", tmp_path / "b", tensors=extra))

    misshapen = {**tensors, "model.norm.weight": np.ones(65, np.float32)}
    with pytest.raises(ValueError, match=r"model\.norm\.weight \(65,\) \(expected \(64,\)\)"):
        load_hf_checkpoint(copy_fixture("tiny_llama", tmp_path / "c", tensors=misshapen))

    # Tied checkpoints may carry a copy of the embedding as lm_head.weight, but not another matrix.
    qwen = read_tensors(fixture_dir("tiny_qwen2"))
    same = {**qwen, "lm_head.weight": qwen["model.embed_tokens.weight"]}
    load_hf_checkpoint(copy_fixture("tiny_qwen2", tmp_path / "d", tensors=same))
    other = {**qwen, "lm_head.weight": qwen["model.embed_tokens.weight"] + 1}
    with pytest.raises(ValueError, match="lm_head.weight differs"):
        load_hf_checkpoint(copy_fixture("tiny_qwen2", tmp_path / "e", tensors=other))


def test_missing_files_and_mismatched_params(tmp_path, loaded):
    with pytest.raises(FileNotFoundError, match="config.json"):
        load_hf_checkpoint(tmp_path)
    with open(tmp_path / "config.json", "w") as f:
        json.dump(read_config("tiny_llama"), f)
    with pytest.raises(FileNotFoundError, match="model.safetensors"):
        load_hf_checkpoint(tmp_path)

    name, config, params = loaded
    broken = {**params, "bogus": np.zeros(3, np.float32)}
    with pytest.raises(ValueError, match="unexpected parameters: bogus"):
        save_hf_checkpoint(tmp_path / "out", config, broken, MODELS[name])
    wrong_type = "qwen2" if MODELS[name] == "llama" else "llama"
    with pytest.raises(ConfigError, match="qkv_bias"):
        save_hf_checkpoint(tmp_path / "out", config, params, wrong_type)
    assert not os.path.exists(tmp_path / "out" / "model.safetensors")
