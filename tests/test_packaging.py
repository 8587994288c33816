"""How jaxrl installs: a wheel built from the clone holds exactly the library's packages (`jaxrl`,
`algos`, `envs`: every file of theirs, none of `experiments`) and, installed outside the clone,
trains PPO and GRPO from Python; and a package of another distribution named `envs` or `algos`
that Python would import instead of ours is named in one line when jaxrl is imported."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from importlib import metadata
from pathlib import Path

import pytest

from tests.script_runs import xla_flags

REPO_ROOT = Path(__file__).resolve().parent.parent
LIBRARY = ("algos", "envs", "jaxrl")


def clean_environment(pythonpath: list[str]) -> dict[str, str]:
    """The test process's environment with only `pythonpath` on PYTHONPATH, one CPU device (not
    conftest.py's eight simulated ones) and no multi-host runtime."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "JAXRL_DISTRIBUTED")}
    env |= {"XLA_FLAGS": xla_flags(), "JAX_PLATFORMS": "cpu", "MPLBACKEND": "Agg"}
    env["PYTHONPATH"] = os.pathsep.join(pythonpath)
    return env


def clone_files() -> list[str]:
    """The files a clone of this checkout holds (tracked, and new ones git does not ignore)."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
    )
    if listed.returncode != 0:
        pytest.skip(f"not a git checkout (git ls-files: {listed.stderr.strip()})")
    return [name for name in listed.stdout.split("\0") if name and (REPO_ROOT / name).is_file()]


def setuptools_builds_this() -> bool:
    """Whether the installed setuptools builds pyproject.toml without an isolated build
    environment: 77 reads its SPDX `license` string and builds wheels itself."""
    try:
        major = int(metadata.version("setuptools").split(".")[0])
    except (metadata.PackageNotFoundError, ValueError):
        return False
    return major >= 77


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel `pip wheel .` builds from a copy of the clone (so the build's egg-info and build/
    land in the copy, not the checkout)."""
    files = clone_files()
    source = tmp_path_factory.mktemp("clone")
    for name in files:
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO_ROOT / name, source / name)
    out = tmp_path_factory.mktemp("wheel")
    command = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", str(out)]
    isolated = not setuptools_builds_this()  # else no download: this environment's setuptools
    command += [] if isolated else ["--no-build-isolation"]
    built = subprocess.run([*command, str(source)], capture_output=True, text=True)
    offline = "No matching distribution" in built.stderr or "connection" in built.stderr.lower()
    if built.returncode != 0 and isolated and offline:
        pytest.skip("pip could not fetch setuptools>=77 to build the wheel (offline?)")
    assert built.returncode == 0, built.stderr[-4000:]
    (path,) = out.glob("jaxrl-*.whl")
    return path


