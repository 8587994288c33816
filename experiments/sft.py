"""Supervised fine-tuning of a language model on a text task or on your own JSONL file (the
starting point of DPO and GRPO).

    python experiments/sft.py --workdir=runs/sft
    python experiments/sft.py --config.num_steps=400 --config.mesh_shape="(1,2,1)"
    python experiments/sft.py --config.init_from=<HF dir> --config.task.train_jsonl=chat.jsonl
    python experiments/sft.py --config=experiments/configs/sft.py:guess_my_number   # a game

Trains on (prompt, answer) pairs of the task, or on the rows of --config.task.train_jsonl in the
formats TRL takes (`jaxrl.data.chat`): "prompt"/"completion" strings or chat messages, or a whole
"messages" conversation rendered with the checkpoint's chat template, the loss on every assistant
turn or (--config.task.assistant_turns=last) the last. On a game's preset (config.task.game,
`jaxrl/trainers/game_play.py`) it trains on a teacher's episodes laid out as the multi-turn sampler
lays out a conversation, the start of `experiments/multiturn.py`. Held-out rows come from
--config.task.eval_jsonl, or are config.task.num_eval rows of the training file. Sequence lengths
are the config's, or with 0 taken from the rows (config.task.length_percentile; a task's are then
lm_runs.TASK_LENGTHS); rows they cut are counted, printed and reported as `cut_rows`.

Training runs in compiled chunks of optimizer steps on `jaxrl.runner`, with a checkpoint after
each; restarted on an existing --workdir it resumes and ends exactly where an uninterrupted run
would. The run directory ends with `params/` (the trained parameters, which
`experiments/dpo.py --config.init_from=<this workdir>` starts from) and `summary.json`, whose
`eval_task_accuracy` is the exact-match accuracy of greedy generations on held-out problems (a
task's), and `eval_loss` / `eval_token_accuracy` the held-out rows' mean NLL and next-token
accuracy over their loss tokens (a file's), with `initial_eval_loss` the same loss before
training.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from jaxrl import interrupts

interrupts.for_a_script()  # first: Ctrl-C during the imports below is one line too

from jaxrl import cli, extras

# A missing optional extra is one error line, before flags are parsed or anything compiles.
extras.require("lm", "experiments/sft.py")

from jaxrl.trainers import base, sft

FLAGS = cli.define_flags(__file__, "sft.py", seeds=False)

if __name__ == "__main__":
    cli.main(lambda argv: base.run_script(FLAGS, sft.train))
