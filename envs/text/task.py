"""What a text task gives a reinforcement-learning algorithm (GRPO): prompts it samples inside the
compiled program, and reward terms that score the sampled completions as token arrays.

    task = make_task("reverse_digits", num_digits=3).text_task(tokenizer, format_weight=0.5)
    prompts = task.sample_prompts(key, 128, task.data)           # a PromptBatch, pure JAX
    reward = sum(t.weight * t.fn(prompts, completion) for t in task.reward_terms)

A task made from a user's prompt file (`envs.text.prompt_dataset`) samples rows of a token table,
`task.data`; the algorithm passes that table into its compiled update as an input rather than
baking it into the program as a constant, so a large dataset costs no compile time.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax

Array = jax.Array


class PromptBatch(NamedTuple):
    """Left-padded prompts with their answers, as token ids."""

    tokens: Array  # [n, P] (BOS first when the tokenizer has one)
    mask: Array  # [n, P] True on real tokens
    answer_tokens: Array  # [n, A] pad after the answer
    answer_length: Array  # [n]
    row: Array | None = None  # [n] the dataset row each prompt is, for tasks made from a file


class RewardTerm(NamedTuple):
    """One reward: `fn(prompts, completion) -> [B]`, scaled by `weight`. `completion` has
    `tokens` and `mask` [B, N] (a `jaxrl.lm.sampler.Completion`); `prompts` is a `PromptBatch`
    of the same B rows."""

    name: str  # the metric is logged as reward_<name>
    weight: float
    fn: Callable[[PromptBatch, Any], Array]


class TextTask(NamedTuple):
    """A task as an RL algorithm trains on it: a prompt sampler and the terms of the reward (a
    weighted sum), with the tokenizer ids the sampler needs to end and pad completions."""

    name: str
    # (key, count, data) -> prompts, pure JAX; `data` is `TextTask.data` as the program got it
    sample_prompts: Callable[[Array, int, Any], PromptBatch]
    reward_terms: tuple[RewardTerm, ...]
    eos_id: int
    pad_id: int
    data: Any = None  # arrays the prompts are drawn from (a prompt table), or None

    def with_reward(self, term: RewardTerm) -> TextTask:
        """This task with one more reward term (a host Python reward, say)."""
        return self._replace(reward_terms=(*self.reward_terms, term))


def supervised_batch(task: TextTask, key: Array, count: int) -> dict[str, Array]:
    """`count` of the task's prompts with their right answers and EOS as fine-tuning targets
    (`algos.sft`'s batch, [count, P + A + 1]), drawn in JAX: a quick supervised start for RL
    inside one program. Only for tasks whose prompts carry answer tokens (the digit tasks)."""
    import jax.numpy as jnp

    prompts = task.sample_prompts(key, count, task.data)
    width = prompts.answer_tokens.shape[1] + 1
    slot = jnp.arange(width)[None]
    answers = jnp.pad(prompts.answer_tokens, ((0, 0), (0, 1)), constant_values=task.pad_id)
    answers = jnp.where(slot == prompts.answer_length[:, None], task.eos_id, answers)
    target = slot <= prompts.answer_length[:, None]
    answers = jnp.where(target, answers, task.pad_id)
    return {
        "tokens": jnp.concatenate([prompts.tokens, answers], axis=1),
        "attention_mask": jnp.concatenate([prompts.mask, target], axis=1),
        "loss_mask": jnp.concatenate([jnp.zeros_like(prompts.mask), target], axis=1),
    }
