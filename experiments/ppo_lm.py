"""PPO of a language model (RLHF): against a reward model trained on preferences, or a task's
verifiable reward.

    TASK="--config.task.num_digits=3 --config.task.num_train=512 --config.task.num_eval=128"
    python experiments/sft.py $TASK --config.num_steps=50 --workdir=runs/sft
    python experiments/reward_model.py $TASK --config.init_from=runs/sft --workdir=runs/rm
    python experiments/ppo_lm.py --config.init_from=runs/sft --config.reward_model=runs/rm \\
        --workdir=runs/ppo
    python experiments/ppo_lm.py --config.init_from=runs/sft --workdir=runs/ppo_task  # task reward

Every update samples one completion per prompt, scores it with the reward model (or the task),
computes the policy's log-probs and values and the reference's log-probs, folds the KL penalty
into per-token rewards, estimates advantages by GAE and takes PPO's clipped steps, all inside one
compiled program (`algos/ppo_lm.py`); updates run in compiled chunks on `jaxrl.runner`, with a
checkpoint after each, and a restarted run resumes from the newest. The reference is the
starting model. --config.reward_model takes reward_model.py run directories (comma-separated:
an ensemble combined by --config.ensemble_rule); without it the score is the task's reward, as
in grpo.py (its prompts, prompt files and reward functions work here the same way). With a
reward model the task's reward is still logged (`reward`, `reward_<name>`): where it is the
known "gold" reward, the distance between it and `score` is over-optimisation of the proxy.
--config.critic=separate trains a critic of its own, started from the (first) reward model as
TRL does, or from the policy without one.

The run directory follows the other scripts' contract: `params/` holds the trained policy (a
language model later scripts can start from), `summary.json` reports `final_mean_reward` (the
task's reward of the samples, mean over the last 10 updates), `final_score`, `final_kl` and the
held-out `eval_task_accuracy` against the start's.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from jaxrl import interrupts

interrupts.for_a_script()  # first: Ctrl-C during the imports below is one line too

from jaxrl import cli, extras

# A missing optional extra is one error line, before flags are parsed or anything compiles.
extras.require("lm", "experiments/ppo_lm.py")

from jaxrl.trainers import base, ppo_lm

FLAGS = cli.define_flags(__file__, "ppo_lm.py", seeds=False)

if __name__ == "__main__":
    cli.main(lambda argv: base.run_script(FLAGS, ppo_lm.train))
