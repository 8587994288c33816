"""Multi-agent PPO presets for `experiments/mappo.py`: `--config=experiments/configs/mappo.py:NAME`.

Top-level fields are `algos.mappo.Config` fields (override with `--config.learning_rate=1e-3`);
`run` holds how the experiment is driven (chunking, checkpoints, logging), not the algorithm.
"""

import ml_collections

from jaxrl.config import config_dict, preset_of

PRESETS = {
    # JaxMARL's IPPO settings for MPE (ippo_ff_mpe.yaml): 16 envs x 128 steps, 4 epochs x 4
    # minibatches, lr 2.5e-4 annealed, 64x64 tanh, parameters shared by the 3 agents.
    "ippo_spread": dict(
        env_name="jaxmarl:MPE_simple_spread_v3", critic="independent", total_timesteps=2_000_000
    ),
    # The same with a centralised critic on the world state (every agent's observation).
    "mappo_spread": dict(
        env_name="jaxmarl:MPE_simple_spread_v3", critic="centralised", total_timesteps=2_000_000
    ),
    # JaxMARL's IPPO settings for Overcooked (ippo_ff_overcooked.yaml): as for MPE, 5M steps, the
    # shaping reward's weight annealed from 1 to 0 over the first 2.5M. Returns are the team's:
    # a soup served scores 20 for each cook, 40 for the team.
    "ippo_cramped_room": dict(
        env_name="jaxmarl:overcooked_cramped_room",
        critic="independent",
        total_timesteps=5_000_000,
        reward_shaping_horizon=2_500_000,
    ),
    "mappo_cramped_room": dict(
        env_name="jaxmarl:overcooked_cramped_room",
        critic="centralised",
        total_timesteps=5_000_000,
        reward_shaping_horizon=2_500_000,
    ),
}


def get_config(preset: str = "mappo_spread") -> ml_collections.ConfigDict:
    """The preset's config: `algos.mappo.Config` fields with the preset's values, and the `run`
    section."""
    from algos import mappo

    return config_dict(mappo.Config, preset_of(PRESETS, preset))
