"""Behaviour policies for offline dataset collection (experiments/collect.py): uniform random
actions, or the checkpoints of a finished PPO or SAC run directory, and the D4RL-style mixtures
made from them.

Mixtures (after D4RL, Fu et al. 2020), each `num_steps` transitions in all:
- random:        uniform random actions;
- medium/expert: stochastic rollouts of the given run's policy (pass a partially trained run, or
                 an earlier checkpoint with --policy_step, for "medium"; a fully trained one for
                 "expert"). The name only labels the data: the run decides its quality;
- medium-expert: half the transitions from --policy, half from --expert_policy;
- medium-replay: rollouts of the run's policy at every checkpoint up to --policy_step, in order,
                 starting with its untrained initial policy, in equal shares. D4RL's medium-replay
                 is the replay buffer of a run trained to medium level; replaying its saved
                 checkpoints is a stand-in: the data come from the same sequence of improving
                 policies, but only at checkpoint resolution. The run keeps only
                 `config.run.keep_checkpoints` (default 3) checkpoints, so train it with that set
                 to its `num_chunks` to have its whole history.

A policy is sampled, not its mode: offline data need the behaviour policy's action noise (SAC's
squashed Gaussian, PPO's Gaussian or categorical), and deterministic rollouts would cover a
thin tube of states.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
from collections.abc import Callable
from typing import Any

import jax

import envs
from algos import ppo, sac
from jaxrl import hparams, loop
from jaxrl.checkpoint import Checkpointer
from jaxrl.data.collect import make_rollout, random_policy, split_episodes

MIXTURES = ("random", "medium", "expert", "medium-replay", "medium-expert")
ALGORITHMS = {"ppo": ppo, "sac": sac}  # whose run directories hold a policy to collect with


class PolicyError(ValueError):
    """A policy or mixture setting is unusable; the message says what to pass instead."""


@dataclasses.dataclass
class RunPolicy:
    """The stochastic policy of one seed of a finished training run, at any saved checkpoint."""

    run_dir: str
    algo: str
    env_name: str
    seed_index: int
    act: Callable[[Any, jax.Array, jax.Array], jax.Array]  # act(state, obs_batch, key)
    steps: list[int]  # checkpoint steps on disk, ascending
    initial: Any  # every seed's initial (untrained) state: the structure to restore into

    def initial_state(self) -> Any:
        return jax.tree.map(lambda x: x[self.seed_index], self.initial)

    def state(self, step: int | None = None) -> Any:
        """The seed's state at checkpoint `step` (default: the newest)."""
        step = self.steps[-1] if step is None else step
        if step not in self.steps:
            raise PolicyError(
                f"{self.run_dir}: no checkpoint at step {step}; saved steps are {self.steps}"
            )
        checkpointer = Checkpointer(os.path.join(self.run_dir, "checkpoints"))
        try:
            states, _ = checkpointer.restore(self.initial, step)
        finally:
            checkpointer.close()
        return jax.tree.map(lambda x: x[self.seed_index], states)

    def label(self, step: int | str) -> str:
        return f"{self.algo}:{self.run_dir}@{step}"


def _read_json(path: str) -> dict[str, Any]:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, json.JSONDecodeError) as error:
        raise PolicyError(f"{path}: unreadable ({error})") from None


def _config(config_cls: type, saved: dict[str, Any], run_dir: str) -> Any:
    """The run's algorithm Config from its config.json (which also holds run/num_seeds/seed)."""
    fields = {f.name for f in dataclasses.fields(config_cls)}
    try:
        return config_cls(**{k: v for k, v in saved.items() if k in fields})
    except (TypeError, ValueError) as error:
        raise PolicyError(f"{run_dir}/config.json: not a valid {config_cls.__module__}.Config "
                          f"({error})") from None  # fmt: skip


def _checkpoint_steps(directory: str) -> list[int]:
    import orbax.checkpoint as ocp

    # Not read_only: orbax warns about that on every open. Listing steps writes nothing.
    manager = ocp.CheckpointManager(directory, options=ocp.CheckpointManagerOptions(create=False))
    try:
        return sorted(int(s) for s in manager.all_steps())
    finally:
        manager.close()


@functools.lru_cache(maxsize=4)
def initial_states(algo: str, config: Any, seed: int, num_seeds: int) -> Any:
    """Every seed's initial state exactly as experiments/<algo>.py makes it (`loop.run_keys` and
    the algorithm's own `init`), so that medium-replay's first policy is the run's own untrained
    one; also the structure checkpoints restore into. Cached: compiling `init` takes seconds."""
    algorithm = ALGORITHMS[algo].make(config)
    init_keys, _ = loop.run_keys(seed, num_seeds)
    hps = hparams.repeat(hparams.hparams(config), num_seeds)
    return jax.jit(jax.vmap(algorithm.init))(init_keys, hps)


