"""The Colab notebooks in notebooks/ run top to bottom in a real Jupyter kernel.

Like papermill, each notebook gets a cell injected right after its `parameters` cell that shrinks
every size knob (the SMALL values below), so that a notebook runs in well under a minute on a CPU.
The kernel is the interpreter running the tests (ipykernel's native kernel), with the repository
on its path, so the notebooks' install cell finds jaxrl and never downloads anything.

Needs nbclient, nbformat and ipykernel (the test extra installs them).
"""

from __future__ import annotations

import ast
import json
import os
import re
import time
from pathlib import Path

import pytest

from tests.script_runs import xla_flags

REPO_ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK_DIR = REPO_ROOT / "notebooks"
NOTEBOOKS = sorted(path.name for path in NOTEBOOK_DIR.glob("*.ipynb"))
INSTALL_CONSTANT = "JAXRL_SOURCE"
MAX_NOTEBOOK_BYTES = 1_000_000  # saved outputs included

# Small values for every size knob, per notebook: each runs in well under a minute on a CPU.
SMALL = {
    "quickstart.ipynb": dict(
        NUM_SEEDS=2,
        TOTAL_TIMESTEPS=2048,
        NUM_ENVS=4,
        ROLLOUT_LENGTH=64,
        EVAL_EPISODES=2,
        SWEEP_LEARNING_RATES=[1e-3],
        SWEEP_ENT_COEFS=[0.0, 0.01],
        SWEEP_SEEDS=1,
        SWEEP_TIMESTEPS=1024,
    ),
    "sac_cql.ipynb": dict(
        HIDDEN_SIZES=(16, 16),
        EVAL_EPISODES=2,
        SAC_SEEDS=1,
        SAC_TIMESTEPS=600,
        SAC_LEARNING_STARTS=200,
        CHUNK_STEPS=200,
        MEDIUM_TIMESTEPS=400,
        COLLECT_STEPS=1000,
        COLLECT_ENVS=5,
        OFFLINE_SEEDS=1,
        OFFLINE_UPDATES=40,
        OFFLINE_EVAL_EVERY=20,
        BATCH_SIZE=32,
    ),
    "dpo.ipynb": dict(
        NUM_DIGITS=4,
        NUM_TRAIN=128,
        NUM_EVAL=16,
        HIDDEN_SIZE=16,
        NUM_LAYERS=1,
        SFT_STEPS=4,
        SFT_BATCH_SIZE=16,
        DPO_STEPS=4,
        DPO_BATCH_SIZE=8,
        EVAL_EVERY=2,
    ),
    "grpo.ipynb": dict(
        NUM_DIGITS=3,
        HIDDEN_SIZE=16,
        NUM_LAYERS=1,
        NUM_EVAL=16,
        SFT_STEPS=3,
        SFT_BATCH_SIZE=16,
        GRPO_UPDATES=4,
        PROMPTS_PER_UPDATE=4,
        GROUP_SIZE=4,
        EVAL_EVERY=2,
    ),
    "multiturn.ipynb": dict(
        HIDDEN_SIZE=16,
        NUM_LAYERS=1,
        NUM_DEMOS=64,
        SFT_STEPS=4,
        SFT_BATCH_SIZE=8,
        RL_UPDATES=4,
        GAMES_PER_UPDATE=2,
        GROUP_SIZE=2,
        EVAL_EVERY=2,
        NUM_EVAL=8,
        EVAL_SAMPLES=0,
    ),
    "grpo_smollm2.ipynb": dict(
        NUM_PROBLEMS=40,
        NUM_EVAL=8,
        EVAL_BATCH_SIZE=8,
        GRPO_UPDATES=2,
        EVAL_EVERY=1,
        PROMPTS_PER_UPDATE=2,
        GROUP_SIZE=2,
        GRAD_ACCUM_STEPS=1,
        MAX_NEW_TOKENS=12,
        OWN_UPDATES=1,
        OWN_PROMPTS_PER_UPDATE=2,
        OWN_GROUP_SIZE=2,
    ),
}

# What the last cell of each notebook prints: its headline results.
HEADLINES = {
    "quickstart.ipynb": ["final_eval_return:", "best sweep setting:"],
    "sac_cql.ipynb": [
        "SAC final_eval_return:",
        "behaviour return:",
        "CQL final_eval_return:",
        "BC final_eval_return:",
    ],
    "dpo.ipynb": ["sft_eval_task_accuracy:", "eval_reward_accuracy:", "eval_task_accuracy:"],
    "grpo.ipynb": ["final_mean_reward:", "eval_task_accuracy:"],
    "multiturn.ipynb": ["initial_eval_success:", "eval_success:", "tool_call_rate:"],
    "grpo_smollm2.ipynb": ["final_mean_reward:", "eval_task_accuracy:", "own_data_mean_reward:"],
}

# Whole-notebook deadline with the SMALL values (generous: a loaded 2-core machine compiles
# slowly). It only catches hangs; nothing here is timed.
TIMEOUT_SECONDS = 300

# Notebooks on the real SmolLM2-135M-Instruct: marked like the other tests that need its package
# (`-m "not smollm2"` leaves them out), and given longer, since they compile a 30-layer model
# (two GRPO programs and three greedy samplers: about four minutes on a loaded 2-core CPU).
SMOLLM2_NOTEBOOKS = {"grpo_smollm2.ipynb"}
SMOLLM2_TIMEOUT_SECONDS = 900


def runnable(name: str):
    """`name` as a test parameter, marked smollm2 where the notebook loads the real model."""
    marks = [pytest.mark.smollm2] if name in SMOLLM2_NOTEBOOKS else []
    return pytest.param(name, marks=marks, id=name)


