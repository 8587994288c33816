"""Online DPO presets for `experiments/online_dpo.py`:
`--config=experiments/configs/online_dpo.py[:NAME]`.

- reverse_digits: reverse 3 digits from a short SFT run (made as for ppo_lm.py's preset), each
  update ranking 4 samples of 256 prompts by the task's answer reward, or by a reward model
  (`--config.reward_model=runs/rm`; comma-separated runs: an ensemble).
"""

import ml_collections

from experiments.configs.lm import lm_config

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
    """The preset's config: `algos.online_dpo.Config` fields, the LM sections, the reward
    settings (grpo.py's, and `reward_model`), and the greedy evaluation's batch size."""
    from algos import online_dpo
    from jaxrl import runner

    rewards = ml_collections.ConfigDict(dict(format_weight=0.0, host="", host_weights=""))
    chosen = runner.preset_of(PRESETS, preset)
    config = lm_config(
        online_dpo.Config(),
        chosen,
        num_chunks=max(1, chosen["num_steps"] // 5),
        rewards=rewards,
        eval_batch_size=256,
        eval_every=0,
        eval_samples=4,  # sampled completions per held-out prompt, for pass@k (0: none)
    )
    config.task.train_tfds = ""
    config.task.tfds_data_dir = ""
    config.task.train_split = "train"
    config.task.eval_split = ""
    config.task.prompt_column = "prompt"
    config.init_from = ""
    config.reward_model = ""  # reward_model.py run(s); "" ranks by the task's reward
    config.run.log_every = 1
    return config
