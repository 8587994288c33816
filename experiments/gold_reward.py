"""Studies on a task whose true ("gold") reward is known, so that preferences can be simulated
and every policy judged by what it should have learned. The GRPO preset's tiny model on
reversing 3 digits; the gold reward is the task's answer reward (1 for the exact answer, partial
credit below 0.5).

    python experiments/gold_reward.py --study=overoptimisation --out=runs/overoptimisation
    python experiments/gold_reward.py --study=online_vs_offline --out=runs/online_vs_offline

--study=overoptimisation: over-optimising a learned reward, the setup of Gao, Schulman and Hilton
(2022), "Scaling Laws for Reward Model Overoptimization", at small scale. For each seed:
1. SFT: `sft_steps` supervised steps leave the model partly right (the gold reward is the task's
   answer reward: 1 for the exact answer, partial credit below 0.5).
2. Preferences: the SFT policy samples two completions of each of `num_pairs` training prompts;
   the gold reward scores both and the first is labelled chosen with probability
   sigmoid(bt_scale * (gold_1 - gold_2)), Bradley-Terry noise; pairs of equal gold are dropped.
3. Proxy reward models: an ensemble of `ensemble_size` reward models trained on those labels by
   `jax.vmap` in one program, each from the SFT transformer with its own head and batch order.
4. PPO from the SFT policy against member 0 alone, and against the whole ensemble combined by
   `rule` (mean_minus_std: uncertainty-weighted; min: worst case; Coste et al., 2024). Each
   update logs the gold reward, the proxy score and the KL to the SFT policy. `kl_coef` fixes
   the KL penalty (small by default: room to over-optimise); `target_kl` holds the KL near a
   target with Ziegler et al.'s adaptive controller instead (1.5 nats, where the gold reward
   peaks here, keeps the gain).

Writes `overoptimisation.json` (every run's curves, and each reward model's held-out pair
accuracy against the gold order) and `overoptimisation.png`: gold reward, proxy reward and KL
against the update, the mean over seeds with a 95% interval (Student t over seeds), and each
run's gold reward against its KL.

--study=online_vs_offline: DPO on the same number of preference labels, from the same annotator
(Bradley-Terry over the gold reward), collected offline from the SFT policy's samples before
training, or online from the current policy's (`algos/online_dpo.py`, the noise as Gumbel noise
on the scores), with the same optimizer steps and batch. Each seed's SFT start and both results
are judged on held-out prompts (the task's eval split): the gold reward of greedy and of sampled
completions. Writes `online_vs_offline.json` and `online_vs_offline.png` (means over seeds with
95% intervals, and the online run's curve).
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from jaxrl import interrupts

interrupts.for_a_script()  # first: Ctrl-C during the imports below is one line too

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags

from algos import dpo, online_dpo, ppo_lm, reward_model, sft
from envs.text import make_task
from envs.text.reward_terms import task_rewards
from envs.text.task import supervised_batch
from jaxrl import cli, extras, hparams, loop
from jaxrl.config import ConfigError, fail
from jaxrl.lm.model import ModelConfig, init_params
from jaxrl.lm.sampler import Sampling, generate
from jaxrl.lm.tokenizer import ByteTokenizer

# A missing optional extra is one error line, before flags are parsed or anything compiles.
extras.require("lm", "experiments/gold_reward.py")

flags.DEFINE_enum("study", "overoptimisation", ["overoptimisation", "online_vs_offline"], "which")
flags.DEFINE_string("out", "runs/gold_reward", "directory for the JSON and the plot")
flags.DEFINE_integer("seeds", 3, "independent repetitions of the whole pipeline")
flags.DEFINE_integer("sft_steps", 40, "supervised steps of the start")
flags.DEFINE_integer("num_pairs", 4096, "prompts sampled for preference pairs (before ties)")
flags.DEFINE_float("bt_scale", 5.0, "Bradley-Terry scale of the gold-reward labels")
flags.DEFINE_integer("ensemble_size", 4, "reward models trained by vmap")
flags.DEFINE_integer("reward_steps", 300, "reward-model optimizer steps (batch 64)")
flags.DEFINE_enum("rule", "mean_minus_std", list(reward_model.ENSEMBLE_RULES), "ensemble rule")
flags.DEFINE_integer("ppo_updates", 100, "PPO updates per run")
flags.DEFINE_float("kl_coef", 0.01, "PPO's KL penalty coefficient (small: room to over-optimise)")
flags.DEFINE_float("target_kl", 0.0, "PPO's adaptive KL target in nats per completion (0: fixed)")
flags.DEFINE_integer("kl_horizon", ppo_lm.KL_HORIZON, "the adaptive controller's horizon")
flags.DEFINE_integer("dpo_updates", 30, "online DPO updates (labels: dpo_updates x dpo_pairs)")
flags.DEFINE_integer("dpo_pairs", 128, "pairs labelled per online update")
flags.DEFINE_integer("dpo_epochs", 2, "passes over each online batch / over the offline labels")
FLAGS = flags.FLAGS

TASK = make_task("reverse_digits", num_digits=3).text_task(ByteTokenizer())
BATCH = 64  # SFT and reward-model batch
# Student t's 97.5% quantile by degrees of freedom (seeds - 1), for 95% intervals over seeds.
T_975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262}


def model_config() -> ModelConfig:
    """The GRPO reverse-digits preset's tiny model."""
    from jaxrl.trainers.presets.grpo import get_config

    return ModelConfig(**get_config("reverse_digits").model.to_dict())