def read_notebook(name: str) -> dict:
    with open(NOTEBOOK_DIR / name, encoding="utf-8") as f:
        return json.load(f)


def source(cell: dict) -> str:
    text = cell["source"]
    return text if isinstance(text, str) else "".join(text)


def code_cells(notebook: dict) -> list[dict]:
    return [cell for cell in notebook["cells"] if cell["cell_type"] == "code"]


def parameter_cells(notebook: dict) -> list[int]:
    return [
        index
        for index, cell in enumerate(notebook["cells"])
        if "parameters" in cell.get("metadata", {}).get("tags", [])
    ]


def assigned_names(code: str) -> set[str]:
    return {
        target.id
        for node in ast.parse(code).body
        if isinstance(node, ast.Assign)
        for target in node.targets
        if isinstance(target, ast.Name)
    }


def with_parameters(notebook, values: dict):
    """A copy of an nbformat notebook with a cell assigning `values` right after its
    `parameters` cell (papermill's convention, tagged `injected-parameters`)."""
    import nbformat

    notebook = nbformat.from_dict(json.loads(json.dumps(notebook)))
    (index,) = parameter_cells(notebook)
    lines = ["# Parameters injected by tests/test_notebooks.py: small values for CI."]
    lines += [f"{name} = {value!r}" for name, value in values.items()]
    cell = nbformat.v4.new_code_cell("\n".join(lines))
    cell.metadata["tags"] = ["injected-parameters"]
    notebook.cells.insert(index + 1, cell)
    return notebook


def kernel_environment() -> dict[str, str]:
    """The test process's environment, minus what conftest.py sets up for the tests themselves
    (eight simulated CPU devices): a notebook sees one CPU device, as on a Colab CPU runtime. The
    repository goes first on the kernel's path, so the checkout under test is what it imports."""
    env = dict(os.environ)
    env["XLA_FLAGS"] = xla_flags()
    env.pop("MPLBACKEND", None)  # the kernel's inline backend produces the image/png outputs
    env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT), *filter(None, [env.get("PYTHONPATH")])])
    return env


def test_notebooks_exist_and_have_small_parameters():
    assert NOTEBOOKS, f"no notebooks in {NOTEBOOK_DIR}"
    assert set(NOTEBOOKS) == set(SMALL) == set(HEADLINES), (
        "every notebook needs SMALL parameters and HEADLINES in tests/test_notebooks.py"
    )


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_structure(name):
    notebook = read_notebook(name)
    assert notebook["nbformat"] == 4
    assert notebook["cells"][0]["cell_type"] == "markdown", "start with a title cell"
    assert source(notebook["cells"][0]).startswith("# "), "the first cell is a markdown title"

    install = source(code_cells(notebook)[0])
    assert re.search(rf"^{INSTALL_CONSTANT} = ", install, re.MULTILINE), (
        f"the first code cell defines {INSTALL_CONSTANT}"
    )
    assert "import jaxrl" in install and "pip" in install and "except ImportError" in install, (
        "the first code cell installs jaxrl only when `import jaxrl` fails"
    )

    params = parameter_cells(notebook)
    assert len(params) == 1, f"exactly one cell tagged 'parameters', found {len(params)}"
    cell = notebook["cells"][params[0]]
    assert cell["cell_type"] == "code"
    knobs = assigned_names(source(cell))
    unknown = set(SMALL[name]) - knobs
    assert not unknown, f"SMALL overrides {sorted(unknown)}, which the parameters cell lacks"
    assert (NOTEBOOK_DIR / name).stat().st_size < MAX_NOTEBOOK_BYTES


MAX_CODE_LINES = 80  # a notebook calls the trainers (jaxrl.trainers); it writes no loop of its own


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_is_short(name):
    """At most MAX_CODE_LINES lines of code (non-blank, not comments), install cell included."""
    lines = [
        line
        for cell in code_cells(read_notebook(name))
        for line in source(cell).splitlines()
        if line.strip() and not line.strip().startswith("#")
    ]
    assert len(lines) <= MAX_CODE_LINES, f"{name}: {len(lines)} lines of code"


@pytest.mark.parametrize("name", [runnable(name) for name in NOTEBOOKS])
def test_notebook_runs(name, tmp_path):
    import ipykernel  # noqa: F401  the kernel the notebooks run in
    import nbclient
    import nbformat
    from jupyter_client.kernelspec import KernelSpecManager
    from jupyter_client.manager import AsyncKernelManager

    notebook = with_parameters(nbformat.read(NOTEBOOK_DIR / name, as_version=4), SMALL[name])
    for cell in notebook.cells:
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None

    # The native kernel (this interpreter), whatever kernel specs the machine has installed.
    manager = AsyncKernelManager(
        kernel_name="python3", kernel_spec_manager=KernelSpecManager(kernel_dirs=[])
    )
    timeout = SMOLLM2_TIMEOUT_SECONDS if name in SMOLLM2_NOTEBOOKS else TIMEOUT_SECONDS
    deadline = time.monotonic() + timeout
    client = nbclient.NotebookClient(
        notebook,
        km=manager,
        timeout_func=lambda cell: max(1, int(deadline - time.monotonic())),
        record_timing=False,
    )
    client.execute(cleanup_kc=True, env=kernel_environment(), cwd=str(tmp_path))

    outputs = [out for cell in notebook.cells if cell.cell_type == "code" for out in cell.outputs]
    assert not [out for out in outputs if out.output_type == "error"]
    assert any("image/png" in out.get("data", {}) for out in outputs), "no plot was produced"

    last = code_cells(notebook)[-1]
    printed = "".join(out.text for out in last.outputs if out.output_type == "stream")
    for expected in HEADLINES[name]:
        assert expected in printed, f"the last cell did not print {expected!r}:\n{printed}"
