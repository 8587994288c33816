"""Train SAC on a continuous-control JAX environment, several seeds vmapped into one program.

    python experiments/sac.py --workdir=runs/pendulum
    python experiments/sac.py --config=experiments/configs/sac.py:pendulum_small --num_seeds=8
    python experiments/sac.py --config=experiments/configs/sac.py:halfcheetah   # needs [mujoco]

Environment steps, the replay buffer and the updates run inside compiled chunks on `jaxrl.runner`,
checkpointed (buffer included) between chunks; restarted on an existing --workdir it resumes and
ends exactly where an uninterrupted run would. `summary.json`'s `final_eval_return` is the mean over
seeds of the deterministic policy's return.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from jaxrl import interrupts

interrupts.for_a_script()  # first: Ctrl-C during the imports below is one line too

from jaxrl import cli
from jaxrl.trainers import base, sac

FLAGS = cli.define_flags(__file__, "sac.py:pendulum")

if __name__ == "__main__":
    cli.main(lambda argv: base.run_script(FLAGS, sac.train))
