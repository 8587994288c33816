"""Arithmetic word problems with integer answers, generated at three difficulties, for GRPO.

A shipped prompt set for `math_answer_reward` (envs/text/math_answers.py): small English stories
whose answer a program knows exactly, so a model's progress is measured by a verifiable reward
and not by a judge. Each problem is built as numbers and operations first, then told in words, so
the answer is always the arithmetic of the numbers the text states, in the order it states them
(`WordProblem.numbers`, `.operations`; `tests/test_word_problems.py` checks every one):

    difficulty 1   one addition or subtraction, numbers up to 20
                   "Maya has 7 apples. She picks 5 more apples. How many apples does she have now?"
    difficulty 2   two additions / subtractions, numbers up to 50
    difficulty 3   three operations: a multiplication, an exact division and an addition or
                   subtraction, e.g. (4 boxes x 6 pencils - 3) / 3 friends

Every intermediate and final value is a positive integer (a division always comes out even, a
subtraction never empties what it takes from). Names, pronouns, objects, containers, verbs and
sentence forms are drawn at random, so no two problems of a set read alike even when their
arithmetic does, and a set holds no repeated problem text while the difficulty's space allows.

    rows = make_word_problems(1000, difficulty=2, seed=0)   # [{"prompt", "answer", "difficulty"}]
    write_jsonl(rows, "train.jsonl", chat=True)              # prompt as one user message

    python -m envs.text.word_problems --out=train.jsonl --num=1000 --difficulty=2 --seed=0 --chat

Each prompt is the problem followed by an instruction (`DEFAULT_INSTRUCTION`) asking for the
number after "Answer:", a form `extract_answer` reads. A 135M-parameter model follows it poorly
(it rambles past any token budget), so `shots=N` (`--shots=N`) puts N worked examples before
every problem instead, as a completion prompt (or chat turns) that shows the answer's form:

    Question: Jonas keeps 19 muffins in a tin. Then he eats 5 muffins. How many muffins are left?
    Answer: 19 - 5 = 14

    Question: <the problem>
    Answer:
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import sys
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NoReturn

import numpy as np

from jaxrl.config import require

__all__ = [
    "DEFAULT_INSTRUCTION",
    "DIFFICULTIES",
    "WordProblem",
    "evaluate",
    "generate_problems",
    "main",
    "make_word_problems",
    "worked_answer",
    "write_jsonl",
]

DEFAULT_INSTRUCTION = "Solve the problem, then write the final number after 'Answer:'."
DIFFICULTIES = (1, 2, 3)


# --- the vocabulary ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Item:
    """Something countable, with verbs (third person singular) that add to or take from it and
    the container it comes in."""

    plural: str
    gains: tuple[str, ...]  # "{Name} {gain} 5 more apples"
    losses: tuple[str, ...]  # "{Name} {loss} 5 of them"
    container: tuple[str, str]  # singular, plural


# plural, gains, losses ("/" between choices), container singular/plural
_ITEMS = tuple(
    _Item(plural, tuple(gains.split("/")), tuple(losses.split("/")), tuple(box.split("/")))
    for plural, gains, losses, box in (
        ("apples", "picks/buys/is given", "eats/gives away/sells", "basket/baskets"),
        ("cookies", "bakes/buys/is given", "eats/gives away/sells", "tray/trays"),
        ("marbles", "wins/finds/buys", "loses/gives away/trades away", "bag/bags"),
        ("stickers", "buys/collects/is given", "uses/gives away", "sheet/sheets"),
        ("pencils", "buys/finds/is given", "loses/gives away/lends out", "box/boxes"),
        ("shells", "finds/collects", "loses/gives away", "bucket/buckets"),
        ("eggs", "collects/buys", "uses/sells/cracks", "carton/cartons"),
        ("books", "buys/borrows/is given", "donates/sells/lends out", "crate/crates"),
        ("beads", "buys/finds", "uses/loses", "jar/jars"),
        ("strawberries", "picks/buys", "eats/gives away", "bowl/bowls"),
        ("cards", "buys/wins/is given", "trades away/loses/gives away", "pack/packs"),
        ("stamps", "buys/collects/is given", "trades away/sells", "album/albums"),
        ("muffins", "bakes/buys", "eats/sells/gives away", "tin/tins"),
        ("crayons", "buys/finds", "breaks/loses/gives away", "case/cases"),
        ("balloons", "buys/blows up/is given", "pops/gives away", "pack/packs"),
    )
)
# (name, he, him, his)
_PEOPLE = (
    ("Maya", "she", "her", "her"),
    ("Leo", "he", "him", "his"),
    ("Aisha", "she", "her", "her"),
    ("Tom", "he", "him", "his"),
    ("Sofia", "she", "her", "her"),
    ("Ravi", "he", "him", "his"),
    ("Emma", "she", "her", "her"),
    ("Kenji", "he", "him", "his"),
    ("Lucia", "she", "her", "her"),
    ("Omar", "he", "him", "his"),
    ("Grace", "she", "her", "her"),
    ("Diego", "he", "him", "his"),
    ("Nadia", "she", "her", "her"),
    ("Sam", "he", "him", "his"),
    ("Zoe", "she", "her", "her"),
    ("Ben", "he", "him", "his"),
    ("Priya", "she", "her", "her"),
    ("Jonas", "he", "him", "his"),
    ("Chloe", "she", "her", "her"),
    ("Mateo", "he", "him", "his"),
)
_GROUPS = (("friend", "friends"), ("classmate", "classmates"), ("cousin", "cousins"))
_BINS = (("bag", "bags"), ("box", "boxes"), ("jar", "jars"), ("bowl", "bowls"), ("pile", "piles"))
_WHEN = ("", "", " on Monday", " in the afternoon", " the next day", " after lunch")


# --- sentences ------------------------------------------------------------------------------
#
# A problem's quantity belongs to a holder, which the sentences name: "own" (everything the
# person has), "container" (each of their containers), "group" (each friend after a fair share)
# or "bin" (each bag after a fair split). Each sentence states the numbers of its operation in the
# order the arithmetic uses them.

_OPEN_OWN = (
    "{Name} has {n} {items}.",
    "{Name} starts the day with {n} {items}.",
    "There are {n} {items} in {Name}'s {container}.",
    "{Name} keeps {n} {items} in a {container}.",
)
_OPEN_PRODUCT = (  # n containers times m items each
    "{Name} buys {n} {containers} of {items}. Each {container} holds {m} {items}.",
    "{Name} has {n} {containers}, and there are {m} {items} in each one.",
    "{Name} fills {n} {containers} with {m} {items} each.",
)
_OPEN_CONTAINER = (
    "Each of {Name}'s {containers} holds {n} {items}.",
    "{Name} puts {n} {items} in every {container}.",
)
_STEPS = {
    ("own", "+"): (
        "{Name} {gain} {n} more {items}{when}.",
        "Then {he} {gain} another {n} {items}.",
        "{Friend} gives {him} {n} more {items}{when}.",
        "Later, {he} {gain} {n} more.",
    ),
    ("own", "-"): (
        "{Name} {loss} {n} of them{when}.",
        "Then {he} {loss} {n} {items}.",
        "{He} gives {n} {items} to {Friend}{when}.",
        "After that, {Name} {loss} {n} of the {items}.",
    ),
    ("own", "/group"): (
        "{Name} shares all the {items} equally among {n} {groups}.",
        "{He} splits the {items} equally between {n} {groups}.",
    ),
    ("own", "/bin"): (
        "{Name} packs all the {items} into {n} {bins}, the same number in each.",
        "{He} divides the {items} equally into {n} {bins}.",
    ),
    ("container", "+"): (
        "Then {he} adds {n} more {items} to each {container}.",
        "{Name} puts {n} extra {items} in every {container}.",
    ),
    ("container", "-"): (
        "Then {he} takes {n} {items} out of each {container}.",
        "{Name} removes {n} {items} from every {container}.",
    ),
    ("container", "*"): (
        "{He} has {n} such {containers}.",
        "There are {n} {containers} like this in all.",
    ),
    ("group", "+"): (
        "Then each {group} {gain} {n} more {items}.",
        "Each {group} later {gain} {n} more.",
    ),
    ("group", "-"): (
        "Then each {group} {loss} {n} of their {items}.",
        "Each {group} {loss} {n} of them{when}.",
    ),
    ("bin", "+"): (
        "Then {he} adds {n} more {items} to each {bin}.",
        "{Name} puts {n} extra {items} in every {bin}.",
    ),
    ("bin", "-"): (
        "Then {he} takes {n} {items} out of each {bin}.",
        "{Name} removes {n} {items} from every {bin}.",
    ),
}
# The question, by the final holder and whether the last operation shared the quantity out.
_QUESTIONS = {
    ("own", "+"): (
        "How many {items} does {Name} have now?",
        "How many {items} does {he} have in all?",
    ),
    ("own", "-"): (
        "How many {items} does {Name} have left?",
        "How many {items} are left?",
    ),
    ("group", "/"): ("How many {items} does each {group} get?",),
    ("group", "+-"): ("How many {items} does each {group} have now?",),
    ("bin", "/"): ("How many {items} are in each {bin}?", "How many {items} go in each {bin}?"),
    ("bin", "+-"): ("How many {items} are in each {bin} now?",),
}

# How a problem runs at each difficulty: (the holder it starts with, its operations). "own" with
# a first "*" opens with `_OPEN_PRODUCT` (n containers of m items).
_PLANS = {
    1: (("own", "+"), ("own", "-")),
    2: (("own", "++"), ("own", "+-"), ("own", "-+"), ("own", "--")),
    3: (
        ("own", "*+/"),
        ("own", "*-/"),
        ("own", "*/+"),
        ("own", "*/-"),
        ("container", "+*/"),
        ("container", "-*/"),
    ),
}
# Operand ranges: the first quantity, additions (and the most a subtraction may take), and for
# difficulty 3 the counts of containers and of items in each. Changes start at 2, so that no
# sentence says "1 apples".
_RANGES = {
    1: dict(start=(3, 20), change=(2, 20)),
    2: dict(start=(5, 50), change=(2, 30)),
    3: dict(start=(3, 15), change=(2, 20), each_change=(2, 8), count=(2, 9), each=(2, 12)),
}


# --- problems -----------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class WordProblem:
    """A problem's text (without the instruction), the numbers it states in order, and the
    operation that applies each number after the first to the running value."""

    text: str
    numbers: tuple[int, ...]
    operations: tuple[str, ...]  # "+", "-", "*", "/": one fewer than numbers
    difficulty: int

    @property
    def answer(self) -> int:
        """The running value after every operation, left to right (divisions are exact)."""
        return evaluate(self.numbers, self.operations)


def evaluate(numbers: Sequence[int], operations: Sequence[str]) -> int:
    """`numbers[0]`, then each operation with the next number, left to right; raises ValueError
    on a division that is not exact or a negative value (a generated problem has neither)."""
    value = numbers[0]
    for operation, number in zip(operations, numbers[1:], strict=True):
        if operation == "+":
            value += number
        elif operation == "-":
            value -= number
        elif operation == "*":
            value *= number
        elif operation == "/":
            if number == 0 or value % number:
                raise ValueError(f"{value} / {number} is not a whole number")
            value //= number
        else:
            raise ValueError(f"unknown operation {operation!r}")
        if value < 0:
            raise ValueError(f"negative value {value}")
    return value


def _pick(rng: np.random.Generator, options: Sequence[Any]) -> Any:
    return options[int(rng.integers(len(options)))]


def _draw(rng: np.random.Generator, low: int, high: int) -> int | None:
    """An integer in [low, high], or None when the range is empty."""
    return int(rng.integers(low, high + 1)) if low <= high else None


def _numbers(
    rng: np.random.Generator, difficulty: int, holder: str, operations: str
) -> list[int] | None:
    """The numbers of a plan, each drawn so every value stays a positive integer; None when a
    draw cannot (a value with no divisor in 2..9 that leaves at least 2 each), to try again."""
    ranges = _RANGES[difficulty]
    if operations[0] == "*":
        numbers = [_draw(rng, *ranges["count"]), _draw(rng, *ranges["each"])]
        value, rest = numbers[0] * numbers[1], operations[1:]
    else:
        numbers = [_draw(rng, *ranges["start"])]
        value, rest = numbers[0], operations
    per_container = holder == "container"
    for index, operation in enumerate(rest):
        # Changes to each container or each share stay small; changes to a total may be larger.
        small = per_container or "/" in rest[:index]
        low, high = ranges["each_change" if difficulty == 3 and small else "change"]
        if operation == "+":
            number = _draw(rng, low, high)
        elif operation == "-":
            number = _draw(rng, low, min(high, value - 1))
        elif operation == "*":
            number, per_container = _draw(rng, *ranges["count"]), False
        else:
            divisors = [d for d in range(2, 10) if value % d == 0 and value // d >= 2]
            number = _pick(rng, divisors) if divisors else None
        if number is None:
            return None
        numbers.append(number)
        value = evaluate([value, number], [operation])
    return numbers


def _render(rng: np.random.Generator, holder: str, operations: str, numbers: Sequence[int]) -> str:
    """The problem told in words: an opening, a sentence per remaining operation, a question."""
    name, he, him, his = _pick(rng, _PEOPLE)
    friend = _pick(rng, [p[0] for p in _PEOPLE if p[0] != name])
    item = _pick(rng, _ITEMS)
    group = _pick(rng, _GROUPS)
    bin_ = _pick(rng, [b for b in _BINS if b[0] != item.container[0]])
    words = dict(
        Name=name,
        he=he,
        He=he.capitalize(),
        him=him,
        his=his,
        Friend=friend,
        items=item.plural,
        container=item.container[0],
        containers=item.container[1],
        group=group[0],
        groups=group[1],
        bin=bin_[0],
        bins=bin_[1],
    )

    used: set[str] = set()

    def say(options: Sequence[str], **values: Any) -> str:
        # A sentence form used once is not used again in the problem ("After that, ... After
        # that, ..."); verbs and time phrases are drawn for each sentence.
        template = _pick(rng, [o for o in options if o not in used] or options)
        used.add(template)
        values.setdefault("gain", _pick(rng, item.gains))
        values.setdefault("loss", _pick(rng, item.losses))
        values.setdefault("when", _pick(rng, _WHEN))
        return template.format(**words, **values)

    if operations[0] == "*":
        sentences = [say(_OPEN_PRODUCT, n=numbers[0], m=numbers[1])]
        steps, rest = operations[1:], numbers[2:]
    else:
        opening = _OPEN_CONTAINER if holder == "container" else _OPEN_OWN
        sentences = [say(opening, n=numbers[0])]
        steps, rest = operations, numbers[1:]
    for operation, number in zip(steps, rest, strict=True):
        if operation == "/":
            holder = _pick(rng, ("group", "bin"))
            sentences.append(say(_STEPS[("own", "/" + holder)], n=number))
            continue
        sentences.append(say(_STEPS[(holder, operation)], n=number))
        if operation == "*":
            holder = "own"
    last = operations[-1]
    kind = last if holder == "own" else ("/" if last == "/" else "+-")
    sentences.append(say(_QUESTIONS[(holder, kind)]))
    return " ".join(sentences)


def _one_problem(rng: np.random.Generator, difficulty: int) -> WordProblem:
    while True:
        holder, operations = _pick(rng, _PLANS[difficulty])
        numbers = _numbers(rng, difficulty, holder, operations)
        if numbers is not None:
            text = _render(rng, holder, operations, numbers)
            return WordProblem(text, tuple(numbers), tuple(operations), difficulty)


def generate_problems(count: int, difficulty: int, seed: int) -> list[WordProblem]:
    """`count` problems of a difficulty (1, 2 or 3), the same for the same seed, with no repeated
    text unless `count` approaches all the difficulty allows (then the rest repeat). Raises
    `ConfigError` naming `count` or `difficulty` for a bad value."""
    require(
        isinstance(count, int | np.integer) and count >= 0,
        "count",
        f"got {count!r}",
        "ask for 0 or more problems",
    )
    require(
        difficulty in DIFFICULTIES,
        "difficulty",
        f"got {difficulty!r}",
        f"choose one of {', '.join(map(str, DIFFICULTIES))}",
    )
    rng = np.random.default_rng(seed)
    problems: list[WordProblem] = []
    seen: set[str] = set()
    attempts = 0
    while len(problems) < count:
        problem = _one_problem(rng, difficulty)
        attempts += 1
        # Many draws in a row that only repeat mean the space is nearly used up: allow repeats.
        if problem.text not in seen or attempts > 20 * count + 1000:
            seen.add(problem.text)
            problems.append(problem)
    return problems


def worked_answer(problem: WordProblem) -> str:
    """The problem's arithmetic, one operation at a time, ending on the answer:
    "13 - 4 = 9", or "4 * 6 = 24, 24 - 3 = 21, 21 / 3 = 7"."""
    steps, value = [], problem.numbers[0]
    for operation, number in zip(problem.operations, problem.numbers[1:], strict=True):
        result = evaluate((value, number), (operation,))
        steps.append(f"{value} {operation} {number} = {result}")
        value = result
    return ", ".join(steps)


def _few_shot_prompt(examples: Sequence[WordProblem], problem: WordProblem, chat: bool) -> Any:
    """Worked examples, then the problem: "Question: ...\nAnswer: 13 - 4 = 9\n\n" per example
    and "Question: ...\nAnswer:" to complete; as chat, alternating user and assistant turns."""
    if chat:
        turns: list[dict[str, str]] = []
        for example in examples:
            turns.append({"role": "user", "content": example.text})
            turns.append({"role": "assistant", "content": worked_answer(example)})
        return [*turns, {"role": "user", "content": problem.text}]
    shown = "".join(f"Question: {e.text}\nAnswer: {worked_answer(e)}\n\n" for e in examples)
    return f"{shown}Question: {problem.text}\nAnswer:"


# Worked examples come from their own stream of problems, never one of the set's.
_SHOT_SEED_OFFSET = 1_000_003


def make_word_problems(
    count: int,
    difficulty: int,
    seed: int,
    instruction: str | None = None,
    shots: int = 0,
    chat: bool = False,
) -> list[dict[str, Any]]:
    """`generate_problems` as prompt-file rows {"prompt", "answer": the integer as a string,
    "difficulty"}. The prompt is the problem, a newline and `instruction` (default
    `DEFAULT_INSTRUCTION`; "" for none); or, with `shots` > 0, the same `shots` worked examples
    (`worked_answer`) before every problem, which show the answer's form instead of an
    instruction, as a completion prompt ending in "Answer:" or, with `chat`, as chat turns. A
    plain prompt with `chat` is one user message."""
    require(shots >= 0, "shots", f"got {shots}", "use 0 (no examples) or more")
    require(
        not (shots and instruction),
        "instruction",
        "worked examples (shots) show the answer's form, so an instruction would be ignored",
        "drop the instruction or set shots=0",
    )
    problems = generate_problems(count, difficulty, seed)
    examples: list[WordProblem] = []
    if shots:
        texts = {p.text for p in problems}
        candidates = generate_problems(shots + 50, difficulty, seed + _SHOT_SEED_OFFSET)
        candidates = [p for p in candidates if p.text not in texts]
        # Examples of different operations first: two additions would teach "always add".
        fresh = list({p.operations: p for p in reversed(candidates)}.values())[::-1]
        examples = (fresh + [p for p in candidates if p not in fresh])[:shots]
    if instruction is None:
        instruction = "" if shots else DEFAULT_INSTRUCTION
    rows = []
    for problem in problems:
        if shots:
            prompt: Any = _few_shot_prompt(examples, problem, chat)
        else:
            prompt = f"{problem.text}\n{instruction}" if instruction else problem.text
            if chat:
                prompt = [{"role": "user", "content": prompt}]
        rows.append({"prompt": prompt, "answer": str(problem.answer), "difficulty": difficulty})
    return rows


def write_jsonl(
    rows: Iterable[Mapping[str, Any]], path: str | os.PathLike, chat: bool = False
) -> None:
    """Write rows as JSON lines, atomically (a temporary file renamed into place, so a reader never
    sees half a file); with `chat`, a string prompt becomes one user message, as conversational
    TRL datasets have it. Creates the file's directory if needed."""
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    temporary = os.path.join(directory, f".{os.path.basename(path)}.tmp-{os.getpid()}")
    try:
        with open(temporary, "w", encoding="utf-8") as f:
            for row in rows:
                row = dict(row)
                if chat and isinstance(row.get("prompt"), str):
                    row["prompt"] = [{"role": "user", "content": row["prompt"]}]
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
        os.replace(temporary, path)
    except BaseException:
        if os.path.exists(temporary):
            os.remove(temporary)
        raise


