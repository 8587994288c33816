"""SAC presets for `experiments/sac.py`: `--config=experiments/configs/sac.py:NAME`.

Top-level fields are `algos.sac.Config` fields (override with `--config.actor_lr=1e-3`); `run` holds
how the experiment is driven (chunking, checkpoints, logging), not the algorithm.
"""

import ml_collections

from jaxrl.config import config_dict, preset_of, run_section

PRESETS = {
    # 20k environment steps, the first 1k uniformly random; 256x256 ReLU networks, batch 256.
    "pendulum": dict(env_name="Pendulum-v1", total_timesteps=20_000),
    # Small networks: about 6x faster on a CPU and still learns Pendulum (the CI test's setting).
    "pendulum_small": dict(env_name="Pendulum-v1", total_timesteps=20_000, hidden_sizes=(64, 64)),
    # Classifying critics (HL-Gauss): 101 bins over Pendulum's soft returns, which lie in about
    # [-1650, 0] (reward >= -16.3 per step, gamma 0.99), with room for the entropy bonus above.
    "pendulum_hl_gauss": dict(
        env_name="Pendulum-v1",
        total_timesteps=20_000,
        hl_gauss_bins=101,
        hl_gauss_range=(-1700.0, 100.0),
    ),
    # MuJoCo locomotion on MJX (pip install "jaxrl[mujoco]"); Haarnoja et al.'s settings.
    "halfcheetah": dict(
        env_name="HalfCheetah-v5",
        total_timesteps=1_000_000,
        learning_starts=10_000,
        actor_lr=3e-4,
        critic_lr=3e-4,
        alpha_lr=3e-4,
        eval_episodes=4,
    ),
    "hopper": dict(
        env_name="Hopper-v5",
        total_timesteps=1_000_000,
        learning_starts=10_000,
        actor_lr=3e-4,
        critic_lr=3e-4,
        alpha_lr=3e-4,
        eval_episodes=4,
    ),
}


def get_config(preset: str = "pendulum") -> ml_collections.ConfigDict:
    """The preset's config: `algos.sac.Config` fields with the preset's values, and the `run`
    section."""
    from algos import sac

    config = config_dict(
        sac.Config,
        preset_of(PRESETS, preset),
        run=run_section(log_every=250),  # updates per metrics row
    )
    # `target_entropy` is None (automatic) by default; ml_collections needs its type declared so
    # that --config.target_entropy=-2 can override it.
    config.target_entropy = ml_collections.FieldReference(None, field_type=float)
    return config
