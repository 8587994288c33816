"""DPO: every loss variant against NumPy, sequence scoring against NumPy, gradient accumulation,
the reference modes, a hyper-parameter sweep as one program, and sharded DPO against one device.
(Learning on reverse-digits: tests/test_lm_experiment.py.)"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from algos import dpo, sft
from jaxrl import hparams, loop, sharding
from jaxrl.config import ConfigError
from jaxrl.lm import training
from jaxrl.lm.model import ModelConfig, Transformer, init_params

MODEL = ModelConfig(
    vocab_size=64, hidden_size=32, intermediate_size=48, num_layers=2, num_heads=4, num_kv_heads=2
)


def log_sigmoid(x):
    return -np.log1p(np.exp(-x))


def numpy_preference_loss(pc, pr, rc, rr, lc, lr, loss_type, beta, eps, gamma):
    """The variants written from their papers' formulas."""
    if loss_type == "simpo":
        chosen, rejected = beta * pc / lc, beta * pr / lr
        z = chosen - rejected - gamma
        return -(1 - eps) * log_sigmoid(z) - eps * log_sigmoid(-z), chosen, rejected
    chosen, rejected = beta * (pc - rc), beta * (pr - rr)
    h = (pc - rc) - (pr - rr)
    if loss_type == "sigmoid":
        loss = -(1 - eps) * log_sigmoid(beta * h) - eps * log_sigmoid(-beta * h)
    else:
        loss = (h - 1 / (2 * beta)) ** 2
    return loss, chosen, rejected


@pytest.mark.parametrize(
    "loss_type,eps",
    [("sigmoid", 0.0), ("sigmoid", 0.2), ("ipo", 0.0), ("simpo", 0.0), ("simpo", 0.1)],
)
def test_preference_losses_equal_numpy(loss_type, eps):
    rng = np.random.default_rng(0)
    pc, pr, rc, rr = (rng.normal(-20, 5, 16) for _ in range(4))
    lc, lr = rng.integers(1, 30, 16).astype(float), rng.integers(1, 30, 16).astype(float)
    got = dpo.preference_loss(
        *(jnp.asarray(x) for x in (pc, pr, rc, rr, lc, lr)), loss_type, 0.3, eps, 0.7
    )
    want = numpy_preference_loss(pc, pr, rc, rr, lc, lr, loss_type, 0.3, eps, 0.7)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)


def test_held_out_accuracy_and_ties_equal_numpy():
    """evaluate_pairs' reward accuracy is TRL's (chosen reward > rejected reward, a tie counts
    as wrong) and eval_reward_ties the fraction of equal rewards, against NumPy: a policy that is
    its own reference ties every pair (accuracy 0, ties 1)."""
    rng = np.random.default_rng(0)
    n = 12
    pc, pr = rng.normal(-20, 5, n), rng.normal(-20, 5, n)
    rc, rr = pc.copy(), pr.copy()  # the reference; the policy moves on the first 8 pairs
    pc[:8] += rng.normal(0, 1, 8)
    pr[:4] += rng.normal(0, 1, 4)
    lengths = np.full(n, 5.0)
    arrays = {"chosen_tokens": np.arange(n)[:, None], "rejected_tokens": np.arange(n)[:, None]}
    reference = {"reference_chosen": rc, "reference_rejected": rr}
    config = dpo.Config(beta=0.3)

    def scores(chosen, rejected):
        def score(params, batch):
            index = batch["chosen_tokens"][:, 0]
            return {"chosen": chosen[index], "rejected": rejected[index],
                    "chosen_length": lengths[index], "rejected_length": lengths[index]}  # fmt: skip

        return score

    got = dpo.evaluate_pairs(scores(pc, pr), None, reference, arrays, config, 5)
    _, chosen, rejected = numpy_preference_loss(pc, pr, rc, rr, lengths, lengths, "sigmoid",
                                                0.3, 0.0, 0.0)  # fmt: skip
    assert np.mean(chosen == rejected) == 4 / 12  # float32 means: as close as one ulp
    np.testing.assert_allclose(got["eval_reward_accuracy"], np.mean(chosen > rejected), rtol=1e-6)
    np.testing.assert_allclose(got["eval_reward_ties"], np.mean(chosen == rejected), rtol=1e-6)
    itself = dpo.evaluate_pairs(scores(rc, rr), None, reference, arrays, config, 5)
    assert (itself["eval_reward_accuracy"], itself["eval_reward_ties"]) == (0.0, 1.0)