# --- command line -------------------------------------------------------------------------------


def _integer(flag: str, low: int, high: int | None, example: str):
    """An argparse type: an int in [low, high], or an error naming the range and an example."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or value < low or (high is not None and value > high):
            wanted = f"between {low} and {high}" if high is not None else f">= {low}"
            raise argparse.ArgumentTypeError(
                f"must be a whole number {wanted}, got {text!r}; pass e.g. {flag}={example}"
            )
        return value

    return parse


class _Parser(argparse.ArgumentParser):
    """argparse whose every error is one `error: --flag: problem; fix` line and exit status 2,
    as the repository's other scripts report bad flags."""

    def error(self, message: str) -> NoReturn:
        flags = ", ".join(a.option_strings[0] for a in self._actions if a.dest != "help")
        if message.startswith("unrecognized arguments: "):
            first = message.removeprefix("unrecognized arguments: ").split()[0]
            if first.startswith("-"):
                line = f"{first.split('=')[0]}: unknown flag; the flags are {flags}"
            else:
                line = f"unexpected argument {first!r}; settings are flags, e.g. --num=1000"
        elif message.startswith("the following arguments are required: "):
            missing = message.removeprefix("the following arguments are required: ").split(",")[0]
            line = f"{missing}: missing; pass the JSONL file to write, e.g. {missing}=train.jsonl"
        elif message.startswith("argument "):
            flag, _, problem = message.removeprefix("argument ").partition(": ")
            flag = flag.split("/")[0]
            if problem == "expected one argument":
                problem = f"needs a value; pass {flag}=VALUE"
            elif problem.startswith("ignored explicit argument"):
                problem = f"takes no value; pass {flag} alone"
            line = f"{flag}: {problem}"
        else:
            line = f"flags: {message}; see --help"
        print(f"error: {line}", file=sys.stderr)
        sys.exit(2)


