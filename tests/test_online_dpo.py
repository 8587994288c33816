"""Online DPO: the pair construction against NumPy, sampling, reward-model ranking and the DPO
update in one compiled program, and learning from the policy's own ranked samples (3 seeds)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from algos import dpo, online_dpo, reward_model
from jaxrl import hparams, loop
from jaxrl.config import ConfigError, from_flat
from jaxrl.lm.model import Transformer, init_params
from jaxrl.lm.sampler import Sampling
from tests.test_grpo import TEXT_TASK, TINY
from tests.test_ppo_lm import MODEL, SEEDS, fine_tuned  # noqa: F401  (a fixture)


def numpy_pairs(scores):
    """Per prompt: the first sample with the highest score is chosen, the last with the lowest
    rejected; a prompt whose samples all score the same makes no pair."""
    chosen, rejected, weight = [], [], []
    for row in scores:
        best = [i for i, s in enumerate(row) if s == row.max()]
        worst = [i for i, s in enumerate(row) if s == row.min()]
        chosen.append(best[0])
        rejected.append(worst[-1])
        weight.append(float(row.max() > row.min()))
    return np.array(chosen), np.array(rejected), np.array(weight)


def test_pairs_are_the_best_and_the_worst_sample_of_each_prompt():
    scores = np.array(
        [[0.1, 0.9, 0.3, 0.9], [0.5, 0.5, 0.5, 0.5], [1.0, 0.0, 0.0, 0.2], [0.2, 0.7, 0.2, 0.4]],
        np.float32,
    )
    got = online_dpo.best_and_worst(jnp.asarray(scores))
    for got_part, want_part in zip(got, numpy_pairs(scores), strict=True):
        np.testing.assert_array_equal(np.asarray(got_part), want_part)
    random = np.random.default_rng(0).integers(0, 3, (50, 3)).astype(np.float32)  # many ties
    for got_part, want_part in zip(
        online_dpo.best_and_worst(jnp.asarray(random)), numpy_pairs(random), strict=True
    ):
        np.testing.assert_array_equal(np.asarray(got_part), want_part)


def test_gumbel_label_noise_gives_bradley_terry_labels():
    """Ranking two scores plus Gumbel noise of scale t picks the first with probability
    sigmoid((s1 - s2) / t): the simulated annotator `label_noise` documents."""
    scores = jnp.tile(jnp.array([[0.5, 0.0], [0.0, 0.2], [1.0, 0.0]]), (20_000, 1))
    noise = jax.random.gumbel(jax.random.key(0), scores.shape) * 0.4
    chosen, _, _ = online_dpo.best_and_worst(scores + noise)
    first = np.asarray(chosen == 0).reshape(20_000, 3).mean(axis=0)
    want = 1 / (1 + np.exp(-np.array([0.5, -0.2, 1.0]) / 0.4))
    np.testing.assert_allclose(first, want, atol=0.015)


def test_config_errors_name_the_field():
    for settings, field in (
        (dict(num_samples=1), "num_samples"),
        (dict(reference="precomputed"), "reference"),
        (dict(ensemble_rule="max"), "ensemble_rule"),
        (dict(batch_size=6, num_minibatches=4), "num_minibatches"),
        (dict(label_noise=-1.0), "label_noise"),
        (dict(top_p=0.0), "top_p"),
    ):
        with pytest.raises(ConfigError, match=f"^{field}: "):
            from_flat(online_dpo.Config, settings)


def test_sampling_ranking_and_update_are_one_compiled_program():
    """A reward model whose bias is 1 higher scores every sample exactly 1 higher, from the same
    executable that sampled the completions and stepped the optimizer; the pairs (and so the
    update) do not change, since a shift keeps every ranking."""
    config = online_dpo.Config(
        batch_size=4, num_samples=3, sampling=Sampling(max_new_tokens=4), learning_rate=1e-3
    )
    lm = init_params(TINY, jax.random.key(0))
    reward = reward_model.init_params(lm, TINY, jax.random.key(1))
    algorithm = online_dpo.make(config, TINY, TEXT_TASK, lm, reward_model_config=TINY)
    hp = hparams.hparams(config)
    state = algorithm.init(jax.random.key(2), hp)
    inputs = online_dpo.Inputs(lm, reward)
    lowered = jax.jit(loop.make_chunk(algorithm.update, 2, runs_axis=False)).lower(
        state, inputs, hp
    )
    assert lowered.as_text().count("stablehlo.while") >= 2  # the updates' scan, the decoding
    compiled = lowered.compile()
    new_state, metrics = compiled(state, inputs, hp)
    shifted = dict(reward, score_bias=reward["score_bias"] + 1.0)
    shifted_state, shifted_metrics = compiled(state, inputs._replace(reward_params=shifted), hp)
    np.testing.assert_allclose(shifted_metrics["score"], metrics["score"] + 1.0, rtol=1e-5)
    np.testing.assert_allclose(shifted_metrics["loss"], metrics["loss"], rtol=1e-5)
    assert metrics["tied_fraction"][0] == 0.0  # a random reward model never ties
    assert metrics["grad_norm"][0] > 0 and np.isclose(metrics["loss"][0], np.log(2), atol=1e-4)
    assert not np.allclose(jax.tree.leaves(new_state.params)[0], jax.tree.leaves(lm)[0])


def test_a_pair_sharing_its_prompt_scores_as_two_rows():
    """score_pairs_sharing_prompt (each pair one sequence, its prompt once) gives dpo.score_pairs'
    summed log-probs and lengths, a tied pair's zeroed loss masks included."""
    prompt, new = 5, 4
    pairs = 3
    key = jax.random.key(0)
    params = init_params(TINY, key)
    tokens = jax.random.randint(key, (pairs, 2, prompt + new), 3, TINY.vocab_size)
    tokens = tokens.at[:, 1, :prompt].set(tokens[:, 0, :prompt])  # one prompt per pair
    mask = np.ones((pairs, 2, prompt + new), bool)
    mask[0, :, :2] = False  # a left-padded prompt
    mask[1, 0, -1:] = False  # a completion that ended early
    loss_mask = mask.copy()
    loss_mask[:, :, :prompt] = False
    loss_mask[2] = False  # a tied pair: nothing scored
    batch = {}
    for index, side in enumerate(("chosen", "rejected")):
        batch[f"{side}_tokens"] = tokens[:, index]
        batch[f"{side}_attention_mask"] = jnp.asarray(mask[:, index])
        batch[f"{side}_loss_mask"] = jnp.asarray(loss_mask[:, index])
    transformer = Transformer(TINY)
    want = dpo.score_pairs(transformer, params, batch)
    got = online_dpo.score_pairs_sharing_prompt(transformer, params, batch, new)
    for name in ("chosen", "rejected", "chosen_length", "rejected_length"):
        np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-5, err_msg=name)


