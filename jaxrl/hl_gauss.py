"""Value learning by classification: HL-Gauss (Farebrother et al., 2024, "Stop Regressing").

A critic outputs logits over `num_bins` equal bins covering [low, high] instead of one number. Its
value is the expectation of the bin centres under softmax(logits). It learns by cross-entropy
against a target distribution: a Normal centred on the scalar TD target (or return) with standard
deviation `sigma` bin widths, integrated over each bin and renormalised to the range. Spreading the
target over neighbouring bins is what makes this better than a one-hot ("two-hot") target; the
paper's recommended width is sigma = 0.75 bin widths.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from jaxrl.config import is_finite_number, require


@dataclasses.dataclass(frozen=True)
class HLGauss:
    """The bins of a classification critic and the maps between values and distributions.

    A frozen dataclass, so it is a static (hashable) part of a network or program.
    """

    num_bins: int
    low: float
    high: float
    sigma: float = 0.75  # the target Normal's standard deviation, in bin widths

    @property
    def bin_width(self) -> float:
        """Width of every bin: (high - low) / num_bins."""
        return (self.high - self.low) / self.num_bins

    def edges(self) -> jax.Array:
        """The num_bins + 1 bin edges, low to high."""
        return jnp.linspace(self.low, self.high, self.num_bins + 1, dtype=jnp.float32)

    def centres(self) -> jax.Array:
        """The num_bins bin centres."""
        edges = self.edges()
        return 0.5 * (edges[:-1] + edges[1:])

    def target_probs(self, target: jax.Array) -> jax.Array:
        """The distribution to classify towards, shape [*target.shape, num_bins].

        Targets outside [low, high] are clipped onto the range first: their mass then sits in the
        end bins, which keeps the critic's value inside the range it can represent.
        """
        target = jnp.clip(target.astype(jnp.float32), self.low, self.high)[..., None]
        scale = self.sigma * self.bin_width * jnp.sqrt(2.0)
        cdf = jax.scipy.special.erf((self.edges() - target) / scale)  # 2 * Phi - 1 at each edge
        mass = cdf[..., 1:] - cdf[..., :-1]
        # The mass between the outermost edges; what fell outside the range is renormalised away.
        return mass / (cdf[..., -1:] - cdf[..., :1])

    def value(self, logits: jax.Array) -> jax.Array:
        """The critic's value: the expected bin centre under softmax(logits)."""
        return jax.nn.softmax(logits.astype(jnp.float32), axis=-1) @ self.centres()

    def loss(self, logits: jax.Array, target: jax.Array) -> jax.Array:
        """Cross-entropy of softmax(logits) against `target_probs(target)`, per sample (no mean).

        The target distribution is a constant: no gradient flows into the TD target or return.
        """
        probs = jax.lax.stop_gradient(self.target_probs(target))
        return -(probs * jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)).sum(-1)


def validate_hl_gauss(
    num_bins: int, value_range: tuple[float, ...], sigma: float, example: str
) -> None:
    """Check a config's `hl_gauss_*` fields (raising `ConfigError` naming the field). With
    `hl_gauss_bins == 0` (regression) the range and sigma must stay at their defaults: setting
    them would be ignored. `example` is a range that suits the algorithm's default task."""
    if num_bins == 0:
        require(
            tuple(value_range) == () and sigma == 0.75,
            "hl_gauss_range" if tuple(value_range) else "hl_gauss_sigma",
            "is set but hl_gauss_bins is 0, so the critic regresses and would ignore it",
            "set hl_gauss_bins (e.g. 51) to learn values by classification, or drop the field",
        )
        return
    require(
        isinstance(num_bins, int) and num_bins >= 2,
        "hl_gauss_bins",
        f"must be 0 (regression) or an integer >= 2, got {num_bins!r}",
        "e.g. hl_gauss_bins=51",
    )
    require(
        len(value_range) == 2 and all(is_finite_number(v) for v in value_range),
        "hl_gauss_range",
        f"must be (low, high) finite numbers, got {tuple(value_range)!r}",
        f"give the range of returns the critic must represent, e.g. hl_gauss_range={example}",
    )
    require(
        value_range[0] < value_range[1],
        "hl_gauss_range",
        f"low must be below high, got {tuple(value_range)!r}",
        f"e.g. hl_gauss_range={example}",
    )
    require(
        is_finite_number(sigma) and sigma > 0,
        "hl_gauss_sigma",
        f"must be a positive number of bin widths, got {sigma!r}",
        "the paper's choice is 0.75",
    )


def make_hl_gauss(num_bins: int, value_range: tuple[float, ...], sigma: float) -> HLGauss | None:
    """The `HLGauss` a config's `hl_gauss_bins`, `hl_gauss_range` and `hl_gauss_sigma` describe,
    or None for the regression critic (`hl_gauss_bins == 0`)."""
    if num_bins == 0:
        return None
    low, high = value_range
    return HLGauss(int(num_bins), float(low), float(high), float(sigma))
