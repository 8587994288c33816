"""Test setup. Eight simulated CPU devices must be requested before jax is first imported."""

import importlib.metadata
import os
import sys

# XLA:CPU compiling, not running, is most of a test's time (tests/compile_stats.py counts it):
# the programs are small and run a few steps. LLVM's optimisation level 1 and XLA's loop emitters
# in place of its newer fusion emitters compile them about twice as fast (test_grpo's sharded
# update and one-program tests: 49 s of compiling -> 21 s) for code that runs a little slower.
# The same programs and assertions; the rounding can differ, so tests whose tolerances were
# measured at XLA's default rounding are marked xla_defaults and run at XLA's settings (level 0
# broke bit-equal comparisons of partial and async with sync). JAXRL_TEST_XLA=default keeps XLA's
# settings for the whole run; the README's main command always runs at them.
# Measured on jaxlib 0.10 (the default leg's); on jaxlib 0.11.2 (Python 3.12's set) both pytest
# workers crashed within the first fifth of the newest leg's tests at these settings, so there
# the tests keep XLA's.
FAST_COMPILE_FLAGS = "--xla_backend_optimization_level=1 --xla_cpu_use_fusion_emitters=false"
_mode = os.environ.get("JAXRL_TEST_XLA", "fast")
if _mode not in ("fast", "default"):
    print(f"error: JAXRL_TEST_XLA: unknown setting {_mode!r}; use fast or default", file=sys.stderr)
    sys.exit(2)
_fast = _mode == "fast"
if _fast and not importlib.metadata.version("jaxlib").startswith("0.10."):
    os.environ["JAXRL_TEST_XLA"] = "default"  # what the xla_defaults hook below reads too
    _fast = False
os.environ["XLA_FLAGS"] = " ".join(
    [os.environ.get("XLA_FLAGS", ""), "--xla_force_host_platform_device_count=8"]
    + ([FAST_COMPILE_FLAGS] if _fast else [])
).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")


def _directory_for_this_run(variable: str, prefix: str) -> None:
    """`variable` names a fresh directory, removed when the run ends, unless it is set already
    (the xdist workers and the scripts the tests start inherit the controller's)."""
    if variable not in os.environ:
        import atexit
        import shutil
        import tempfile

        os.environ[variable] = tempfile.mkdtemp(prefix=prefix)
        atexit.register(shutil.rmtree, os.environ[variable], ignore_errors=True)


# Compiling, not running, is most of a test's time on the CPU: the programs are tiny and each
# test builds its own. So the suite shares one persistent compilation cache, made fresh for each
# pytest run (the xdist workers and the scripts the tests start inherit it through the
# environment), and a program that two tests or two runs of a script compile alike is compiled
# once. The cached program is the same executable, so no number changes. Cold is the default;
# JAX_COMPILATION_CACHE_DIR=<a kept directory> runs warm from the second run on, and
# JAX_ENABLE_COMPILATION_CACHE=false turns the cache off.
_directory_for_this_run("JAX_COMPILATION_CACHE_DIR", "jaxrl-tests-xla-cache-")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")  # tiny programs too
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "-1")

# Where each test's time goes (tests/compile_stats.py): one directory per run, shared by the workers.
_directory_for_this_run("JAXRL_COMPILE_STATS", "jaxrl-tests-compile-stats-")

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO_ROOT)

import pytest  # noqa: E402

from tests.compile_stats import over_budget, pytest_runtest_protocol, read_rows, summary_lines  # noqa: E402, F401

# A CI-tier test takes at most this long on its own; two workers share the two cores, so a run
# holds each test to twice it (set-up included). Longer ones belong in NOT_IN_CI, with a reason.
TEST_BUDGET_SECONDS = 120
RUN_BUDGET_SECONDS = 2 * TEST_BUDGET_SECONDS


def _rows(config) -> list[dict]:
    if hasattr(config, "workerinput"):  # an xdist worker: the controller reports
        return []
    return read_rows(os.environ["JAXRL_COMPILE_STATS"])


def pytest_sessionfinish(session, exitstatus):
    """A run with a CI-tier test over its budget fails, however its assertions went."""
    if over_budget(_rows(session.config), RUN_BUDGET_SECONDS) and exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter, config):
    """The run's XLA compiles (the workers' rows), beside pytest's slowest durations."""
    rows = _rows(config)
    if not rows:
        return
    terminalreporter.write_sep("=", "XLA compiles")
    for line in summary_lines(rows):
        terminalreporter.write_line(line)
    for row in over_budget(rows, RUN_BUDGET_SECONDS):
        terminalreporter.write_line(
            f"OVER BUDGET: {row['test']} took {row['wall_s']:.0f} s, more than "
            f"{RUN_BUDGET_SECONDS} s in this run; make it cheaper or move it to NOT_IN_CI"
        )


def pytest_addoption(parser):
    parser.addoption(
        "--runslow", action="store_true", help="also run tests marked slow (minutes each)"
    )


