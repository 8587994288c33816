"""The test run's own bookkeeping (tests/compile_stats.py): the budget that fails a run and the
compile totals CI prints."""

from tests.compile_stats import over_budget, summary_lines

ROWS = [
    {"test": "tests/test_a.py::test_quick", "wall_s": 3.0, "compiled": 4, "compile_s": 2.0},
    {"test": "tests/test_a.py::test_long", "wall_s": 250.0, "compiled": 9, "cached": 3},
    {"test": "tests/test_b.py::test_sweep", "wall_s": 900.0, "slow": True, "compiled": 1},
]


def test_a_ci_tier_test_over_its_budget_is_named_and_a_slow_one_is_not():
    assert [r["test"] for r in over_budget(ROWS, 240)] == ["tests/test_a.py::test_long"]
    assert over_budget(ROWS, 1000) == []


def test_the_summary_counts_every_compile_and_ranks_files_by_time():
    lines = summary_lines(ROWS)
    assert lines[0].startswith("XLA compiles: 14 compiled, 3 from the persistent cache")
    assert "of 1153 s of test time (3 tests)" in lines[0]
    assert "900 s  tests/test_b.py: 1 compiled" in lines[1]
    assert "253 s  tests/test_a.py: 13 compiled, 3 cached, 2 s compiling" in lines[2]
