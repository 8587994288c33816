"""Optional extras: the core never imports them, and a missing one is one line naming it.

A missing package is simulated by a finder in front of `sys.meta_path` that reports it absent,
as Python does for a package that is not installed.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from jaxrl import extras

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXTRA_PACKAGES = sorted({name.split(".")[0] for names in extras.EXTRAS.values() for name in names})


def without(module: str) -> str:
    """Code that makes `module` (and its submodules) look uninstalled to the code after it."""
    return (
        "import sys\n"
        "class Absent:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        f"        if name == {module!r} or name.startswith({module + '.'!r}):\n"
        "            raise ModuleNotFoundError(f'No module named {name!r}', name=name)\n"
        "sys.meta_path.insert(0, Absent())\n"
    )


def run_python(code: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": REPO_ROOT, "JAX_PLATFORMS": "cpu"}
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO_ROOT, env=env
    )


def test_the_core_imports_no_extra():
    """Control algorithms, the environments, the runner and the data loaders import without
    touching any package of an extra (or SymPy, which math-verify brings)."""
    result = run_python(
        "import sys\n"
        "import jaxrl, jaxrl.runner, jaxrl.data, envs, envs.registry\n"
        "import algos.ppo, algos.sac, algos.cql, algos.bc, algos.mappo, algos.sft, algos.grpo\n"
        f"print(sorted(n for n in {EXTRA_PACKAGES + ['sympy']!r} if n in sys.modules))\n"
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]", result.stdout


@pytest.mark.parametrize(
    "module, extra, call",
    [
        ("gguf", "lm", "from jaxrl.lm import gguf; gguf._gguf()"),
        ("safetensors", "lm", "from jaxrl.lm import hf; hf._safetensors()"),
        ("jaxmarl", "marl", "from envs import multi_agent; multi_agent._import_jaxmarl()"),
        ("envpool", "envpool", "import envs; envs.make_vec('envpool:CartPole-v1', 2)"),
    ],
)
def test_a_missing_extra_is_one_line_naming_it(module, extra, call):
    result = run_python(
        without(module) + "from jaxrl import extras\n"
        f"try:\n    {call}\n"
        "except extras.MissingExtraError as error:\n    print(error)\n"
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.strip().splitlines()
    assert len(lines) == 1, result.stdout
    assert f"needs {module}" in lines[0] and f"jaxrl[{extra}]" in lines[0], lines[0]
    assert f"pip install -e '.[{extra}]'" in lines[0], lines[0]


def test_an_import_error_inside_an_installed_package_is_not_called_a_missing_extra(
    tmp_path, monkeypatch
):
    """An installed package that fails to import one of its own dependencies is a broken
    install, reported as Python reports it, not as a missing extra."""
    (tmp_path / "half_installed").mkdir()
    (tmp_path / "half_installed" / "__init__.py").write_text("import a_dependency_not_installed\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ImportError) as error:
        extras.import_module("half_installed", "lm", "a test")
    assert not isinstance(error.value, extras.MissingExtraError)
    assert error.value.name == "a_dependency_not_installed"
    with pytest.raises(extras.MissingExtraError, match=r"^a test: needs not_a_package_here, "):
        extras.import_module("not_a_package_here", "lm", "a test")


@pytest.mark.parametrize(
    "script, module, extra",
    [
        ("sft.py", "tokenizers", "lm"),
        ("grpo.py", "math_verify", "lm"),
        ("mappo.py", "jaxmarl", "marl"),
    ],
)
def test_a_script_without_its_extra_fails_in_one_error_line(script, module, extra, tmp_path):
    """Before flags are parsed or anything compiles: `error: experiments/<script>: ...`, exit 2,
    nothing written."""
    workdir = tmp_path / "run"
    result = run_python(
        without(module) + "import runpy\n"
        f"sys.argv = ['experiments/{script}', '--workdir={workdir}']\n"
        f"runpy.run_path('experiments/{script}', run_name='__main__')\n"
    )
    assert result.returncode == 2, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert lines == [
        f"error: experiments/{script}: needs {module}, from the optional extra jaxrl[{extra}]; "
        f"pip install -e '.[{extra}]' in the jaxrl clone"
    ], result.stderr
    assert not workdir.exists()
