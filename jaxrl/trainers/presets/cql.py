"""CQL presets for `experiments/cql.py`: `--config=experiments/configs/cql.py:NAME`.

Top-level fields are `algos.cql.Config` fields (override with `--config.cql_alpha=1.0`).
`dataset` names the offline data (a path printed by experiments/collect.py, or a TFDS name with
`data_dir`); `reference` gives D4RL's random and expert returns for the normalized score (None:
the dataset's own metadata); `bc` trains behaviour cloning on the same data for comparison.
"""

import ml_collections

from jaxrl.config import config_dict, preset_of, run_section

PRESETS = {
    # Pendulum-v1 from a "medium" dataset made by experiments/collect.py (see README).
    # Learning rates as SAC's online ones: Kumar et al.'s slower actor (1e-4) needs far more steps.
    "pendulum": dict(
        env_name="Pendulum-v1",
        num_steps=5_000,
        hidden_sizes=(64, 64),
        actor_lr=3e-4,
        critic_lr=1e-3,
        alpha_lr=1e-3,
    ),
    # D4RL-style locomotion (pip install "jaxrl[mujoco]"), Kumar et al.'s network sizes.
    "halfcheetah": dict(env_name="HalfCheetah-v5", num_steps=1_000_000, eval_episodes=5),
}


def get_config(preset: str = "pendulum") -> ml_collections.ConfigDict:
    """The preset's config: `algos.cql.Config` fields with the preset's values, and the `run`
    section."""
    from algos import cql

    def optional(field_type: type) -> ml_collections.FieldReference:
        return ml_collections.FieldReference(None, field_type=field_type)

    config = config_dict(
        cql.Config,
        preset_of(PRESETS, preset),
        dataset=ml_collections.ConfigDict(
            dict(path=optional(str), data_dir=optional(str), split="train")  # path is required
        ),
        reference=ml_collections.ConfigDict(
            dict(random_return=optional(float), expert_return=optional(float))
        ),
        bc=ml_collections.ConfigDict(dict(enabled=True, num_steps=5_000, learning_rate=1e-3)),
        # Each chunk ends with an evaluation in the environment.
        run=run_section(log_every=100),  # gradient steps per metrics row
    )
    config.target_entropy = optional(float)
    return config
