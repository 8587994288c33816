"""Train IPPO or MAPPO on a JaxMARL environment, several seeds vmapped into one compiled program.

    python experiments/mappo.py --workdir=runs/mappo                     # MAPPO, MPE simple spread
    python experiments/mappo.py --config=experiments/configs/mappo.py:ippo_spread --num_seeds=3

The run is compiled chunks of updates on `jaxrl.runner`, checkpointed between chunks and resumed
exactly. `summary.json`'s `final_eval_return` is the mean over seeds of the deterministic policy's
team return (the sum over agents), `final_train_return` that of the training policy's last
episodes, on the scale JaxMARL logs.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from jaxrl import interrupts

interrupts.for_a_script()  # first: Ctrl-C during the imports below is one line too

from jaxrl import cli, extras
from jaxrl.trainers import base, mappo

# A missing optional extra is one error line, before flags are parsed or anything compiles.
extras.require("marl", "experiments/mappo.py")

FLAGS = cli.define_flags(__file__, "mappo.py:mappo_spread")

if __name__ == "__main__":
    cli.main(lambda argv: base.run_script(FLAGS, mappo.train))
