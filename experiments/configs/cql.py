"""CQL presets for `experiments/cql.py`: `--config=experiments/configs/cql.py:NAME`.

Top-level fields are `algos.cql.Config` fields (override with `--config.cql_alpha=1.0`).
`dataset` names the offline data (a path printed by experiments/collect.py, or a TFDS name with
`data_dir`); `reference` gives D4RL's random and expert returns for the normalized score (None:
the dataset's own metadata); `bc` trains behaviour cloning on the same data for comparison.
"""

import ml_collections

PRESETS = {
    # Pendulum-v1 from a "medium" dataset made by experiments/collect.py (see README).
    # Learning rates as SAC's online ones: Kumar et al.'s slower actor (1e-4) needs far more steps.
    "pendulum": dict(
        env_name="Pendulum-v1",
        num_updates=5_000,
        hidden_sizes=(64, 64),
        actor_lr=3e-4,
        critic_lr=1e-3,
        alpha_lr=1e-3,
    ),
    # D4RL-style locomotion (pip install "jaxrl[mujoco]"), Kumar et al.'s network sizes.
    "halfcheetah": dict(env_name="HalfCheetah-v5", num_updates=1_000_000, eval_episodes=5),
}


def get_config(preset: str = "pendulum") -> ml_collections.ConfigDict:
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; choose one of {sorted(PRESETS)}")
    from algos import cql

    config = ml_collections.ConfigDict(cql.Config().__dict__)
    config.update(PRESETS[preset])
    config.hidden_sizes = tuple(config.hidden_sizes)
    config.target_entropy = ml_collections.FieldReference(None, field_type=float)
    config.dataset = ml_collections.ConfigDict(
        dict(
            path=ml_collections.FieldReference(None, field_type=str),  # required
            data_dir=ml_collections.FieldReference(None, field_type=str),
            split="train",
        )
    )
    config.reference = ml_collections.ConfigDict(
        dict(
            random_return=ml_collections.FieldReference(None, field_type=float),
            expert_return=ml_collections.FieldReference(None, field_type=float),
        )
    )
    config.bc = ml_collections.ConfigDict(dict(enabled=True, num_updates=5_000, learning_rate=1e-3))
    config.run = ml_collections.ConfigDict(
        dict(
            num_chunks=10,  # each chunk ends with an evaluation in the environment
            checkpoint_every=1,  # chunks
            keep_checkpoints=3,
            log_every=100,  # gradient steps per metrics row (rounded down to divide a chunk)
            tensorboard=True,
            progress=True,
        )
    )
    return config
