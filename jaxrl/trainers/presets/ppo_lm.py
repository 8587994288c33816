"""PPO (RLHF) presets for `experiments/ppo_lm.py`: `--config=experiments/configs/ppo_lm.py[:NAME]`.

- reverse_digits: reverse 3 digits, from a short SFT run (`--config.init_from=runs/sft`, made by
  `experiments/sft.py --config.task.num_digits=3 --config.task.num_train=512
  --config.task.num_eval=128 --config.num_steps=50`), rewarded by the task's answer reward, or by
  a reward model (`--config.reward_model=runs/rm`, made by `experiments/reward_model.py` with the
  same task settings from the same SFT run; several comma-separated run directories are an
  ensemble).
- word_problems: SmolLM2-135M-Instruct (init_from "smollm2") on arithmetic word problems from
  data/word_problems.jsonl (made as for the GRPO preset), rewarded by
  envs.text.math_answers:math_answer_reward or a reward model.
"""

import ml_collections

from jaxrl.config import preset_of
from jaxrl.trainers.presets import grpo
from jaxrl.trainers.presets.lm import prompt_rl_config

PRESETS = {
    "reverse_digits": dict(
        num_steps=60,
        batch_size=256,
        num_minibatches=4,
        num_epochs=4,
        learning_rate=3e-4,
        max_new_tokens=4,
        task=dict(num_digits=3),
    ),
    "word_problems": dict(
        num_steps=20,
        batch_size=16,
        num_minibatches=2,
        grad_accum_steps=2,
        num_epochs=2,
        max_new_tokens=12,
        task=grpo.PRESETS["word_problems"]["task"],
    ),
}
PRESET_SETTINGS = grpo.PRESET_SETTINGS  # the same start, reward and evaluation batch


def get_config(preset: str = "reverse_digits") -> ml_collections.ConfigDict:
    """The preset's config: `algos.ppo_lm.Config` fields, the LM sections, the reward settings
    (those of grpo.py, and `reward_model`), and the greedy evaluation's batch size."""
    from algos import ppo_lm

    chosen = preset_of(PRESETS, preset)
    settings = PRESET_SETTINGS.get(preset, {})
    config = prompt_rl_config(ppo_lm.Config(), chosen, settings, max(1, chosen["num_steps"] // 5))
    # A reward_model.py run directory (comma-separated: an ensemble, combined by
    # config.ensemble_rule) whose score replaces the task's reward; the task's reward is still
    # logged (reward_<name>), which on a testbed with a known reward measures over-optimisation.
    config.reward_model = ""
    config.run.log_every = 1  # an update is seconds of work: log each
    return config
