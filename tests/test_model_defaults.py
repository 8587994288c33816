"""Defaults by starting point for a model given in memory (`jaxrl.trainers.base.ModelParams`):
one that does not say `pretrained=` is taken as pretrained when its vocabulary is a real
tokenizer's (above 512 tokens) and says so in one line, never getting the tiny random model's
learning rate silently; one that says it is obeyed without a line; the byte vocabulary stays
from scratch, silently. Every run prints the values it took by starting point and records them
(config.json the values, model.json which were defaults and the start), and a trainer's
`Result.model_params()` carries its run's starting point to the next trainer. The tiny model's
shapes with SmolLM2's vocabulary size stand in for SmolLM2, so this runs in seconds."""

import dataclasses
import json
import os

import jax
import pytest

from algos import dpo as dpo_algorithm
from algos import grpo as grpo_algorithm
from jaxrl.config import InputError
from jaxrl.lm.model import ModelConfig, init_params
from jaxrl.trainers import base, dpo, grpo, lm_runs
from jaxrl.trainers.presets.lm import PRETRAINED
from tests.test_trainers import configured

SMOLLM2_VOCAB = 49_152
INFERRED = "model: ModelParams without pretrained=: a 49,152-token vocabulary, so the pretrained"


def tiny_model(vocab_size: int) -> tuple[dict, ModelConfig]:
    """Random parameters of the presets' tiny model with `vocab_size` tokens, and the model."""
    model = dataclasses.replace(ModelConfig(**dpo.config().model.to_dict()), vocab_size=vocab_size)
    return jax.jit(lambda: init_params(model, jax.random.key(0)))(), model


@pytest.fixture(scope="module")
def large():
    return tiny_model(SMOLLM2_VOCAB)


@pytest.fixture(scope="module")
def byte():
    return tiny_model(259)


def resolved(trainer, algorithm, weights, **settings):
    """The Config `trainer` would train `weights` with (`settings` given), as its `train`
    resolves it before anything is written or compiled."""
    config = trainer.config()
    for name, value in settings.items():
        config[name] = value
    name = trainer.__name__.rsplit(".", 1)[-1]
    flat, parts = base.lm_parts(config, name, model=weights)
    check = getattr(algorithm, "check_rollout", None)  # GRPO's rollout settings
    return lm_runs.setup(flat, None, algorithm.Config, name, parts, check).config


def test_dpo_from_bare_params_with_a_real_vocabulary_takes_the_pretrained_defaults(large, capsys):
    """The README's form, `ModelParams(params, model, tokenizer)`, of a model with SmolLM2's
    vocabulary: DPO's pretrained lr 5e-6 and beta 0.1, never the tiny model's 5e-4 and 0.5, with
    one line on stderr saying so and how to say otherwise, and the values on stdout."""
    config = resolved(dpo, dpo_algorithm, base.ModelParams(*large, "byte"))
    assert (config.learning_rate, config.beta) == (5e-6, 0.1) == tuple(PRETRAINED["dpo"].values())
    out, err = capsys.readouterr()
    [line] = err.splitlines()
    assert line.startswith(INFERRED), line
    assert "(learning_rate 5e-06, beta 0.1)" in line and "pass pretrained=False" in line, line
    [said] = [line for line in out.splitlines() if line.startswith("defaults for")]
    assert said.startswith("defaults for a pretrained start (parameters given from Python")
    assert said.endswith(": learning_rate 5e-06, beta 0.1 (docs/defaults.md)"), said
    # GRPO alike (2e-5, not the preset's 1e-3); a value given is kept and only the rest said.
    assert resolved(grpo, grpo_algorithm, base.ModelParams(*large)).learning_rate == 2e-5
    config = resolved(dpo, dpo_algorithm, base.ModelParams(*large), learning_rate=1e-5)
    assert (config.learning_rate, config.beta) == (1e-5, 0.1)
    err = capsys.readouterr().err.splitlines()
    assert [line for line in err if "(beta 0.1)" in line and line.startswith(INFERRED)], err


def test_pretrained_said_is_obeyed_without_a_line(large, capsys):
    config = resolved(dpo, dpo_algorithm, base.ModelParams(*large, pretrained=False))
    assert (config.learning_rate, config.beta) == (5e-4, 0.5)
    out, err = capsys.readouterr()
    assert err == ""
    assert "defaults for a start from scratch (parameters given from Python (digest " in out
    assert ": learning_rate 0.0005, beta 0.5 (docs/defaults.md)" in out
    config = resolved(dpo, dpo_algorithm, base.ModelParams(*large, pretrained=True))
    assert (config.learning_rate, config.beta) == (5e-6, 0.1)
    assert capsys.readouterr().err == ""


def test_the_byte_vocabulary_starts_from_scratch_silently(byte, capsys):
    config = resolved(dpo, dpo_algorithm, base.ModelParams(*byte, "byte"))
    assert (config.learning_rate, config.beta) == (5e-4, 0.5)
    assert capsys.readouterr().err == ""
    assert not base.taken_as_pretrained(base.ModelParams(*byte))
    edge = base.ModelParams(None, dataclasses.replace(byte[1], vocab_size=base.SCRATCH_VOCAB_MAX))
    assert not base.taken_as_pretrained(edge)
    above = dataclasses.replace(byte[1], vocab_size=base.SCRATCH_VOCAB_MAX + 1)
    assert base.taken_as_pretrained(dataclasses.replace(edge, model=above))


PAIRS = [{"prompt": f"{n}+1=", "chosen": str(n + 1), "rejected": str(n + 2)} for n in range(4)]
ONE_UPDATE = {"num_steps": 1, "batch_size": 2, "eval_batch_size": 2, "run.num_chunks": 1}
ONE_UPDATE |= {"task.num_eval": 2, "run.progress": False, "run.tensorboard": False}


def test_a_run_records_its_defaults_and_its_result_carries_its_start(large, tmp_path, capsys):
    """One DPO update from bare parameters with a real vocabulary: config.json records the
    pretrained values, model.json that they were the defaults of a pretrained start; the
    result's `model_params()` is the trained model, pretrained as its run recorded, which the
    next run takes without a line, described as `ModelParams.load` of the run describes it."""
    result = dpo.train(
        configured(dpo, None, ONE_UPDATE),
        tmp_path / "dpo",
        model=base.ModelParams(*large),
        train_data=PAIRS,
    )
    with open(os.path.join(result.run_dir, "config.json")) as f:
        saved = json.load(f)
    assert (saved["learning_rate"], saved["beta"]) == (5e-6, 0.1)
    with open(os.path.join(result.run_dir, "model.json")) as f:
        record = json.load(f)
    assert record["pretrained"] is True
    assert record["starting_point_defaults"] == {"learning_rate": 5e-6, "beta": 0.1}
    capsys.readouterr()
    trained = result.model_params()
    assert trained.pretrained is True and trained.tokenizer == "byte"
    assert trained.model.vocab_size == SMOLLM2_VOCAB and trained.params is result.state.params
    config = resolved(dpo, dpo_algorithm, trained)
    assert (config.learning_rate, config.beta) == (5e-6, 0.1)
    assert capsys.readouterr().err == ""
    loaded = base.ModelParams.load(result.run_dir)
    assert base.model_checkpoint(loaded).description == base.model_checkpoint(trained).description


def test_model_params_of_a_run_without_a_language_model_is_one_line(tmp_path):
    result = base.Result(None, {}, str(tmp_path))
    with pytest.raises(InputError, match=r"^model_params: .* holds no language model"):
        result.model_params()
