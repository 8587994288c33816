"""Griffe extension: each trainer's `train` documented with the signature users call.

A trainer's `train` (`jaxrl/trainers/<algo>.py`) is written as a body, `train(flat, workdir,
...)`, that a decorator of `jaxrl.trainers.base` (`control_trainer`, `lm_trainer`) wraps into the
public function; read statically, its page would show the body's parameters. This extension
gives each function so decorated the parameters of the `train` that the decorator defines, read
from base.py's source, so the page follows base.py. A decorator without such a `train` leaves
the function as it is. Likewise each trainer's `config = functools.partial(base.load_config,
"<algo>")` gets `load_config`'s docstring, so `<algo>.config(preset)` has its entry.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import griffe

BASE = Path(__file__).resolve().parent.parent / "jaxrl" / "trainers" / "base.py"


def public_trains(source: str) -> dict[str, tuple[ast.FunctionDef, ast.FunctionDef]]:
    """{decorator factory's name: (the factory, the `train` it defines)} in base.py's source."""
    found = {}
    for node in ast.parse(source).body:
        if isinstance(node, ast.FunctionDef):
            for inner in ast.walk(node):
                if isinstance(inner, ast.FunctionDef) and inner.name == "train":
                    found[node.name] = (node, inner)
    return found


def factory_values(factory: ast.FunctionDef, call: str) -> dict[str, str]:
    """The factory's parameters as the decorator `call` gives them (its defaults otherwise), as
    source text: `control_trainer("cql", num_seeds=3)` -> {"algo": "'cql'", "num_seeds": "3"}."""
    args = factory.args.args
    defaults = factory.args.defaults
    with_defaults = args[len(args) - len(defaults) :]
    values = dict(zip([a.arg for a in with_defaults], map(ast.unparse, defaults), strict=True))
    try:
        parsed = ast.parse(call, mode="eval").body
    except SyntaxError:
        return values
    if isinstance(parsed, ast.Call):
        values |= {a.arg: ast.unparse(v) for a, v in zip(args, parsed.args, strict=False)}
        values |= {k.arg: ast.unparse(k.value) for k in parsed.keywords if k.arg}
    return values


def text(node: ast.AST | None) -> str | None:
    """The source text of an annotation or default, or None."""
    return None if node is None else ast.unparse(node)


def parameters(train: ast.FunctionDef, values: dict[str, str]) -> griffe.Parameters:
    """`train`'s parameters as griffe's, a default that names a factory parameter replaced by
    that parameter's value (`num_seeds=num_seeds` -> `num_seeds=4`)."""

    def default_text(node: ast.AST | None) -> str | None:
        if isinstance(node, ast.Name) and node.id in values:
            return values[node.id]
        return text(node)

    args = train.args
    positional = [*args.posonlyargs, *args.args]
    defaults = [None] * (len(positional) - len(args.defaults)) + list(args.defaults)
    found = [
        griffe.Parameter(
            arg.arg,
            annotation=text(arg.annotation),
            kind=griffe.ParameterKind.positional_or_keyword,
            default=default_text(default),
        )
        for arg, default in zip(positional, defaults, strict=True)
    ]
    found += [
        griffe.Parameter(
            arg.arg,
            annotation=text(arg.annotation),
            kind=griffe.ParameterKind.keyword_only,
            default=default_text(default),
        )
        for arg, default in zip(args.kwonlyargs, args.kw_defaults, strict=True)
    ]
    return griffe.Parameters(*found)


class TrainerSignatures(griffe.Extension):
    """Replace a decorated trainer body's parameters by the public `train`'s."""

    def __init__(self) -> None:
        super().__init__()
        source = BASE.read_text(encoding="utf-8")
        self.trains = public_trains(source)
        self.load_config_doc = next(
            (
                ast.get_docstring(node)
                for node in ast.parse(source).body
                if isinstance(node, ast.FunctionDef) and node.name == "load_config"
            ),
            None,
        )

    def on_function_instance(self, *, node: Any, func: griffe.Function, **kwargs: Any) -> None:
        """Give `func` the public signature when a trainer decorator wraps it."""
        for decorator in func.decorators:
            name = str(decorator.value).split("(", 1)[0].rsplit(".", 1)[-1]
            if name in self.trains:
                factory, train = self.trains[name]
                func.parameters = parameters(train, factory_values(factory, str(decorator.value)))
                func.returns = text(train.returns)
                return

    def on_attribute_instance(self, *, node: Any, attr: griffe.Attribute, **kwargs: Any) -> None:
        """Document a trainer's `config = functools.partial(base.load_config, "<algo>")`."""
        value = str(attr.value or "")
        if "partial(base.load_config" in value and attr.docstring is None and self.load_config_doc:
            algo = value.split(",", 1)[-1].strip(" )")
            attr.docstring = griffe.Docstring(
                f"`config(preset=None)` is `base.load_config({algo}, preset)`: "
                + self.load_config_doc,
                parent=attr,
            )
