"""Tools a language-model agent can call inside a conversation, and a task that needs one.

    game = with_tools(lambda: Multiplication(digits=3), {"calc": calculator})
    env = host_text_env("multiply", game, tokenizer, max_turns=3, max_message_tokens=24)

A turn that starts with a tool's name and a colon ("calc: 347 * 829") is a tool call: the tool
runs on the host and its result is the environment's answer ("= 287663"); any other turn goes to
the game. A tool call costs a turn and earns nothing by itself.

- `calculator`: arithmetic on integers and decimals (+ - * / // % ** and parentheses), evaluated
  from Python's syntax tree, never `eval`, with limits on exponents and on the size of numbers.
- `python_tool`: a short Python program run in a separate interpreter with a wall-clock and CPU
  limit and an address-space limit; an audit hook refuses the network, subprocesses and writing
  or reading files outside the Python installation. Its printed output is the result. This is a
  guard against accidents and runaway programs, not a security boundary against hostile code.
"""

from __future__ import annotations

import ast
import operator
import re
import subprocess
import sys
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

MAX_EXPONENT = 64
MAX_DIGITS = 60  # a result longer than this is refused, not printed
TOOL_CALL = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*)\s*:\s*(.*)$", re.DOTALL)

_BINARY = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
    ast.Div: operator.truediv, ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}  # fmt: skip
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}


def calculator(expression: str) -> str:
    """'= <value>' of an arithmetic expression, or 'error: <why>'."""

    def value(node: ast.AST) -> int | float:
        if isinstance(node, ast.Constant) and type(node.value) in (int, float):
            return node.value
        if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
            return _UNARY[type(node.op)](value(node.operand))
        if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
            left, right = value(node.left), value(node.right)
            if isinstance(node.op, ast.Pow) and abs(right) > MAX_EXPONENT:
                raise ValueError(f"exponent {right} is above {MAX_EXPONENT}")
            result = _BINARY[type(node.op)](left, right)
            if abs(result) >= 10**MAX_DIGITS:
                raise ValueError("the result is too large")
            return result
        raise ValueError("only numbers, + - * / // % ** and parentheses")

    try:
        result = value(ast.parse(expression.strip().replace(",", ""), mode="eval").body)
    except ZeroDivisionError:
        return "error: division by zero"
    except (SyntaxError, ValueError, TypeError, OverflowError, RecursionError) as error:
        return f"error: {str(error).splitlines()[0] if str(error) else type(error).__name__}"
    if isinstance(result, float) and result.is_integer():
        result = int(result)
    return f"= {result}"


# The child interpreter's guard: refuse the network, processes and files outside Python's own
# installation (reading the standard library must still work for imports).
_GUARD = r"""
import os, resource, sys

def install(cpu_s, memory):
    # Limits first, then the guard; the child sets them on itself (no preexec_fn: forking a
    # multithreaded JAX process to run Python before exec can deadlock).
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s))
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    roots = tuple({os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)})
    refused = ("socket.", "subprocess.", "os.system", "os.exec", "os.spawn", "os.fork",
               "os.posix_spawn", "os.remove", "os.rename", "os.rmdir", "os.mkdir", "shutil.",
               "os.unlink", "os.chmod", "os.chown", "ctypes.", "os.kill", "pty.")

    def guard(event, args):
        if event.startswith(refused):
            raise PermissionError(f"{event} is not allowed in this tool")
        if event == "open":
            path, mode = args[0], args[1] or "r"
            if isinstance(path, int):
                return
            path = os.path.realpath(os.fsdecode(path))
            if any(c in str(mode) for c in "wax+") or not path.startswith(roots):
                raise PermissionError("files are not available in this tool")

    sys.addaudithook(guard)

install(int(sys.argv[1]), int(sys.argv[2]))
del install
code = sys.stdin.read()
exec(compile(code, "<tool>", "exec"), {"__name__": "__main__"})
"""


