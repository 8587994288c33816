"""One model, several meshes: the same loss and gradients, parameters split as the mesh says,
checkpoints that move between meshes, and clear errors for shapes that do not divide."""

import jax
import numpy as np
import pytest

from jaxrl import sharding
from jaxrl.checkpoint import Checkpointer
from jaxrl.config import ConfigError
from jaxrl.lm.model import ModelConfig, Transformer, init_params, param_shardings, token_log_probs

# Dimensions chosen so every mesh below divides them: vocab/heads/kv_heads/mlp by tensor=2,
# embed by fsdp=4.
CONFIG = ModelConfig(
    vocab_size=64, hidden_size=32, intermediate_size=48, num_layers=2, num_heads=4, num_kv_heads=2
)
MESHES = [(8, 1, 1), (2, 4, 1), (2, 2, 2), (1, 4, 2)]


def make_loss(mesh):
    model = Transformer(CONFIG, mesh=mesh, rules=sharding.RULES)

    def loss(params, tokens):
        logits, _ = model.apply({"params": params}, tokens)
        return -token_log_probs(logits, tokens)[:, 1:].mean()

    return jax.value_and_grad(loss)


@pytest.fixture(scope="module")
def setup():
    params = init_params(CONFIG, jax.random.key(0))
    tokens = jax.random.randint(jax.random.key(1), (16, 12), 0, CONFIG.vocab_size)
    single = jax.jit(make_loss(None))(params, tokens)
    return params, tokens, single


@pytest.mark.parametrize("shape", MESHES)
def test_sharded_loss_and_gradients_equal_single_device(setup, shape):
    params, tokens, (loss_1, grads_1) = setup
    mesh = sharding.make_mesh(*shape)
    param_sharding = param_shardings(CONFIG, mesh)
    sharded_params = jax.device_put(params, param_sharding)
    sharded_tokens = sharding.shard_batch(tokens, mesh)
    step = jax.jit(
        make_loss(mesh),
        in_shardings=(param_sharding, sharding.batch_sharding(mesh)),
        out_shardings=(sharding.replicated(mesh), param_sharding),
    )
    loss, grads = step(sharded_params, sharded_tokens)
    np.testing.assert_allclose(loss, loss_1, rtol=1e-5)
    for got, want in zip(jax.tree.leaves(grads), jax.tree.leaves(grads_1), strict=True):
        np.testing.assert_allclose(got, want, atol=2e-6, rtol=1e-4)
    # Gradients come back sharded like the parameters they update.
    assert jax.tree.leaves(grads)[0].sharding == jax.tree.leaves(param_sharding)[0]


@pytest.mark.parametrize("shape", MESHES)
def test_parameter_bytes_per_device_fall_with_fsdp_times_tensor(setup, shape):
    params = setup[0]
    mesh = sharding.make_mesh(*shape)
    placed = jax.device_put(params, param_shardings(CONFIG, mesh))
    total = sum(x.nbytes for x in jax.tree.leaves(params))
    per_device = sharding.bytes_per_device(placed)
    split = shape[1] * shape[2]
    assert len(per_device) == 8
    # Norm scales are split over fsdp only, so allow their small excess over total/split.
    norms = sum(
        x.nbytes for path, x in jax.tree_util.tree_leaves_with_path(params) if "norm" in str(path)
    )
    for nbytes in per_device.values():
        assert total / split <= nbytes <= total / split + norms


def test_checkpoint_saved_on_one_mesh_restores_on_another(setup, tmp_path):
    params = setup[0]
    mesh_a, mesh_b = sharding.make_mesh(2, 4, 1), sharding.make_mesh(1, 4, 2)
    saved = jax.device_put(params, param_shardings(CONFIG, mesh_a))
    checkpointer = Checkpointer(str(tmp_path / "ckpt"))
    checkpointer.save(1, saved, {"note": "mesh a"})
    target = jax.tree.map(
        lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
        params,
        param_shardings(CONFIG, mesh_b),
    )
    restored, metadata = checkpointer.restore(target)
    checkpointer.close()
    assert metadata == {"note": "mesh a"}
    for got, want, s in zip(
        jax.tree.leaves(restored),
        jax.tree.leaves(params),
        jax.tree.leaves(param_shardings(CONFIG, mesh_b)),
        strict=True,
    ):
        assert got.sharding == s
        np.testing.assert_array_equal(got, want)


def test_shapes_that_do_not_divide_are_named_before_compiling():
    mesh = sharding.make_mesh(1, 1, 8)
    with pytest.raises(
        ConfigError, match=r"params\['layers'\]\['attention'\]\['k_kernel'\].*kv_heads"
    ):
        param_shardings(CONFIG, mesh)  # 2 kv heads cannot split 8 ways
    with pytest.raises(ConfigError, match="batch_size: 6 does not divide"):
        sharding.check_batch(6, sharding.make_mesh(2, 2, 2))
    with pytest.raises(ConfigError, match="mesh: data\\*fsdp\\*tensor"):
        sharding.make_mesh(4, 4, 1)
