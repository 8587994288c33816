"""Layers point one way (docs/design.md): the core (`jaxrl` without its trainers) < `envs` <
`algos` < `jaxrl.trainers` < `experiments`, which nothing imports; and no import cycle among
modules. Imports are read from the source (imports inside functions too, and
`importlib.import_module` with a literal name), so a lazy import cannot hide an upward edge.

The checker is run on the repository, and on two small made-up trees that break each rule once,
so the test shows that it can fail."""

from __future__ import annotations

import ast
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("jaxrl", "envs", "algos", "experiments")


def layer(module: str) -> int:
    """0 core, 1 envs, 2 algos, 3 trainers (the public one-call API), 4 scripts."""
    parts = module.split(".")
    if parts[0] == "jaxrl":
        return 3 if len(parts) > 1 and parts[1] == "trainers" else 0
    return {"envs": 1, "algos": 2, "experiments": 4}[parts[0]]


def find_modules(root: Path) -> dict[str, Path]:
    """{dotted module name: file} for every .py file under the packages at `root`."""
    found = {}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            name = ".".join(path.relative_to(root).with_suffix("").parts)
            found[name.removesuffix(".__init__")] = path
    return found


def imported_names(path: Path, module: str) -> set[str]:
    """Every dotted name `module`'s source imports, relative imports resolved."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parts = parts[: len(parts) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
        elif (
            isinstance(node, ast.Call)
            and getattr(node.func, "attr", getattr(node.func, "id", None)) == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant | ast.JoinedStr)
        ):
            first = node.args[0]
            if isinstance(first, ast.Constant):
                names.add(str(first.value))
            else:  # f"pkg.{name}": the literal prefix names the package at least
                names.add("".join(v.value for v in first.values if isinstance(v, ast.Constant)))
    return {name.strip(".") for name in names if name.strip(".")}


def import_graph(root: Path) -> dict[str, set[str]]:
    """{module: the project's modules it imports}; a name is cut back to the longest module it
    starts with (`from jaxrl.lm import model` imports jaxrl.lm.model, `from jaxrl.lm import
    Tokenizer` the package jaxrl.lm)."""
    modules = find_modules(root)
    graph = {}
    for module, path in modules.items():
        edges = set()
        for name in imported_names(path, module):
            if name.split(".")[0] not in PACKAGES:
                continue
            while name and name not in modules:
                name = name.rpartition(".")[0]
            if name and name != module:
                edges.add(name)
        graph[module] = edges
    return graph


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """Imports that go up the layers, and any import of the scripts' folder."""
    return sorted(
        f"{a} -> {b}"
        for a, targets in graph.items()
        for b in targets
        if layer(b) > layer(a) or (layer(b) == 4 and layer(a) < 4)
    )


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, written
    iteratively). A package importing its own submodules (re-exports in __init__) is not an
    edge here: Python runs the package first either way."""

    def edges(module: str) -> list[str]:
        return sorted(b for b in graph[module] if not b.startswith(module + "."))

    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(edges(start)))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(edges(child))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_the_project_s_imports_go_down_the_layers():
    graph = import_graph(REPO_ROOT)
    assert len(graph) > 100  # the walk found the project
    assert upward_imports(graph) == []


def test_the_project_has_no_import_cycle():
    assert cycles(import_graph(REPO_ROOT)) == []


def _tree(root: Path, files: dict[str, str]) -> Path:
    for name, source in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(source)
    for package in PACKAGES:
        (root / package).mkdir(exist_ok=True)
        (root / package / "__init__.py").touch()
    return root


def test_the_checker_finds_an_upward_import_even_inside_a_function(tmp_path):
    root = _tree(
        tmp_path,
        {
            "jaxrl/core.py": "def f():\n    from algos import ppo\n",
            "algos/ppo.py": "import jaxrl.core\n",
            "jaxrl/trainers/__init__.py": "",
            "jaxrl/trainers/ppo.py": "from algos import ppo\n",
            "envs/cartpole.py": "import importlib\nimportlib.import_module('experiments.run')\n",
            "experiments/run.py": "from jaxrl.trainers import ppo\n",
        },
    )
    assert upward_imports(import_graph(root)) == [
        "envs.cartpole -> experiments.run",
        "jaxrl.core -> algos",  # `from algos import ppo` runs algos/__init__.py first
        "jaxrl.core -> algos.ppo",
    ]


def test_the_checker_finds_a_cycle(tmp_path):
    root = _tree(
        tmp_path,
        {
            "algos/grpo.py": "def make():\n    from algos import partial\n",
            "algos/partial.py": "from algos.grpo import make\n",
            "algos/ppo.py": "from . import grpo\n",
        },
    )
    graph = import_graph(root)
    assert upward_imports(graph) == []
    assert cycles(graph) == [["algos.grpo", "algos.partial"]]


def test_a_wheel_installs_only_the_library_packages():
    """pyproject.toml's package list: jaxrl, algos and envs (and their subpackages), never the
    scripts' folder (an installed `experiments` would shadow, or be shadowed by, PyPI's)."""
    import tomllib

    config = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())
    include = config["tool"]["setuptools"]["packages"]["find"]["include"]
    assert sorted(include) == ["algos*", "envs*", "jaxrl*"]