def python_tool(
    code: str, timeout_s: float = 2.0, memory_mb: int = 256, max_output: int = 200
) -> str:
    """Run `code` in a fresh, isolated interpreter (`python -I`) and return what it printed (cut
    to `max_output` characters), or 'error: <the last line of its traceback>', or 'error:
    timed out'. Limits: `timeout_s` of wall clock and of CPU, `memory_mb` of address space."""

    cpu_s, memory = str(int(timeout_s) + 1), str(memory_mb * 1024 * 1024)
    try:
        done = subprocess.run(
            [sys.executable, "-I", "-c", _GUARD, cpu_s, memory], input=code, capture_output=True,
            text=True, timeout=timeout_s, env={}, cwd="/",
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        return "error: timed out"
    if done.returncode != 0:
        lines = done.stderr.strip().splitlines()
        return f"error: {lines[-1] if lines else f'exit status {done.returncode}'}"[:max_output]
    return done.stdout.strip()[:max_output]


def tool_call(utterance: str, tools: dict[str, Callable[[str], str]]) -> tuple[str, str] | None:
    """(tool name, its argument) when the utterance calls one of `tools`, else None."""
    match = TOOL_CALL.match(utterance)
    if match is None or match.group(1) not in tools:
        return None
    return match.group(1), match.group(2).strip()


class _WithTools:
    def __init__(
        self, game: Any, tools: dict[str, Callable[[str], str]], max_result_chars: int
    ) -> None:
        self.game, self.tools, self.calls = game, tools, 0
        self.max_result_chars = max_result_chars

    def reset(self, seed: int) -> str:
        return self.game.reset(seed)

    def step(self, utterance: str) -> tuple[str, float, bool]:
        call = tool_call(utterance, self.tools)
        if call is None:
            return self.game.step(utterance)
        self.calls += 1
        name, argument = call
        result = self.tools[name](argument)
        if len(result) > self.max_result_chars:  # the policy chose the call: an answer, not a fault
            result = f"error: the result is longer than {self.max_result_chars} characters"
        return result, 0.0, False


def with_tools(
    make_game: Callable[[], Any],
    tools: dict[str, Callable[[str], str]],
    max_result_chars: int = 40,
) -> Callable[[], Any]:
    """A host game (for `host_text_env`) whose turns may call `tools` first. A result longer
    than `max_result_chars` is answered as an error (keep it within the environment's
    max_message_tokens): what a policy asks a tool is its choice, so the answer is part of the
    game, not a failure of the run."""
    return lambda: _WithTools(make_game(), tools, max_result_chars)


class Multiplication:
    """A task a small model cannot do unaided: multiply two `digits`-digit numbers. The answer
    is the last integer of a turn that starts with 'answer:' (reward 1 if right; the episode
    ends either way); any other turn is told how to answer."""

    def __init__(self, digits: int = 3, tool_hint: bool = True) -> None:
        self.digits, self.tool_hint = digits, tool_hint

    def reset(self, seed: int) -> str:
        rng = np.random.default_rng(seed)
        low, high = 10 ** (self.digits - 1), 10**self.digits
        self.a, self.b = (int(x) for x in rng.integers(low, high, 2))
        hint = " You may use a calculator: write 'calc: <expression>'." if self.tool_hint else ""
        return f"What is {self.a} * {self.b}?{hint} Reply 'answer: <number>'."

    def step(self, utterance: str) -> tuple[str, float, bool]:
        match = re.match(r"^\s*answer\s*:\s*(.*)$", utterance, re.IGNORECASE | re.DOTALL)
        if match is None:
            return "Reply 'answer: <number>'.", 0.0, False
        numbers = re.findall(r"[0-9]+", match.group(1).replace(",", ""))
        right = bool(numbers) and int(numbers[-1]) == self.a * self.b
        return ("Right." if right else "Wrong."), float(right), True


# --- the multiplication task's players: its baselines and SFT teachers, in host Python ---------


class CalculatorUser:
    """Multiplication's scripted player: ask the calculator, then answer with its result."""

    def speak(self, heard: str, rng: np.random.Generator) -> str:
        question = re.match(r"^What is ([0-9]+) \* ([0-9]+)\?", heard)
        if question is not None:
            return f"calc: {question.group(1)} * {question.group(2)}"
        return f"answer: {heard.removeprefix('= ')}"


class DirectAnswerer:
    """Multiplication answered without the tool: right (a teacher that can multiply) or, with
    `random=True`, a random number with the product's number of digits (the random baseline)."""

    def __init__(self, random: bool = False) -> None:
        self.random = random

    def speak(self, heard: str, rng: np.random.Generator) -> str:
        a, b = (int(x) for x in re.match(r"^What is ([0-9]+) \* ([0-9]+)\?", heard).groups())
        product = a * b
        if self.random:
            digits = len(str(product))
            product = int(rng.integers(10 ** (digits - 1), 10**digits))
        return f"answer: {product}"


def multiplication_players() -> dict[str, Any]:
    """The multiplication task's players by the names of `multiturn.scripted_players`:
    "scripted" calls the calculator, "plausible" answers right without it (a teacher whose
    imitation a small model cannot follow), "random" answers a random number of the right size."""
    return {
        "scripted": CalculatorUser(),
        "plausible": DirectAnswerer(),
        "random": DirectAnswerer(random=True),
    }


def play_host(
    make_game: Callable[[], Any], players: Sequence[Any], max_turns: int, seed: int = 0
) -> dict[str, Any]:
    """Host players against a host game (`host_env`'s kind), one episode each, seeded seed+i:
    `multiturn.play`'s result (returns, turns, transcripts) for games that are not JAX."""
    rng = np.random.default_rng(seed)
    returns, turns = np.zeros(len(players)), np.zeros(len(players), np.int32)
    transcripts = []
    for i, player in enumerate(players):
        game = make_game()
        heard = game.reset(seed + i)
        transcript = [("env", heard)]
        for turn in range(max_turns):
            said = player.speak(heard, rng)
            heard, reward, done = game.step(said)
            transcript += [("policy", said), ("env", heard)]
            returns[i] += reward
            turns[i] = turn + 1
            if done:
                break
        transcripts.append(transcript)
    return {"returns": returns, "turns": turns, "transcripts": transcripts}
