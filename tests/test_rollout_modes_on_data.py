"""Every rollout mode on every data source (issue 60): partial and async mode draw their prompts
from a prompt file's table as synchronous GRPO does. Partial mode read the table's shapes from
the task's NumPy arrays with a traced row index, and crashed (TracerArrayConversionError) on any
prompt file or rows, the shipped word_problems preset included; it ran only on the built-in
tasks, which draw prompts in JAX.

At bound 0 both modes equal synchronous GRPO on a prompt file and on chat prompts, bit for bit,
as they do on the built-in task (test_partial_rollouts, test_async_rollouts); from Python, rows
in memory train 2 updates in each mode with a host reward."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from algos import grpo
from algos.asynchronous import Async
from algos.partial import Partial
from envs.text.prompt_dataset import prompt_dataset_task
from envs.text.task import RewardTerm
from jaxrl import hparams
from jaxrl.data.prompts import read_prompt_jsonl, tokenize_prompts
from jaxrl.lm.model import ModelConfig, init_params
from jaxrl.lm.sampler import Sampling
from jaxrl.lm.tokenizer import ByteTokenizer, load_tokenizer
from tests.test_prompt_data import FIXTURES, chat_tokenizer_dir

BYTES = ByteTokenizer()
TINY = ModelConfig(
    vocab_size=259, hidden_size=32, intermediate_size=64, num_layers=1, num_heads=2,
    num_kv_heads=1, max_position_embeddings=128,
)  # fmt: skip
# A dense reward (the fraction of even token ids), so that every update moves the parameters.
EVEN = RewardTerm("even", 1.0, lambda prompts, c: jnp.mean((c.tokens % 2 == 0) & c.mask, axis=1))
CONFIG = grpo.Config(
    batch_size=4, group_size=2, sampling=Sampling(max_new_tokens=4), learning_rate=3e-3
)
MODES = {
    "partial": Partial(rollout_budget=4),  # the budget covers max_new_tokens: bound 0
    "async": Async(generation_dtype="float32"),  # one device: the programs take turns
}


def file_task(name: str, tokenizer):
    """A task of the fixture prompt file `name` (its table the task's `data`), rewarded by EVEN."""
    table = tokenize_prompts(read_prompt_jsonl(f"{FIXTURES}/prompts/{name}"), tokenizer)
    return prompt_dataset_task(name, table, tokenizer)._replace(reward_terms=(EVEN,))


def updates(task, rollout=None, count=2):
    """`count` updates from the same start with `rollout` (None: sync): the parameters and
    metrics after the last."""
    params = init_params(TINY, jax.random.key(0))
    algorithm = grpo.make(CONFIG, TINY, task, params, None, rollout)
    hp = hparams.hparams(CONFIG)
    state = algorithm.init(jax.random.key(3), hp)
    update = algorithm.update if isinstance(rollout, Async) else jax.jit(algorithm.update)
    inputs = grpo.Inputs(task_data=task.data)
    for _ in range(count):
        state, metrics = update(state, inputs, hp)
    return jax.device_get(state.params), jax.device_get(metrics)


_sync: dict = {}


@pytest.mark.parametrize("source", ["say_digit.jsonl", "say_digit_chat.jsonl"])
@pytest.mark.parametrize("mode", list(MODES))
def test_bound_zero_equals_sync_on_a_prompt_file(mode, source, tmp_path):
    """String prompts (the byte tokenizer) and chat prompts (the fixture tokenizer's ChatML
    template): partial and async mode at bound 0 take synchronous GRPO's 2 updates."""
    chat = "chat" in source
    tokenizer = load_tokenizer(chat_tokenizer_dir(tmp_path)) if chat else BYTES
    task = file_task(source, tokenizer)
    if source not in _sync:
        _sync[source] = updates(task)
    (want, want_metrics), (got, got_metrics) = _sync[source], updates(task, MODES[mode])
    for a, b in zip(jax.tree.leaves(want), jax.tree.leaves(got), strict=True):
        np.testing.assert_array_equal(a, b)
    start = jax.tree.leaves(init_params(TINY, jax.random.key(0)))
    moved = max(np.abs(a - b).max() for a, b in zip(start, jax.tree.leaves(got), strict=True))
    assert moved > 1e-4  # the updates changed the parameters: the equality is not vacuous
    for name in ("reward", "loss", "completion_length"):
        assert got_metrics[name] == want_metrics[name], name
    assert got_metrics["staleness_max"] == 0


@pytest.mark.parametrize(
    "mode,settings",
    [("partial", dict(rollout_budget=6, max_staleness=1)), ("async", dict(max_staleness=1))],
)
def test_rows_from_python_train_in_every_mode(mode, settings, tmp_path):
    """The README's GRPO call (rows in memory and a reward function, the word_problems preset
    on the tiny model, 2 updates) in partial and async mode, with a staleness bound of 1 (the
    command the issue saw crash, on rows instead of the preset's file)."""
    from jaxrl.trainers import grpo as trainer
    from tests.test_small_data import ROWS, contains_answer

    config = trainer.config("word_problems")
    config.init_from = ""  # the tiny random model
    config.num_steps = 2
    config.rollout_mode = mode
    for name, value in settings.items():
        setattr(config, name, value)
    result = trainer.train(config, tmp_path / "run", train_data=ROWS, rewards=[contains_answer])
    assert result.summary["steps"] == 2
    saved = json.loads((tmp_path / "run" / "config.json").read_text())
    assert saved["rollout_mode"] == mode
    assert 0.0 <= result.summary["eval_task_accuracy"] <= 1.0
