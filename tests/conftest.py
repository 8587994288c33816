"""Test setup. Eight simulated CPU devices must be requested before jax is first imported."""

import os
import sys

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

# Compiling, not running, is most of a test's time on the CPU: the programs are tiny and each
# test builds its own. So the suite shares one persistent compilation cache, made fresh for each
# pytest run (the xdist workers and the scripts the tests start inherit it through the
# environment), and a program that two tests or two runs of a script compile alike is compiled
# once. The cached program is the same executable, so no number changes.
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    import atexit
    import shutil
    import tempfile

    _cache_dir = tempfile.mkdtemp(prefix="jaxrl-tests-xla-cache-")
    atexit.register(shutil.rmtree, _cache_dir, ignore_errors=True)
    os.environ["JAX_COMPILATION_CACHE_DIR"] = _cache_dir
    os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
    os.environ["JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"] = "-1"

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
