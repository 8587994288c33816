"""Online DPO of a language model: pairs of its own samples, ranked by a reward model or a
task's reward, trained on with DPO's losses as they are drawn.

    python experiments/online_dpo.py --config.init_from=runs/sft3 --workdir=runs/online_dpo
    python experiments/online_dpo.py --config.init_from=runs/sft3 --config.reward_model=runs/rm3 \\
        --workdir=runs/online_dpo_rm

Every update samples num_samples completions per prompt from the current policy, scores them
(`--config.reward_model`: reward_model.py runs, comma-separated for an ensemble; without it the
task's reward, grpo.py's prompts, prompt files and reward functions), pairs each prompt's best
against its worst and takes DPO steps (`--config.loss_type`: sigmoid, ipo or simpo) against the
starting model, all in one compiled program (`algos/online_dpo.py`); chunks, checkpoints and
resumption are the runner's. `params/` holds the policy; `summary.json` reports
`final_mean_reward` (the task's reward of the samples, last 10 updates), `final_score` and the
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
extras.require("lm", "experiments/online_dpo.py")

from jaxrl.trainers import base, online_dpo

FLAGS = cli.define_flags(__file__, "online_dpo.py", seeds=False)

if __name__ == "__main__":
    cli.main(lambda argv: base.run_script(FLAGS, online_dpo.train))
