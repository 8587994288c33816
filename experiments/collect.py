"""Collect an offline RL dataset (RLDS episodes, a tensorflow-datasets dataset in array_record).

    python experiments/collect.py --env=Pendulum-v1 --policy=random --num_steps=100000
    python experiments/collect.py --policy=runs/sac-pendulum --mixture=expert
    python experiments/collect.py --policy=runs/ppo-short --mixture=medium-expert \
        --expert_policy=runs/ppo-long
    python experiments/collect.py --policy=runs/sac-pendulum --policy_step=3 --mixture=medium-replay

--policy is `random` or the --workdir of a finished experiments/ppo.py or experiments/sac.py run
(seed --policy_seed of its checkpoints; the policy is sampled, not its mode). Mixtures follow
D4RL (see jaxrl/trainers/offline_sources.py for what each one collects and how
medium-replay stands in for a replay buffer). The dataset lands in --data_dir/--name/--version
(default name `<env>/<mixture>`, e.g. pendulum_v1/random) with its metadata (environment,
policy, mixture, reference returns, behaviour score); the script prints its path, the number of
episodes and transitions, and the behaviour score: the mean return of the complete episodes.

Read it back with `jaxrl.data.load_transitions(path)` or `load_transitions(name, data_dir=...)`.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from jaxrl import interrupts

interrupts.for_a_script()  # first: Ctrl-C during the imports below is one line too

import jax
import tensorflow_datasets as tfds
from absl import flags, logging

from jaxrl import cli
from jaxrl.data import normalized_score
from jaxrl.data.collect import episode_returns
from jaxrl.data.rlds_builder import DEFAULT_VERSION, build_episode_dataset, build_path
from jaxrl.runner import fail
from jaxrl.trainers import offline_sources

_ENV = flags.DEFINE_string(
    "env", None, "Environment name (envs.registered()); default: the --policy run's environment."
)
_POLICY = flags.DEFINE_string(
    "policy", "random", "`random`, or the run directory of a finished ppo/sac run."
)
_EXPERT_POLICY = flags.DEFINE_string(
    "expert_policy", None, "Run directory of the expert half of --mixture=medium-expert."
)
_MIXTURE = flags.DEFINE_enum(
    "mixture",
    None,
    list(offline_sources.MIXTURES),
    "D4RL-style mixture; default: random for --policy=random, else medium.",
)
_NUM_STEPS = flags.DEFINE_integer(
    "num_steps", 100_000, "Transitions to collect in all (rounded up per policy to num_envs)."
)
_NUM_ENVS = flags.DEFINE_integer("num_envs", 10, "Environments stepped in parallel.")
_MAX_EPISODE_STEPS = flags.DEFINE_integer(
    "max_episode_steps", None, "Override the environment's time limit (default: its own)."
)
_KEEP_PARTIAL = flags.DEFINE_bool(
    "keep_partial",
    True,
    "Keep episodes still running when collection stops (stored as cut, not terminal).",
)
_DATA_DIR = flags.DEFINE_string(
    "data_dir", None, "TFDS data directory; default $TFDS_DATA_DIR or ~/tensorflow_datasets."
)
_NAME = flags.DEFINE_string(
    "name", None, "Dataset name NAME or NAME/CONFIG; default <env>/<mixture>."
)
_VERSION = flags.DEFINE_string("version", DEFAULT_VERSION, "Dataset version X.Y.Z.")
_OVERWRITE = flags.DEFINE_bool("overwrite", False, "Replace an existing dataset of that name.")
_SEED = flags.DEFINE_integer("seed", 0, "Collection seed.")
_POLICY_SEED = flags.DEFINE_integer(
    "policy_seed", 0, "Which seed of the runs' checkpoints (--policy and --expert_policy)."
)
_POLICY_STEP = flags.DEFINE_integer(
    "policy_step", None, "Checkpoint step of --policy (default: the newest)."
)
_EXPERT_STEP = flags.DEFINE_integer(
    "expert_step", None, "Checkpoint step of --expert_policy (default: the newest)."
)
_REF_MIN = flags.DEFINE_float(
    "ref_min_return", None, "D4RL reference minimum return (a random policy's), for scores."
)
_REF_MAX = flags.DEFINE_float(
    "ref_max_return", None, "D4RL reference maximum return (an expert's), for scores."
)


def default_name(env_name: str, mixture: str) -> str:
    """`Pendulum-v1`, `medium-replay` -> `pendulum_v1/medium-replay` (a valid tfds name)."""
    base = re.sub(r"\W+", "_", env_name).strip("_").lower()
    return f"{base if base[:1].isalpha() else 'env_' + base}/{mixture}"


def check_writable(target: str) -> None:
    """One line, before collecting, when the dataset's directory cannot be written: a file is
    made (and removed) in the nearest directory of `target` that exists, so nothing stays."""
    existing = target
    while not os.path.isdir(existing) and os.path.dirname(existing) != existing:
        existing = os.path.dirname(existing)
    try:
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError as error:
        where = _DATA_DIR.value or existing
        fail(f"--data_dir={where}: cannot write there ({error.strerror}); pass a writable one")


def main(argv: list[str]) -> None:
    logging.set_verbosity(logging.ERROR)  # orbax and tfds narrate at INFO and WARNING
    tfds.disable_progress_bar()
    if len(argv) > 1:
        fail(f"unexpected arguments {argv[1:]}; settings are flags, e.g. --num_steps=10000")
    if _NUM_STEPS.value < 1:
        fail(f"--num_steps must be >= 1, got {_NUM_STEPS.value}; pass 1 or more")
    if _NUM_ENVS.value < 1:
        fail(f"--num_envs must be >= 1, got {_NUM_ENVS.value}; pass 1 or more")
    if _MAX_EPISODE_STEPS.value is not None and _MAX_EPISODE_STEPS.value < 1:
        fail(f"--max_episode_steps must be >= 1, got {_MAX_EPISODE_STEPS.value}; pass 1 or more")
    for flag in (_REF_MIN, _REF_MAX):
        if flag.value is not None and not math.isfinite(flag.value):
            fail(f"--{flag.name}: must be a finite number, got {flag.value}; give a return")
    if (_REF_MIN.value is None) != (_REF_MAX.value is None):
        fail("--ref_min_return and --ref_max_return: only one is given; give both (a random "
             "and an expert return) or neither")  # fmt: skip
    if _REF_MIN.value is not None and _REF_MIN.value == _REF_MAX.value:
        fail("--ref_min_return and --ref_max_return are equal; scores would be undefined")
    random_policy = _POLICY.value == "random"
    mixture = _MIXTURE.value or ("random" if random_policy else "medium")

    try:
        policy = expert = None
        if not random_policy:
            policy = offline_sources.load_run_policy(_POLICY.value, _POLICY_SEED.value)
        if _EXPERT_POLICY.value:
            expert = offline_sources.load_run_policy(_EXPERT_POLICY.value, _POLICY_SEED.value)
    except offline_sources.PolicyError as error:
        fail(str(error))
    env_name = _ENV.value or (policy.env_name if policy is not None else None)
    if env_name is None:
        fail("--env is required with --policy=random (e.g. --env=Pendulum-v1)")
    if policy is not None and policy.env_name != env_name:
        fail(f"--env={env_name}, but --policy={_POLICY.value} was trained on {policy.env_name}")
    try:
        env = offline_sources.make_env(env_name, _MAX_EPISODE_STEPS.value)
    except ValueError as error:
        fail(f"--env: {error}")
    name = _NAME.value or default_name(env_name, mixture)
    try:  # before spending time on collection
        target = build_path(_DATA_DIR.value, name, _VERSION.value, overwrite=_OVERWRITE.value)
    except (FileExistsError, NotADirectoryError, ValueError) as error:
        fail(f"--name/--data_dir: {error}")
    check_writable(target)

    t0 = time.time()
    try:
        sources = offline_sources.plan_mixture(
            mixture,
            env,
            _NUM_STEPS.value,
            policy,
            expert,
            policy_step=_POLICY_STEP.value,
            expert_step=_EXPERT_STEP.value,
        )
    except offline_sources.PolicyError as error:
        fail(str(error))
    episodes = offline_sources.collect_sources(
        env,
        sources,
        jax.random.PRNGKey(_SEED.value),
        _NUM_ENVS.value,
        keep_partial=_KEEP_PARTIAL.value,
    )
    collect_seconds = time.time() - t0
    if not episodes:
        fail("no episodes were collected (every one was cut short); raise --num_steps")

    description = f"Collected by experiments/collect.py with {', '.join(s.label for s in sources)}."
    metadata = {
        "seed": _SEED.value,
        "num_envs": _NUM_ENVS.value,
        "max_episode_steps": int(getattr(env, "max_episode_steps", 0)) or None,
        "policy_seed": None if random_policy else _POLICY_SEED.value,
        "sources": [{"policy": s.label, "num_steps": s.num_steps} for s in sources],
        "collect_seconds": round(collect_seconds, 2),
    }
    try:
        # tfds reports its progress on stdout; keep stdout for this script's own summary.
        with contextlib.redirect_stdout(sys.stderr):
            path = build_episode_dataset(
                episodes,
                _DATA_DIR.value,
                name,
                env_name=env_name,
                policy=sources[0].label if len(sources) == 1 else f"{mixture} mixture",
                mixture=mixture,
                reference_min_return=_REF_MIN.value,
                reference_max_return=_REF_MAX.value,
                num_actions=int(env.action_space.n) if hasattr(env.action_space, "n") else None,
                metadata=metadata,
                description=description,
                version=_VERSION.value,
                overwrite=_OVERWRITE.value,
            )
    except (FileExistsError, ValueError) as error:
        fail(str(error))
    except OSError as error:
        fail(f"--data_dir={_DATA_DIR.value}: cannot write the dataset ({error}); pass a writable "
             "directory")  # fmt: skip

    returns = episode_returns(episodes)
    transitions = sum(len(e["reward"]) for e in episodes)
    print(f"Dataset: {path}")
    print(
        f"episodes: {len(episodes)} ({len(returns)} complete, "
        f"{sum(e['terminal'] for e in episodes)} terminal), transitions: {transitions}"
    )
    if len(returns):
        score = (
            f"behaviour score (mean return of {len(returns)} complete episodes): "
            f"{returns.mean():.2f} (std {returns.std():.2f})"
        )
        if _REF_MIN.value is not None and _REF_MAX.value is not None:
            normalized = normalized_score(returns.mean(), _REF_MIN.value, _REF_MAX.value)
            score += f", normalized {normalized:.1f}"
        print(score)
    else:
        print(
            "behaviour score: n/a (no episode ended during collection; raise --num_steps or "
            "lower --num_envs)"
        )
    print(f"collected in {collect_seconds:.1f}s; load with jaxrl.data.load_transitions({path!r})")


if __name__ == "__main__":
    cli.main(main)