def fine_tune(model: ModelConfig, seed: int) -> dict:
    """The SFT start: `sft_steps` supervised steps from random weights, in one program."""
    config = sft.Config(learning_rate=3e-3, batch_size=BATCH)
    algorithm = sft.make(config, model, init_params(model, jax.random.key(seed)))
    hp = hparams.hparams(config)

    def step(state, key):
        batch = jax.tree.map(lambda x: x[None], supervised_batch(TASK, key, BATCH))
        return algorithm.update(state, batch, hp)

    keys = jax.random.split(jax.random.fold_in(jax.random.key(100), seed), FLAGS.sft_steps)
    state, _ = jax.jit(lambda s: jax.lax.scan(step, s, keys))(
        algorithm.init(jax.random.key(seed), hp)
    )
    return state.params


def gold_labelled_pairs(
    model: ModelConfig, params: dict, seed: int, keep_ties: bool = False
) -> dict[str, np.ndarray]:
    """Two samples of the policy per prompt, labelled by the gold reward with Bradley-Terry noise
    (ties dropped, or with `keep_ties` labelled at random as the model says). Returns the pair
    arrays reward-model training reads, plus `agrees` (whether each label matches the gold
    order)."""
    sampling = Sampling(max_new_tokens=4).for_tokens(TASK.eos_id, TASK.pad_id)

    @jax.jit
    def sample(key):
        prompt_key, sample_key = jax.random.split(key)
        prompts = TASK.sample_prompts(prompt_key, FLAGS.num_pairs, None)
        twice = jax.tree.map(lambda x: jnp.repeat(x, 2, axis=0), prompts)
        completion = generate(model, params, twice.tokens, twice.mask, sample_key, sampling)
        gold, _ = task_rewards(TASK, twice, completion)
        tokens = jnp.concatenate([twice.tokens, completion.tokens], axis=1)
        mask = jnp.concatenate([twice.mask, completion.mask], axis=1)
        return tokens, mask, gold

    tokens, mask, gold = jax.device_get(sample(jax.random.key(1000 + seed)))
    tokens, mask, gold = (x.reshape(FLAGS.num_pairs, 2, *x.shape[1:]) for x in (tokens, mask, gold))
    keep = (gold[:, 0] != gold[:, 1]) | keep_ties
    tokens, mask, gold = tokens[keep], mask[keep], gold[keep]
    rng = np.random.default_rng(seed)
    difference = gold[:, 0] - gold[:, 1]
    first = rng.random(len(gold)) < 1.0 / (1.0 + np.exp(-FLAGS.bt_scale * difference))
    chosen, rejected = np.where(first, 0, 1), np.where(first, 1, 0)
    rows = np.arange(len(gold))
    return {
        "chosen_tokens": tokens[rows, chosen],
        "chosen_attention_mask": mask[rows, chosen],
        "rejected_tokens": tokens[rows, rejected],
        "rejected_attention_mask": mask[rows, rejected],
        "agrees": first == (difference > 0),
    }


