"""`--help` in every script exits 0 with its usage, and `--helpconfig` lists a trainer's config
fields (sections flattened, overrides applied), also exiting 0."""

import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPTS = sorted(
    name
    for name in os.listdir(os.path.join(REPO, "experiments"))
    if name.endswith(".py") and not name.startswith("_")
)


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, timeout=300, cwd=REPO
    )


@pytest.mark.parametrize("script", SCRIPTS)
def test_help_exits_0_with_the_usage(script):
    result = run(os.path.join("experiments", script), "--help")
    assert result.returncode == 0, result.stderr[-2000:]
    assert "--helpfull" in result.stdout


def test_helpconfig_lists_the_fields_with_overrides_applied():
    result = run("experiments/sac.py", "--helpconfig", "--config.gamma=0.9")
    assert result.returncode == 0, result.stderr[-2000:]
    lines = result.stdout.splitlines()
    assert "--config.gamma=0.9" in lines
    assert "--config.run.log_every=250" in lines
    assert all(line.startswith("--config.") for line in lines), lines
