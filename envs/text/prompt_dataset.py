"""A text task made from a user's prompt file: the prompts of a `jaxrl.data.prompts.PromptTable`,
sampled inside the compiled program, and rewards that are the user's own Python functions.

    table = tokenize_prompts(read_prompt_jsonl("train.jsonl"), tokenizer)
    task = prompt_dataset_task("train.jsonl", table, tokenizer)
    task = task.with_reward(host_reward(math_answer_reward, tokenizer, "answer", table=table))

Each sampled prompt carries its row index (`PromptBatch.row`), which is how a host reward finds
the row's other columns (the `answer`, say) without decoding anything back from tokens
(`envs.text.reward_terms.host_reward`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import numpy as np

from envs.text.task import PromptBatch, TextTask

if TYPE_CHECKING:
    from jaxrl.data.prompts import PromptTable

Array = jax.Array


def sample_rows(key: Array, count: int, data: dict[str, Array]) -> PromptBatch:
    """`count` distinct rows of the table `data` (tokens and mask [R, P]) drawn uniformly, with
    replacement only when the table has fewer than `count` rows. Prompts of a file have no answer
    tokens: their answers are columns that host rewards read by row."""
    num_rows = data["tokens"].shape[0]
    row = jax.random.choice(key, num_rows, (count,), replace=count > num_rows).astype(jnp.int32)
    no_answer = jnp.zeros((count, 1), jnp.int32)
    # The table may be the task's own NumPy arrays (closed over, as partial mode's shapes read
    # it) or the update's traced input: index it as a JAX array either way.
    tokens, mask = jnp.asarray(data["tokens"]), jnp.asarray(data["mask"])
    return PromptBatch(tokens[row], mask[row], no_answer, jnp.zeros(count, jnp.int32), row)


def prompt_dataset_task(name: str, table: PromptTable, tokenizer: Any) -> TextTask:
    """The task of sampling `table`'s prompts, with no reward terms yet (add the user's with
    `with_reward`). Its `data` holds the table's tokens and mask as NumPy arrays; the algorithm
    places them on the device and passes them into its update."""
    data = {"tokens": np.asarray(table.tokens), "mask": np.asarray(table.mask)}
    return TextTask(name, sample_rows, (), tokenizer.eos_id, tokenizer.pad_id, data)
