"""Multi-turn RL (algos/multiturn.py, jaxrl/lm/dialogue.py): the conversation recorded by the
sampler is exactly opening + turns + answers, with only the policy's tokens in the loss mask
(against a reference built from the game's rules); one forward pass over it gives the sampler's
log-probs again; turn credit against NumPy; the update is one lowered program."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from algos import multiturn
from envs.text import multiturn as games
from jaxrl import hparams
from jaxrl.config import ConfigError, from_flat
from jaxrl.lm import dialogue
from jaxrl.lm.model import ModelConfig, Transformer, init_params
from jaxrl.lm.sampler import Sampling, SamplingConfig
from jaxrl.lm.tokenizer import ByteTokenizer
from tests.test_text_games import Reference

BYTES = ByteTokenizer()
TINY = ModelConfig(
    vocab_size=BYTES.vocab_size, hidden_size=32, intermediate_size=64, num_layers=2,
    num_heads=4, num_kv_heads=2,
)  # fmt: skip


def digits_model(seed=0):
    """A random tiny model that favours digits and EOS, so turns often say a number and often end
    before the budget (every path of a turn is taken). The bias rides on one residual dimension
    made constant through the embedding, which the head reads."""
    params = jax.tree.map(np.array, init_params(TINY, jax.random.key(seed)))
    params["embedding"][:, 0] = 10.0  # dimension 0 stays near sqrt(hidden) after the final norm
    head = params["lm_head"] * 0.1
    head[0] = 0.0
    head[0, [BYTES.encode(str(d))[0] for d in range(10)]] = 4.0 / np.sqrt(TINY.hidden_size)
    head[0, BYTES.eos_id] = 5.0 / np.sqrt(TINY.hidden_size)
    params["lm_head"] = head
    return jax.tree.map(jnp.asarray, params)


def converse(budget=4, episodes=16, seed=1, temperature=1.0):
    env = games.make_guess_my_number(BYTES, maximum=8, max_turns=4)
    params = digits_model(seed)
    sampling = SamplingConfig(budget, BYTES.eos_id, BYTES.pad_id, temperature)
    reset_keys = jax.random.split(jax.random.key(seed), episodes)
    sample_keys = jax.random.split(jax.random.key(seed + 100), episodes)
    run = jax.jit(lambda p: dialogue.converse(TINY, p, env, reset_keys, sample_keys, sampling))
    episodes_, states = run(params)
    return env, params, sampling, jax.device_get(episodes_), jax.device_get(states)


@pytest.fixture(scope="module")
def conversation():
    """48 sampled episodes (one compile), shared by the tests that read the recorded slots."""
    return converse(episodes=48)


def test_the_recorded_conversation_is_opening_turns_and_answers(conversation):
    """Each row's real tokens, in slot order, are the rendered opening, then per turn the
    policy's tokens (EOS included; EOS appended, outside the loss mask, where the budget cut the
    turn) and the rendered answer the reference game gives to what was said; the loss mask is
    exactly the policy's tokens; rewards and ends match the reference."""
    env, _, sampling, episodes, states = conversation
    reference = Reference("guess_my_number")
    opening = BYTES.encode(games.plain_render(env.messages[0], True))
    eos = BYTES.eos_id
    for row in range(episodes.tokens.shape[0]):
        real = episodes.mask[row]
        tokens, policy = episodes.tokens[row][real], episodes.policy_mask[row][real]
        expected, expected_policy = list(opening), [False] * len(opening)
        turn_ids = episodes.turn_index[row][real]
        for turn in range(int(episodes.spoke[row].sum())):
            said = tokens[(turn_ids == turn) & policy].tolist()
            assert 1 <= len(said) <= sampling.max_new_tokens
            expected += said
            expected_policy += [True] * len(said)
            if said[-1] != eos:
                assert len(said) == sampling.max_new_tokens
                expected.append(eos)
                expected_policy.append(False)
            answer, solved = reference.reply(int(states.secret[row]), BYTES.decode(said).encode())
            assert episodes.rewards[row, turn] == float(solved)
            last = solved or turn + 1 == env.max_turns
            if not last:
                rendered = BYTES.encode(games.plain_render(answer, False))
                expected += rendered
                expected_policy += [False] * len(rendered)
            assert bool(last) == (turn + 1 == episodes.spoke[row].sum())
        assert tokens.tolist() == expected, row
        assert policy.tolist() == expected_policy, row
    assert episodes.done.all() and episodes.rewards.sum() >= 2  # some games won, some lost
    turn_lengths = [((episodes.turn_index == t) & episodes.policy_mask).sum(1) for t in range(4)]
    lengths = np.concatenate(turn_lengths)
    assert (lengths == sampling.max_new_tokens).any() and (
        (lengths > 0) & (lengths < sampling.max_new_tokens)
    ).any()  # turns cut by the budget and turns ended by EOS


