"""Test setup. Eight simulated CPU devices must be requested before jax is first imported."""

import os
import sys

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO_ROOT)

import pytest  # noqa: E402


def pytest_addoption(parser):
    parser.addoption(
        "--runslow", action="store_true", help="also run tests marked slow (minutes each)"
    )


def pytest_collection_modifyitems(config, items):
    """Tests marked slow (real-model runs of several minutes, with their measured times in the
    README) run only when asked: `pytest --runslow -m slow`. CI's budget is for the rest."""
    if config.getoption("--runslow"):
        return
    skip = pytest.mark.skip(reason="slow: run with --runslow")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)