def train_ensemble(
    model: ModelConfig, sft_params: dict, pairs: dict[str, np.ndarray], seed: int
) -> tuple[dict, list[float], float]:
    """K reward models trained as one vmapped program on 7/8 of the pairs; returns their stacked
    parameters and each one's accuracy on the held-out 1/8 against the gold order."""
    config = reward_model.Config(learning_rate=3e-4, batch_size=BATCH, num_steps=FLAGS.reward_steps)
    hp = hparams.hparams(config)
    k = FLAGS.ensemble_size
    members = [
        reward_model.init_params(sft_params, model, jax.random.key(10 * seed + i)) for i in range(k)
    ]
    keys = ("chosen_tokens", "chosen_attention_mask", "rejected_tokens", "rejected_attention_mask")
    count = len(pairs["agrees"])
    split = count * 7 // 8
    rng = np.random.default_rng(seed)
    states = [
        reward_model.make(config, model, p).init(jax.random.key(i), hp)
        for i, p in enumerate(members)
    ]
    state = jax.tree.map(lambda *x: jnp.stack(x), *states)
    update = jax.jit(
        jax.vmap(reward_model.make(config, model, members[0]).update, in_axes=(0, 0, None))
    )
    for _ in range(config.num_steps):
        index = np.stack([rng.choice(split, BATCH, replace=False) for _ in range(k)])
        batch = {name: pairs[name][index][:, None] for name in keys}
        state, _ = update(state, batch, hp)
    score = jax.jit(jax.vmap(reward_model.make_score(model), in_axes=(0, None)))
    held = {name: pairs[name][split:] for name in keys}
    rewards = jax.device_get(score(state.params, held))
    # Accuracy against the gold order (a held-out label against it counts the other way).
    prefers_chosen = rewards["chosen"] > rewards["rejected"]
    agrees = pairs["agrees"][split:]
    accuracy = np.mean(prefers_chosen == agrees[None], axis=1)
    return state.params, accuracy.tolist(), float(np.mean(agrees))


def ppo_config(rule: str) -> ppo_lm.Config:
    """The study's PPO settings with the KL flags (checked by `ppo_lm.Config`)."""
    return ppo_lm.Config(
        batch_size=256, sampling=Sampling(max_new_tokens=4), num_minibatches=4, num_epochs=4,
        learning_rate=3e-4, kl_coef=FLAGS.kl_coef, target_kl=FLAGS.target_kl,
        kl_horizon=FLAGS.kl_horizon, ensemble_rule=rule,
    )  # fmt: skip


def ppo_curves(
    model: ModelConfig, sft_params: dict, reward_params: dict, rule: str, seed: int
) -> dict[str, list[float]]:
    """PPO from the SFT policy against the proxy: gold reward, proxy score and KL per update."""
    config = ppo_config(rule)
    algorithm = ppo_lm.make(
        config, model, TASK, ppo_lm.init_params(sft_params, model), reward_model_config=model
    )
    hp = hparams.hparams(config)
    state = algorithm.init(jax.random.key(seed), hp)
    chunk = jax.jit(loop.make_chunk(algorithm.update, FLAGS.ppo_updates, runs_axis=False))
    _, metrics = chunk(state, ppo_lm.Inputs(sft_params, reward_params), hp)
    metrics = jax.device_get(metrics)
    return {name: np.asarray(metrics[name]).tolist() for name in ("reward_task", "score", "kl")}


