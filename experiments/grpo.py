"""GRPO (or Dr. GRPO / DAPO / RLOO) of a language model on a text task with a verifiable reward.

    python experiments/grpo.py --workdir=runs/grpo                 # reverse 3 digits, random init
    python experiments/grpo.py --config.variant=dapo --config.seed=1
    python experiments/sft.py --config=experiments/configs/sft.py:addition --workdir=runs/sft_add
    python experiments/grpo.py --config=experiments/configs/grpo.py:addition \\
        --config.init_from=runs/sft_add --workdir=runs/grpo_add

Every update samples prompts, generates group_size completions per prompt, scores them and
updates the policy inside one compiled program (`algos/grpo.py`); updates run in compiled chunks
on `jaxrl.runner`, with a checkpoint after each, and a restarted run resumes from the newest.
--config.init_from takes an SFT or DPO run directory, a Hugging Face checkpoint directory or a
GGUF file (its architecture and tokenizer come along); without it the model starts from random
weights. Rewards are the task's (`envs.text`): the answer reward
(exact match 1, partial credit below 0.5), plus `rewards.format_weight` x the format reward, plus
an optional host Python function (`--config.rewards.host=my_module:my_reward`, called as
f(prompts, completions, answer=[...])).

`summary.json` reports `final_mean_reward` (the answer reward of the sampled completions, mean
over the last 10 updates) and `eval_task_accuracy` (greedy generations exactly right on held-out
problems), next to the starting model's `initial_eval_task_accuracy`.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from jaxrl import interrupts

interrupts.for_a_script()  # first: Ctrl-C during the imports below is one line too

from jaxrl import cli, extras

# A missing optional extra is one error line, before flags are parsed or anything compiles.
extras.require("lm", "experiments/grpo.py")

from jaxrl.trainers import base, grpo

FLAGS = cli.define_flags(__file__, "grpo.py", seeds=False)

if __name__ == "__main__":
    cli.main(lambda argv: base.run_script(FLAGS, grpo.train))