def test_one_forward_pass_gives_the_sampler_log_probs():
    """Recomputed from the recorded slots (rows with holes where other rows spoke longer), the
    policy tokens' log-probs equal the sampler's, at temperature 0.7 (a temperature other than 1:
    the division is in both)."""
    env, params, sampling, episodes, _ = converse(temperature=0.7, episodes=6)
    gathered = dialogue.policy_tokens(episodes, env.max_turns * sampling.max_new_tokens)
    recomputed = dialogue.policy_log_probs(Transformer(TINY), params, episodes, gathered, 0.7)
    assert gathered.valid.sum() > 20
    np.testing.assert_allclose(
        np.where(gathered.valid, recomputed, 0), gathered.sampled_log_probs, atol=2e-5
    )


def numpy_turn_returns(rewards, spoke, gamma):
    out = np.zeros_like(rewards)
    for index in np.ndindex(rewards.shape[:-1]):
        following = 0.0
        for t in reversed(range(rewards.shape[-1])):
            if spoke[index][t]:
                following = rewards[index][t] + gamma * following
                out[index][t] = following
    return out


def numpy_turn_advantages(returns, spoke, baseline, scale, eps):
    out = np.zeros_like(returns)
    games_, group, turns = returns.shape
    for g in range(games_):
        for t in range(turns):
            members = [i for i in range(group) if spoke[g, i, t]]
            if len(members) < 2:
                continue
            values = np.array([returns[g, i, t] for i in members])
            for i in members:
                if baseline == "leave_one_out":
                    reference = (values.sum() - returns[g, i, t]) / (len(members) - 1)
                else:
                    reference = values.mean()
                advantage = returns[g, i, t] - reference
                if scale:
                    advantage /= values.std(ddof=1) + eps
                out[g, i, t] = advantage
    return out


@pytest.mark.parametrize("baseline,scale", [("group_mean", True), ("leave_one_out", False)])
@pytest.mark.parametrize("gamma", [1.0, 0.8])
def test_turn_credit_equals_numpy(baseline, scale, gamma):
    """Discounted per-turn returns and their within-group advantages at each turn, over episodes
    of different lengths (a reward on the last turn spoken, or none)."""
    rng = np.random.default_rng(0)
    games_, group, turns = 3, 5, 4
    lengths = rng.integers(1, turns + 1, (games_, group))
    spoke = np.arange(turns)[None, None] < lengths[..., None]
    rewards = np.where(np.arange(turns)[None, None] == lengths[..., None] - 1, 1.0, 0.0)
    rewards *= rng.random((games_, group, 1)) < 0.6
    rewards += 0.1 * rng.standard_normal(rewards.shape) * spoke
    returns = multiturn.discounted_turn_returns(jnp.asarray(rewards), jnp.asarray(spoke), gamma)
    np.testing.assert_allclose(returns, numpy_turn_returns(rewards, spoke, gamma), atol=1e-6)
    advantages = multiturn.turn_advantages(returns, jnp.asarray(spoke), baseline, scale, 1e-4)
    expected = numpy_turn_advantages(np.asarray(returns), spoke, baseline, scale, 1e-4)
    np.testing.assert_allclose(advantages, expected, atol=1e-5)
    turn_index = np.array([[0, 0, 1, 2, -1], [1, 1, 0, -1, -1]])
    per_turn = np.arange(8, dtype=np.float32).reshape(2, 4)
    tokens = multiturn.token_advantages(jnp.asarray(per_turn), turn_index, turn_index >= 0)
    assert tokens.tolist() == [[0, 0, 1, 2, 0], [5, 5, 4, 0, 0]]