def interval(values: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Mean over seeds (axis 0) and its 95% Student-t interval."""
    mean = values.mean(axis=0)
    if len(values) < 2:
        return mean, mean, mean
    t = T_975.get(len(values) - 1, 1.96)
    half = t * values.std(axis=0, ddof=1) / np.sqrt(len(values))
    return mean, mean - half, mean + half


def plot(results: dict, path: str) -> None:
    """Gold reward, proxy reward and KL against the update, for the single and the ensemble
    proxy: each the mean over seeds with its 95% interval."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = (
        ("reward_task", "gold reward of samples"),
        ("score", "proxy reward (what PPO maximised)"),
        ("kl", "KL to the SFT policy (nats)"),
    )
    figure, axes = plt.subplots(1, 4, figsize=(20, 4.2))
    smooth = lambda x: np.convolve(x, np.ones(5) / 5, mode="valid")  # noqa: E731
    for name, color in (("single", "tab:red"), ("ensemble", "tab:blue")):
        runs = results["runs"][name]
        label = "one reward model" if name == "single" else f"ensemble ({FLAGS.rule})"
        # Gao et al.'s view: each run's gold reward against its own KL (5-update means).
        for index, run in enumerate(runs):
            axes[3].plot(
                smooth(np.array(run["kl"])), smooth(np.array(run["reward_task"])), color=color,
                alpha=0.8, linewidth=1, label=label if index == 0 else None,
            )  # fmt: skip
        axes[3].set_xlabel("KL to the SFT policy (nats)")
        axes[3].set_title("gold reward against KL, each seed")
        for axis, (key, title) in zip(axes, panels, strict=False):
            mean, low, high = interval(np.array([run[key] for run in runs]))
            updates = np.arange(1, len(mean) + 1)
            axis.plot(updates, mean, color=color, label=label)
            axis.fill_between(updates, low, high, color=color, alpha=0.2)
            axis.set_xlabel("PPO update")
            axis.set_title(f"{title}, 95% CI over seeds")
    axes[0].legend()
    axes[3].legend()
    figure.suptitle(
        f"PPO against a learned reward on reverse-3-digits, {len(results['seeds'])} seeds; "
        f"ensemble of {FLAGS.ensemble_size}"
    )
    figure.tight_layout()
    figure.savefig(path, dpi=110)


# --- online against offline DPO --------------------------------------------------------------


def held_out_gold(model: ModelConfig, params: dict, seed: int) -> dict[str, float]:
    """The gold reward of greedy and of sampled completions of 512 prompts drawn from the task's
    eval split (problems training never samples)."""
    digits_task = make_task("reverse_digits", num_digits=3)

    @jax.jit
    def judge(params, key):
        prompt_key, sample_key = jax.random.split(key)
        prompts = digits_task.sample_prompts(
            prompt_key, 512, digits_task.tokens(ByteTokenizer()), split="eval"
        )
        result = {}
        for name, temperature in (("greedy", 0.0), ("sampled", 1.0)):
            sampling = Sampling(max_new_tokens=4).for_tokens(TASK.eos_id, TASK.pad_id)
            sampling = dataclasses.replace(sampling, temperature=temperature)
            completion = generate(model, params, prompts.tokens, prompts.mask, sample_key, sampling)
            result[name] = task_rewards(TASK, prompts, completion)[0].mean()
        return result

    return {k: float(v) for k, v in judge(params, jax.random.key(2000 + seed)).items()}


def dpo_config(batch_size: int, num_steps: int) -> dict:
    """The DPO settings both arms share."""
    return dict(learning_rate=5e-4, beta=0.1, batch_size=batch_size, num_steps=num_steps)


def offline_dpo(model: ModelConfig, sft_params: dict, seed: int) -> tuple[dict, int]:
    """DPO on labels collected once from the SFT policy's samples: dpo_updates x dpo_pairs
    pairs, dpo_epochs passes in batches of 64 (the online arm's optimizer steps)."""
    labels = FLAGS.dpo_updates * FLAGS.dpo_pairs
    if labels > FLAGS.num_pairs:
        raise app.UsageError(
            f"--dpo_updates x --dpo_pairs = {labels} labels, more than --num_pairs="
            f"{FLAGS.num_pairs} offline pairs; raise --num_pairs"
        )
    pairs = gold_labelled_pairs(model, sft_params, seed, keep_ties=True)
    pairs = {name: value[:labels] for name, value in pairs.items()}
    prompt_length = TASK.sample_prompts(jax.random.key(0), 1, None).tokens.shape[1]
    for side in ("chosen", "rejected"):
        loss_mask = pairs[f"{side}_attention_mask"].copy()
        loss_mask[:, :prompt_length] = False
        pairs[f"{side}_loss_mask"] = loss_mask
    steps = FLAGS.dpo_epochs * labels // BATCH
    config = dpo.Config(**dpo_config(BATCH, steps), reference="in_step")
    algorithm = dpo.make(config, model, sft_params)
    hp = hparams.hparams(config)
    state = algorithm.init(jax.random.key(seed), hp)
    update = jax.jit(algorithm.update)
    rng = np.random.default_rng(seed)
    keys = [k for k in pairs if k != "agrees"]
    order = np.concatenate([rng.permutation(labels) for _ in range(FLAGS.dpo_epochs)])
    for step in range(steps):
        index = order[step * BATCH : (step + 1) * BATCH]
        batch = {k: pairs[k][index][None] for k in keys}
        state, _ = update(state, (batch, sft_params), hp)
    return state.params, steps


