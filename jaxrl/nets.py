"""Networks, as Flax linen modules whose `apply(params, inputs)` is all an algorithm uses.

Policy heads return distrax distributions so that losses read `dist.log_prob(a)` and
`dist.entropy()` whatever the action space.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from jaxrl.hl_gauss import HLGauss

if TYPE_CHECKING:  # distrax is imported where a distribution is built: start-up time
    import distrax

ACTIVATIONS: dict[str, Callable[[jax.Array], jax.Array]] = {
    "tanh": nn.tanh,
    "relu": nn.relu,
    "gelu": nn.gelu,
    "silu": nn.silu,
}


def orthogonal(scale: float) -> nn.initializers.Initializer:
    """Flax's orthogonal weight initialiser with gain `scale`, computed one matrix at a time when
    vmapped (over seeds, say): the same values, but never a batched QR factorisation. jaxlib's
    batched LAPACK kernels hand the batch to the CPU thread pool and block until it is done, and
    with XLA's concurrency-optimised scheduler running other work on that pool the wait can
    deadlock (jaxlib 0.10.2, seen as a vmapped PPO run idling forever)."""
    flax_init = nn.initializers.orthogonal(scale)

    def init(key: jax.Array, shape: Sequence[int], dtype: jnp.dtype = jnp.float32) -> jax.Array:
        @jax.custom_batching.custom_vmap
        def one(key: jax.Array) -> jax.Array:
            return flax_init(key, shape, dtype)

        @one.def_vmap
        def one_at_a_time(axis_size: int, in_batched: list[bool], key: jax.Array):
            del axis_size
            if not in_batched[0]:
                return one(key), False
            return jax.lax.map(one, key), True

        return one(key)

    return init


@jax.custom_vjp
def _matmul(x: jax.Array, kernel: jax.Array) -> jax.Array:
    return x @ kernel


def _matmul_forward(x: jax.Array, kernel: jax.Array) -> tuple[jax.Array, tuple]:
    return x @ kernel, (x, kernel)


# Up to this many rows (samples) the transposed-first product below is faster on XLA:CPU; above
# it the transpose's copy costs more than it saves (64-wide layers: 30 vs 32 us at 256 rows, 60
# vs 50 us at 512, 2.3 vs 1.9 ms at 16,384).
TRANSPOSED_GRADIENT_MAX_ROWS = 256


def _matmul_backward(residuals: tuple, grad: jax.Array) -> tuple[jax.Array, jax.Array]:
    x, kernel = residuals
    x_rows = x.reshape(-1, x.shape[-1]).T
    if x_rows.shape[1] <= TRANSPOSED_GRADIENT_MAX_ROWS:
        # The kernel's gradient x^T g contracts the batch axis, x's FIRST axis. XLA:CPU's
        # YNNPACK matrix kernels take a left operand only if it is contracted over its last
        # axis, so autodiff's own x^T g falls back to XLA's generic dot, about half as fast at
        # minibatch sizes (64x128 by 128x64: 29 us against 13 us in a PPO gradient step).
        # Transposing x first makes the product canonical; the barrier keeps XLA's simplifier
        # from folding the transpose back into the dot.
        x_rows = jax.lax.optimization_barrier(x_rows)
    return grad @ kernel.T, x_rows @ grad.reshape(-1, grad.shape[-1])


_matmul.defvjp(_matmul_forward, _matmul_backward)


def _dense_dot_general(
    lhs: jax.Array, rhs: jax.Array, dimension_numbers: Any, precision: Any = None, **kwargs: Any
) -> jax.Array:
    """`nn.Dense`'s product (inputs [..., in] by kernel [in, out]) with the CPU-friendly weight
    gradient of `_matmul`; on other backends, and for anything but a plain dense product, the
    usual `lax.dot_general`."""
    contracting, batch = dimension_numbers
    plain = contracting == ((lhs.ndim - 1,), (0,)) and batch == ((), ()) and rhs.ndim == 2
    if plain and precision is None and not kwargs and jax.default_backend() == "cpu":
        return _matmul(lhs, rhs)
    return jax.lax.dot_general(lhs, rhs, dimension_numbers, precision, **kwargs)


def Dense(features: int, **kwargs: Any) -> nn.Dense:  # noqa: N802  (a module constructor)
    """`flax.linen.Dense` with a weight gradient that XLA:CPU runs on its fast matrix kernels
    (`_matmul_backward`) at minibatch sizes: the same parameters and values, 3-6% more PPO steps per
    second on CPU at rejax's setting."""
    return nn.Dense(features, dot_general=_dense_dot_general, **kwargs)


