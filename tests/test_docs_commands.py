"""Every command the docs show runs as written from the repository root, and every entry of the
README's API table has its reference page.

The commands are read from README.md and docs/*.md: the shell code blocks and the inline code
that run one of our programs (`python3 experiments/<script>.py ...`, `python3 -m envs....`), in
any command line (after `&&`, an environment assignment, inside `gcloud ... --command="..."`).
Nothing is trained; each command is checked as far as it can be without running it:
- each distinct program starts from the repository root with its help flag (`--helpfull` for
  the absl scripts of experiments/, `--help` for the benchmarks and `-m` modules), exits 0 and
  lists every flag the docs pass it; so a script that only imports when installed, or a renamed
  flag, fails;
- each script command's `--config=FILE:PRESET` is loaded as the script loads it and each
  `--config.X=V` must name a field of that config and convert to its type (in this process: a
  config file costs milliseconds where a script's start costs seconds).
About a minute on 2 cores.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parent.parent
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
SHELL_BLOCKS = {"", "bash", "sh", "shell", "console"}  # fenced blocks holding command lines
PACKAGES = ("jaxrl", "envs", "algos")  # what `python -m` may run of ours
OPERATORS = {"&&", "||", ";", "|"}


def code_blocks(text: str) -> Iterator[tuple[str, str]]:
    """(language, body) of each fenced code block of a Markdown text."""
    for match in re.finditer(r"^ *```([\w-]*)[^\n]*\n(.*?)^ *```", text, re.M | re.S):
        yield match.group(1).lower(), match.group(2)


def open_quote(line: str) -> bool:
    """Whether a shell line ends inside a quoted string (it goes on on the next line)."""
    try:
        shlex.split(line, comments=True)
    except ValueError:
        return True
    return False


def command_lines(block: str) -> Iterator[str]:
    """The logical lines of a shell block: continuations and quoted line breaks joined, heredoc
    bodies left out."""
    lines = iter(block.splitlines())
    pending = ""
    for line in lines:
        heredoc = re.search(r"<<-?\s*['\"]?(\w+)['\"]?", line)
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        if not heredoc and open_quote(pending + line):
            pending += line + " "
            continue
        yield pending + line
        pending = ""
        if heredoc:  # skip the document up to its terminator
            for body in lines:
                if body.strip() == heredoc.group(1):
                    break
    if pending:
        yield pending


def split_words(line: str) -> list[str]:
    """A shell line's words (comments dropped); a line shlex cannot read gives none."""
    try:
        return shlex.split(line, comments=True)
    except ValueError:
        return []


def programs(words: list[str]) -> Iterator[tuple[str, list[str]]]:
    """(program, arguments) of each of our programs a command line runs; program is a script
    path under experiments/ or `-m module`. A quoted word holding a command line of its own (a
    remote shell's `--command="..."`) is read too."""
    segment: list[str] = []
    for word in [*words, ";"]:
        if word not in OPERATORS:
            segment.append(word)
            continue
        while segment and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", segment[0]):
            segment.pop(0)  # an environment assignment before the command
        if len(segment) >= 2 and re.fullmatch(r"python3?", segment[0]):
            target, rest = segment[1], segment[2:]
            if target.startswith("experiments/") and target.endswith(".py"):
                yield target, rest
            elif target == "-m" and rest and rest[0].split(".")[0] in PACKAGES:
                yield f"-m {rest[0]}", rest[1:]
        for word_ in segment:
            if " " in word_ and "python" in word_:
                for inner in command_lines(word_):
                    yield from programs(split_words(inner))
        segment = []


