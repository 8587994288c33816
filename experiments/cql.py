"""Train CQL offline on an RLDS dataset, several seeds vmapped into one program, and compare with
behaviour cloning on the same data.

    python experiments/collect.py --policy=runs/sac-medium --mixture=medium --data_dir=data
    python experiments/cql.py --config.dataset.path=data/pendulum_v1/medium/1.0.0
    python experiments/cql.py --config=experiments/configs/cql.py:halfcheetah \\
        --config.dataset.path=d4rl_mujoco_halfcheetah/v2-medium --config.dataset.data_dir=~/tfds

Gradient steps on the dataset held on the device run in compiled chunks on `jaxrl.runner`; after
each chunk the deterministic policy is evaluated in the JAX environment (an `eval_return` row in
metrics.jsonl). Restarted on an existing --workdir, a run resumes from its newest checkpoint and
ends where an uninterrupted run would. `summary.json` reports `final_eval_return`, the D4RL
`normalized_score`, the dataset's behaviour score and (unless --config.bc.enabled=false) behaviour
cloning's score on the same data and seeds.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from jaxrl import interrupts

interrupts.for_a_script()  # first: Ctrl-C during the imports below is one line too

from absl import flags

from jaxrl import cli
from jaxrl.trainers import base, cql

FLAGS = cli.define_flags(__file__, "cql.py:pendulum")
flags.FLAGS.set_default("num_seeds", 3)
if __name__ == "__main__":
    cli.main(lambda argv: base.run_script(FLAGS, cql.train))
