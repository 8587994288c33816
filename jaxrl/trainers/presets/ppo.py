"""PPO presets for `experiments/ppo.py`: `--config=experiments/configs/ppo.py:NAME`.

Top-level fields are `algos.ppo.Config` fields (override with `--config.learning_rate=1e-3`);
`run` holds how the experiment is driven (chunking, checkpoints, logging), not the algorithm.
"""

import ml_collections

from jaxrl.config import config_dict, preset_of

PRESETS = {
    # PureJaxRL / CleanRL CartPole settings: 4 envs x 128 steps, 4 epochs x 4 minibatches.
    "cartpole": dict(env_name="CartPole-v1", total_timesteps=500_000),
    # Continuous control: a shorter horizon (gamma 0.95), normalised observations and rewards,
    # more parallel data and epochs, no entropy bonus.
    "pendulum": dict(
        env_name="Pendulum-v1",
        total_timesteps=2_000_000,
        num_envs=32,
        rollout_length=128,
        num_epochs=10,
        num_minibatches=16,
        learning_rate=1e-3,
        gamma=0.95,
        gae_lambda=0.95,
        ent_coef=0.0,
        normalize_observations=True,
        normalize_rewards=True,
        hidden_sizes=(64, 64),
    ),
    # Value learning by classification (HL-Gauss, Farebrother et al., 2024): the critic classifies
    # the return over 51 bins. CartPole's discounted returns lie in [0, 100] with gamma 0.99.
    "cartpole_hl_gauss": dict(
        env_name="CartPole-v1",
        total_timesteps=500_000,
        hl_gauss_bins=51,
        hl_gauss_range=(0.0, 100.0),
        clip_value=False,
    ),
    # MinAtar Breakout with an MLP on the flattened 10x10x4 image: PureJaxRL's MinAtar settings
    # (a high, annealed learning rate and small 64x64 networks). At lr 5e-4 with 256x256 networks
    # seeds froze at returns of 7-14 for millions of steps; with these, 3 of 3 seeds pass 20 by
    # 2.5M steps and end at 34-39 (README.md, Results).
    "breakout": dict(
        env_name="Breakout-MinAtar",
        total_timesteps=10_000_000,
        num_envs=64,
        rollout_length=128,
        num_epochs=4,
        num_minibatches=8,
        learning_rate=5e-3,
        ent_coef=0.01,
        hidden_sizes=(64, 64),
        activation="relu",
    ),
}


# Atari through EnvPool with CleanRL's PPO settings (Huang et al., 2022, "The 37 Implementation
# Details of PPO"): the Nature CNN shared by actor and critic, 8 envs x 128 steps, clip 0.1, a lost
# life ending the learner's episode and rewards clipped to their sign, while returns count whole
# games in points. 10M agent steps (40M frames at EnvPool's frame skip of 4) is CleanRL's budget;
# a few hundred steps/s on a 2-core CPU make it a GPU run (README.md, Host environments).
ATARI = dict(
    env_options="episodic_life=True,reward_clip=True",
    torso="nature_cnn",
    total_timesteps=10_000_000,
    num_envs=8,
    rollout_length=128,
    num_epochs=4,
    num_minibatches=4,
    learning_rate=2.5e-4,
    clip_eps=0.1,
    ent_coef=0.01,
    eval_episodes=8,  # whole games, each up to EnvPool's 27,000-step limit
)
PRESETS["atari_breakout"] = dict(ATARI, env_name="envpool:Breakout-v5")
PRESETS["atari_pong"] = dict(ATARI, env_name="envpool:Pong-v5")

# Pendulum's settings with an HL-Gauss critic; the normalised discounted returns (gamma 0.95)
# stay inside [-10, 2] in units of their running standard deviation.
PRESETS["pendulum_hl_gauss"] = dict(
    PRESETS["pendulum"], hl_gauss_bins=51, hl_gauss_range=(-10.0, 2.0), clip_value=False
)


def get_config(preset: str = "cartpole") -> ml_collections.ConfigDict:
    """The preset's config: `algos.ppo.Config` fields with the preset's values, and the `run`
    section."""
    from algos import ppo

    return config_dict(ppo.Config, preset_of(PRESETS, preset))
