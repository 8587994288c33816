"""A reward model trained on preference pairs (Bradley-Terry), for RL against it.

    python experiments/sft.py --workdir=runs/sft
    python experiments/reward_model.py --config.init_from=runs/sft --workdir=runs/rm
    python experiments/reward_model.py --config.init_from=<HF dir or .gguf> \
        --config.task.train_jsonl=pairs.jsonl --workdir=runs/rm

The pairs are those dpo.py reads, in the same formats: your JSONL files (`prompt`, `chosen`,
`rejected` as strings or chat messages) or the task's synthetic pairs, checked and tokenised
before anything is written and kept in the run directory as a tensorflow-datasets dataset. The
model is the transformer of init_from (or the config's, randomly initialised) with a scalar head
on its last token (`algos.reward_model`). Training runs on `jaxrl.runner` (compiled chunks,
checkpoints, resumption); `summary.json` reports held-out `eval_pair_accuracy` (the chosen
answer gets the higher reward) for the starting model and the trained one, and params/ holds
{"backbone", "score_kernel", "score_bias"}; model.json records the run as a reward model's, so
no language-model script mistakes it for a policy to start from.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from jaxrl import interrupts

interrupts.for_a_script()  # first: Ctrl-C during the imports below is one line too

from jaxrl import cli, extras

# A missing optional extra is one error line, before flags are parsed or anything compiles.
extras.require("lm", "experiments/reward_model.py")

from jaxrl.trainers import base, reward_model

FLAGS = cli.define_flags(__file__, "reward_model.py", seeds=False)

if __name__ == "__main__":
    cli.main(lambda argv: base.run_script(FLAGS, reward_model.train))
