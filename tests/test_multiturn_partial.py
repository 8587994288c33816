"""Partial rollouts of multi-turn episodes (issue 39, item 4; algos/multiturn_partial.py):
conversations carried across updates. With the bound at 0 they are synchronous multi-turn GRPO
bit for bit; over a longer run with a budget of one turn, conversations carry over, staleness
stays within its bound, and a carried conversation's recorded log-probs are the trainer's; a
checkpoint taken mid-conversation resumes equal to an uninterrupted run."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from algos import multiturn
from algos.partial import Partial
from envs.text import multiturn as games
from jaxrl import hparams
from jaxrl.config import ConfigError
from jaxrl.lm import dialogue
from jaxrl.lm.model import Transformer
from jaxrl.lm.sampler import Sampling
from jaxrl.trainers import rollout_modes
from tests.test_multiturn import BYTES, TINY, digits_model

ENV = games.make_guess_my_number(BYTES, maximum=8, max_turns=4)
SYNC = multiturn.Config(
    batch_size=2, group_size=4, sampling=Sampling(max_new_tokens=4), learning_rate=1e-3,
    credit="turn", gamma=0.9,
)  # fmt: skip


def ends_early(env):
    """`env` whose game also ends after 1 + secret % 4 turns: a game's conversations all last
    as long, and games last 1 to 4 turns, so slots free at different updates and new games
    start beside conversations carried mid-game."""

    def step(state, utterance):
        state, message, reward, done = env.step(state, utterance)
        done = done | (state.turn >= 1 + state.secret % 4)
        return state._replace(done=done), message, reward, done

    return env._replace(step=step)


STAGGERED = ends_early(ENV)
# One turn per update: a conversation of 4 turns spans 4 updates, so its first tokens are 3
# versions old when it trains. 3 games in the slots, 2 trained per update (APRIL's
# over-provisioning).
CARRIED = dataclasses.replace(SYNC, sampling=Sampling(max_new_tokens=4, temperature=1.5))
CARRYING = Partial(rollout_budget=1, max_staleness=3, rollout_groups=3)


def run_updates(config, count, hp=None, state=None, update=None, env=ENV, rollout=None):
    """`count` jitted updates from `state` (or a fresh one, seed 0) with `rollout` (None:
    sync); the algorithm, the hyper-parameters, the jitted update, and the states and metrics
    after each."""
    algorithm = multiturn.make(
        config, TINY, env, digits_model(), BYTES.eos_id, BYTES.pad_id, rollout=rollout
    )
    hp = hparams.hparams(config) if hp is None else hp
    state = algorithm.init(jax.random.key(0), hp) if state is None else state
    update = jax.jit(algorithm.update) if update is None else update
    states, metrics = [], []
    for _ in range(count):
        state, m = update(state, None, hp)
        states.append(state)
        metrics.append(jax.device_get(m))
    return algorithm, hp, update, states, metrics


@pytest.fixture(scope="module")
def carried_run():
    """Ten updates of CARRIED on STAGGERED (one compile, shared by the tests below)."""
    return run_updates(CARRIED, 10, env=STAGGERED, rollout=CARRYING)


def test_partial_with_bound_zero_equals_synchronous_multiturn_grpo():
    """Staleness 0 and a budget of max_turns (rollout_budget 0): every conversation starts and
    ends in one update; the same conversations (tokens, loss mask, sampler log-probs, rewards)
    and the same parameters after each of 2 updates, bit for bit (fp32)."""
    *_, sync_states, sync_metrics = run_updates(SYNC, 2)
    *_, states, metrics = run_updates(SYNC, 2, rollout=Partial())
    rollout = jax.jit(multiturn.make_rollout(SYNC, TINY, ENV, BYTES.eos_id, BYTES.pad_id))
    hp = hparams.hparams(SYNC)
    params = digits_model()
    for i in range(2):
        key = jax.random.split(jax.random.fold_in(sync_states[i].key, i))[0]
        batch, _ = rollout(params, key, hp)
        conversations = states[i].slots.conversations
        record = conversations["record"]
        np.testing.assert_array_equal(record["mask"], batch["mask"])
        real = np.asarray(batch["mask"])
        np.testing.assert_array_equal(np.asarray(record["tokens"])[real], batch["tokens"][real])
        np.testing.assert_array_equal(
            np.asarray(record["positions"])[real], batch["positions"][real]
        )
        gathered = dialogue.policy_tokens(
            dialogue.episodes_of(dict(conversations, record=record)),
            ENV.max_turns * SYNC.sampling.max_new_tokens,
        )
        np.testing.assert_array_equal(gathered.tokens, batch["targets"])
        np.testing.assert_array_equal(gathered.valid, batch["valid"])
        np.testing.assert_array_equal(gathered.sampled_log_probs, batch["sampler_log_probs"])
        assert batch["valid"].sum() > 20
        for a, b in zip(
            jax.tree.leaves(sync_states[i].params), jax.tree.leaves(states[i].params), strict=True
        ):
            np.testing.assert_array_equal(a, b)
        moved = max(
            float(np.abs(a - b).max())
            for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(states[i].params), strict=True)
        )
        assert moved > 1e-5  # the update did change the parameters
        params = states[i].params
        assert metrics[i]["trained_groups"] == 2 and metrics[i]["staleness_max"] == 0
        assert metrics[i]["carried_conversations"] == 0
        for name in ("loss", "return", "logprob_mismatch_mean", "logprob_mismatch_max"):
            assert metrics[i][name] == sync_metrics[i][name], name
        assert metrics[i]["logprob_mismatch_max"] < 1e-5


def test_conversations_carry_over_within_the_staleness_bound(carried_run):
    """Ten updates of one turn each (bound 3) on games of 1 to 4 turns: conversations are
    carried across updates, freed slots take new games beside them, no trained token is older
    than the bound, every group trains once it ended (none dropped)."""
    *_, states, metrics = carried_run
    ages = [float(m["staleness_max"]) for m in metrics]
    assert max(ages) <= 3, ages
    assert max(ages) >= 1, ages  # conversations trained after more than one update
    assert any(m["carried_conversations"] > 0 for m in metrics)
    assert sum(m["trained_groups"] for m in metrics) >= 4
    for m in metrics:
        assert m["dropped_groups"] == 0 and m["trained_groups"] <= 2
        # A budget of one turn: at most one turn's columns (4 tokens, an end, a message).
        assert m["decode_columns"] <= SYNC.sampling.max_new_tokens + 1 + ENV.max_message_tokens
        histogram = sum(m[f"staleness_{age}"] for age in range(4))
        assert m["trained_tokens"] == 0 or abs(histogram - 1) < 1e-6
        assert 0 <= m["offpolicy_token_fraction"] <= 1
        assert m["logprob_mismatch_max"] < 1e-4, m["logprob_mismatch_max"]
    # Slots freed at different updates: new games beside conversations carried mid-game.
    assert any(len(set(np.asarray(state.slots.started).tolist())) > 1 for state in states)
    # A slot's conversation spans updates: some live slot started before the last update.
    slots = states[-1].slots
    live, started = np.asarray(slots.live), np.asarray(slots.started)
    assert (live & (started < len(states) - 1)).any()
    versions = np.asarray(slots.conversations["record"]["versions"])
    policy = np.asarray(slots.conversations["record"]["policy_mask"])
    assert np.all(versions[policy] < len(states))


def test_carried_conversations_continue_where_they_stopped(carried_run):
    """With the parameters held (a learning rate of 1e-30), the log-prob every slot's sampler
    recorded for each policy token, whichever update spoke it,
    equals the trainer's recomputed from the whole recorded conversation: the cache moved left
    between updates and refilled slots lost nothing of a carried conversation."""
    _, _, update, _, _ = carried_run
    held = hparams.hparams(dataclasses.replace(CARRIED, learning_rate=1e-30))
    *_, states, _ = run_updates(CARRIED, 6, hp=held, update=update, env=STAGGERED, rollout=CARRYING)
    leaves = jax.tree.leaves(digits_model()), jax.tree.leaves(states[-1].params)
    assert max(float(np.abs(a - b).max()) for a, b in zip(*leaves, strict=True)) < 1e-20
    params = digits_model()

    @jax.jit
    def recorded_and_recomputed(conversations):
        episodes = dialogue.episodes_of(conversations)
        gathered = dialogue.policy_tokens(episodes, ENV.max_turns * SYNC.sampling.max_new_tokens)
        recomputed = dialogue.policy_log_probs(
            Transformer(TINY), params, episodes, gathered, CARRIED.sampling.temperature
        )
        versions = jnp.take_along_axis(conversations["record"]["versions"], gathered.slots, 1)
        return gathered.sampled_log_probs, recomputed, gathered.valid, versions

    spans = []
    for state in states[2:]:
        recorded, recomputed, valid, versions = map(
            np.asarray, recorded_and_recomputed(state.slots.conversations)
        )
        spans += [len(set(versions[row][valid[row]])) for row in range(valid.shape[0])]
        gap = np.abs(recomputed - recorded)[valid]
        assert gap.max() < 1e-4, gap.max()
    # Conversations spoken over 2, 3 and 4 updates (the cache moved left 1 to 3 times).
    assert {2, 3, 4} <= set(spans), spans


def test_checkpoint_mid_conversation_resumes_equal_to_an_uninterrupted_run(carried_run, tmp_path):
    """The carried conversations are part of the state: saved after update 2 (conversations
    half played), restored into a fresh state and run on for 3 updates, the run is where the
    uninterrupted one was after update 5."""
    from jaxrl.checkpoint import Checkpointer

    algorithm, hp, update, states, _ = carried_run
    state = states[1]
    live, done = np.asarray(state.slots.live), np.asarray(state.slots.conversations["done"])
    assert (live & ~done).any()  # conversations carried mid-play
    checkpoints = Checkpointer(str(tmp_path / "checkpoints"))
    checkpoints.save(2, state, {})
    resumed, _ = checkpoints.restore(algorithm.init(jax.random.key(0), hp))
    *_, resumed_states, _ = run_updates(
        CARRIED, 3, hp=hp, state=resumed, update=update, env=STAGGERED, rollout=CARRYING
    )
    uninterrupted = states[4]
    for a, b in zip(
        jax.tree.leaves(uninterrupted), jax.tree.leaves(resumed_states[-1]), strict=True
    ):
        if jnp.issubdtype(a.dtype, jax.dtypes.prng_key):
            a, b = jax.random.key_data(a), jax.random.key_data(b)
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.parametrize(
    "settings, field, message",
    [
        (dict(rollout_budget=5, max_staleness=3), "rollout_budget", "more than a game's"),
        (dict(rollout_budget=1, max_staleness=2), "max_staleness", "raise max_staleness to 3"),
        (dict(rollout_budget=-1), "rollout_budget", "whole number"),
        (dict(rollout_groups=1), "rollout_groups", "fewer than the batch_size"),
    ],
)
def test_partial_config_errors_name_the_field(settings, field, message):
    """One-line errors naming the field: from the Config, or from make (the game's turns)."""
    with pytest.raises(ConfigError, match=f"^{field}:.*{message}"):
        rollout = Partial(**settings)
        multiturn.make(SYNC, TINY, ENV, None, BYTES.eos_id, BYTES.pad_id, rollout=rollout)


def test_a_turn_budget_is_not_checked_against_max_new_tokens():
    """rollout_budget counts turns here: 3 turns with 2-token turns is a valid Config."""
    settings = dict(max_new_tokens=2, rollout_mode="partial", rollout_budget=3, max_staleness=1)
    _, rollout = rollout_modes.configure(multiturn.Config, settings, multiturn.check_rollout)
    assert rollout.rollout_budget == 3


# --- through the script: kill -9 after a checkpoint mid-conversation, then resume -------------

SCRIPT_SMALL = [
    "--config.task.max_turns=3",
    "--config.task.num_eval=8",
    "--config.batch_size=2",
    "--config.group_size=4",
    "--config.num_steps=8",
    "--config.run.num_chunks=4",
    "--config.run.log_every=1",
    "--config.max_new_tokens=3",
    "--config.eval_samples=0",
    "--config.rollout_mode=partial",
    "--config.rollout_budget=1",
    "--config.max_staleness=2",
]


# Three runs of experiments/multiturn.py: 39 s of a run with 2 pytest workers.
def test_multiturn_partial_run_killed_after_a_checkpoint_mid_conversation_resumes_equal(tmp_path):
    """experiments/multiturn.py in partial mode, SIGKILLed right after its first checkpoint
    (update 2 of 8: every conversation is mid-game, 3 turns at one a turn per update), then
    the same command: every metrics row, the summary's counts and the final parameters are
    the uninterrupted run's; the summary counts the episodes trained on."""
    import orbax.checkpoint as ocp

    from tests.script_runs import checkpoint_steps, run_script
    from tests.test_lm_experiment import QUIET, assert_same_params, read_json, read_metrics

    whole, parts = str(tmp_path / "whole"), str(tmp_path / "parts")
    run_script("multiturn.py", *SCRIPT_SMALL, *QUIET, f"--workdir={whole}")
    flags = [*SCRIPT_SMALL, *QUIET, f"--workdir={parts}"]
    killed = run_script("multiturn.py", *flags, "--kill_after_chunk=1", check=False)
    assert killed.returncode == -9, killed.stderr[-3000:]
    assert checkpoint_steps(parts) == [2]
    with ocp.StandardCheckpointer() as checkpointer:
        state = checkpointer.restore(f"{parts}/checkpoints/2/state")
    slots = state["slots"] if isinstance(state, dict) else state[4]
    live = np.asarray(slots["live"] if isinstance(slots, dict) else slots[1])
    assert live.all()  # every conversation carried mid-game
    run_script("multiturn.py", *flags)
    assert read_metrics(parts) == read_metrics(whole)
    a, b = read_json(whole), read_json(parts)
    for key in ("episodes", "eval_success", "final_success"):
        assert a[key] == b[key], key
    assert_same_params(whole, parts)
    rows = [row for row in read_metrics(whole) if "loss" in row]
    assert a["episodes"] == sum(row["trained_groups"] for row in rows) * 4 < 8 * 8
