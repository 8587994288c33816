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
from jaxrl.lm.hf import config_from_hf, load_hf_checkpoint, save_hf_checkpoint
from jaxrl.lm.model import ModelConfig, Transformer, init_params

FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "hf")
MODELS = {"tiny_llama": "llama", "tiny_qwen2": "qwen2"}
TOLERANCE = 1e-4  # max abs logit difference, fp32; achieved ~1.5e-6


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
    name, config, _ = loaded
    assert config.vocab_size == 128 and config.hidden_size == 64 and config.num_layers == 2
    assert (config.num_heads, config.num_kv_heads, config.dims_per_head) == (4, 2, 16)
    if name == "tiny_llama":
        assert config.rope_theta == 10_000.0 and not config.tie_embeddings and not config.qkv_bias
    else:
        assert config.rope_theta == 1_000_000.0 and config.tie_embeddings and config.qkv_bias


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


# --- round trips -------------------------------------------------------------------------------


def test_export_of_import_reproduces_fixture_tensors(loaded, tmp_path):
    name, config, params = loaded
    save_hf_checkpoint(tmp_path, config, params, model_type=MODELS[name])
    original, exported = read_tensors(fixture_dir(name)), read_tensors(tmp_path)
    assert sorted(exported) == sorted(original)
    for key, value in original.items():
        assert exported[key].shape == value.shape and exported[key].dtype == value.dtype, key
        np.testing.assert_array_equal(exported[key], value, err_msg=key)
    # The written config.json reads back as the same ModelConfig.
    with open(tmp_path / "config.json") as f:
        assert config_from_hf(json.load(f)) == config


@pytest.mark.parametrize(
    "model_type, overrides",
    [
        ("llama", {}),
        ("llama", {"tie_embeddings": True, "head_dim": 8}),  # head_dim != hidden / heads
        ("qwen2", {"qkv_bias": True, "tie_embeddings": True, "rope_theta": 1e6}),
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


# --- errors ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name, change, field",
    [
        (
            "tiny_llama",
            {"rope_parameters": {"rope_type": "llama3", "rope_theta": 5e5}},
            "rope_type",
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
