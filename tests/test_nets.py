"""`jaxrl.nets.Dense`, `jaxrl.nets.PatchConv` and `jaxrl.nets.Categorical` are faster stand-ins
for Flax's and distrax's own: same parameters, same values, same gradients, same samples. The
Nature CNN torso has the paper's shapes."""

import distrax
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl.nets import ActorCritic, Categorical, Dense, NatureCNN, PatchConv


@pytest.mark.parametrize("batch_shape", [(128,), (16, 4), (), (600,)])
def test_dense_equals_flax_dense_in_value_and_gradient(batch_shape):
    x = jax.random.normal(jax.random.key(0), batch_shape + (5,))
    ours, flax = Dense(7), nn.Dense(7)
    params = flax.init(jax.random.key(1), x)
    assert jax.tree.structure(ours.init(jax.random.key(1), x)) == jax.tree.structure(params)

    def loss(module, params, x):
        return jnp.sum(jnp.tanh(module.apply(params, x)) ** 2)

    np.testing.assert_allclose(ours.apply(params, x), flax.apply(params, x), rtol=1e-6)
    ours_grads = jax.grad(loss, argnums=(1, 2))(ours, params, x)
    flax_grads = jax.grad(loss, argnums=(1, 2))(flax, params, x)
    for a, b in zip(jax.tree.leaves(ours_grads), jax.tree.leaves(flax_grads), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_dense_gradient_under_vmap_and_its_compiled_product_is_canonical():
    """Vmapped over seeds, as every training program is, the gradient is still Flax's; and the
    kernel's gradient is a product over x's last axis (the form XLA:CPU's fast kernels take)."""
    x = jax.random.normal(jax.random.key(0), (3, 32, 6))
    params = jax.vmap(lambda k: nn.Dense(8).init(k, x[0]))(jax.random.split(jax.random.key(1), 3))

    def grads(module):
        loss = lambda p, x: jnp.sum(module.apply(p, x) ** 3)  # noqa: E731
        return jax.vmap(jax.grad(loss))(params, x)

    for a, b in zip(
        jax.tree.leaves(grads(Dense(8))), jax.tree.leaves(grads(nn.Dense(8))), strict=True
    ):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
    kernel_grad = lambda p: jax.grad(lambda p: jnp.sum(Dense(8).apply(p, x[0])))(p)  # noqa: E731
    text = jax.jit(kernel_grad).lower(jax.tree.map(lambda a: a[0], params)).compile().as_text()
    dots = [line for line in text.splitlines() if " dot(" in line]
    assert dots and not [d for d in dots if "lhs_contracting_dims={0}" in d], dots


def test_categorical_equals_distrax():
    logits = jax.random.normal(jax.random.key(0), (64, 5)) * 3.0
    ours, theirs = Categorical(logits=logits), distrax.Categorical(logits=logits)
    key = jax.random.key(1)
    sample, log_prob = ours.sample_and_log_prob(seed=key)
    their_sample, their_log_prob = theirs.sample_and_log_prob(seed=key)
    np.testing.assert_array_equal(sample, their_sample)
    np.testing.assert_allclose(log_prob, their_log_prob, rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(
        ours.sample(seed=key, sample_shape=3), theirs.sample(seed=key, sample_shape=3)
    )
    actions = jnp.arange(64) % 5
    np.testing.assert_allclose(ours.log_prob(actions), theirs.log_prob(actions), rtol=1e-6)
    np.testing.assert_allclose(ours.entropy(), theirs.entropy(), rtol=1e-6)
    np.testing.assert_array_equal(ours.mode(), theirs.mode())
    # The log-prob's gradient too: the PPO loss differentiates it.
    grad = lambda cls: jax.grad(lambda z: cls(logits=z).log_prob(actions).sum())(logits)  # noqa: E731
    np.testing.assert_allclose(grad(Categorical), grad(distrax.Categorical), rtol=1e-5, atol=1e-6)


def test_actor_critic_uses_them():
    network = ActorCritic(action_dim=2, discrete=True)
    obs = jnp.zeros((3, 4))
    dist, value = network.apply(network.init(jax.random.key(0), obs), obs)
    assert isinstance(dist, Categorical) and value.shape == (3,)


@pytest.mark.parametrize(
    "size, stride, image", [(8, 4, 84), (8, 4, 86), (4, 2, 20), (4, 2, 21), (3, 1, 9), (3, 2, 10)]
)
def test_patch_conv_equals_flax_conv_in_value_and_gradient(size, stride, image):
    x = jax.random.normal(jax.random.key(0), (2, 3, image, image, 4))  # two batch axes
    ours = PatchConv(6, size, stride)
    flax = nn.Conv(6, (size, size), (stride, stride), "VALID")
    params = flax.init(jax.random.key(1), x)
    assert jax.tree.map(jnp.shape, ours.init(jax.random.key(1), x)) == jax.tree.map(
        jnp.shape, params
    )

    def loss(module, params, x):
        return jnp.sum(jnp.tanh(module.apply(params, x)) ** 2)

    np.testing.assert_allclose(ours.apply(params, x), flax.apply(params, x), rtol=1e-4, atol=1e-5)
    ours_grads = jax.grad(loss, argnums=(1, 2))(ours, params, x)
    flax_grads = jax.grad(loss, argnums=(1, 2))(flax, params, x)
    for a, b in zip(jax.tree.leaves(ours_grads), jax.tree.leaves(flax_grads), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)


def test_nature_cnn_has_the_papers_shapes_and_scales_pixels():
    """Mnih et al. (2015): 4x84x84 frames -> 32x20x20 -> 64x9x9 -> 64x7x7 -> 512, so
    1,684,128 parameters; uint8 pixels are read as [0, 1]; actor and critic share it."""
    frames = jax.random.randint(jax.random.key(0), (5, 4, 84, 84), 0, 256).astype(jnp.uint8)
    params = NatureCNN().init(jax.random.key(1), frames)
    shapes = jax.tree.map(jnp.shape, params)["params"]
    assert [shapes[f"PatchConv_{i}"]["kernel"] for i in range(3)] == [
        (8, 8, 4, 32),
        (4, 4, 32, 64),
        (3, 3, 64, 64),
    ]
    assert shapes["Dense_0"]["kernel"] == (3136, 512)
    assert sum(x.size for x in jax.tree.leaves(params)) == 1_684_128
    features = NatureCNN().apply(params, frames)
    assert features.shape == (5, 512)
    scaled = NatureCNN().apply(params, frames.astype(jnp.float32) / 255.0)
    np.testing.assert_allclose(features, scaled, rtol=1e-5, atol=1e-5)

    network = ActorCritic(action_dim=4, discrete=True, obs_ndim=3, torso="nature_cnn")
    params = network.init(jax.random.key(2), frames[:, None])
    assert set(params["params"]) == {"shared_torso", "actor_head", "critic_head"}
    dist, value = network.apply(params, frames[:, None])  # [5, 1] batch axes
    assert dist.logits.shape == (5, 1, 4) and value.shape == (5, 1)
