"""Online DPO presets for `experiments/online_dpo.py`:
`--config=experiments/configs/online_dpo.py[:NAME]`.

- reverse_digits: reverse 3 digits from a short SFT run (made as for ppo_lm.py's preset), each
  update ranking 4 samples of 256 prompts by the task's answer reward, or by a reward model
  (`--config.reward_model=runs/rm`; comma-separated runs: an ensemble).
"""

import ml_collections

from jaxrl.config import preset_of
from jaxrl.trainers.presets.lm import prompt_rl_config

PRESETS = {
    "reverse_digits": dict(
        num_steps=30,
        batch_size=256,
        num_samples=4,
        num_minibatches=4,
        num_epochs=2,
        learning_rate=5e-4,
        max_new_tokens=4,
        task=dict(num_digits=3),
    ),
}


def get_config(preset: str = "reverse_digits") -> ml_collections.ConfigDict:
    """The preset's config: `algos.online_dpo.Config` fields, the LM sections, the reward settings
    (those of grpo.py, and `reward_model`), and the greedy evaluation's batch size."""
    from algos import online_dpo

    chosen = preset_of(PRESETS, preset)
    settings = {}
    config = prompt_rl_config(
        online_dpo.Config(), chosen, settings, max(1, chosen["num_steps"] // 5)
    )
    # A reward_model.py run directory (comma-separated: an ensemble, combined by
    # config.ensemble_rule) whose score replaces the task's reward; the task's reward is still
    # logged (reward_<name>), which on a testbed with a known reward measures over-optimisation.
    config.reward_model = ""
    config.run.log_every = 1  # an update is seconds of work: log each
    return config
