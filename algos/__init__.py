"""One module per algorithm, each readable top to bottom."""

# Importing jaxrl joins JAX's multi-host runtime when JAXRL_DISTRIBUTED=1 (jaxrl.distributed),
# which must happen before anything computes. It sets no XLA flags.
import jaxrl  # noqa: F401
