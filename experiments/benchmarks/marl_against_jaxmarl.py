"""IPPO and MAPPO on MPE simple spread against JaxMARL's own IPPO baseline, side by side.

    python experiments/benchmarks/marl_against_jaxmarl.py \
        --jaxmarl_ippo=/path/to/JaxMARL/baselines/IPPO/ippo_ff_mpe.py --seeds=3 --out=marl.json

JaxMARL's baseline scripts are not part of its wheel: pass the `ippo_ff_mpe.py` of a JaxMARL
checkout (its `make_train` is imported and run as it is; wandb and hydra, which it imports for
logging and configuration, are stood in for by no-ops). Both sides run JaxMARL's settings for this
task (`baselines/IPPO/config/ippo_ff_mpe.yaml`: 16 environments x 128 steps, 4 epochs of 4
minibatches, lr 2.5e-4 annealed, 64x64 tanh networks, parameters shared by the agents) for the
same number of environment steps and seeds, in this one process on the same JAX.

The headline is each run's training return over its last 10 updates, on the scale JaxMARL logs
(the sum over the three agents of their episode returns). Also: environment steps per second of
each compiled run, compile seconds, and a plot of the learning curves.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import time
import types

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

# The values of JaxMARL's ippo_ff_mpe.yaml (at commit c793d09).
JAXMARL_IPPO_MPE = {
    "LR": 2.5e-4,
    "NUM_ENVS": 16,
    "NUM_STEPS": 128,
    "UPDATE_EPOCHS": 4,
    "NUM_MINIBATCHES": 4,
    "GAMMA": 0.99,
    "GAE_LAMBDA": 0.95,
    "CLIP_EPS": 0.2,
    "ENT_COEF": 0.01,
    "VF_COEF": 0.5,
    "MAX_GRAD_NORM": 0.5,
    "ACTIVATION": "tanh",
    "ENV_NAME": "MPE_simple_spread_v3",
    "ENV_KWARGS": {},
    "ANNEAL_LR": True,
}


def load_jaxmarl_make_train(path: str):
    """`make_train` of JaxMARL's IPPO script, with its logging imports stood in for."""
    sys.modules.setdefault("wandb", types.SimpleNamespace(log=lambda *a, **k: None))
    hydra = types.ModuleType("hydra")
    hydra.main = lambda **kwargs: lambda function: function
    sys.modules.setdefault("hydra", hydra)
    omegaconf = types.ModuleType("omegaconf")
    omegaconf.OmegaConf = types.SimpleNamespace(to_container=dict)
    sys.modules.setdefault("omegaconf", omegaconf)
    from envs.multi_agent import _import_jaxmarl

    _import_jaxmarl()  # quietly, before the script imports it
    import jax.experimental  # noqa: F401  the script calls jax.experimental.io_callback

    spec = importlib.util.spec_from_file_location("jaxmarl_ippo_ff_mpe", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.make_train


def timed_run(train, keys):
    """Compile `vmap(train)` over the seeds, then run it: (outputs, compile s, run s)."""
    import jax

    start = time.perf_counter()
    compiled = jax.jit(jax.vmap(train)).lower(keys).compile()
    compile_seconds = time.perf_counter() - start
    start = time.perf_counter()
    out = jax.block_until_ready(compiled(keys))
    return out, compile_seconds, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jaxmarl_ippo", help="JaxMARL's baselines/IPPO/ippo_ff_mpe.py")
    parser.add_argument("--total_timesteps", type=int, default=2_000_000)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--out", default="marl_against_jaxmarl.json")
    parser.add_argument("--plot", default="marl_against_jaxmarl.png")
    args = parser.parse_args()

    import jax
    import numpy as np

    from algos import mappo

    keys = jax.random.split(jax.random.key(30), args.seeds)
    curves, rows = {}, []
    steps_per_update = JAXMARL_IPPO_MPE["NUM_ENVS"] * JAXMARL_IPPO_MPE["NUM_STEPS"]

    def record(name, returns, compile_seconds, run_seconds):
        returns = np.asarray(returns)  # [seeds, updates]
        final = returns[:, -10:].mean(axis=1)
        curves[name] = returns
        rows.append(
            {
                "run": name,
                "final_return_per_seed": np.round(final, 2).tolist(),
                "final_return": round(float(final.mean()), 2),
                "env_steps_per_second": round(
                    returns.shape[1] * steps_per_update * args.seeds / run_seconds
                ),
                "compile_seconds": round(compile_seconds, 1),
                "run_seconds": round(run_seconds, 1),
            }
        )
        print(json.dumps(rows[-1]), flush=True)

    if args.jaxmarl_ippo:
        make_train = load_jaxmarl_make_train(args.jaxmarl_ippo)
        config = dict(JAXMARL_IPPO_MPE, TOTAL_TIMESTEPS=args.total_timesteps)
        out, compile_seconds, run_seconds = timed_run(make_train(config), keys)
        returns = out["metrics"]["returned_episode_returns"]
        record("JaxMARL IPPO", returns, compile_seconds, run_seconds)
    else:
        print("--jaxmarl_ippo not given: JaxMARL's row is left out", flush=True)

    for critic, name in (("independent", "jaxrl IPPO"), ("centralised", "jaxrl MAPPO")):
        config = mappo.Config(critic=critic, total_timesteps=args.total_timesteps)
        train = mappo.make_train(config, final_evaluation=False)
        (_, metrics), compile_seconds, run_seconds = timed_run(train, keys)
        record(name, metrics["episode_return"], compile_seconds, run_seconds)

    reference = next((r for r in rows if r["run"] == "JaxMARL IPPO"), None)
    for row in rows:
        if reference is not None:
            # Returns are negative: the ratio of costs, < 1 is better than JaxMARL's.
            row["return_vs_jaxmarl"] = round(row["final_return"] / reference["final_return"], 3)
            row["speed_vs_jaxmarl"] = round(
                row["env_steps_per_second"] / reference["env_steps_per_second"], 2
            )
    result = {
        "task": "MPE_simple_spread_v3",
        "total_timesteps": args.total_timesteps,
        "seeds": args.seeds,
        "rows": rows,
    }
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2)
    plot(curves, steps_per_update, args.plot)
    print(json.dumps(result, indent=2))


def plot(curves, steps_per_update: int, path: str) -> None:
    """Mean training return over seeds against environment steps, with the seeds' range."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, ax = plt.subplots(figsize=(6, 4))
    for name, returns in curves.items():
        steps = (np.arange(returns.shape[1]) + 1) * steps_per_update
        ax.plot(steps, returns.mean(axis=0), label=name)
        ax.fill_between(steps, returns.min(axis=0), returns.max(axis=0), alpha=0.2)
    ax.set_xlabel("environment steps")
    ax.set_ylabel("team return (sum over agents)")
    ax.set_title("MPE simple spread")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
