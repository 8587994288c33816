"""Multi-turn GRPO with shared openings (`multiturn.Config.shared_prompt`): a game's group_size
episodes share their opening slot for slot, and every pass of the update runs each game's opening
once, its episodes' turns packed after it (`dialogue.shared_opening_logits`). The logits and
log-probs, the loss and its gradients, and whole updates' parameters equal the per-episode
passes' within the tolerance of GRPO's shared-prompt tests (1e-5), for credit by episode and by
turn, with gradient accumulation, epochs, the reference's pass and a sharded batch; minibatches
shuffle whole games; partial and async modes at staleness 0 still equal synchronous multi-turn
GRPO with it, bit for bit (those three marked slow)."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from algos import multiturn, optimizer_steps
from algos.partial import Partial
from envs.text import multiturn as games
from jaxrl import hparams, sharding
from jaxrl.config import ConfigError
from jaxrl.lm import dialogue, training
from jaxrl.lm.model import Transformer, param_shardings, token_statistics
from jaxrl.lm.sampler import Sampling, SamplingConfig
from tests.test_multiturn import BYTES, TINY, digits_model

ATOL = 1e-5  # tests/test_grpo_shared_prompt.py's, for log-probs, gradients and parameters
ENV = games.make_guess_my_number(BYTES, maximum=8, max_turns=4)
BUDGET = 4
GAMES, GROUP = 3, 4
TEMPERATURE = 0.7
TURN_SLOTS = dialogue.turn_slots(ENV.max_turns, BUDGET, ENV.max_message_tokens)
# Small enough that Adam keeps the passes' rounding below ATOL in the parameters (as GRPO's
# shared-prompt test), large enough that every update moves them by many ATOLs.
LEARNING_RATE = 1e-4


@pytest.fixture(scope="module")
def played():
    """GAMES games x GROUP episodes each (a game's episodes adjacent, one reset key), as
    multi-turn GRPO's rollout plays them: the episodes and the sampling parameters."""
    params = digits_model(1)
    sampling = SamplingConfig(BUDGET, BYTES.eos_id, BYTES.pad_id, TEMPERATURE)
    reset_keys = jnp.repeat(jax.random.split(jax.random.key(1), GAMES), GROUP, axis=0)
    sample_keys = jax.random.split(jax.random.key(101), GAMES * GROUP)
    run = jax.jit(lambda p: dialogue.converse(TINY, p, ENV, reset_keys, sample_keys, sampling))
    episodes, _ = run(params)
    return params, jax.device_get(episodes)


def test_the_episodes_of_a_game_share_their_opening_slot_for_slot(played):
    """The first S - turn_slots slots (tokens, mask, positions) are the same in every episode
    of a game, and hold the opening; the turns after them differ."""
    _, episodes = played
    size = episodes.tokens.shape[1]
    opening = size - TURN_SLOTS
    assert opening == len(BYTES.encode(games.plain_render(ENV.messages[0], True)))
    for name in ("tokens", "mask", "positions"):
        grouped = getattr(episodes, name).reshape(GAMES, GROUP, size)
        np.testing.assert_array_equal(
            grouped[:, :, :opening], np.repeat(grouped[:, :1, :opening], GROUP, 1), err_msg=name
        )
    assert not episodes.policy_mask[:, :opening].any()
    turns = episodes.tokens.reshape(GAMES, GROUP, size)[:, :, opening:]
    assert any(not (turns[g] == turns[g, :1]).all() for g in range(GAMES))


def _logits(params, episodes, gathered, policy_pass):
    return policy_pass(
        Transformer(TINY), params, episodes.tokens, episodes.positions, episodes.mask,
        gathered.predictors,
    )  # fmt: skip


def test_shared_opening_logits_and_log_probs_equal_per_episode(played):
    """The policy tokens' logits and log-probs at the sampling temperature, shared opening
    against every episode over its own slots; and those are the sampler's log-probs."""
    params, episodes = played
    gathered = dialogue.policy_tokens(episodes, ENV.max_turns * BUDGET)
    shared = dialogue.PolicyPass(GROUP, TURN_SLOTS)
    want = jax.jit(_logits, static_argnums=3)(params, episodes, gathered, dialogue.PER_EPISODE)
    got = jax.jit(_logits, static_argnums=3)(params, episodes, gathered, shared)
    valid = np.asarray(gathered.valid)
    assert valid.sum() > 40 and valid[:, 0].all()  # first tokens predicted from the opening
    np.testing.assert_allclose(np.asarray(got)[valid], np.asarray(want)[valid], atol=ATOL)
    got_lp = token_statistics(got, gathered.tokens, TEMPERATURE).log_probs
    want_lp = token_statistics(want, gathered.tokens, TEMPERATURE).log_probs
    np.testing.assert_allclose(np.where(valid, got_lp, 0), np.where(valid, want_lp, 0), atol=ATOL)
    np.testing.assert_allclose(
        np.where(valid, got_lp, 0), gathered.sampled_log_probs, atol=2e-5
    )  # test_multiturn's tolerance for the sampler's
    size = episodes.tokens.shape[1]
    assert shared.tokens(GAMES * GROUP, size) == GAMES * (size + (GROUP - 1) * TURN_SLOTS)
    assert dialogue.PER_EPISODE.tokens(GAMES * GROUP, size) == GAMES * GROUP * size


@pytest.mark.parametrize("credit", ["episode", "turn"])
def test_the_loss_and_its_gradients_equal_per_episode(played, credit):
    """Multi-turn GRPO's loss (with the KL penalty to a reference, the entropy bonus and the
    uniform KL) and its gradients over a training batch of the played games, shared opening
    against per episode."""
    params, episodes = played
    settings = dict(gamma=0.9) if credit == "turn" else {}
    config = multiturn.Config(
        batch_size=GAMES, group_size=GROUP, credit=credit, kl_beta=0.05, entropy_coef=0.01,
        uniform_kl_coef=0.02, shared_prompt=True,
        sampling=Sampling(max_new_tokens=BUDGET, temperature=TEMPERATURE), **settings,
    )  # fmt: skip
    hp = hparams.hparams(config)
    capacity = ENV.max_turns * BUDGET
    batch, _ = multiturn.training_batch(config, episodes, hp, capacity, ENV.max_turns)
    assert np.abs(batch["advantages"]).max() > 0.1
    reference = jax.tree.map(lambda p: p * 0.9, params)
    per_episode = dialogue.PER_EPISODE
    batch["reference_log_probs"] = token_statistics(
        multiturn.policy_logits_of(Transformer(TINY), reference, batch, per_episode),
        batch["targets"],
        TEMPERATURE,
    )[0]
    shared = multiturn.choose_policy_pass(config, ENV)
    assert shared == dialogue.PolicyPass(GROUP, TURN_SLOTS)
    assert multiturn.choose_policy_pass(dataclasses.replace(config, shared_prompt=False), ENV) == (
        per_episode
    )
    results = []
    for policy_pass in (per_episode, shared):
        loss_fn = multiturn.make_loss(Transformer(TINY), config, capacity, policy_pass=policy_pass)
        grad_fn = jax.jit(jax.value_and_grad(lambda p, b, f=loss_fn: f(p, b, hp), has_aux=True))
        results.append(jax.device_get(grad_fn(params, batch)))
    ((want_loss, want), want_grads), ((got_loss, got), got_grads) = results
    np.testing.assert_allclose(got_loss, want_loss, atol=ATOL, rtol=1e-5)
    for name in want:
        np.testing.assert_allclose(got[name], want[name], atol=ATOL, rtol=1e-5, err_msg=name)
    for (path, w), g in zip(
        jax.tree_util.tree_leaves_with_path(want_grads), jax.tree.leaves(got_grads), strict=True
    ):
        np.testing.assert_allclose(g, w, atol=ATOL, rtol=0, err_msg=jax.tree_util.keystr(path))
    assert max(np.abs(g).max() for g in jax.tree.leaves(want_grads)) > 100 * ATOL


def test_minibatches_of_whole_games_equal_the_per_episode_pass_over_them(played):
    """num_minibatches = 3 over the 3 played games, two epochs: the shared update shuffles whole
    games into minibatches (the per-episode update shuffles episodes: not the same minibatches).
    Over the same game-shuffled minibatches the per-episode pass gives the same parameters and
    metrics; were a game split, its packed episodes would read another game's opening."""
    params, episodes = played
    config = multiturn.Config(
        batch_size=GAMES, group_size=GROUP, num_minibatches=GAMES, num_epochs=2, kl_beta=0.05,
        sampling=Sampling(max_new_tokens=BUDGET, temperature=TEMPERATURE), shared_prompt=True,
        learning_rate=LEARNING_RATE,
    )  # fmt: skip
    hp = hparams.hparams(config)
    capacity = ENV.max_turns * BUDGET
    batch, _ = multiturn.training_batch(config, episodes, hp, capacity, ENV.max_turns)
    batch = jax.tree.map(jnp.asarray, batch)  # the shuffle indexes it inside the program
    model = Transformer(TINY)

    def per_episode_old_log_probs(p, b):
        logits = multiturn.policy_logits_of(model, p, b)
        return jax.lax.stop_gradient(token_statistics(logits, b["targets"], TEMPERATURE)[0])

    shared = multiturn.choose_policy_pass(config, ENV)
    per_episode_loss = multiturn.make_loss(model, config, capacity)
    optimizers = [
        # Both shuffle whole games of GROUP rows; only the pass differs.
        optimizer_steps.optimize_with(
            per_episode_loss, per_episode_old_log_probs, config, None, group_size=GROUP,
            denominators=multiturn.step_normalisers,
        ),
        multiturn.make_optimize(
            model, multiturn.make_loss(model, config, capacity, policy_pass=shared), config,
            None, shared,
        ),
    ]  # fmt: skip
    init = training.make_init(params, config)
    reference = jax.tree.map(lambda p: p * 0.9, params)
    results = []
    for optimize in optimizers:
        state = init(jax.random.key(1), hp)
        run = jax.jit(lambda s, o=optimize: o(s, batch, hp, jax.random.key(2), s.params, reference))
        results.append(jax.device_get(run(state)))
    (want_state, want), (got_state, got) = results
    for name in want:
        np.testing.assert_allclose(got[name], want[name], atol=ATOL, rtol=1e-5, err_msg=name)
    for w, g in zip(*map(jax.tree.leaves, (want_state.params, got_state.params)), strict=True):
        np.testing.assert_allclose(g, w, atol=ATOL, rtol=0)
    leaves = zip(jax.tree.leaves(want_state.params), jax.tree.leaves(params), strict=True)
    assert max(np.abs(w - p).max() for w, p in leaves) > 10 * ATOL


def _updates(config, count, mesh_shape=(1, 1, 1), rollout=None, reference=False):
    """`count` jitted multi-turn updates on ENV from the digit-favouring model (on a mesh of
    `mesh_shape`, with the starting parameters as the KL reference when `reference`): the
    parameters and metrics after each, and the starting parameters."""
    config = dataclasses.replace(config, mesh_shape=mesh_shape)
    params, mesh = digits_model(), None
    if mesh_shape != (1, 1, 1):
        mesh = sharding.make_mesh(*mesh_shape)
        params = jax.device_put(params, param_shardings(TINY, mesh))
    algorithm = multiturn.make(config, TINY, ENV, params, BYTES.eos_id, BYTES.pad_id, mesh, rollout)
    hp = hparams.hparams(config)
    if mesh is not None:
        hp = jax.device_put(hp, sharding.replicated(mesh))
    inputs = multiturn.Inputs(params) if reference else None
    state = algorithm.init(jax.random.key(0), hp)
    update = jax.jit(algorithm.update)
    states, metrics = [], []
    for _ in range(count):
        state, m = update(state, inputs, hp)
        states.append(jax.device_get(state.params))
        metrics.append(jax.device_get(m))
    return states, metrics, jax.device_get(params)


UPDATE = dict(
    batch_size=2, group_size=4, sampling=Sampling(max_new_tokens=BUDGET),
    learning_rate=LEARNING_RATE, grad_accum_steps=2, warn_no_signal_updates=0,
)  # fmt: skip


@pytest.mark.parametrize(
    "settings,mesh_shape",
    [
        # two epochs (the old policy's pass) and the reference's pass, one game a micro-batch
        (dict(credit="episode", num_epochs=2, kl_beta=0.05), (1, 1, 1)),
        # per-turn credit and the entropy bonus on a (2, 1, 1) mesh of simulated devices: 4
        # games, 2 micro-batches of 2 games, one game on each batch shard
        (dict(credit="turn", gamma=0.9, entropy_coef=0.01, batch_size=4), (2, 1, 1)),
    ],
    ids=["episode_epochs_kl", "turn_entropy_mesh"],
)
def test_shared_update_equals_the_per_episode_update(settings, mesh_shape):
    """Two updates with shared_prompt equal two without: the same games played (returns, turns,
    policy tokens), losses and metrics and parameters within ATOL; and the parameters moved by
    far more than that."""
    today = multiturn.Config(**(UPDATE | settings))
    shared = dataclasses.replace(today, shared_prompt=True)
    reference = today.kl_beta > 0
    want_params, want, start = _updates(today, 2, mesh_shape, reference=reference)
    got_params, got, _ = _updates(shared, 2, mesh_shape, reference=reference)
    for m_want, m_got in zip(want, got, strict=True):
        for name in ("return", "turns", "policy_tokens"):
            np.testing.assert_array_equal(m_got[name], m_want[name], err_msg=name)
        for name in ("loss", "entropy", "kl", "grad_norm", "logprob_mismatch_mean"):
            if name in m_want:
                np.testing.assert_allclose(
                    m_got[name], m_want[name], atol=ATOL, rtol=1e-5, err_msg=name
                )
    for w_params, g_params in zip(want_params, got_params, strict=True):
        for (path, w), g in zip(
            jax.tree_util.tree_leaves_with_path(w_params), jax.tree.leaves(g_params), strict=True
        ):
            np.testing.assert_allclose(g, w, atol=ATOL, rtol=0, err_msg=jax.tree_util.keystr(path))
    leaves = zip(jax.tree.leaves(want_params[-1]), jax.tree.leaves(start), strict=True)
    assert max(np.abs(w - p).max() for w, p in leaves) > 10 * ATOL


def test_partial_with_bound_zero_equals_synchronous_multiturn_grpo_with_shared_openings():
    """Partial rollouts at staleness 0 with shared openings: the same parameters and losses, bit
    for bit, as synchronous multi-turn GRPO with them (the games it trains are whole and in
    order, their openings kept in the slots' records from slot 0)."""
    config = multiturn.Config(**(UPDATE | dict(credit="turn", gamma=0.9, shared_prompt=True)))
    sync_params, sync_metrics, _ = _updates(config, 2)
    partial_params, partial_metrics, _ = _updates(config, 2, rollout=Partial())
    for want, got, m_want, m_got in zip(
        sync_params, partial_params, sync_metrics, partial_metrics, strict=True
    ):
        for a, b in zip(jax.tree.leaves(want), jax.tree.leaves(got), strict=True):
            np.testing.assert_array_equal(a, b)
        assert m_got["loss"] == m_want["loss"]


def test_shared_prompt_refused_where_a_pass_would_split_a_game():
    cases = [
        dict(grad_accum_steps=4),  # micro-batches of 2 episodes, games of 4
        dict(num_minibatches=2, grad_accum_steps=2),  # the same through minibatches
        dict(mesh_shape=(2, 1, 1), grad_accum_steps=2),  # 4 episodes over 2 batch shards
    ]
    for settings in cases:
        with pytest.raises(ConfigError, match="^shared_prompt: .*; .*") as error:
            multiturn.Config(batch_size=2, group_size=4, shared_prompt=True, **settings)
        assert "\n" not in str(error.value) and "length_buckets" not in str(error.value)
    multiturn.Config(batch_size=2, group_size=4, shared_prompt=True, grad_accum_steps=2)
    multiturn.Config(batch_size=2, group_size=4, grad_accum_steps=4)  # off: nothing to split


def test_async_with_bound_zero_equals_synchronous_multiturn_grpo_with_shared_openings():
    """Async at staleness 0 (fp32 generation copy, one device) with shared openings: the same
    returns, losses and parameters, bit for bit, as synchronous multi-turn GRPO with them (its
    batches train through the same passes)."""
    from algos.asynchronous import Async
    from tests.test_async_rollouts import MT_SYNC, _multiturn_updates

    config = multiturn.Config(**MT_SYNC, shared_prompt=True)
    sync_states, sync_metrics, _ = _multiturn_updates(config, 2)
    async_states, async_metrics, _ = _multiturn_updates(
        config, 2, rollout=Async(generation_dtype="float32")
    )
    for want, got, m_want, m_got in zip(
        sync_states, async_states, sync_metrics, async_metrics, strict=True
    ):
        for a, b in zip(*map(jax.tree.leaves, (want.params, got.params)), strict=True):
            np.testing.assert_array_equal(jax.device_get(a), jax.device_get(b))
        for name in ("return", "loss", "policy_tokens", "logprob_mismatch_max"):
            assert m_got[name] == m_want[name], name