def documented_commands() -> list[tuple[str, str, list[str]]]:
    """(where, program, arguments) of every command the docs show, in order, without repeats."""
    found, seen = [], set()
    for path in DOCS:
        text = path.read_text(encoding="utf-8")
        where = path.relative_to(REPO).as_posix()
        lines = [
            line
            for language, body in code_blocks(text)
            if language in SHELL_BLOCKS
            for line in command_lines(body)
        ]
        prose = re.sub(r"^ *```.*?^ *```", "", text, flags=re.M | re.S)
        lines += [span for span in re.findall(r"`([^`\n]+)`", prose) if "python" in span]
        for line in lines:
            for program, args in programs(split_words(line)):
                key = (program, tuple(args))
                if key not in seen:
                    seen.add(key)
                    found.append((where, program, args))
    return found


COMMANDS = documented_commands()


def is_script(program: str) -> bool:
    """A script of experiments/ (absl flags), not a benchmark or a module (argparse)."""
    return program.startswith("experiments/") and program.count("/") == 1


def flag_name(arg: str) -> str:
    return arg.split("=", 1)[0]


def run(program: str, args: list[str]) -> subprocess.CompletedProcess:
    command = program.split() if program.startswith("-m ") else [program]
    env = {k: v for k, v in os.environ.items() if not k.startswith("JAXRL_")}
    env["JAX_PLATFORMS"] = "cpu"
    return subprocess.run(
        [sys.executable, *command, *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
        env=env,
    )


def has_flag(help_text: str, flag: str) -> bool:
    """Whether a usage text lists `--name` (absl: `--name:` or `--[no]name:`; argparse)."""
    name = re.escape(flag.removeprefix("--"))
    return re.search(rf"--(\[no\])?{name}\b", help_text) is not None


def test_the_docs_show_commands_of_every_kind():
    programs_shown = {program for _, program, _ in COMMANDS}
    assert len(COMMANDS) >= 40, COMMANDS
    assert "experiments/ppo.py" in programs_shown  # the README's main command
    assert "experiments/benchmarks/generation.py" in programs_shown
    assert "-m envs.text.word_problems" in programs_shown
    assert any("/mnt/shared/runs/grpo" in " ".join(args) for _, _, args in COMMANDS)  # gcloud's


def test_every_documented_program_starts_and_has_the_flags_shown():
    """Each program the docs run starts from the repository root (`--helpfull` for a script,
    `--help` for a benchmark or module, exit 0), and lists every flag the docs pass it; a
    script's `--config.X` settings are the next test's."""
    flags: dict[str, set[str]] = {}
    places: dict[str, set[str]] = {}
    for where, program, args in COMMANDS:
        names = {flag_name(a) for a in args if a.startswith("--")}
        flags.setdefault(program, set()).update(
            n
            for n in names
            if not n.startswith(("--config.", "--help"))  # help: the runner's
        )
        places.setdefault(program, set()).add(where)

    def usage(program: str) -> subprocess.CompletedProcess:
        return run(program, ["--helpfull" if is_script(program) else "--help"])

    with ThreadPoolExecutor(max_workers=2) as pool:
        results = dict(zip(flags, pool.map(usage, flags), strict=True))
    failures = []
    for program, result in results.items():
        where = ", ".join(sorted(places[program]))
        if result.returncode != 0:
            last = (result.stderr.strip().splitlines() or ["(no output)"])[-1]
            failures.append(f"{where}: python3 {program} --help exits {result.returncode}: {last}")
            continue
        missing = sorted(f for f in flags[program] if not has_flag(result.stdout, f))
        if missing:
            failures.append(f"{where}: python3 {program} has no {', '.join(missing)}")
    assert not failures, "\n".join(failures)


def load_config(path: str, preset: str | None) -> Any:
    """A script's --config FILE[:PRESET] loaded as the script loads it (locked: a field it
    lacks cannot be set)."""
    spec = importlib.util.spec_from_file_location(f"docs_config_{Path(path).stem}", REPO / path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    config = module.get_config() if preset is None else module.get_config(preset)
    config.lock()
    return config


def parse_value(text: str, kind: type) -> Any:
    """A --config.X value as ml_collections reads it for a field of type `kind`."""
    if kind is bool:
        if text.lower() not in ("true", "false", "1", "0"):
            raise ValueError(f"not a bool: {text!r}")
        return text.lower() in ("true", "1")
    if kind in (int, float):
        return kind(text)
    if kind is str:
        return text
    value = ast.literal_eval(text)
    return tuple(value) if kind is tuple else value


def override(config: Any, name: str, text: str) -> None:
    """Set `--config.<name>=<text>` on `config`, as the script would (type-checked)."""
    *sections, field = name.split(".")
    node = config
    for section in sections:
        node = node[section]
    if field not in node:
        raise KeyError(f"no field {name}")
    node[field] = parse_value(text, node.get_type(field))


def test_every_documented_config_setting_is_a_field_of_its_config():
    """Each script command's `--config=FILE:PRESET` loads and each `--config.X=V` names a
    field of that config and gives it a value of the field's type (read the way the scripts'
    ml_collections flags read it), so a renamed setting or a removed preset fails here."""
    sys.path.insert(0, str(REPO))  # the config files import the library, as the scripts do
    failures = []
    for where, program, args in COMMANDS:
        if not is_script(program):
            continue
        given = [a for a in args if flag_name(a) == "--config"]
        path, _, preset = (
            given[-1].split("=", 1)[1].partition(":")
            if given
            else (f"experiments/configs/{Path(program).name}", "", "")
        )
        settings = [a for a in args if a.startswith("--config.")]
        if not given and not settings:
            continue
        if not (REPO / path).is_file():
            if given or settings:
                failures.append(f"{where}: {program}: no config file {path}")
            continue
        try:
            config = load_config(path, preset or None)
            for setting in settings:
                name, _, text = setting.removeprefix("--config.").partition("=")
                override(config, name, text)
        except Exception as error:  # noqa: BLE001  any failure is the command's
            failures.append(f"{where}: python3 {program} {shlex.join(args)}\n  {error!r}")
    assert not failures, "\n".join(failures)


# --------------------------------------------------------------------------------------------
# The README's API table and the site's reference pages


def api_modules() -> list[str]:
    """The modules of the site's API reference: mkdocs.yml's `api/<module>.md` nav entries."""
    text = (REPO / "mkdocs.yml").read_text(encoding="utf-8")
    found = re.findall(r"^\s*-\s*(?:[^:\n]+:\s*)?api/([\w.]+)\.md\s*$", text, re.M)
    return [module for module in found if module != "index"]


def module_file(module: str) -> Path | None:
    """The source file of a dotted module name in this repository, or None."""
    path = REPO.joinpath(*module.split("."))
    for candidate in (path.with_suffix(".py"), path / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def defines(module: str, name: str) -> bool:
    """Whether `module`'s source binds `name` at its top level (or lists it in __all__)."""
    source = module_file(module)
    if source is None:
        return False
    tree = ast.parse(source.read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.ClassDef) and node.name == name:
            return True
        imported = isinstance(node, ast.ImportFrom | ast.Import)
        if imported and any((a.asname or a.name).split(".")[0] == name for a in node.names):
            return True
        if isinstance(node, ast.Assign):
            targets = [t.id for t in node.targets if isinstance(t, ast.Name)]
            if name in targets:
                return True
            if "__all__" in targets and name in exported(tree, node.value):
                return True
    return False


def exported(tree: ast.Module, value: ast.expr) -> Any:
    """The names of a module's `__all__`: a literal list, or `sorted(_MODULES)` over a dict
    literal of the names a lazy package (envs, jaxrl.data) imports at first use."""
    try:
        return ast.literal_eval(value)
    except ValueError:
        pass
    if isinstance(value, ast.Call) and value.args and isinstance(value.args[0], ast.Name):
        for node in tree.body:
            named = isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == value.args[0].id for t in node.targets
            )
            if named:
                return ast.literal_eval(node.value)
    return ()


def expand(name: str) -> list[str]:
    """`jaxrl.trainers.<algo>.train` -> the name for every module of that folder that has it."""
    match = re.search(r"\.<\w+>", name)
    if not match:
        return [name]
    folder, rest = name[: match.start()], name[match.end() :].lstrip(".")
    attribute = rest.split(".")[0]
    modules = sorted(
        f"{folder}.{path.stem}"
        for path in REPO.joinpath(*folder.split(".")).glob("*.py")
        if path.stem != "__init__"
    )
    return [f"{m}.{rest}" if rest else m for m in modules if not attribute or defines(m, attribute)]


def module_of(name: str) -> str | None:
    """The longest dotted prefix of `name` that is a module of this repository."""
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        if module_file(".".join(parts[:end])):
            return ".".join(parts[:end])
    return None


def relative_module(name: str, previous: str) -> str | None:
    """The module a bare name in a table cell means, read after the qualified `previous`
    (`jaxrl.lm.model`, `sampler` -> `jaxrl.lm.sampler`; `algos.ppo.gae`, `ppo_loss_terms` ->
    `algos.ppo`; `algos.ppo.gae`, `sac.critic_loss` -> `algos.sac`)."""
    parts, first = previous.split("."), name.split(".")[0]
    for end in range(len(parts) - 1, 0, -1):
        base = ".".join(parts[:end])
        if module_file(f"{base}.{first}"):
            return f"{base}.{first}"
        if module_file(base) and defines(base, first):
            return base
    return None


def api_table_rows() -> list[tuple[list[str], str]]:
    """(names in the first column, the row's text) of the README's API table."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    section = text.split("\n## API\n", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 2 or set(cells[0]) <= set("-: ") or cells[0] == "API":
            continue
        names = [
            re.split(r"[(\s]", span, maxsplit=1)[0] for span in re.findall(r"`([^`]+)`", cells[0])
        ]
        rows.append((names, line))
    return rows


def test_every_api_table_entry_has_its_reference_page():
    listed = set(api_modules())
    rows = api_table_rows()
    assert len(rows) >= 10, rows
    missing = []
    for names, line in rows:
        previous = None
        for name in names:
            if name.split(".")[0] in PACKAGES:
                modules = [module_of(n) for n in expand(name)]
                previous = None if "<" in name else name
            elif previous is not None:
                modules = [relative_module(name, previous)]
            else:
                continue
            for module in modules:
                if module is None:
                    missing.append(f"{name}: no such module")
                elif (
                    module not in listed
                    and module_file(module).parent.joinpath("__init__.py").is_file()
                ):
                    missing.append(f"{name}: {module} has no page in mkdocs.yml's API reference")
                elif module not in listed and not re.search(r"\]\((docs/[\w./-]+)", line):
                    missing.append(f"{name}: {module} (a namespace package) links no docs page")
    assert not missing, "\n".join(missing)


def test_every_reference_page_names_a_module():
    """A module renamed or removed must leave the API list too (mkdocs would fail on it)."""
    modules = api_modules()
    assert len(modules) >= 30, modules
    assert len(modules) == len(set(modules)), "a module listed twice"
    assert [m for m in modules if module_file(m) is None] == []


@pytest.mark.parametrize("path", [p.relative_to(REPO).as_posix() for p in DOCS])
def test_relative_links_point_at_files(path):
    """Links between the README and the docs pages (the site checks its own pages' links and
    anchors when built; this covers the README and runs without the docs tools)."""
    page = REPO / path
    text = re.sub(r"^ *```.*?^ *```", "", page.read_text(encoding="utf-8"), flags=re.M | re.S)
    broken = [
        target
        for target in re.findall(r"\]\(([^)\s#]+)(?:#[^)]*)?\)", text)
        if "://" not in target and not (page.parent / target).exists()
    ]
    assert not broken, broken
