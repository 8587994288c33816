"""A text task's reward terms as an algorithm scores completions with them: their weighted sum
(`task_rewards`), and a term computed by ordinary Python on the host (`host_reward`), TRL's
`f(prompts, completions, **columns) -> list[float]`, called from inside the compiled update.

    task = task.with_reward(host_reward(math_answer_reward, tokenizer, "answer", table=table))
    rewards, metrics = task_rewards(task, prompts, completion)   # [B], {"reward_answer": ...}
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import io_callback

from envs.text.task import PromptBatch, RewardTerm, TextTask
from jaxrl import host, sharding
from jaxrl.lm.sampler import Completion

if TYPE_CHECKING:
    from jaxrl.data.prompts import PromptTable

Array = jax.Array


def task_rewards(
    task: TextTask, prompts: PromptBatch, completion: Completion
) -> tuple[Array, dict[str, Array]]:
    """The task's reward of each completion [B], the weighted sum of its terms, and each term's
    batch mean as the metric `reward_<name>`."""
    metrics = {}
    rewards = jnp.zeros(completion.lengths.shape, jnp.float32)
    for term in task.reward_terms:
        value = term.fn(prompts, completion).astype(jnp.float32)
        metrics[f"reward_{term.name}"] = value.mean()
        rewards = rewards + term.weight * value
    return rewards, metrics


def host_reward(
    fn: Callable[..., Sequence[float]],
    tokenizer: Any,
    name: str = "host",
    weight: float = 1.0,
    mesh: Any = None,
    table: PromptTable | None = None,
) -> RewardTerm:
    """A reward computed by ordinary Python on the host, `fn(prompts, completions, **columns)`
    (TRL's signature), called from inside the compiled step through `io_callback`.

    On a prompt file's task (`table` given: the `PromptTable` the task samples) `prompts` are the
    rows' prompts as the file gives them (strings or chat messages), `completions` the decoded
    completions (as `[{"role": "assistant", "content": ...}]` when the prompts are chat messages)
    and every other column of the rows arrives as a keyword argument. On a built-in digit task
    both are decoded text and the one column is `answer`.

    On a mesh every batch shard calls back with its own rows (under `shard_map`), so no device
    waits on another's host call: a callback pinned to one device inside a loop with collectives
    can deadlock the multi-device CPU runtime. Even so, a host reward on a multi-device *CPU* mesh
    hung once in our tests (jaxlib 0.10.2); on one device it is reliable."""

    qualified = f"{getattr(fn, '__module__', None)}:{getattr(fn, '__qualname__', None)}"
    function_name = f"reward function {qualified if 'None' not in qualified else repr(fn)}"

    def decode(tokens: Any, mask: Any) -> list[str]:
        return [tokenizer.decode(row[row_in]) for row, row_in in zip(tokens, mask, strict=True)]

    def score(prompts: list, completions: list[str], **columns: list) -> np.ndarray:
        # Through jaxrl.host, so a failure (an exception, or NaN rewards) reaches the user as one
        # line naming the function, not as a traceback of callback plumbing.
        values = host.call(function_name, fn, prompts, completions, **columns)
        return host.check_rewards(function_name, values, len(completions))

    def on_host_digits(prompt_tokens, prompt_mask, tokens, mask, answer_tokens, answer_length):
        answers = [a[:n] for a, n in zip(answer_tokens, answer_length, strict=True)]
        return score(
            decode(prompt_tokens, prompt_mask),
            decode(tokens, mask),
            answer=[tokenizer.decode(a) for a in answers],
        )

    def on_host_rows(rows, tokens, mask):
        picked = [table.rows[i] for i in rows]
        completions: list = decode(tokens, mask)
        if table.conversational:
            completions = [[{"role": "assistant", "content": c}] for c in completions]
        columns = {name: [row.columns[name] for row in picked] for name in table.column_names()}
        return score([row.prompt for row in picked], completions, **columns)

    on_rows = on_host_digits if table is None else on_host_rows

    def on_host(*arrays: Any) -> np.ndarray:
        # NumPy before anything iterates or slices them: the callback gets jax.Arrays, and a
        # loop over one dispatches a JAX computation (unstack) from inside the running program.
        # On a CPU whose thread pool has one thread (a process pinned to one core) the callback
        # holds that thread, the computation waits for it, and the update hangs for good.
        return on_rows(*(np.asarray(a) for a in arrays))

    def call_back(*arrays: Array) -> Array:
        shape = jax.ShapeDtypeStruct(arrays[0].shape[:1], jnp.float32)
        return io_callback(on_host, shape, *arrays, ordered=False)

    def reward(prompts: PromptBatch, completion: Completion) -> Array:
        if table is None:
            arrays = (prompts.tokens, prompts.mask, completion.tokens, completion.mask)
            arrays += (prompts.answer_tokens, prompts.answer_length)
        else:
            arrays = (prompts.row, completion.tokens, completion.mask)
        if mesh is None:
            return call_back(*arrays)
        rows = jax.sharding.PartitionSpec(sharding.BATCH_AXES)
        per_shard = jax.shard_map(
            call_back, mesh=mesh, in_specs=(rows,) * len(arrays), out_specs=rows, check_vma=False
        )
        return per_shard(*arrays)

    return RewardTerm(name, weight, reward)
