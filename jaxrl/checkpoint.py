"""Atomic, resumable checkpoints of a training-state pytree (a thin wrapper over orbax).

Orbax writes each checkpoint into a temporary directory and renames it into place when complete,
so a run killed mid-save leaves the previous checkpoint intact; `restore` reads the newest
complete one.
"""

from __future__ import annotations

import os
from typing import Any

import jax
import numpy as np

# orbax.checkpoint is imported where a checkpoint is opened, not here: it costs about a second of
# every script's start, and --help or a mistyped flag never opens one.


def _is_empty(leaf: Any) -> bool:
    return hasattr(leaf, "size") and hasattr(leaf, "dtype") and leaf.size == 0


def _without_empty_arrays(tree: Any) -> Any:
    """Zero-size arrays (e.g. MJX's actuator activations of a model without any) replaced by one
    placeholder element: orbax refuses to save arrays without data. They are restored from the
    `like` tree, which has their shape and dtype, so nothing is lost."""
    return jax.tree.map(lambda x: np.zeros((1,), x.dtype) if _is_empty(x) else x, tree)


class DamagedCheckpointError(RuntimeError):
    """Checkpoints exist but none of them can be read back."""


class Checkpointer:
    """Save a state pytree and JSON metadata at the steps the caller chooses (the runner's
    schedule), keeping the newest `keep`."""

    def __init__(self, directory: str, keep: int = 3):
        if keep < 1:
            raise ValueError(f"keep ({keep}) must be >= 1")
        import orbax.checkpoint as ocp  # here, not at the top: start-up time

        self.directory = os.path.abspath(directory)
        self._manager = ocp.CheckpointManager(
            self.directory,
            options=ocp.CheckpointManagerOptions(max_to_keep=keep, create=True),
        )

    def latest_step(self) -> int | None:
        """The step of the newest complete checkpoint, or None when there is none."""
        return self._manager.latest_step()

    def save(self, step: int, state: Any, metadata: dict[str, Any]) -> bool:
        """Save `state` and `metadata` as checkpoint `step`; returns whether it saved."""
        import orbax.checkpoint as ocp  # start-up time (already loaded by __init__)

        saved = self._manager.save(
            step,
            args=ocp.args.Composite(
                state=ocp.args.StandardSave(_without_empty_arrays(state)),
                metadata=ocp.args.JsonSave(metadata),
            ),
            force=True,
        )
        # Block until the files are renamed into place: "saved" then means durable.
        self._manager.wait_until_finished()
        return bool(saved)

    def restore(self, like: Any, step: int | None = None) -> tuple[Any, dict[str, Any]]:
        """Restore the state at `step` (default newest) with the structure, shapes, dtypes and
        shardings of `like`, and its metadata."""
        import orbax.checkpoint as ocp  # start-up time (already loaded by __init__)

        step = self.latest_step() if step is None else step
        if step is None:
            raise FileNotFoundError(f"no checkpoint in {self.directory}")
        abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, _without_empty_arrays(like))
        restored = self._manager.restore(
            step,
            args=ocp.args.Composite(
                state=ocp.args.StandardRestore(abstract), metadata=ocp.args.JsonRestore()
            ),
        )
        state = jax.tree.map(
            lambda saved, template: template if _is_empty(template) else saved,
            restored["state"],
            like,
        )
        return state, dict(restored["metadata"])

    def all_steps(self) -> list[int]:
        """Steps of every complete checkpoint, oldest first."""
        return sorted(self._manager.all_steps())

    def restore_newest_intact(
        self, like: Any, quarantine: str
    ) -> tuple[Any, dict[str, Any], list[str]] | None:
        """Restore the newest checkpoint that reads back whole. Damaged newer ones (a deleted or
        truncated file, say) are moved into the `quarantine` directory, so the run continues
        from the intact one and saving over their steps works. Returns (state, metadata, one
        note per damaged checkpoint), or None when there is no checkpoint at all; raises
        `DamagedCheckpointError` when there are checkpoints and none is intact."""
        steps = self.all_steps()
        if not steps:
            return None
        notes = []
        for step in reversed(steps):
            try:
                state, metadata = self.restore(like, step)
            except Exception as error:  # noqa: BLE001  orbax/tensorstore raise many types
                reason = " ".join(str(error).split())[:160]
                notes.append(f"checkpoint {step} is damaged ({type(error).__name__}: {reason})")
                continue
            if notes:
                self._quarantine([s for s in steps if s > step], quarantine)
            return state, metadata, notes
        raise DamagedCheckpointError(
            f"none of the {len(steps)} checkpoints in {self.directory} is intact "
            f"(steps {steps}); move that directory away to start the run afresh"
        )

    def _quarantine(self, steps: list[int], quarantine: str) -> None:
        os.makedirs(quarantine, exist_ok=True)
        for step in steps:
            os.replace(os.path.join(self.directory, str(step)), os.path.join(quarantine, str(step)))
        self._manager.reload()

    def close(self) -> None:
        """Wait for pending writes and release the checkpoint manager."""
        self._manager.close()
