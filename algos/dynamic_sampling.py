"""Groups of completions that carry a learning signal, and DAPO's dynamic sampling, which keeps
those: what GRPO, multi-turn GRPO and online DPO share.

A group is the completions (or episodes) of one prompt (or game). Where every member scored the
same, group-relative advantages are all 0 and the group gives no gradient. Dynamic sampling (Yu
et al., 2025) draws oversample_factor x batch_size groups, scores them all, and keeps batch_size,
those with signal first (`select_groups`), filling up with uniform ones when too few vary. Shapes
stay fixed and the selection happens inside the program. `no_signal_monitor` warns, one line, when
most groups carry no signal for several updates in a row.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl.config import require

Array = jax.Array


def validate_dynamic_sampling(config: Any) -> None:
    """Check a Config's dynamic_sampling, oversample_factor and warn_no_signal_updates (GRPO's,
    multi-turn's and online DPO's)."""
    require(
        isinstance(config.dynamic_sampling, bool),
        "dynamic_sampling",
        f"got {config.dynamic_sampling!r}",
        "use True or False",
    )
    require(
        isinstance(config.oversample_factor, int) and config.oversample_factor >= 1,
        "oversample_factor",
        f"got {config.oversample_factor!r}",
        "use a whole number of prompts drawn per prompt kept, 2 or more",
    )
    require(
        not config.dynamic_sampling or config.oversample_factor >= 2,
        "oversample_factor",
        "1 draws only the groups the update keeps, so dynamic sampling has none to choose from",
        "use 2 or more",
    )
    require(
        config.dynamic_sampling or config.oversample_factor == 2,
        "oversample_factor",
        f"got {config.oversample_factor}, but it is read only with dynamic_sampling=True",
        "set dynamic_sampling=True, or drop oversample_factor",
    )
    require(
        isinstance(config.warn_no_signal_updates, int) and config.warn_no_signal_updates >= 0,
        "warn_no_signal_updates",
        f"got {config.warn_no_signal_updates!r}",
        "use a number of updates, or 0 for no warning",
    )


def group_has_signal(rewards: Array, greedy_rewards: Array | None = None) -> Array:
    """[num_prompts, group_size] rewards -> [num_prompts] whether the group carries a learning
    signal: its rewards differ (or, with the greedy baseline, some sample scored unlike the
    greedy completion)."""
    if greedy_rewards is not None:
        return jnp.any(rewards != greedy_rewards[:, None], axis=1)
    return jnp.ptp(rewards, axis=1) > 0


def select_groups(has_signal: Array, count: int) -> Array:
    """DAPO's dynamic sampling at fixed shapes: the indices of `count` of the drawn groups, the
    ones with signal first in the order drawn, then (if fewer than `count` have signal) uniform
    ones in the order drawn to fill the batch. The drawn prompts are independent draws, so
    taking the first ones biases nothing."""
    return jnp.argsort(jnp.logical_not(has_signal).astype(jnp.int32), stable=True)[:count]


def take_groups(tree: Any, groups: Array, num_groups: int, group_size: int) -> Any:
    """The chosen `groups` (indices among `num_groups`) of every array in `tree`: an array with
    a row per completion (leading dimension num_groups * group_size, a group's rows adjacent)
    gives those groups' rows, one with a row per group (num_groups) those rows; a scalar (a
    value shared by every row) stays as it is."""
    rows = (groups[:, None] * group_size + jnp.arange(group_size)).reshape(-1)

    def take(leaf: Array) -> Array:
        if jnp.ndim(leaf) == 0:
            return leaf
        if leaf.shape[0] == num_groups * group_size:
            return jnp.take(leaf, rows, axis=0)
        if leaf.shape[0] == num_groups:
            return jnp.take(leaf, groups, axis=0)
        raise ValueError(f"take_groups: a leaf of {leaf.shape[0]} rows for {num_groups} groups")

    return jax.tree.map(take, tree)


def keep_varied_groups(
    tree: Any, has_signal: Array, count: int, group_size: int
) -> tuple[Any, Array, dict[str, Array]]:
    """Dynamic sampling's selection inside the program: of the drawn groups (`has_signal`
    [drawn]) keep `count`, those with signal first (`select_groups`), from every array of `tree`
    (`take_groups`). Returns the kept tree, the kept groups' has_signal, and the counts
    (`selection_metrics`)."""
    keep = select_groups(has_signal, count)
    num_drawn = has_signal.shape[0]
    kept, kept_signal = take_groups((tree, has_signal), keep, num_drawn, group_size)
    return kept, kept_signal, selection_metrics(has_signal, kept_signal)


def selection_metrics(drawn_has_signal: Array, kept_has_signal: Array) -> dict[str, Array]:
    """Dynamic sampling's per-update counts: groups_drawn, groups_varied (of those drawn),
    groups_kept_varied and groups_filled_uniform (kept without signal: too few varied)."""
    kept_varied = kept_has_signal.sum().astype(jnp.float32)
    return {
        "groups_drawn": jnp.float32(drawn_has_signal.shape[0]),
        "groups_varied": drawn_has_signal.sum().astype(jnp.float32),
        "groups_kept_varied": kept_varied,
        "groups_filled_uniform": kept_has_signal.shape[0] - kept_varied,
    }


def no_signal_monitor(
    name: str, patience: int, metric: str = "zero_variance_fraction", dynamic: bool = False
) -> Callable[[Any, Any], None]:
    """A host function `monitor(step, fraction)`, called once per update from inside the
    program with the fraction of drawn groups whose rewards were all equal (no gradient from
    them; the metric `metric`), that prints one warning line when it is above one half in
    `patience` consecutive updates, and again only after an update with signal. Updates may
    report out of order (unordered callbacks): it keeps each update's fraction by step. With
    `dynamic` (dynamic sampling already on) it suggests drawing more instead."""
    remedy = "raise --config.oversample_factor" if dynamic else "set --config.dynamic_sampling=True"
    fractions: dict[int, float] = {}
    warned_at: list[int] = []

    def monitor(step: Any, fraction: Any) -> None:
        steps = np.asarray(step).reshape(-1)
        values = np.asarray(fraction, dtype=np.float64).reshape(-1)
        # Several runs of one program (a sweep): the fraction over all of them.
        current = int(steps.max())
        fractions[current] = float(values.mean())
        streak = [fractions.get(current - i) for i in range(patience)]
        if any(value is None or value <= 0.5 for value in streak):
            return
        if warned_at and all(
            fractions.get(s, 1.0) > 0.5 for s in range(warned_at[-1], current + 1)
        ):
            return  # the same streak as the last warning
        warned_at.append(current)
        if jax.process_index() == 0:
            print(
                f"warning: {name}: more than half the prompt groups got the same reward for "
                f"every completion in {patience} consecutive updates ({metric} "
                f"{fractions[current]:.2f} in update {current + 1}), so they give no gradient; "
                f"{remedy}, raise group_size or temperature, or make the rewards finer or the "
                "prompts easier",
                file=sys.stderr,
            )

    return monitor