def online_dpo_run(model: ModelConfig, sft_params: dict, seed: int) -> tuple[dict, dict, int]:
    """Online DPO with the same annotator: each update labels dpo_pairs pairs of the current
    policy's two samples, dpo_epochs passes over them in minibatches of 64."""
    minibatches = FLAGS.dpo_pairs // BATCH
    config = online_dpo.Config(
        **dpo_config(FLAGS.dpo_pairs, FLAGS.dpo_updates), num_samples=2,
        sampling=Sampling(max_new_tokens=4), num_epochs=FLAGS.dpo_epochs,
        num_minibatches=minibatches, label_noise=1.0 / FLAGS.bt_scale,
    )  # fmt: skip
    algorithm = online_dpo.make(config, model, TASK, sft_params)
    hp = hparams.hparams(config)
    state = algorithm.init(jax.random.key(seed), hp)
    chunk = jax.jit(loop.make_chunk(algorithm.update, FLAGS.dpo_updates, runs_axis=False))
    state, metrics = chunk(state, online_dpo.Inputs(sft_params), hp)
    curve = {"reward_task": np.asarray(metrics["reward_task"]).tolist()}
    return state.params, curve, FLAGS.dpo_updates * FLAGS.dpo_epochs * minibatches


def online_vs_offline(model: ModelConfig, results: dict) -> None:
    """Run the study, write its JSON and plot, print the result."""
    arms = ("sft start", "offline DPO", "online DPO")
    results["held_out"] = {arm: [] for arm in arms}
    results["online_curves"] = []
    start = time.time()
    for seed in range(FLAGS.seeds):
        sft_params = fine_tune(model, seed)
        offline, offline_steps = offline_dpo(model, sft_params, seed)
        online, curve, online_steps = online_dpo_run(model, sft_params, seed)
        assert offline_steps == online_steps, (offline_steps, online_steps)
        for arm, params in zip(arms, (sft_params, offline, online), strict=True):
            results["held_out"][arm].append(held_out_gold(model, params, seed))
        results["online_curves"].append(curve)
        print(
            f"seed {seed}: "
            + ", ".join(f"{arm} {results['held_out'][arm][-1]}" for arm in arms)
            + f" ({time.time() - start:.0f}s)",
            flush=True,
        )
    results["labels"] = FLAGS.dpo_updates * FLAGS.dpo_pairs
    summary = {}
    for arm in arms:
        for kind in ("greedy", "sampled"):
            values = np.array([row[kind] for row in results["held_out"][arm]])
            mean, low, high = interval(values[:, None])
            summary[f"{arm} {kind}"] = [float(mean[0]), float(low[0]), float(high[0])]
    results["summary"] = summary
    with open(os.path.join(FLAGS.out, "online_vs_offline.json"), "w") as f:
        json.dump(results, f)
    plot_online_vs_offline(results, os.path.join(FLAGS.out, "online_vs_offline.png"))
    for name, (mean, low, high) in summary.items():
        print(f"{name}: held-out gold reward {mean:.3f} [{low:.3f}, {high:.3f}]")


