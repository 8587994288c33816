"""Train PPO on a JAX environment, several seeds vmapped into one compiled program.

    python experiments/ppo.py --workdir=runs/cartpole
    python experiments/ppo.py --config=experiments/configs/ppo.py:pendulum --num_seeds=4
    python experiments/ppo.py --config.learning_rate=1e-3 --config.total_timesteps=200000

The run is compiled chunks of updates on `jaxrl.runner`, checkpointed between chunks; restarted on
an existing --workdir it resumes and ends exactly where an uninterrupted run would. `summary.json`'s
`final_eval_return` is the mean over seeds of the deterministic policy's return.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from jaxrl import interrupts

interrupts.for_a_script()  # first: Ctrl-C during the imports below is one line too

from jaxrl import cli
from jaxrl.trainers import base, ppo

FLAGS = cli.define_flags(__file__, "ppo.py:cartpole")

if __name__ == "__main__":
    cli.main(lambda argv: base.run_script(FLAGS, ppo.train))
