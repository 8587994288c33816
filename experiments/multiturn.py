"""Multi-turn RL of a language-model agent on a text game (`envs.text.multiturn`): whole
conversations with the game, the credit over turns and the update in one compiled program.

    python experiments/sft.py --config=experiments/configs/sft.py:guess_my_number \\
        --workdir=runs/sft_guess
    python experiments/multiturn.py --config=experiments/configs/multiturn.py:guess_my_number \\
        --config.init_from=runs/sft_guess --workdir=runs/mt_guess
    python experiments/multiturn.py ... --config.credit=turn --config.gamma=0.9

Every update plays batch_size games group_size times each with the current policy, turn by turn
(the policy speaks up to max_new_tokens tokens, the game answers, its answer joins the context),
compares the episodes of a game as GRPO compares completions (credit=episode), or turn by turn
with discounted returns (credit=turn), and takes the clipped policy-gradient step on the policy's
own tokens (`algos/multiturn.py`). Updates run in compiled chunks on `jaxrl.runner`, with a
checkpoint after each; a restarted run resumes from the newest.

The game, its turns and its rendering come from config.task (`jaxrl/trainers/game_play.game_task`);
with a chat template (init_from a chat model such as "smollm2") the game speaks in user turns.
Evaluation plays task.num_eval episodes, the same games and sampling keys before and after
training (paired), sampled as trained and greedily. `summary.json` reports `eval_success` and
`eval_success_greedy` with 95% intervals, the paired change, and `initial_*` the same before
training; `transcripts_before.txt` and `transcripts_after.txt` hold the first episodes as text;
`learning_curve.png` the training episodes' success per update, `eval_success.png` the
evaluations.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from jaxrl import interrupts

interrupts.for_a_script()  # first: Ctrl-C during the imports below is one line too

from jaxrl import cli, extras

# A missing optional extra is one error line, before flags are parsed or anything compiles.
extras.require("lm", "experiments/multiturn.py")

from jaxrl.trainers import base, multiturn

FLAGS = cli.define_flags(__file__, "multiturn.py", seeds=False)

if __name__ == "__main__":
    cli.main(lambda argv: base.run_script(FLAGS, multiturn.train))