def test_the_update_is_one_program_and_trains():
    """The lowered update holds the turn loop, the decoding loop and the optimizer; compiled
    once, it plays the games (the environment's rewards are in its metrics) and moves the
    parameters."""
    env = games.make_guess_my_number(BYTES, maximum=8, max_turns=4)
    params = digits_model()
    config = multiturn.Config(
        batch_size=2, group_size=4, sampling=Sampling(max_new_tokens=4), learning_rate=1e-3,
        credit="turn", gamma=0.9, num_minibatches=2,
    )  # fmt: skip
    algorithm = multiturn.make(config, TINY, env, params, BYTES.eos_id, BYTES.pad_id)
    hp = hparams.hparams(config)
    state = algorithm.init(jax.random.key(0), hp)
    lowered = jax.jit(algorithm.update).lower(state, None, hp)
    assert lowered.as_text().count("stablehlo.while") >= 3  # turns, tokens, optimizer steps
    compiled = lowered.compile()
    new_state, metrics = compiled(state, None, hp)
    assert 0 <= float(metrics["success"]) <= 1 and 1 <= float(metrics["turns"]) <= 4
    assert np.isfinite(float(metrics["loss"])) and float(metrics["policy_tokens"]) > 0
    moved = jax.tree.map(lambda a, b: float(jnp.abs(a - b).max()), new_state.params, params)
    assert max(jax.tree.leaves(moved)) > 0


@pytest.mark.parametrize(
    "field,value,message",
    [
        ("credit", "token", "unknown credit"),
        ("gamma", 0.9, "read only by credit=turn"),
        ("variant", "remax", "greedy baseline"),
    ],
)
def test_config_errors_name_the_field(field, value, message):
    with pytest.raises(ConfigError, match=message) as error:
        from_flat(multiturn.Config, {"max_new_tokens": 4, field: value})
    assert field in str(error.value)


def test_single_completion_settings_are_not_multiturn_settings():
    """DAPO's overlong penalty (and length buckets) are GRPO's settings for single completions:
    multi-turn GRPO's Config does not take them (it used to inherit and refuse them)."""
    for field in ("overlong_buffer", "overlong_penalty", "length_buckets"):
        with pytest.raises(TypeError, match=field):
            multiturn.Config(**{field: 2})


def test_supervised_rows_are_laid_out_as_the_sampler_lays_out_a_conversation(conversation):
    """conversation_batch on the transcripts of sampled episodes gives each row's real tokens in
    the sampler's order; its loss mask is the policy's tokens plus the end of turn the sampler
    appended to turns the budget cut (a teacher's turns always end). Rows whose sampled bytes
    are not valid UTF-8 text (a transcript cannot hold them) are left out."""
    env, _, sampling, episodes, states = conversation
    reference = Reference("guess_my_number")
    transcripts, expected_tokens, expected_loss = [], [], []
    for row in range(episodes.tokens.shape[0]):
        real = episodes.mask[row]
        tokens, policy = episodes.tokens[row][real], episodes.policy_mask[row][real]
        turn_ids = episodes.turn_index[row][real]
        transcript = [("env", env.messages[0])]
        for turn in range(int(episodes.spoke[row].sum())):
            said = [t for t in tokens[(turn_ids == turn) & policy].tolist() if t != BYTES.eos_id]
            text = BYTES.decode(said)
            answer, _ = reference.reply(int(states.secret[row]), text.encode())
            transcript += [("policy", text), ("env", answer)]
        if any(
            BYTES.encode(text) != [t for t in tokens[(turn_ids == k) & policy] if t != BYTES.eos_id]
            for k, text in enumerate(t for speaker, t in transcript if speaker == "policy")
        ):
            continue  # bytes that are not text
        transcripts.append(transcript)
        expected_tokens.append(tokens.tolist())
        ends = np.zeros_like(policy)
        ends[1:] = (tokens[1:] == BYTES.eos_id) & policy[:-1] & ~policy[1:]
        expected_loss.append((policy | ends).tolist())
    assert len(transcripts) >= 4
    width = episodes.tokens.shape[1]
    rows = games.conversation_batch(transcripts, BYTES, BYTES.eos_id, width)
    for row in range(len(transcripts)):
        real = rows["attention_mask"][row]
        assert rows["tokens"][row][real].tolist() == expected_tokens[row], row
        assert rows["loss_mask"][row][real].tolist() == expected_loss[row], row