def test_the_wheel_holds_exactly_jaxrl_algos_and_envs(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    tops = {name.split("/")[0] for name in names if ".dist-info/" not in name}
    assert sorted(tops) == list(LIBRARY)
    # Every file of the library in the clone (modules, presets, any data files) is in the wheel.
    library = {name for name in clone_files() if name.split("/")[0] in LIBRARY}
    assert sorted(library - set(names)) == []
    (top_level,) = [name for name in names if name.endswith(".dist-info/top_level.txt")]
    assert sorted(zipfile.ZipFile(wheel).read(top_level).decode().split()) == list(LIBRARY)


# Run by the installed wheel's interpreter in a directory outside the clone: the packages must
# come from the installation, every module of theirs that the runs import too; then a small PPO
# run (CartPole) and a small GRPO run (the tiny model on its digit task), as a user would.
OUTSIDE_THE_CLONE = """
import json, sys
import algos, envs, jaxrl
from jaxrl.trainers import grpo, ppo

config = ppo.config()
config.total_timesteps = 2048
config.eval_episodes = 2
config.run.num_chunks = 2
config.run.progress = config.run.tensorboard = False
ppo_summary = ppo.train(config, "ppo-run", num_seeds=1).summary

config = grpo.config()
config.num_steps, config.batch_size, config.group_size = 2, 4, 4
config.eval_batch_size, config.task.num_eval, config.eval_samples = 16, 16, 0
config.run.num_chunks, config.run.log_every = 1, 1
config.run.progress = config.run.tensorboard = False
grpo_summary = grpo.train(config, "grpo-run").summary

ours = {name: getattr(module, "__file__", None) or str(list(getattr(module, "__path__", [])))
        for name, module in sys.modules.items() if name.split(".")[0] in ("jaxrl", "algos", "envs")}
print(json.dumps({"ppo": ppo_summary, "grpo": grpo_summary, "modules": ours}))
"""


def test_an_installed_wheel_trains_ppo_and_grpo_outside_the_clone(wheel, tmp_path):
    target, elsewhere = tmp_path / "site", tmp_path / "elsewhere"
    elsewhere.mkdir()
    installed = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "--quiet", "--target", str(target)]
        + [str(wheel)],
        capture_output=True,
        text=True,
    )
    assert installed.returncode == 0, installed.stderr[-4000:]
    assert sorted(p.name for p in target.iterdir() if not p.name.endswith(".dist-info")) == list(
        LIBRARY
    )
    # The installation first on the path; the dependencies from this environment's site-packages
    # (an editable jaxrl there, if any, comes after: its finder runs after the path's).
    run = subprocess.run(
        [sys.executable, "-c", OUTSIDE_THE_CLONE],
        cwd=elsewhere,
        env=clean_environment([str(target)]),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-4000:]
    result = json.loads(run.stdout.strip().splitlines()[-1])
    outside = {name: path for name, path in result["modules"].items() if str(target) not in path}
    assert outside == {}, "imported from outside the installation"
    assert {"jaxrl.trainers.presets.ppo", "jaxrl.trainers.presets.grpo"} <= set(result["modules"])
    ppo_summary, grpo_summary = result["ppo"], result["grpo"]
    assert ppo_summary["algo"] == "ppo" and ppo_summary["num_seeds"] == 1
    assert ppo_summary["env_steps"] == 2048 and ppo_summary["final_eval_return"] > 0
    assert grpo_summary["algo"] == "grpo" and grpo_summary["steps"] == 2
    assert 0.0 <= grpo_summary["eval_task_accuracy"] <= 1.0
    assert (elsewhere / "ppo-run" / "summary.json").is_file()
    assert (elsewhere / "grpo-run" / "summary.json").is_file()


def test_a_package_shadowing_envs_or_algos_is_named_in_one_line(tmp_path):
    """A folder earlier on the path than jaxrl's siblings holds an `envs` package of another
    distribution (with its dist-info, as pip would leave it) and a stray `algos.py`: importing
    jaxrl names each in one line with its fix; the checkout alone prints nothing."""
    shadows = tmp_path / "shadows"
    (shadows / "envs").mkdir(parents=True)
    (shadows / "envs" / "__init__.py").write_text("")
    (shadows / "algos.py").write_text("")
    info = shadows / "envs-9.9.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: envs\nVersion: 9.9\n")
    (info / "top_level.txt").write_text("envs\n")

    def import_jaxrl(pythonpath: list[str]) -> list[str]:
        run = subprocess.run(
            [sys.executable, "-c", "import jaxrl"],
            cwd=tmp_path,
            env=clean_environment(pythonpath),
            capture_output=True,
            text=True,
        )
        assert run.returncode == 0, run.stderr
        return run.stderr.splitlines()

    assert import_jaxrl([str(REPO_ROOT)]) == []
    envs_line, algos_line = import_jaxrl([str(shadows), str(REPO_ROOT)])
    assert envs_line.startswith("jaxrl: warning: `import envs` finds ")
    assert str(shadows / "envs") in envs_line and "pip uninstall envs" in envs_line
    assert algos_line.startswith("jaxrl: warning: `import algos` finds ")
    assert str(shadows / "algos.py") in algos_line and "off sys.path" in algos_line
