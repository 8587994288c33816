"""The transformer's cache, padding and sampler: exact equalities against plain recomputation."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl.config import ConfigError
from jaxrl.lm.model import (
    ModelConfig,
    Transformer,
    head_log_probs,
    init_cache,
    init_params,
    token_log_probs,
)
from jaxrl.lm.sampler import SamplingConfig, _filter_logits, generate

CONFIG = ModelConfig(
    vocab_size=64, hidden_size=32, intermediate_size=48, num_layers=2, num_heads=4, num_kv_heads=2
)
PAD, EOS = 0, 1


@pytest.fixture(scope="module")
def params():
    return init_params(CONFIG, jax.random.key(0))


def forward(params, tokens, mask=None, positions=None):
    return Transformer(CONFIG).apply({"params": params}, tokens, positions, mask)[0]


def test_parameter_count_matches_formula(params):
    assert sum(x.size for x in jax.tree.leaves(params)) == CONFIG.num_params()


def test_prefill_then_decode_equals_full_forward(params):
    tokens = jax.random.randint(jax.random.key(1), (2, 10), 2, 64)
    full = forward(params, tokens)
    model = Transformer(CONFIG)
    cache = init_cache(CONFIG, 2, 10)
    positions = jnp.broadcast_to(jnp.arange(10), (2, 10))
    ones = jnp.ones((2, 10), bool)
    pieces, cache = model.apply(
        {"params": params}, tokens[:, :6], positions[:, :6], ones[:, :6], cache
    )
    pieces = [pieces]
    for t in range(6, 10):
        step = slice(t, t + 1)
        logits, cache = model.apply(
            {"params": params}, tokens[:, step], positions[:, step], ones[:, step], cache
        )
        pieces.append(logits)
    np.testing.assert_allclose(jnp.concatenate(pieces, axis=1), full, atol=1e-5)


def test_left_padding_does_not_change_real_tokens(params):
    tokens = jax.random.randint(jax.random.key(2), (1, 7), 2, 64)
    padded = jnp.concatenate([jnp.zeros((1, 3), jnp.int32), tokens], axis=1)
    mask = padded != PAD
    np.testing.assert_allclose(
        forward(params, padded, mask)[:, 3:], forward(params, tokens), atol=1e-5
    )


def naive_greedy(params, prompt, steps):
    sequence = list(prompt)
    for _ in range(steps):
        logits = forward(params, jnp.array([sequence]))
        sequence.append(int(jnp.argmax(logits[0, -1])))
        if sequence[-1] == EOS:
            break
    return sequence[len(prompt) :]


def test_greedy_cache_decoding_equals_recomputation_without_cache(params):
    prompts = np.array([[0, 0, 5, 6, 7], [3, 4, 5, 6, 7], [0, 9, 9, 2, 2]])
    config = SamplingConfig(max_new_tokens=8, eos_id=EOS, pad_id=PAD, temperature=0.0)
    out = jax.jit(lambda p, t, m, k: generate(CONFIG, p, t, m, k, config))(
        params, prompts, prompts != PAD, jax.random.key(0)
    )
    for row, prompt in enumerate(prompts):
        expected = naive_greedy(params, [t for t in prompt if t != PAD], 8)
        got = np.asarray(out.tokens[row])[np.asarray(out.mask[row])]
        assert got.tolist() == expected


def test_sampler_log_probs_equal_scored_log_probs(params):
    prompts = np.array([[0, 0, 5, 6, 7], [3, 4, 5, 6, 7]])
    mask = prompts != PAD
    for temperature, top_k, top_p in [(1.0, 0, 1.0), (0.7, 10, 0.9)]:
        config = SamplingConfig(
            max_new_tokens=12,
            eos_id=EOS,
            pad_id=PAD,
            temperature=temperature,
            top_k=top_k,
            top_p=top_p,
        )
        out = generate(CONFIG, params, prompts, mask, jax.random.key(3), config)
        sequence = jnp.concatenate([prompts, out.tokens], axis=1)
        logits = forward(params, sequence, jnp.concatenate([mask, out.mask], axis=1))
        scored = token_log_probs(logits / temperature, sequence)[:, prompts.shape[1] :]
        np.testing.assert_allclose(
            np.where(out.mask, scored, 0.0), np.where(out.mask, out.log_probs, 0.0), atol=1e-5
        )
        assert out.lengths.tolist() == out.mask.sum(-1).tolist()


def test_eos_stops_a_row_and_pads_after_it():
    # A model whose first choice after the prompt is EOS: the head's EOS column points along the
    # prompt's last hidden state, so EOS's logit is 100 |h|^2. Then padding; mask covers one token.
    config = SamplingConfig(max_new_tokens=4, eos_id=EOS, pad_id=PAD, temperature=0.0)
    params = init_params(CONFIG, jax.random.key(0))
    prompts = np.array([[3, 4, 5]])
    hidden, _ = Transformer(CONFIG).apply({"params": params}, prompts, hidden_only=True)
    params["lm_head"] = params["lm_head"].at[:, EOS].set(100.0 * hidden[0, -1])
    out = generate(CONFIG, params, prompts, prompts != PAD, jax.random.key(0), config)
    tokens, mask = np.asarray(out.tokens[0]), np.asarray(out.mask[0])
    first_eos = int(np.argmax(tokens == EOS))
    assert mask.tolist() == [i <= first_eos for i in range(4)]
    assert (tokens[first_eos + 1 :] == PAD).all()


def test_top_k_and_top_p_filters_match_numpy():
    logits = jax.random.normal(jax.random.key(4), (3, 20))
    kept = np.asarray(_filter_logits(logits, 5, 1.0)) > -1e30
    for row in range(3):
        assert set(np.flatnonzero(kept[row])) == set(np.argsort(-np.asarray(logits[row]))[:5])
    kept = np.asarray(_filter_logits(logits, 0, 0.8)) > -1e30
    for row in range(3):
        order = np.argsort(-np.asarray(logits[row]))
        probs = np.exp(logits[row] - logits[row].max())
        probs = np.asarray(probs / probs.sum())[order]
        before = np.cumsum(probs) - probs
        assert set(np.flatnonzero(kept[row])) == set(order[before < 0.8])


def test_bad_model_and_sampling_settings_name_the_field():
    with pytest.raises(ConfigError, match="num_kv_heads"):
        ModelConfig(
            vocab_size=8,
            hidden_size=8,
            intermediate_size=8,
            num_layers=1,
            num_heads=4,
            num_kv_heads=3,
        )
    with pytest.raises(ConfigError, match="top_p"):
        SamplingConfig(max_new_tokens=4, eos_id=1, pad_id=0, top_p=1.5)


def test_remat_gives_the_same_gradients_and_bf16_stays_close(params):
    import dataclasses

    tokens = jax.random.randint(jax.random.key(5), (2, 9), 2, 64)

    def loss(config, p):
        logits = Transformer(config).apply({"params": p}, tokens)[0]
        return -token_log_probs(logits, tokens).mean()

    plain = jax.grad(lambda p: loss(CONFIG, p))(params)
    # Every policy (True is the older spelling of "full") recomputes the same gradients, and the
    # chunked head's log-probs equal the whole-vocabulary ones.
    for policy in ("save_dots", "full", True):
        config = dataclasses.replace(CONFIG, remat=policy)
        remat = jax.grad(lambda p, config=config: loss(config, p))(params)
        for a, b in zip(jax.tree.leaves(plain), jax.tree.leaves(remat), strict=True):
            np.testing.assert_allclose(a, b, atol=1e-6)
    with pytest.raises(ConfigError, match="remat"):
        dataclasses.replace(CONFIG, remat="some")
    hidden = Transformer(CONFIG).apply({"params": params}, tokens, hidden_only=True)[0]
    whole = token_log_probs(Transformer(CONFIG).apply({"params": params}, tokens)[0], tokens)
    # Chunks of 3 positions (two rows x 3 x vocab 64 elements each), the last one padded.
    chunked = head_log_probs(CONFIG, params, hidden[:, :-1], tokens[:, 1:], 0.7, 2 * 3 * 64)
    logits = np.asarray(Transformer(CONFIG).apply({"params": params}, tokens)[0])[:, :-1] / 0.7
    # NumPy reference at temperature 0.7: log p, entropy, KL(uniform || p) = mean(log(u / p)).
    log_p = logits - logits.max(-1, keepdims=True)
    log_p = log_p - np.log(np.exp(log_p).sum(-1, keepdims=True))
    picked = np.take_along_axis(log_p, np.asarray(tokens)[:, 1:, None], -1)[..., 0]
    uniform = 1.0 / CONFIG.vocab_size
    np.testing.assert_allclose(chunked.log_probs, picked, atol=1e-5)
    np.testing.assert_allclose(chunked.entropy, -(np.exp(log_p) * log_p).sum(-1), atol=1e-5)
    kl = (uniform * (np.log(uniform) - log_p)).sum(-1)
    np.testing.assert_allclose(chunked.uniform_kl, kl, atol=1e-5)
    at_one = head_log_probs(CONFIG, params, hidden[:, :-1], tokens[:, 1:], 1.0, 2 * 3 * 64)
    np.testing.assert_allclose(at_one.log_probs, whole[:, 1:], atol=1e-6)
    bf16 = dataclasses.replace(CONFIG, dtype="bfloat16")
    np.testing.assert_allclose(loss(bf16, params), loss(CONFIG, params), rtol=2e-2)


def test_packed_attention_equals_the_masked_pass(params, monkeypatch):
    """The packed pass (each row's real tokens first, causal attention over their count: what
    cuDNN's fused attention runs on a GPU) gives the masked pass's logits at every real token
    and the same gradients, with left padding, right padding and a hole mid-row. Here XLA's
    kernel runs the packed layout (cuDNN needs a GPU); "auto" on this CPU is the masked pass."""
    import dataclasses

    from jaxrl.lm import model as lm_model

    tokens = jax.random.randint(jax.random.key(7), (4, 11), 2, 64)
    mask = np.ones((4, 11), bool)
    mask[0, :3] = False  # a left-padded prompt
    mask[1, 8:] = False  # a right-padded completion
    mask[2, :2] = mask[2, 9:] = False  # both
    mask[3, 4:6] = False  # a hole
    mask = jnp.asarray(mask)

    def logits(p):
        return Transformer(CONFIG).apply({"params": p}, tokens, token_mask=mask)[0]

    def loss(p):  # tokens whose prediction is read at a real token (padding's is unspecified)
        log_p = token_log_probs(logits(p), tokens)
        read = mask & jnp.pad(mask[:, :-1], ((0, 0), (1, 0)))
        return -jnp.sum(jnp.where(read, log_p, 0.0))

    both = lambda p: (logits(p), jax.grad(loss)(p))  # noqa: E731
    assert lm_model.packed_attention(CONFIG) is None  # "auto" off a GPU
    masked, masked_grad = jax.jit(both)(params)
    monkeypatch.setattr(lm_model, "packed_attention", lambda config: "xla")
    packed, packed_grad = jax.jit(both)(params)
    real = np.asarray(mask)
    np.testing.assert_allclose(np.asarray(packed)[real], np.asarray(masked)[real], atol=1e-6)
    assert np.isfinite(np.asarray(packed)).all()
    for a, b in zip(jax.tree.leaves(masked_grad), jax.tree.leaves(packed_grad), strict=True):
        np.testing.assert_allclose(a, b, atol=1e-6)
    monkeypatch.undo()
    cudnn = dataclasses.replace(CONFIG, dtype="bfloat16", attention="cudnn")
    assert lm_model.packed_attention(cudnn) == "cudnn"
    assert lm_model.packed_attention(dataclasses.replace(cudnn, attention="xla")) is None
    with pytest.raises(ConfigError, match="^attention: unknown implementation 'flash'"):
        dataclasses.replace(CONFIG, attention="flash")


def test_an_unrolled_decode_step_samples_what_the_scanned_one_does(params):
    """`decode_unroll` (the GPU's default: the decode step's layers unrolled, so each layer's
    weights are a fixed slice taken once per rollout) samples the same tokens with the same
    log-probs as the scanned step, and "auto" scans off a GPU."""
    import dataclasses

    from jaxrl.lm.model import decode_unroll

    prompts = np.array([[0, 0, 5, 6, 7], [3, 4, 5, 6, 7], [0, 9, 9, 2, 2]])
    config = SamplingConfig(max_new_tokens=6, eos_id=EOS, pad_id=PAD, temperature=1.0)
    outs = []
    for unroll in (1, CONFIG.num_layers):
        model = dataclasses.replace(CONFIG, decode_unroll=unroll)
        outs.append(
            jax.jit(lambda p, t, m, k, model=model: generate(model, p, t, m, k, config))(
                params, jnp.array(prompts), jnp.array(prompts != PAD), jax.random.key(3)
            )
        )
    np.testing.assert_array_equal(outs[0].tokens, outs[1].tokens)
    np.testing.assert_allclose(outs[0].log_probs, outs[1].log_probs, atol=1e-6)
    assert decode_unroll(CONFIG) == 1  # "auto" (0) off a GPU
    assert decode_unroll(dataclasses.replace(CONFIG, decode_unroll=CONFIG.num_layers)) == (
        CONFIG.num_layers
    )
    with pytest.raises(ConfigError, match="^decode_unroll: got -1"):
        dataclasses.replace(CONFIG, decode_unroll=-1)
    # More than the layers was clamped silently, though the refusal of -1 says "up to".
    with pytest.raises(ConfigError, match="^decode_unroll: got 99; .* up to num_layers = "):
        dataclasses.replace(CONFIG, decode_unroll=99)


def test_layers_are_one_stacked_scan_and_older_per_layer_runs_still_load(tmp_path):
    import orbax.checkpoint as ocp

    from jaxrl.lm.model import param_axes, stack_layers, unstack_layers
    from jaxrl.lm.training import restore_params

    params = init_params(CONFIG, jax.random.key(3))
    # One entry for all layers, each array stacked on a leading "layers" axis.
    assert not any(name.startswith("layer_") for name in params)
    q = params["layers"]["attention"]["q_kernel"]
    assert q.shape[0] == CONFIG.num_layers
    assert param_axes(CONFIG)["layers"]["attention"]["q_kernel"][0] == "layers"
    per_layer = unstack_layers(params)
    assert sorted(n for n in per_layer if n.startswith("layer_")) == [
        f"layer_{i}" for i in range(CONFIG.num_layers)
    ]
    jax.tree.map(np.testing.assert_array_equal, stack_layers(per_layer), params)
    # A run directory saved before the layers were stacked restores into the stacked layout.
    with ocp.StandardCheckpointer() as checkpointer:
        checkpointer.save(tmp_path / "params", per_layer)
    like = jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), params
    )
    restored = restore_params(str(tmp_path / "params"), like)
    jax.tree.map(np.testing.assert_array_equal, restored, params)


def test_sampling_inverts_the_distribution_exactly():
    # Five tokens with known probabilities at temperature 2: the frequencies of 40,000 draws lie
    # within 5 standard errors of them, a masked (top-k) token is never drawn, and greedy
    # decoding takes the first of tied maxima.
    from jaxrl.lm.sampler import sample_token

    logits = jnp.asarray([[2.0, 0.0, -1.0, 1.0, -30.0]])
    config = SamplingConfig(max_new_tokens=1, eos_id=0, pad_id=0, temperature=2.0, top_k=4)
    keys = jax.random.split(jax.random.key(0), 40_000)
    tokens, log_probs = jax.vmap(lambda k: sample_token(logits, k, config))(keys)
    tokens = np.asarray(tokens[:, 0])
    scaled = np.asarray(logits[0]) / 2.0
    probs = np.exp(scaled - scaled.max())
    probs /= probs.sum()
    kept = probs.copy()
    kept[4] = 0.0
    kept /= kept.sum()
    freq = np.bincount(tokens, minlength=5) / len(tokens)
    assert freq[4] == 0
    np.testing.assert_array_less(
        np.abs(freq - kept), 5 * np.sqrt(kept * (1 - kept) / 40_000) + 1e-9
    )
    # The log-prob is the untruncated policy's, as the trainer scores it.
    np.testing.assert_allclose(np.asarray(log_probs[:, 0]), np.log(probs)[tokens], rtol=1e-5)
    greedy = SamplingConfig(max_new_tokens=1, eos_id=0, pad_id=0, temperature=0.0)
    tied = jnp.asarray([[0.0, 3.0, 1.0, 3.0]])
    assert int(sample_token(tied, jax.random.key(0), greedy)[0][0]) == 1


def test_a_group_shares_its_prompt_prefill():
    # G = 8 samples of each of 2 prompts: the prefill runs over the 2 prompts once (8x fewer
    # prompt tokens than over the repeated batch), and the samples, log-probs and masks equal
    # the unshared sampler's on the repeated prompts with the same key.
    group = 8
    prompts = np.array([[PAD, 3, 4, 5], [6, 7, 8, 9]])
    mask = prompts != PAD
    config = SamplingConfig(max_new_tokens=6, eos_id=EOS, pad_id=PAD, temperature=1.0)
    params = init_params(CONFIG, jax.random.key(1))
    key = jax.random.key(7)
    shared = jax.jit(lambda p, t, m, k: generate(CONFIG, p, t, m, k, config, group_size=group))(
        params, prompts, mask, key
    )
    repeated = np.repeat(prompts, group, axis=0)
    unshared = jax.jit(lambda p, t, m, k: generate(CONFIG, p, t, m, k, config))(
        params, repeated, repeated != PAD, key
    )
    assert int(shared.prefilled_tokens) * group == int(unshared.prefilled_tokens) == 16 * 4
    np.testing.assert_array_equal(shared.tokens, unshared.tokens)
    np.testing.assert_array_equal(shared.mask, unshared.mask)
    np.testing.assert_allclose(shared.log_probs, unshared.log_probs, atol=1e-5)
    # Within a group the samples differ: they are G draws, not one draw copied.
    assert len({tuple(row) for row in np.asarray(shared.tokens[:group])}) > 1


def test_held_out_answers_and_samples_share_one_prefill():
    # greedy_and_sampled_completions (the held-out evaluation: greedy accuracy and pass@k)
    # prefills each of 13 prompts once for its greedy answer and its 4 samples; call i of 4
    # prompts (the last wraps round) draws with fold_in(key, i), so the samples are those of
    # sampling the repeated prompts row by row, 16 rows a batch, and the answers are greedy ones.
    from jaxrl.lm.completions import greedy_and_sampled_completions, greedy_completions
    from jaxrl.sharding import make_mesh

    class Digits:
        eos_id, pad_id = EOS, PAD

        def decode(self, ids):
            return " ".join(map(str, ids))

    prompts = np.asarray(jax.random.randint(jax.random.key(1), (13, 5), 3, CONFIG.vocab_size))
    mask = np.ones_like(prompts, bool)
    mask[3, :2] = False
    config = SamplingConfig(max_new_tokens=5, eos_id=EOS, pad_id=PAD, temperature=1.0)
    params = init_params(CONFIG, jax.random.key(0))
    key, mesh = jax.random.key(7), make_mesh()
    answers, samples = greedy_and_sampled_completions(
        CONFIG, params, Digits(), prompts, mask, config, 4, key, mesh, 4
    )
    assert answers == greedy_completions(CONFIG, params, Digits(), prompts, mask, 5, mesh, 13)
    rows = np.repeat(np.arange(13), 4)
    sample = jax.jit(lambda p, t, m, k: generate(CONFIG, p, t, m, k, config))
    texts = []
    for index, start in enumerate(range(0, len(rows), 16)):
        chosen = rows[np.arange(start, start + 16) % len(rows)]
        out = sample(params, prompts[chosen], mask[chosen], jax.random.fold_in(key, index))
        texts += [Digits().decode(t[m]) for t, m in zip(out.tokens, out.mask, strict=True)]
    assert samples == [texts[4 * i : 4 * i + 4] for i in range(13)]


def test_decode_row_buckets_sample_what_decoding_every_row_samples():
    # 16 rows, half of which end (EOS) at different steps: with 4 row buckets the decode steps
    # gather the rows still sampling into 12 or 8 rows, and the samples are the same.
    prompts = np.tile(np.array([[PAD, 3, 4, 5], [6, 7, 8, 9]]), (8, 1))
    config = SamplingConfig(max_new_tokens=60, eos_id=EOS, pad_id=PAD, temperature=1.0)
    params = init_params(CONFIG, jax.random.key(1))
    key = jax.random.key(5)

    def sample(buckets):
        run = jax.jit(lambda p, t, m, k: generate(CONFIG, p, t, m, k, config, row_buckets=buckets))
        return run(params, prompts, prompts != PAD, key)

    every, bucketed = sample(0), sample(4)
    lengths = np.asarray(every.lengths)
    # Rows ended at many different steps, 4 by step 30 and 8 before the last: the 12- and 8-row
    # buckets ran.
    assert np.sum(lengths <= 30) >= 4 and np.sum(lengths < 60) >= 8, lengths
    np.testing.assert_array_equal(bucketed.tokens, every.tokens)
    np.testing.assert_array_equal(bucketed.mask, every.mask)
    np.testing.assert_array_equal(bucketed.lengths, every.lengths)
    np.testing.assert_allclose(bucketed.log_probs, every.log_probs, atol=1e-5)
