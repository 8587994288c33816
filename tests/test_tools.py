"""Tools for multi-turn agents (envs/text/tools.py): the calculator on hand cases, the isolated
Python tool's limits and refusals, tool calls routed before the game, and the multiplication
task scored from its rules, with its players."""

import time

import pytest

from envs.text.tools import (
    Multiplication,
    calculator,
    multiplication_players,
    play_host,
    python_tool,
    tool_call,
    with_tools,
)


@pytest.mark.parametrize(
    "expression,result",
    [
        ("347 * 829", "= 287663"),
        ("(3 + 4) * 5 - 2 ** 3", "= 27"),
        ("7 / 2", "= 3.5"),
        ("8 / 2", "= 4"),
        ("17 // 5 + 17 % 5", "= 5"),
        ("-3 * -3", "= 9"),
        ("1,234 + 1", "= 1235"),
        ("1 / 0", "error: division by zero"),
        ("2 ** 100", "error: exponent 100 is above 64"),
        ("9" * 70 + " * 9", "error: the result is too large"),
        ("__import__('os')", "error: only numbers, + - * / // % ** and parentheses"),
        ("x + 1", "error: only numbers, + - * / // % ** and parentheses"),
        ("3 +", "error: invalid syntax"),
    ],
)
def test_calculator(expression, result):
    assert calculator(expression).startswith(result), calculator(expression)


@pytest.mark.parametrize(
    "code,result",
    [
        ("print(6 * 7)", "42"),
        ("import math; print(math.factorial(20))", "2432902008176640000"),
        ("1 / 0", "error: ZeroDivisionError: division by zero"),
        ("import socket; socket.socket()", "error: PermissionError: socket"),
        ("open('/etc/hostname').read()", "error: PermissionError: files are not available"),
        ("open('/tmp/tool_test', 'w')", "error: PermissionError: files are not available"),
        ("import os; os.system('true')", "error: PermissionError: os.system is not allowed"),
        ("import subprocess; subprocess.run(['true'])", "error: PermissionError: subprocess"),
        ("x = bytearray(10 ** 9)", "error: MemoryError"),
        ("print('x' * 1000)", "x" * 200),
    ],
)
def test_python_tool_runs_isolated_with_limits(code, result):
    output = python_tool(code)
    assert output.startswith(result) and len(output) <= 200, output


def test_python_tool_stops_a_program_that_runs_too_long():
    start = time.time()
    assert python_tool("while True: pass", timeout_s=1.0) == "error: timed out"
    assert time.time() - start < 3


def test_tool_calls_go_to_the_tool_and_other_turns_to_the_game():
    assert tool_call("calc: 2 + 2", {"calc": calculator}) == ("calc", "2 + 2")
    assert tool_call("answer: 4", {"calc": calculator}) is None
    game = with_tools(lambda: Multiplication(digits=3), {"calc": calculator})()
    opening = game.reset(0)
    assert opening.startswith(f"What is {game.game.a} * {game.game.b}?") and "calc:" in opening
    product = game.game.a * game.game.b
    assert game.step(f"calc: {game.game.a} * {game.game.b}") == (f"= {product}", 0.0, False)
    assert game.step("I think it is big") == ("Reply 'answer: <number>'.", 0.0, False)
    assert game.step(f"answer: {product:,}") == ("Right.", 1.0, True)
    assert game.calls == 1
    other = Multiplication(digits=3)
    other.reset(1)
    assert other.step("answer: 12") == ("Wrong.", 0.0, True)


def test_a_tool_result_too_long_for_the_environment_is_answered_as_an_error():
    game = with_tools(lambda: Multiplication(digits=2), {"calc": calculator}, max_result_chars=12)()
    game.reset(0)
    assert game.step("calc: 99 ** 9") == (
        "error: the result is longer than 12 characters",
        0.0,
        False,
    )
    assert game.step("calc: 99 * 99") == ("= 9801", 0.0, False)


def test_multiplication_players_score_as_designed():
    """The calculator user and the direct answerer always win (two turns and one), a random
    answer of the right size almost never does."""
    make = with_tools(lambda: Multiplication(digits=2), {"calc": calculator})
    players = multiplication_players()
    for kind, wins, turns in (("scripted", 1.0, 2), ("plausible", 1.0, 1)):
        played = play_host(make, [players[kind]] * 64, max_turns=3, seed=0)
        assert played["returns"].mean() == wins and (played["turns"] == turns).all(), kind
        first = played["transcripts"][0]
        assert first[0][0] == "env" and first[0][1].startswith("What is")
    scripted = play_host(make, [players["scripted"]], max_turns=3)["transcripts"][0]
    assert [who for who, _ in scripted] == ["env", "policy", "env", "policy", "env"]
    assert scripted[1][1].startswith("calc: ") and scripted[3][1].startswith("answer: ")
    played = play_host(make, [players["random"]] * 256, max_turns=3, seed=1)
    assert played["returns"].mean() < 0.05
