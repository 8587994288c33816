"""DPO (or IPO / conservative DPO / SimPO) of an SFT model on preference pairs.

    python experiments/sft.py --workdir=runs/sft
    python experiments/dpo.py --config.init_from=runs/sft --workdir=runs/dpo
    python experiments/dpo.py --config.init_from=runs/sft --config.loss_type=ipo

Pairs are your own JSONL files (--config.task.train_jsonl, and --config.task.eval_jsonl or
config.task.num_eval of its rows held out) with `prompt`, `chosen`, `rejected` as strings or, as
TRL's conversational format, chat messages (the prompt's conversation; chosen / rejected with the
assistant's reply), rendered with the checkpoint's chat template. Without files the pairs are the
task's, synthetic: chosen is the right answer, rejected a plausibly wrong one. They are checked
and tokenised before anything is written, to lengths that are the config's or, with 0, the
pairs' (config.task.length_percentile; pairs cut are counted and reported as `cut_rows`), and the
run directory keeps them as a tensorflow-datasets dataset (array_record). The reference model is
the SFT model.

Training runs on `jaxrl.runner` (compiled chunks, checkpoints, resumption). `summary.json` reports
held-out `eval_reward_accuracy` (the policy's implicit reward ranks chosen above rejected) and
`eval_task_accuracy` (greedy generations exactly right), next to the SFT model's
`sft_eval_task_accuracy`.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from jaxrl import interrupts

interrupts.for_a_script()  # first: Ctrl-C during the imports below is one line too

from jaxrl import cli, extras

# A missing optional extra is one error line, before flags are parsed or anything compiles.
extras.require("lm", "experiments/dpo.py")

from jaxrl.trainers import base, dpo

FLAGS = cli.define_flags(__file__, "dpo.py", seeds=False)

if __name__ == "__main__":
    cli.main(lambda argv: base.run_script(FLAGS, dpo.train))