@functools.cache
def _parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="python -m envs.text.word_problems",
        description="Write arithmetic word problems as a JSONL prompt file (prompt, answer).",
        allow_abbrev=False,
    )
    parser.add_argument("--out", required=True, help="The JSONL file to write.")
    parser.add_argument(
        "--num", type=_integer("--num", 1, None, "1000"), default=1000, help="Problems."
    )
    parser.add_argument(
        "--difficulty",
        type=_integer("--difficulty", DIFFICULTIES[0], DIFFICULTIES[-1], "2"),
        default=1,
        help="1: one +/-; 2: two +/-; 3: x, exact / and +/-.",
    )
    parser.add_argument("--seed", type=_integer("--seed", 0, None, "0"), default=0, help="Seed.")
    parser.add_argument(
        "--chat", action="store_true", help="Write each prompt as one user chat message."
    )
    parser.add_argument(
        "--instruction",
        default=None,
        help="Text after each problem ('' for none); default: ask for the number after "
        "'Answer:' (no instruction with --shots).",
    )
    parser.add_argument(
        "--shots",
        type=_integer("--shots", 0, None, "2"),
        default=0,
        help="Worked examples before each problem (a completion prompt ending in 'Answer:').",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> None:
    """The command line: parse the flags (one `error:` line and exit 2 if bad), write the file and
    say so on stderr."""
    args = _parser().parse_args(argv)
    if os.path.isdir(args.out):
        print(f"error: --out={args.out}: is a directory; pass a file path", file=sys.stderr)
        sys.exit(2)
    if args.shots and args.instruction:
        print(
            "error: --instruction: worked examples (--shots) show the answer's form, so the "
            "instruction would be ignored; drop --instruction or --shots",
            file=sys.stderr,
        )
        sys.exit(2)
    rows = make_word_problems(
        args.num, args.difficulty, args.seed, args.instruction, args.shots, args.chat
    )
    try:
        write_jsonl(rows, args.out)
    except OSError as error:
        print(f"error: --out={args.out}: {error.strerror}; pass a writable path", file=sys.stderr)
        sys.exit(2)
    print(
        f"wrote {len(rows)} problems (difficulty {args.difficulty}, seed {args.seed}) to "
        f"{args.out}",
        file=sys.stderr,
    )


if __name__ == "__main__":
    main()