def random_pairs(n, length=10, seed=0):
    rng = np.random.default_rng(seed)
    out = {}
    for side in ("chosen", "rejected"):
        answer_start = rng.integers(2, 5, n)
        lengths = rng.integers(6, length + 1, n)
        positions = np.arange(length)
        out[f"{side}_tokens"] = rng.integers(2, MODEL.vocab_size, (n, length)).astype(np.int32)
        out[f"{side}_attention_mask"] = positions < lengths[:, None]
        out[f"{side}_loss_mask"] = (positions >= answer_start[:, None]) & (
            positions < lengths[:, None]
        )
        out[f"{side}_tokens"][~out[f"{side}_attention_mask"]] = 0
    return out


def test_sequence_scores_equal_numpy_log_softmax():
    params = init_params(MODEL, jax.random.key(0))
    batch = random_pairs(3)
    scores = dpo.score_pairs(Transformer(MODEL), params, batch)
    for side in ("chosen", "rejected"):
        tokens, mask = batch[f"{side}_tokens"], batch[f"{side}_attention_mask"]
        logits = np.asarray(
            Transformer(MODEL).apply({"params": params}, tokens, None, mask)[0], np.float64
        )
        log_probs = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
        want = [
            sum(
                log_probs[b, t - 1, tokens[b, t]]
                for t in np.flatnonzero(batch[f"{side}_loss_mask"][b])
            )
            for b in range(3)
        ]
        np.testing.assert_allclose(scores[side], want, rtol=1e-5)
        np.testing.assert_array_equal(scores[f"{side}_length"], batch[f"{side}_loss_mask"].sum(-1))


def test_answer_window_scores_and_gradients_equal_the_full_head():
    """The head on each row's answer window (training.scored_length) gives the full head's sums
    and gradients: answers starting at different positions, one running to the last position,
    and a row with nothing scored."""
    params = init_params(MODEL, jax.random.key(1))
    batch = random_pairs(6, seed=3)
    batch["chosen_loss_mask"][0] = False
    batch["rejected_attention_mask"][1] = True
    batch["rejected_loss_mask"][1] = np.arange(batch["rejected_loss_mask"].shape[1]) >= 9
    masks = [batch["chosen_loss_mask"], batch["rejected_loss_mask"]]
    window = training.scored_length(*masks)
    assert 0 < window < batch["chosen_tokens"].shape[1] - 1
    spans = [np.flatnonzero(row) for mask in masks for row in mask if row.any()]
    assert window == max(span[-1] - span[0] + 1 for span in spans)

    def total(params, scored_length):
        scores = dpo.score_pairs(Transformer(MODEL), params, batch, scored_length)
        return scores["chosen"].sum() - 2 * scores["rejected"].sum(), scores

    (_, full), full_grads = jax.value_and_grad(total, has_aux=True)(params, None)
    (_, windowed), window_grads = jax.value_and_grad(total, has_aux=True)(params, window)
    for key in full:
        np.testing.assert_allclose(windowed[key], full[key], rtol=1e-5, atol=1e-5)
    assert full["chosen"][0] == 0
    jax.tree.map(
        lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6),
        window_grads,
        full_grads,
    )
    # Too narrow a window is NaN for the rows it cuts, never a partial sum.
    (_, narrow), _ = jax.value_and_grad(total, has_aux=True)(params, window - 1)
    widest = [mask.sum(-1) == window for mask in masks]
    for side, cut in zip(("chosen", "rejected"), widest, strict=True):
        assert np.isnan(narrow[side][cut]).all() and not np.isnan(narrow[side][~cut]).any()


