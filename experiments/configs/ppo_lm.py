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

from experiments.configs.lm import lm_config

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
        task=dict(train_jsonl="data/word_problems.jsonl", num_eval=200),
    ),
}
PRESET_SETTINGS = {
    "word_problems": dict(
        init_from="smollm2", host="envs.text.math_answers:math_answer_reward", eval_batch_size=40
    ),
}


def get_config(preset: str = "reverse_digits") -> ml_collections.ConfigDict:
    """The preset's config: `algos.ppo_lm.Config` fields, the LM sections, the reward settings
    (those of grpo.py, and `reward_model`), and the greedy evaluation's batch size."""
    from algos import ppo_lm
    from jaxrl import runner

    rewards = ml_collections.ConfigDict(dict(format_weight=0.0, host="", host_weights=""))
    chosen = runner.preset_of(PRESETS, preset)
    settings = PRESET_SETTINGS.get(preset, {})
    rewards.host = settings.get("host", "")
    config = lm_config(
        ppo_lm.Config(),
        chosen,
        num_chunks=max(1, chosen["num_steps"] // 5),
        rewards=rewards,
        eval_batch_size=settings.get("eval_batch_size", 256),
        eval_every=0,  # held-out evaluation every N chunks (0: at the start and the end only)
        eval_samples=4,  # sampled completions per held-out prompt, for pass@k (0: none)
    )
    config.task.train_tfds = ""
    config.task.tfds_data_dir = ""
    config.task.train_split = "train"
    config.task.eval_split = ""
    config.task.prompt_column = "prompt"
    config.init_from = settings.get("init_from", "")
    # A reward_model.py run directory (comma-separated: an ensemble, combined by
    # config.ensemble_rule) whose score replaces the task's reward; the task's reward is still
    # logged (reward_<name>), which on a testbed with a known reward measures over-optimisation.
    config.reward_model = ""
    config.run.log_every = 1  # an update is seconds of work: log each
    return config
