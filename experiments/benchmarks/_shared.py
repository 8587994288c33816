"""Helpers both benchmark drivers use. Standard library only: the peer workers (rejax, TRL) run the
benchmark scripts from their own virtual environments, where jaxrl is not installed."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any


def marked_json(stdout: str | bytes | None, marker: str) -> dict[str, Any] | None:
    """The JSON after the last line of `stdout` that starts with `marker`, if any."""
    if isinstance(stdout, bytes):  # TimeoutExpired carries undecoded output
        stdout = stdout.decode(errors="replace")
    for line in reversed((stdout or "").splitlines()):
        if line.startswith(marker):
            return json.loads(line[len(marker) :])
    return None


def comma_list(cast: Callable[[str], Any]) -> Callable[[str], list[Any]]:
    """An argparse type: "a,b,c" -> [cast(a), cast(b), cast(c)]."""
    return lambda text: [cast(item) for item in text.split(",") if item.strip()]
