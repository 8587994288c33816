"""jaxrl: shared machinery (networks, checkpointing, logging, evaluation) for the algorithms in
`algos/`. Nothing here knows about a particular algorithm."""

__version__ = "0.1.0"