def run_steps(config, batch, reference_params=None, params=None):
    """One DPO update on `batch` (pairs [B, L], split into config.grad_accum_steps micro-batches)
    from `params` (default: random); returns (state, metrics)."""
    params = init_params(MODEL, jax.random.key(0)) if params is None else params
    algorithm = dpo.make(config, MODEL, params)
    hp = hparams.hparams(config)
    state = algorithm.init(jax.random.PRNGKey(0), hp)
    stacked = jax.tree.map(lambda x: x.reshape(config.grad_accum_steps, -1, *x.shape[1:]), batch)
    return jax.jit(algorithm.update)(state, (stacked, reference_params), hp)


def test_gradient_accumulation_equals_one_big_batch():
    """Four micro-batches of 2 give the loss and the gradient (its norm, and the parameters after
    the step) of one batch of 8. The parameters alone would not show a gradient of the wrong
    scale: Adam's first step moves each weight by about the learning rate, whatever the scale."""
    batch = random_pairs(8)
    ref = init_params(MODEL, jax.random.key(1))
    one, metrics_one = run_steps(
        dpo.Config(batch_size=8, reference="in_step", learning_rate=1e-3), batch, ref
    )
    four, metrics_four = run_steps(
        dpo.Config(batch_size=8, grad_accum_steps=4, reference="in_step", learning_rate=1e-3),
        batch,
        ref,
    )
    for name in ("loss", "grad_norm"):
        np.testing.assert_allclose(metrics_one[name], metrics_four[name], rtol=1e-5, err_msg=name)
    # Adam's first step is about +-lr per weight whatever the gradient's size, so a weight whose
    # gradient is near zero can flip on summation-order rounding: allow 1% of the learning rate
    # anywhere (one weight in 1536 moved 5.7e-6 on an AVX-512 CPU), and require agreement on
    # average.
    for a, b in zip(jax.tree.leaves(one.params), jax.tree.leaves(four.params), strict=True):
        np.testing.assert_allclose(a, b, atol=1e-5)
        assert np.abs(a - b).mean() < 1e-7


def test_precomputed_reference_equals_reference_in_the_step():
    batch = random_pairs(8)
    ref_params = init_params(MODEL, jax.random.key(1))
    score = jax.jit(dpo.make_score(MODEL))
    pre = dict(batch, **dpo.reference_log_probs(score, ref_params, batch, 4))
    a, metrics_a = run_steps(dpo.Config(batch_size=8, learning_rate=1e-3), pre)
    b, metrics_b = run_steps(
        dpo.Config(batch_size=8, reference="in_step", learning_rate=1e-3), batch, ref_params
    )
    np.testing.assert_allclose(metrics_a["loss"], metrics_b["loss"], rtol=1e-5)
    for x, y in zip(jax.tree.leaves(a.params), jax.tree.leaves(b.params), strict=True):
        np.testing.assert_allclose(x, y, atol=1e-6)


def test_sweep_over_learning_rate_and_beta_is_one_program_equal_to_separate_runs():
    """hparams.sweep gives every run its own learning rate and beta; the runs vmapped through
    loop.make_chunk (3 updates on the same batches) end where the separate runs do."""
    pairs = random_pairs(24)
    ref_params = init_params(MODEL, jax.random.key(1))
    config = dpo.Config(batch_size=8, reference="in_step")
    algorithm = dpo.make(config, MODEL, init_params(MODEL, jax.random.key(0)))
    batches = jax.tree.map(lambda x: x.reshape(3, 1, 8, *x.shape[1:]), pairs)
    hps = hparams.sweep(config, learning_rate=[1e-3, 3e-3], beta=[0.1, 0.5])
    keys = jnp.stack([jax.random.PRNGKey(0)] * 4)

    def with_reference(update):  # the reference (like the batches) is shared by the runs
        return lambda state, batch, hp: update(state, (batch, ref_params), hp)

    swept, swept_metrics = jax.jit(
        loop.make_chunk(with_reference(algorithm.update), 3, scan_inputs=True)
    )(jax.vmap(algorithm.init)(keys, hps), batches, hps)
    one_run = jax.jit(
        loop.make_chunk(with_reference(algorithm.update), 3, runs_axis=False, scan_inputs=True)
    )
    for i in range(4):
        hp = jax.tree.map(lambda x, i=i: x[i], hps)
        alone, metrics = one_run(algorithm.init(keys[i], hp), batches, hp)
        np.testing.assert_allclose(swept_metrics["loss"][:, i], metrics["loss"], rtol=1e-5)
        for x, y in zip(jax.tree.leaves(swept.params), jax.tree.leaves(alone.params), strict=True):
            np.testing.assert_allclose(x[i], y, atol=1e-6)
    # The sweep is not one run four times: each setting moved the policy its own way.
    assert len({round(float(x), 6) for x in swept_metrics["loss"][-1]}) == 4