def load_run_policy(run_dir: str, seed_index: int = 0) -> RunPolicy:
    """The stochastic policy of seed `seed_index` of a finished run directory of
    experiments/ppo.py or experiments/sac.py (summary.json's "algo" says which)."""
    run_dir = os.path.abspath(os.path.expanduser(run_dir))
    if not os.path.isdir(run_dir):
        raise PolicyError(
            f"{run_dir}: no such run directory; pass --policy=random or the --workdir of a "
            "finished run (python experiments/ppo.py --workdir=DIR ...)"
        )
    if not os.path.isfile(os.path.join(run_dir, "summary.json")):
        raise PolicyError(
            f"{run_dir}: no summary.json, so not a finished run; let the training run finish "
            "(rerunning it resumes from its checkpoint) or pass another run directory"
        )
    summary = _read_json(os.path.join(run_dir, "summary.json"))
    saved = _read_json(os.path.join(run_dir, "config.json"))
    algo = summary.get("algo")
    num_seeds, seed = int(saved.get("num_seeds", 1)), int(saved.get("seed", 0))
    if not 0 <= seed_index < num_seeds:
        raise PolicyError(
            f"--policy_seed={seed_index}: {run_dir} trained {num_seeds} seed(s); choose 0 .. "
            f"{num_seeds - 1}"
        )
    if algo not in ALGORITHMS:
        raise PolicyError(
            f"{run_dir}/summary.json: algo {algo!r} has no policy to collect with; pass a ppo or "
            "sac run directory"
        )
    module = ALGORITHMS[algo]
    config = _config(module.Config, saved, run_dir)
    act = module.make_policy(config, deterministic=False)
    initial = initial_states(algo, config, seed, num_seeds)
    checkpoint_dir = os.path.join(run_dir, "checkpoints")
    steps = _checkpoint_steps(checkpoint_dir) if os.path.isdir(checkpoint_dir) else []
    if not steps:
        raise PolicyError(f"{checkpoint_dir}: no checkpoints; the run saved no policy to load")
    return RunPolicy(run_dir, algo, config.env_name, seed_index, act, steps, initial)


@dataclasses.dataclass
class Source:
    """One behaviour policy's share of a mixture."""

    label: str
    act: Callable[[Any, jax.Array, jax.Array], jax.Array]  # act(params, obs_batch, key)
    params: Any
    num_steps: int


def plan_mixture(
    mixture: str,
    env: Any,
    num_steps: int,
    policy: RunPolicy | None,
    expert: RunPolicy | None,
    policy_step: int | None = None,
    expert_step: int | None = None,
) -> list[Source]:
    """Which policy collects how many transitions, in collection order."""
    if mixture not in MIXTURES:
        raise PolicyError(f"--mixture={mixture!r}: choose one of {', '.join(MIXTURES)}")
    if mixture != "medium-expert" and expert is not None:
        raise PolicyError(f"--expert_policy is only used by --mixture=medium-expert, not {mixture}")
    if mixture == "random":
        if policy is not None:
            raise PolicyError(
                "--mixture=random uses uniform random actions; drop --policy (or pass "
                "--policy=random), or choose --mixture=medium/expert for a trained policy"
            )
        uniform = random_policy(env.action_space)
        return [Source("random", lambda params, obs, key: uniform(obs, key), None, num_steps)]
    if policy is None:
        raise PolicyError(
            f"--mixture={mixture} collects with a trained policy: pass --policy=<run directory of "
            "a finished ppo or sac run>"
        )
    step = policy.steps[-1] if policy_step is None else policy_step
    if mixture in ("medium", "expert"):
        return [Source(policy.label(step), policy.act, policy.state(step), num_steps)]
    if mixture == "medium-expert":
        if expert is None:
            raise PolicyError(
                "--mixture=medium-expert needs --expert_policy=<run directory> for its expert half"
            )
        if expert.env_name != policy.env_name:
            raise PolicyError(
                f"--expert_policy was trained on {expert.env_name}, --policy on "
                f"{policy.env_name}; both must act in the same environment"
            )
        e_step = expert.steps[-1] if expert_step is None else expert_step
        half = num_steps // 2
        return [
            Source(policy.label(step), policy.act, policy.state(step), num_steps - half),
            Source(expert.label(e_step), expert.act, expert.state(e_step), half),
        ]
    # medium-replay: the untrained policy, then every checkpoint up to `step`, equal shares.
    if step not in policy.steps:
        raise PolicyError(
            f"--policy_step={step}: {policy.run_dir} saved steps {policy.steps}; choose one"
        )
    chosen = [s for s in policy.steps if s <= step]
    share = math.ceil(num_steps / (len(chosen) + 1))
    sources = [Source(policy.label(0), policy.act, policy.initial_state(), share)]
    sources += [Source(policy.label(s), policy.act, policy.state(s), share) for s in chosen]
    return sources


def collect_sources(
    env: Any, sources: list[Source], key: jax.Array, num_envs: int, keep_partial: bool = True
) -> list[dict[str, Any]]:
    """Episodes of every source in order. Each distinct (policy, share) compiles once: the
    checkpoints of medium-replay reuse one program, their parameters being arguments."""
    compiled: dict[tuple[int, int], Any] = {}
    episodes: list[dict[str, Any]] = []
    for index, source in enumerate(sources):
        cache_key = (id(source.act), source.num_steps)
        if cache_key not in compiled:
            compiled[cache_key] = make_rollout(
                env, source.act, num_envs, num_steps=source.num_steps
            )
        record, steps_run = compiled[cache_key](source.params, jax.random.fold_in(key, index))
        episodes += split_episodes(
            record, int(steps_run), keep_partial=keep_partial, policy_name=source.label
        )
    return episodes


def make_env(env_name: str, max_episode_steps: int | None = None) -> Any:
    """The single, non-resetting environment to collect in (optionally a shorter time limit)."""
    params = {} if max_episode_steps is None else {"max_steps_in_episode": max_episode_steps}
    return envs.make(env_name, **params)
