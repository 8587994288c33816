"""Objects in, strings only at the edge: `train(...)` uses the reward functions, rows and
parameters it is given as they are. Nothing is kept between calls (no registry of user objects,
no file of rows), so two runs in one process with different parts each train on their own and
resume from their own directory; and setting a run up from parameters in memory copies no
weight to the host to name or fingerprint them."""

import jax
import numpy as np
import pytest

from jaxrl.config import InputError
from tests.test_trainers import LM_QUIET, configured

SMALL = {"batch_size": 4, "group_size": 2, "eval_batch_size": 8, "task.num_eval": 4}
SMALL |= {"eval_samples": 0, "max_new_tokens": 4, "run.num_chunks": 1, **LM_QUIET}


def always_one(prompts, completions, **columns):
    return [1.0] * len(completions)


def always_a_quarter(prompts, completions, **columns):
    return [0.25] * len(completions)


def rows(offset: int) -> list[dict]:
    return [{"prompt": f"{n + offset}+1=", "answer": str(n + offset + 1)} for n in range(12)]


def tiny_params(seed: int):
    from jaxrl.lm.model import ModelConfig, init_params
    from jaxrl.trainers import grpo

    model = ModelConfig(**grpo.config().model.to_dict())
    return model, jax.jit(lambda: init_params(model, jax.random.key(seed)))()


def test_two_runs_in_one_process_keep_their_own_parts_and_resume_from_their_own_directory(
    tmp_path,
):
    from jaxrl.trainers import grpo
    from jaxrl.trainers.base import ModelParams

    model, first_params = tiny_params(1)
    _, second_params = tiny_params(2)
    parts = {
        "first": (ModelParams(first_params, model), rows(0), always_one),
        "second": (ModelParams(second_params, model), rows(50), always_a_quarter),
    }

    def run(name: str, steps: int, given=None):
        weights, data, reward = given or parts[name]
        config = configured(grpo, None, {**SMALL, "num_steps": steps})
        return grpo.train(config, tmp_path / name, model=weights, train_data=data, rewards=[reward])

    first, second = run("first", 2), run("second", 2)
    # Each run rewarded by its own function, on its own rows, from its own parameters.
    assert first.summary["final_mean_reward"] == pytest.approx(1.0)
    assert second.summary["final_mean_reward"] == pytest.approx(0.25)
    assert first.summary["init_from"] != second.summary["init_from"]
    # Each finished run extended in its own directory resumes from its own checkpoint ...
    longer_first, longer_second = run("first", 3), run("second", 3)
    assert longer_first.summary["resumed_from_step"] == 2
    assert longer_second.summary["resumed_from_step"] == 2
    assert longer_second.summary["final_mean_reward"] == pytest.approx(0.25)
    # ... and a directory refuses the other run's parameters, rows or reward function.
    for swapped in (
        (parts["second"][0], rows(0), always_one),
        (parts["first"][0], rows(50), always_one),
        (parts["first"][0], rows(0), always_a_quarter),
    ):
        with pytest.raises(InputError, match="holds a run with config"):
            run("first", 3, swapped)


def test_setting_a_run_up_from_parameters_in_memory_copies_no_weight_to_the_host(
    tmp_path, monkeypatch
):
    """Under `jax.transfer_guard_device_to_host("disallow")` (which refuses an implicit copy on
    an accelerator; on the CPU, where device memory is host memory, it never fires), and with
    every read of an array's values recorded: the parameters, spread over two devices, are
    named by a fingerprint computed where they are, whose [leaves, 2] numbers alone reach the
    host, and placed on the run's mesh device to device."""
    from jax._src.array import ArrayImpl
    from jax.sharding import NamedSharding, PartitionSpec

    from algos import grpo as algorithm
    from jaxrl.lm import checkpoints
    from jaxrl.trainers import base, grpo, lm_runs

    model, params = tiny_params(3)
    two = jax.sharding.Mesh(np.array(jax.devices()[:2]), ("data",))
    params = jax.device_put(params, NamedSharding(two, PartitionSpec()))
    read = []  # the shape of every array whose values are read on the host
    value = ArrayImpl._value
    monkeypatch.setattr(
        ArrayImpl, "_value", property(lambda a: read.append(a.shape) or value.fget(a))
    )
    config = configured(grpo, None, {**SMALL, "num_steps": 2})
    with jax.transfer_guard_device_to_host("disallow"):
        flat, parts = base.lm_parts(
            config, "grpo", model=base.ModelParams(params, model), rewards=[always_one],
            train_data=rows(0),
        )  # fmt: skip
        run = lm_runs.setup(
            flat, str(tmp_path / "run"), algorithm.Config, "grpo", parts, algorithm.check_rollout
        )
        placed = checkpoints.load_params(run.source, run.model, run.mesh)
    leaves = jax.tree.leaves(params)
    assert read == [(len(leaves), 2)]  # the fingerprint, and no weight
    assert run.source.kind == "params" and flat.init_from == run.source.description
    monkeypatch.undo()
    for a, b in zip(jax.tree.leaves(placed), leaves, strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    # The record does see a weight read on the host.
    monkeypatch.setattr(
        ArrayImpl, "_value", property(lambda a: read.append(a.shape) or value.fget(a))
    )
    np.asarray(leaves[0])
    assert read[-1] == leaves[0].shape


def test_a_second_call_s_failure_is_logged_in_its_own_directory(tmp_path, caplog):
    """Nothing of the first run is kept for the second: its failing reward's traceback goes to
    its own error.log, and its line names its own run. JAX's log of the failing callback (a
    22-27-line traceback before the line) is kept out of the user's console, as the scripts
    keep it out."""
    from jaxrl.trainers import grpo

    calls = []

    def raises_in_training(prompts, completions, **columns):
        """Fine when tried before training and in the starting model's evaluation; raises in
        the first update."""
        calls.append(len(completions))
        if len(calls) > 2:
            raise KeyError("score")
        return [0.0] * len(completions)

    config = configured(grpo, None, {**SMALL, "num_steps": 2})
    first = grpo.train(config, tmp_path / "first", train_data=rows(0), rewards=[always_one])
    with pytest.raises(InputError) as failed:
        grpo.train(config, tmp_path / "second", train_data=rows(0), rewards=[raises_in_training])
    log = tmp_path / "second" / "error.log"
    assert str(failed.value).endswith(f"traceback in {log}") and "raised KeyError" in str(
        failed.value
    )
    assert log.is_file() and "KeyError" in log.read_text()
    assert not [r for r in caplog.records if r.name == "jax._src.callback"]
    assert not (tmp_path / "first" / "error.log").exists() and first.summary["steps"] == 2