def plot_online_vs_offline(results: dict, path: str) -> None:
    """Held-out gold reward of each arm (means over seeds, 95% intervals), and the online run's
    gold reward of samples per update."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, 2, figsize=(12, 4.2))
    arms = list(results["held_out"])
    for offset, kind in ((-0.18, "greedy"), (0.18, "sampled")):
        values = [results["summary"][f"{arm} {kind}"] for arm in arms]
        means = np.array([v[0] for v in values])
        errors = np.array([[v[0] - v[1], v[2] - v[0]] for v in values]).T
        axes[0].bar(np.arange(len(arms)) + offset, means, 0.34, yerr=errors, capsize=4, label=kind)
    axes[0].set_xticks(np.arange(len(arms)), arms)
    axes[0].set_ylabel("held-out gold reward (95% CI over seeds)")
    axes[0].set_title(f"{results['labels']} preference labels each")
    axes[0].legend()
    curves = np.array([curve["reward_task"] for curve in results["online_curves"]])
    mean, low, high = interval(curves)
    updates = np.arange(1, len(mean) + 1)
    axes[1].plot(updates, mean, color="tab:blue")
    axes[1].fill_between(updates, low, high, color="tab:blue", alpha=0.2)
    axes[1].set_xlabel("online DPO update")
    axes[1].set_ylabel("gold reward of its samples (95% CI)")
    axes[1].set_title("online DPO while training")
    figure.suptitle(f"Online against offline DPO, {FLAGS.seeds} seeds, reverse 3 digits")
    figure.tight_layout()
    figure.savefig(path, dpi=110)


def main(argv: list[str]) -> None:
    del argv
    if FLAGS.study == "overoptimisation":
        try:  # the KL flags, before minutes of SFT and reward-model training
            for rule in ("mean", FLAGS.rule):
                ppo_config(rule)
        except ConfigError as error:
            fail(f"--{error}")
    os.makedirs(FLAGS.out, exist_ok=True)
    model = model_config()
    results = {"flags": {f.name: f.value for f in FLAGS.get_key_flags_for_module(sys.argv[0])}}
    if FLAGS.study == "online_vs_offline":
        online_vs_offline(model, results)
        return
    overoptimisation(model, results)


def overoptimisation(model: ModelConfig, results: dict) -> None:
    """Run the study, write its JSON and plot, print the result."""
    results |= {"seeds": list(range(FLAGS.seeds)), "runs": {"single": [], "ensemble": []}}
    results["reward_models"] = []
    start = time.time()
    for seed in range(FLAGS.seeds):
        sft_params = fine_tune(model, seed)
        pairs = gold_labelled_pairs(model, sft_params, seed)
        ensemble, accuracy, label_agreement = train_ensemble(model, sft_params, pairs, seed)
        results["reward_models"].append(
            {"pairs": len(pairs["agrees"]), "held_out_gold_accuracy": accuracy,
             "label_agreement_with_gold": label_agreement}
        )  # fmt: skip
        single = jax.tree.map(lambda x: x[0], ensemble)
        results["runs"]["single"].append(ppo_curves(model, sft_params, single, "mean", seed))
        results["runs"]["ensemble"].append(
            ppo_curves(model, sft_params, ensemble, FLAGS.rule, seed)
        )
        for name in ("single", "ensemble"):
            run = results["runs"][name][-1]
            print(
                f"seed {seed} {name}: gold {run['reward_task'][0]:.3f} -> "
                f"{np.mean(run['reward_task'][-10:]):.3f}, proxy {run['score'][0]:.3f} -> "
                f"{np.mean(run['score'][-10:]):.3f}, KL {np.mean(run['kl'][-10:]):.2f} "
                f"({time.time() - start:.0f}s)",
                flush=True,
            )
    with open(os.path.join(FLAGS.out, "overoptimisation.json"), "w") as f:
        json.dump(results, f)
    plot(results, os.path.join(FLAGS.out, "overoptimisation.png"))
    for name in ("single", "ensemble"):
        runs = results["runs"][name]
        final = np.array([np.mean(run["reward_task"][-10:]) for run in runs])
        peak = np.array([np.max(run["reward_task"]) for run in runs])
        start_gold = np.array([run["reward_task"][0] for run in runs])
        mean, low, high = interval(final[:, None])
        gain, gain_low, gain_high = interval((final - start_gold)[:, None])
        print(
            f"{name}: final gold {mean[0]:.3f} [{low[0]:.3f}, {high[0]:.3f}], peak gold "
            f"{peak.mean():.3f}, start {start_gold.mean():.3f}; final - start "
            f"{gain[0]:+.3f} [{gain_low[0]:+.3f}, {gain_high[0]:+.3f}]"
        )
    print(f"Wrote {FLAGS.out}/overoptimisation.json and overoptimisation.png")


if __name__ == "__main__":
    cli.main(main)