class MLP(nn.Module):
    """Fully connected torso with orthogonal(sqrt 2) weights, the PPO-standard initialisation."""

    hidden_sizes: Sequence[int] = (64, 64)
    activation: str = "tanh"

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        act = ACTIVATIONS[self.activation]
        for size in self.hidden_sizes:
            x = act(Dense(size, kernel_init=orthogonal(np.sqrt(2)))(x))
        return x


class PatchConv(nn.Module):
    """A "VALID" 2-D convolution, channels-last, computed as one matrix product over the input's
    patches (im2col). Parameters are named and shaped as `flax.linen.Conv`'s (`kernel` [size,
    size, in, features], `bias`) and the values agree to float rounding. Why not `nn.Conv`: inside
    a `scan` (PPO's minibatch loop), XLA:CPU runs the convolutions of the gradient about 16x slower
    than outside one (1.86 s against 0.11 s per Nature CNN gradient step on 64 frames); as slices
    and one product per layer it takes 0.15 s in either place.

    When the stride divides the kernel size (the Nature CNN's 8x8/4 and 4x4/2), the input is first
    cut into stride x stride blocks stacked along channels ("space to depth"), so the convolution
    becomes one of stride 1 over (size/stride)^2 contiguous block offsets rather than size^2
    strided slices of a few channels each."""

    features: int
    size: int
    stride: int
    kernel_init: nn.initializers.Initializer = nn.initializers.lecun_normal()

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        size, stride, channels = self.size, self.stride, x.shape[-1]
        kernel = self.param("kernel", self.kernel_init, (size, size, channels, self.features))
        bias = self.param("bias", nn.initializers.zeros, (self.features,))
        out_h = (x.shape[-3] - size) // stride + 1
        out_w = (x.shape[-2] - size) // stride + 1
        if stride > 1 and size % stride == 0:
            blocks = size // stride  # kernel size in blocks
            rows, cols = (out_h - 1 + blocks) * stride, (out_w - 1 + blocks) * stride
            x = x[..., :rows, :cols, :]  # the pixels any output sees
            x = x.reshape(x.shape[:-3] + (rows // stride, stride, cols // stride, stride, channels))
            # -> [..., row block, col block, row in block, col in block, channel]
            x = jnp.moveaxis(x, -4, -3)
            x = x.reshape(x.shape[:-3] + (stride * stride * channels,))
            # Kernel row i = block row * stride + row in block, likewise columns: regroup alike.
            kernel = kernel.reshape(blocks, stride, blocks, stride, channels, self.features)
            kernel = kernel.transpose(0, 2, 1, 3, 4, 5)
            size, stride = blocks, 1
        patches = jnp.concatenate(
            [
                x[
                    ...,
                    i : i + stride * (out_h - 1) + 1 : stride,
                    j : j + stride * (out_w - 1) + 1 : stride,
                    :,
                ]
                for i in range(size)
                for j in range(size)
            ],
            axis=-1,
        )  # [..., out_h, out_w, size * size * in], ordered as the kernel's flattened axes
        return patches @ kernel.reshape(-1, self.features) + bias


class NatureCNN(nn.Module):
    """The convolutional torso of DQN (Mnih et al., 2015) that Atari PPO shares between actor and
    critic (CleanRL, Huang et al., 2022): 32 8x8 filters at stride 4, 64 4x4 at stride 2, 64 3x3
    at stride 1, then 512 units, all ReLU, orthogonal(sqrt 2) weights.

    Takes stacked frames channels-first, `[..., frames, height, width]` as EnvPool and ALE give them
    (uint8 pixels are scaled to [0, 1]); any leading axes are batch axes."""

    @nn.compact
    def __call__(self, frames: jax.Array) -> jax.Array:
        batch_shape = frames.shape[:-3]
        x = frames.reshape((-1,) + frames.shape[-3:]).astype(jnp.float32)
        if frames.dtype == jnp.uint8:
            x = x / 255.0
        x = jnp.moveaxis(x, -3, -1)  # Flax convolves channels-last
        for features, size, stride in ((32, 8, 4), (64, 4, 2), (64, 3, 1)):
            x = nn.relu(PatchConv(features, size, stride, kernel_init=orthogonal(np.sqrt(2)))(x))
        x = x.reshape(x.shape[:1] + (-1,))
        x = nn.relu(Dense(512, kernel_init=orthogonal(np.sqrt(2)))(x))
        return x.reshape(batch_shape + x.shape[-1:])


TORSOS = ("mlp", "nature_cnn")  # ActorCritic's torsos (algos.ppo.Config.torso)


def tanh_normal(mean: jax.Array, log_std: jax.Array) -> distrax.Distribution:
    """A diagonal Normal squashed by tanh into (-1, 1), with the change-of-variables log-prob."""
    import distrax  # here, not at the top: start-up time

    base = distrax.MultivariateNormalDiag(mean, jnp.exp(log_std))
    return distrax.Transformed(base, distrax.Block(distrax.Tanh(), ndims=1))


def __getattr__(name: str) -> Any:
    # `jaxrl.nets.Categorical` is `jaxrl.categorical.Categorical`, imported when first asked for
    # (distrax costs start-up time).
    if name == "Categorical":
        from jaxrl.categorical import Categorical

        return Categorical
    raise AttributeError(f"module 'jaxrl.nets' has no attribute {name!r}")


class CategoricalHead(nn.Module):
    """A linear layer to `num_actions` logits, returned as a categorical distribution."""

    num_actions: int

    @nn.compact
    def __call__(self, x: jax.Array) -> distrax.Distribution:
        from jaxrl.categorical import Categorical  # here, not at the top: start-up time

        # Small final-layer scale: the initial policy is near uniform (Andrychowicz et al., 2021).
        logits = Dense(self.num_actions, kernel_init=orthogonal(0.01))(x)
        return Categorical(logits=logits)


class GaussianHead(nn.Module):
    """Diagonal Gaussian with a state-independent learned log standard deviation (PPO style)."""

    action_dim: int
    init_log_std: float = 0.0

    @nn.compact
    def __call__(self, x: jax.Array) -> distrax.Distribution:
        import distrax  # here, not at the top: start-up time

        mean = Dense(self.action_dim, kernel_init=orthogonal(0.01))(x)
        log_std = self.param(
            "log_std", nn.initializers.constant(self.init_log_std), (self.action_dim,)
        )
        return distrax.MultivariateNormalDiag(mean, jnp.exp(jnp.broadcast_to(log_std, mean.shape)))


class TanhGaussianHead(nn.Module):
    """State-dependent tanh-squashed Gaussian (SAC style); log-std is clipped for stability."""

    action_dim: int
    log_std_min: float = -5.0
    log_std_max: float = 2.0

    @nn.compact
    def __call__(self, x: jax.Array) -> distrax.Distribution:
        mean = Dense(self.action_dim)(x)
        log_std = Dense(self.action_dim)(x)
        log_std = jnp.clip(log_std, self.log_std_min, self.log_std_max)
        return tanh_normal(mean, log_std)


class SquashedGaussianActor(nn.Module):
    """SAC's actor: an MLP torso and a state-dependent tanh-Gaussian over actions in (-1, 1).

    Actions are scaled to the environment's bounds outside the network, so the same actor serves
    every action box and entropy targets stay in the (-1, 1) units the literature uses.
    """

    action_dim: int
    hidden_sizes: Sequence[int] = (256, 256)
    activation: str = "relu"

    @nn.compact
    def __call__(self, obs: jax.Array) -> distrax.Distribution:
        x = MLP(self.hidden_sizes, self.activation, name="torso")(obs.astype(jnp.float32))
        return TanhGaussianHead(self.action_dim, name="head")(x)


class QNetwork(nn.Module):
    """Q(s, a): an MLP on the concatenated observation and action. With `value_bins` > 0 its head
    gives that many logits (an HL-Gauss classification critic) instead of one value."""

    hidden_sizes: Sequence[int] = (256, 256)
    activation: str = "relu"
    value_bins: int = 0

    @nn.compact
    def __call__(self, obs: jax.Array, action: jax.Array) -> jax.Array:
        x = jnp.concatenate([obs.astype(jnp.float32), action.astype(jnp.float32)], axis=-1)
        x = MLP(self.hidden_sizes, self.activation, name="torso")(x)
        if self.value_bins:
            return Dense(self.value_bins, name="head")(x)
        return Dense(1, name="head")(x).squeeze(-1)


class QEnsemble(nn.Module):
    """`num_critics` independent Q-networks evaluated as one batched network.

    `apply(params, obs, action) -> q` of shape [num_critics, *batch]. The members' parameters are
    stacked on a leading axis (`nn.vmap`), so twin critics cost one set of larger matrix products
    rather than two sets of small ones. With `hl_gauss` the members classify: `apply` still
    returns values (each member's expected bin centre), and `logits=True` returns the logits,
    [num_critics, *batch, num_bins], that the cross-entropy loss trains.
    """

    num_critics: int = 2
    hidden_sizes: Sequence[int] = (256, 256)
    activation: str = "relu"
    hl_gauss: HLGauss | None = None

    @nn.compact
    def __call__(self, obs: jax.Array, action: jax.Array, logits: bool = False) -> jax.Array:
        bins = self.hl_gauss.num_bins if self.hl_gauss else 0
        ensemble = nn.vmap(
            QNetwork,
            variable_axes={"params": 0},
            split_rngs={"params": True},
            in_axes=None,
            out_axes=0,
            axis_size=self.num_critics,
        )
        out = ensemble(self.hidden_sizes, self.activation, bins, name="members")(obs, action)
        if self.hl_gauss is None or logits:
            return out
        return self.hl_gauss.value(out)


class ActorCritic(nn.Module):
    """Separate actor and critic MLPs (sharing a torso hurts PPO on small control tasks).

    `apply(params, obs) -> (distribution, value)`. Observations with `obs_ndim` axes (3 for
    MinAtar images) are flattened; any leading axes are batch axes. With `value_bins` > 0 the
    critic classifies (HL-Gauss): the second output is its `value_bins` logits, not a value.
    `apply(params, obs, critic_obs)` gives the critic its own, flat input: a centralised critic's
    world state (MAPPO), while the actor acts on the agent's observation.
    With `torso="nature_cnn"` (Atari frames) both heads sit on one shared `NatureCNN`, as in
    CleanRL's Atari PPO; `hidden_sizes`, `activation` and `critic_obs` are then unused.
    """

    action_dim: int
    discrete: bool
    hidden_sizes: Sequence[int] = (64, 64)
    activation: str = "tanh"
    obs_ndim: int = 1
    value_bins: int = 0
    torso: str = "mlp"  # or "nature_cnn": one NatureCNN that actor and critic share

    @nn.compact
    def __call__(
        self, obs: jax.Array, critic_obs: jax.Array | None = None
    ) -> tuple[distrax.Distribution, jax.Array]:
        if self.torso == "nature_cnn":
            # Pixels: one shared torso (separate ones would double the costly part).
            actor = critic = NatureCNN(name="shared_torso")(obs)
        else:
            obs = obs.reshape(obs.shape[: obs.ndim - self.obs_ndim] + (-1,)).astype(jnp.float32)
            actor = MLP(self.hidden_sizes, self.activation, name="actor_torso")(obs)
            critic_input = obs if critic_obs is None else critic_obs.astype(jnp.float32)
            critic = MLP(self.hidden_sizes, self.activation, name="critic_torso")(critic_input)
        if self.discrete:
            dist = CategoricalHead(self.action_dim, name="actor_head")(actor)
        else:
            dist = GaussianHead(self.action_dim, name="actor_head")(actor)
        if self.value_bins:
            return dist, Dense(self.value_bins, name="critic_head")(critic)
        value = Dense(1, kernel_init=orthogonal(1.0), name="critic_head")(critic)
        return dist, value.squeeze(-1)