@pytest.mark.parametrize("loss_type", dpo.LOSS_TYPES)
def test_shared_prompt_update_equals_the_per_row_update(loss_type):
    """One update (ranked by a reward model, so no pair is tied; two micro-batches) with
    shared_prompt gives the per-row update's loss, metrics and parameters up to rounding."""
    lm = init_params(TINY, jax.random.key(0))
    reward = reward_model.init_params(lm, TINY, jax.random.key(1))
    results = []
    for shared in (False, True):
        config = online_dpo.Config(
            batch_size=4,
            num_samples=3,
            grad_accum_steps=2,
            sampling=Sampling(max_new_tokens=4),
            learning_rate=1e-3,
            loss_type=loss_type,
            shared_prompt=shared,
        )
        algorithm = online_dpo.make(config, TINY, TEXT_TASK, lm, reward_model_config=TINY)
        hp = hparams.hparams(config)
        state = algorithm.init(jax.random.key(2), hp)
        results.append(jax.jit(algorithm.update)(state, online_dpo.Inputs(lm, reward), hp))
    (per_row, per_row_metrics), (shared, shared_metrics) = results
    for name in ("loss", "chosen_log_prob", "rejected_log_prob", "reward_margin", "grad_norm"):
        np.testing.assert_allclose(
            shared_metrics[name], per_row_metrics[name], rtol=1e-5, atol=1e-5, err_msg=name
        )
    # GRPO's shared-prompt tests' tolerance: Adam's first step moves each weight by about the
    # learning rate whatever the gradient's size, so rounding in a near-zero gradient shows.
    for a, b in zip(jax.tree.leaves(shared.params), jax.tree.leaves(per_row.params), strict=True):
        np.testing.assert_allclose(a, b, atol=1e-5)


def test_online_dpo_raises_the_answer_reward_of_a_briefly_fine_tuned_policy(fine_tuned):  # noqa: F811
    """Three seeds vmapped in one program, from test_ppo_lm's 40-step SFT starts (answer reward
    about 0.25): 30 updates, each ranking 4 samples of 256 prompts by the task's reward, raise the
    samples' answer reward by 0.2 or more over the last 10 updates (when written: about 0.6 for
    seed 0 after 30-40 updates, where it levelled off)."""
    config = online_dpo.Config(
        batch_size=256, num_samples=4, sampling=Sampling(max_new_tokens=4), learning_rate=5e-4,
        num_epochs=2, num_minibatches=4,
    )  # fmt: skip
    hp = hparams.hparams(config)

    @jax.jit
    @jax.vmap
    def train(seed, start):
        algorithm = online_dpo.make(config, MODEL, TEXT_TASK, start)
        state = algorithm.init(jax.random.fold_in(jax.random.key(0), seed), hp)
        chunk = loop.make_chunk(algorithm.update, 30, runs_axis=False)
        return chunk(state, online_dpo.Inputs(start), hp)[1]

    rewards = np.asarray(train(SEEDS, fine_tuned)["reward_task"])  # [seed, update]
    assert (rewards[:, 0] < 0.45).all(), rewards[:, 0]
    assert (rewards[:, -10:].mean(axis=1) >= rewards[:, 0] + 0.2).all(), rewards[:, ::5]