# What runs only with --runslow (`pytest --runslow -m slow`): tests long by nature, each with its
# seconds and the test CI keeps for its property. This is the whole list: no test marks itself
# slow. Seconds: "m", one test of a run of the list with 2 pytest workers on the 2-core host
# on 2026-11-29 at the test compile settings above; "l", CI's loaded runs of 2026-11-27/28 at
# XLA's defaults (about 2-10x a quiet run's); "d", the test's docstring.
NOT_IN_CI = {
    # SmolLM2 (the real model) trained for minutes: CI keeps its short runs (test_smollm2.py,
    # test_starting_point_defaults' SFT at the defaults)
    "tests/test_smollm2_training.py::test_smollm2_chat_sft_then_dpo_prefers_the_right_operation": 331,  # l
    "tests/test_smollm2_training.py::test_grpo_trains_smollm2_on_word_problems": 243,  # l
    "tests/test_smollm2_training.py::test_smollm2_reward_model_then_ppo": 180,  # d
    "tests/test_dynamic_sampling.py::test_smollm2_dynamic_sampling_beats_plain_grpo_when_most_groups_are_uniform": 900,  # d; the tiny model's dynamic sampling tests
    "tests/test_starting_point_defaults.py::test_smollm2_defaults_improve_sft_and_dpo_and_sft_beats_the_random_model_value": 300,  # d
    "tests/test_starting_point_defaults.py::test_smollm2_grpo_at_the_defaults_improves_held_out_accuracy": 600,  # d
    "tests/test_notebooks.py::test_notebook_runs[grpo_smollm2.ipynb]": 142,  # m
    "tests/test_trainers.py::test_grpo_on_smollm2_from_python_with_rows_and_a_reward_function": 67,  # m; test_prompt_data's GRPO from a file
    "tests/test_small_data.py::test_the_readme_grpo_snippet_runs_as_written_on_smollm2": 64,  # m; the tiny model's snippet
    # learning runs of minutes: CI keeps a cheaper learning test of the same update
    **{
        f"tests/test_grpo.py::test_grpo_learns_reverse_three_digits_from_random_init_on_every_seed[{seed}]": 900  # d
        for seed in (0, 1, 3, 4, 5, 6, 7)
    },
    "tests/test_grpo.py::test_grpo_learns_reverse_three_digits_from_random_init": 201,  # m; test_prompt_data's GRPO learns (for every seed above)
    "tests/test_multiturn_learning.py::test_rl_raises_the_success_of_an_sft_guesser": 190,  # m; test_multiturn.py's update trains
    "tests/test_multiturn_learning.py::test_rl_teaches_the_tiny_model_to_call_the_calculator": 128,  # m; test_multiturn.py's update trains
    "tests/test_ppo.py::test_pendulum_continuous_learns": 63,  # m; CartPole's; SAC on Pendulum
    "tests/test_gymnasium_env.py::test_ppo_learns_envpool_cartpole": 78,  # m; the adapters' tests
    "tests/test_gymnasium_env.py::test_ppo_learns_gymnasium_cartpole": 67,  # m
    "tests/test_cql.py::test_the_penalty_keeps_q_conservative_where_offline_sac_overestimates": 67,  # m; CQL beats behaviour
    # whole scripts interrupted and rerun: CI keeps test_experiment's SIGKILL[0] and the
    # Ctrl-C test of every other script
    "tests/test_experiment.py::test_interrupted_in_every_way_then_rerun_equals_an_uninterrupted_run": 104,  # m
    "tests/test_stopping.py::test_ctrl_c_stops_after_the_running_update_and_the_rerun_ends_equal[cql.py]": 75,  # m; [sac.py]
}


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem):
    """A test marked xla_defaults (its tolerances were measured at XLA's default rounding, which
    the compile settings above change) runs in a pytest of its own compiling at XLA's settings."""
    if "xla_defaults" not in pyfuncitem.keywords or os.environ.get("JAXRL_TEST_XLA") == "default":
        return None
    import subprocess

    env = {**os.environ, "JAXRL_TEST_XLA": "default"}
    env.pop("JAXRL_COMPILE_STATS", None)  # its own rows: this test's are the outer run's
    ours = [*FAST_COMPILE_FLAGS.split(), "--xla_force_host_platform_device_count=8"]
    env["XLA_FLAGS"] = " ".join(f for f in env["XLA_FLAGS"].split() if f not in ours)
    args = ["-p", "no:xdist", "-p", "no:cacheprovider", "-o", "addopts=", "-q", "--runslow"]
    command = [sys.executable, "-m", "pytest", *args, pyfuncitem.nodeid]
    result = subprocess.run(command, cwd=REPO_ROOT, env=env, capture_output=True, text=True)
    if result.returncode != 0:
        raise AssertionError(f"at XLA's default settings:\n{result.stdout[-6000:]}")
    return True


def pytest_collection_modifyitems(config, items):
    """The tests in NOT_IN_CI are marked slow and run only when asked: `pytest --runslow -m
    slow`. CI's budget is for the rest."""
    for item in items:
        if item.nodeid in NOT_IN_CI:
            item.add_marker(pytest.mark.slow)
    if config.getoption("--runslow"):
        return
    skip = pytest.mark.skip(reason="slow: run with --runslow")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)