@pytest.mark.parametrize("shape", [(8, 1, 1), (2, 2, 2)])
def test_sharded_dpo_step_equals_single_device(shape):
    batch = random_pairs(8)
    params = init_params(MODEL, jax.random.key(0))
    ref_params = init_params(MODEL, jax.random.key(1))
    config = dpo.Config(batch_size=8, reference="in_step", learning_rate=1e-3)
    single, single_metrics = run_steps(config, batch, ref_params, params=params)
    mesh = sharding.make_mesh(*shape)
    from jaxrl.lm.model import param_shardings

    placed = jax.device_put(params, param_shardings(MODEL, mesh))
    placed_ref = jax.device_put(ref_params, param_shardings(MODEL, mesh))
    # The sharded run puts the head on the answer window (as experiments/dpo.py does), the
    # single-device one on every position: the same step either way.
    window = training.scored_length(batch["chosen_loss_mask"], batch["rejected_loss_mask"])
    assert window < batch["chosen_tokens"].shape[1] - 1
    algorithm = dpo.make(config, MODEL, placed, mesh, window)
    hp = hparams.hparams(config)
    state = algorithm.init(jax.random.PRNGKey(0), hp)
    stacked = training.shard_chunk(jax.tree.map(lambda x: x.reshape(1, 1, 8, -1), batch), mesh)
    chunk = jax.jit(
        training.make_batch_chunk(algorithm.update, 1),
        out_shardings=(training.state_shardings(state), sharding.replicated(mesh)),
    )
    sharded, sharded_metrics = chunk(state, (stacked, placed_ref), hp)
    np.testing.assert_allclose(sharded_metrics["loss"][0], single_metrics["loss"], rtol=1e-5)
    # One Adam step (lr 1e-3) after fp32 reductions in a different order: updates agree to ~1e-5.
    for x, y in zip(jax.tree.leaves(sharded.params), jax.tree.leaves(single.params), strict=True):
        np.testing.assert_allclose(x, y, atol=1e-5)
    assert sharded.params["embedding"].sharding == param_shardings(MODEL, mesh)["embedding"]


def test_bad_settings_name_the_field():
    with pytest.raises(ConfigError, match="loss_type"):
        dpo.Config(loss_type="hinge")
    with pytest.raises(ConfigError, match="grad_accum_steps"):
        dpo.Config(batch_size=8, grad_accum_steps=3)
    with pytest.raises(ConfigError, match="batch_size: micro-batch 2"):
        dpo.Config(batch_size=8, grad_accum_steps=4, mesh_shape=(2, 2, 1))
    with pytest.raises(ConfigError, match="label_smoothing"):
        dpo.Config(loss_type="ipo", label_smoothing=0.1)


def test_sft_loss_is_mean_target_nll():
    params = init_params(MODEL, jax.random.key(0))
    batch = {
        k.removeprefix("chosen_"): v[:3]
        for k, v in random_pairs(3).items()
        if k.startswith("chosen")
    }
    loss, _ = sft.make_loss(Transformer(MODEL))(params, batch)
    scores = dpo.score_pairs(
        Transformer(MODEL),
        params,
        {f"{s}_{k}": v for s in ("chosen", "rejected") for k, v in batch.items()},
    )
    np.testing.assert_allclose(
        loss, -scores["chosen"].sum() / scores["chosen_length"].sum(), rtol=1e-5
    )
