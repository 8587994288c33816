"""One module per algorithm, each readable top to bottom."""

import jaxrl  # noqa: F401  sets XLA CPU runtime flags before anything is computed
