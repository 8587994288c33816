"""Setting up a language-model run (sft, dpo, grpo, reward_model, ppo_lm, online_dpo,
multiturn): the settings every trainer reads (model, mesh, task) checked, the starting checkpoint
and tokenizer (`jaxrl.lm.checkpoints`), the defaults by starting point filled in, the run
directory with what it records of its model and tokenizer, and the runner's `Job` for one run."""

from __future__ import annotations

import dataclasses
import functools
import os
import sys
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, NamedTuple

import jax
import ml_collections
import numpy as np

from jaxrl import hparams, retention, runner, sharding
from jaxrl.config import ConfigError, build_config, check_run_settings, fail, is_given
from jaxrl.data.chat import GivenRows
from jaxrl.lm import Tokenizer, load_tokenizer, training
from jaxrl.lm.checkpoints import (
    BYTE,
    LM_HEAD,
    MODEL_FILE,
    PARAMS_DIR,
    REWARD_HEAD,
    RUNTIME_FIELDS,
    TOKENIZER_DIR,
    Checkpoint,
    check_vocabulary,
    copy_tokenizer_files,
    find_checkpoint,
    load_params,
    placement,
    read_json,
    read_saved_params,
    run_tokenizer,
    saved_param_dtype,
    special_token_ids,
    tokenizer_bytes,
    write_json,
)
from jaxrl.lm.model import ModelConfig, check_attention, init_params
from jaxrl.logging import RunDirectory
from jaxrl.loop import Algorithm
from jaxrl.trainers.presets.lm import (
    TINY_MODEL,
    described_values,
    for_start,
    starting_point_defaults,
)

if TYPE_CHECKING:  # envs imports gymnax (2 s): generate.py and export.py never need it
    from envs.text import ProblemTask

SETTINGS = (
    "init_from",
    "seed",
    "eval_batch_size",
    "eval_every",
    "reward_model",  # ppo_lm.py's and online_dpo.py's reward_model.py run(s)
    "eval_samples",  # sampled completions per held-out prompt, for pass@k
)  # top-level scalars that are not Config fields


class Parts(NamedTuple):
    """The user's parts of a language-model run as the objects it uses, resolved once where
    `train` is called (`jaxrl.trainers.base.lm_parts`) and never looked up again by name; the
    config records a description of each (which a resumed run compares)."""

    model: Checkpoint | None = None  # parameters given in memory; None: config.init_from's
    data: Mapping[str, str | GivenRows] = {}  # "train_jsonl" / "eval_jsonl": rows given
    # (metric name, function) of each host reward; None: no reward functions given
    rewards: list[tuple[str, Callable]] | None = None
    game: Callable | None = None  # a host game's class, which config.task.game describes
    task: type | None = None  # a text task's class of the user's, which config.task.name names
    # The settings the user chose ("task.num_eval": `jaxrl.config.given_settings`); the others
    # are the preset's, which `data_sizes` may fit to the data given.
    given: frozenset[str] = frozenset()


class Setup(NamedTuple):
    """What every LM script reads first, each setting checked (one error line otherwise)."""

    name: str  # the algorithm's: "sft", "dpo" or "grpo"
    flat: ml_collections.ConfigDict  # the whole config, sections included
    config: Any  # the algorithm's frozen Config
    mesh: Any
    task: ProblemTask | None  # None on a game (jaxrl/trainers/game_play.py)
    tokenizer: Tokenizer
    model: ModelConfig  # the model trained: the config's, or init_from's architecture
    workdir: str
    source: Checkpoint  # where the parameters come from (see `initial_params`)
    tokenizer_source: str  # "byte" or the tokenizer.json path the run copies
    parts: Parts = Parts()
    rollout: Any = None  # GRPO's and multi-turn GRPO's rollout mode (`algos.rollouts`)
    # {setting: value} of the settings left to the starting point, as filled in for `source`
    defaults: Mapping[str, Any] = {}

    def data(self, field: str) -> str | GivenRows:
        """config.task.<field>'s rows: given in memory, or the path of a JSONL file ("" none)."""
        return self.parts.data.get(field) or self.flat.task.get(field, "")


def setup(
    flat: ml_collections.ConfigDict,
    workdir: str | None,
    config_cls: type,
    name: str,
    parts: Parts | None = None,
    check_rollout: Callable[[Any, Any], None] | None = None,
) -> Setup:
    """Check the config, and make the mesh, task, starting checkpoint and tokenizer (each problem
    one error line). With init_from, the architecture comes from the checkpoint and only the model
    section's runtime fields (dtype, param_dtype, remat, attention, decode_unroll) apply; the
    tokenizer comes from the checkpoint unless config.task.tokenizer names one, and must fit the
    model's vocabulary. `workdir` None is runs/<name>-<task>-<date>-<time>. An algorithm with
    rollout modes passes its `check_rollout`: the config file's rollout settings become the Setup's
    `rollout` object (`rollout_modes`). config.run.keep_final_state left None is filled by starting
    point (`keeps_final_state`). Where `workdir` holds this run finished, `Finished` is raised with
    its recorded result, which the trainer returns (`jaxrl.trainers.base.lm_trainer`)."""
    # Only the algorithms with rollout modes import them (and through them envs, 2 s).
    from jaxrl.trainers import rollout_modes

    settings = SETTINGS + (rollout_modes.SETTINGS if check_rollout else ())
    # Every setting checked first (the ones left to the starting point at their random-model
    # values), then the checkpoint read, then those settings filled in for it and checked again.
    config = build_config(config_cls, for_start(flat, pretrained=False), settings)
    if check_rollout:
        rollout_modes.for_run(flat, config, check_rollout)
    check_run_settings(flat.run)
    mesh = make_mesh(config.mesh_shape)
    parts = parts or Parts()
    # A short run still logs a curve: a preset's log_every (never one the user set) is lowered
    # so that a run of N updates logs min(N, MIN_ROWS) rows (an 8-update DPO run logged one).
    if not is_given(parts.given, "run.log_every"):
        flat.run.log_every = min(flat.run.log_every, max(1, config.num_steps // MIN_ROWS))
    if workdir is not None and parts.model is None and flat.init_from:
        # A finished run from a checkpoint file is recognised from its own record before the
        # file is read (SmolLM2's GGUF takes seconds to parse).
        recorded = as_recorded_by(flat, workdir)
        summary = recorded and retention.finished_summary(workdir, recorded[1], config.num_steps)
        if summary:
            raise Finished(finished_result(recorded[0], workdir, summary))
    # A game's task section (jaxrl/trainers/game_play.py) names a game, not a text task.
    task = None if "game" in flat.task else make_text_task(flat, parts.task)
    source = start_checkpoint(flat, parts.model)
    defaults = resolve_defaults(flat, source)
    config = build_config(config_cls, flat, settings)
    rollout = rollout_modes.for_run(flat, config, check_rollout) if check_rollout else None
    tokenizer, tokenizer_source = run_tokenizer(flat.task.tokenizer, source)
    check_vocabulary(tokenizer, source.model, source, "config.task.tokenizer")
    try:  # the settings against the model they will train (a LoRA target it lacks)
        training.check_model(config, source.model)
    except ConfigError as error:
        fail(f"config.{error}")
    workdir = workdir or os.path.join(
        "runs", f"{name}-{task.name if task else flat.task.game}-{time.strftime('%Y%m%d-%H%M%S')}"
    )
    if flat.run.get("keep_final_state", True) is None:  # by starting point: see `finish`
        flat.run.keep_final_state = not source.pretrained
    # A run that finished with these settings is not set up again (data, model, compilation):
    # its recorded result is returned at once.
    summary = retention.finished_summary(
        workdir, recorded_config(flat, source.model), config.num_steps
    )
    if summary is not None:
        raise Finished(finished_result(flat, workdir, summary))
    line = defaults_line(defaults, source)  # for a run that runs (a finished one says so)
    if line:
        print(line, flush=True)
    return Setup(
        name, flat, config, mesh, task, tokenizer, source.model, workdir, source,
        tokenizer_source, parts, rollout, defaults,
    )  # fmt: skip


# --- defaults by starting point ---------------------------------------------------------------

# Values of the starting-point settings that fine-tune a pretrained model without wrecking it,
# as (low, high): a value given outside this range from a pretrained checkpoint (10x beyond
# the values that have been seen to work) earns one warning line. LoRA adapters, initialised
# at zero and scaled down, take learning rates about 10x larger than the full model's.
PRETRAINED_RANGES = {
    "learning_rate": (1e-8, 1e-4),
    "beta": (0.01, 2.0),
    "kl_coef": (0.0, 1.0),
    "kl_beta": (0.0, 1.0),
}
PRETRAINED_LORA_RANGES = PRETRAINED_RANGES | {"learning_rate": (1e-7, 1e-3)}


# Metric rows a language-model run logs at least (fewer only where it has fewer updates).
MIN_ROWS = 10


def resolve_defaults(flat: ml_collections.ConfigDict, source: Checkpoint) -> dict[str, Any]:
    """Fill the settings left to the starting point with their defaults for `source` (once the
    model is known; a value the user gave is kept), and warn, one line each, about a value
    given for a pretrained model that lies far outside what fine-tunes one. Returns the
    defaults filled in."""
    given = {name: flat[name] for name in PRETRAINED_RANGES if name in flat}
    filled = starting_point_defaults(flat, source.pretrained)
    for name, value in filled.items():
        flat[name] = value
    if source.pretrained:
        ranges = PRETRAINED_LORA_RANGES if flat.get("lora_rank", 0) > 0 else PRETRAINED_RANGES
        for name, value in given.items():
            low, high = ranges[name]
            if value is None or low <= value <= high:
                continue
            default = starting_point_defaults_for(flat, name)
            print(
                f"warning: config.{name}={value:g} is far {'above' if value > high else 'below'} "
                f"what fine-tunes a pretrained model ({source.description}: {low:g} to {high:g}"
                f"{'' if default is None else f'; its default from one is {default:g}'}); "
                f"drop --config.{name} to use the default, or keep it if you mean it",
                file=sys.stderr,
            )
    return filled


def defaults_line(filled: Mapping[str, Any], source: Checkpoint) -> str | None:
    """The line a run prints of the settings it took by starting point (`resolve_defaults`'s
    `filled`: the ones the user left), their values and why: from where it starts, pretrained
    or from scratch. None where it took none."""
    if not filled:
        return None
    start = "a pretrained start" if source.pretrained else "a start from scratch"
    values = described_values(dict(filled))
    return f"defaults for {start} ({source.description}): {values} (docs/defaults.md)"


def starting_point_defaults_for(flat: ml_collections.ConfigDict, name: str) -> Any:
    """The pretrained-model default of setting `name` in `flat`, or None if it has none."""
    if "defaults" not in flat or name not in flat.defaults.pretrained:
        return None
    if flat.get("lora_rank", 0) > 0 and name in flat.defaults.pretrained_lora:
        return flat.defaults.pretrained_lora[name]
    return flat.defaults.pretrained[name]


def job(
    run: Setup,
    algorithm: Algorithm,
    description: str,
    *,
    inputs_for: Callable[[int, int], Any],
    units_name: str,
    units_per_step: int,
    scan_inputs: bool = False,
    chunk: Callable[..., Callable] | None = None,
    after_chunk: Callable[[Any, int, int], dict[str, Any] | None] | None = None,
    host_loop: bool = False,
) -> runner.Job:
    """The runner's `Job` for one LM run (no runs axis): the state made once with
    `PRNGKey(config.seed)` and the config's hyper-parameters (replicated over the mesh), kept in
    its shardings by every chunk. The runner compiles chunks of `algorithm.update` itself
    (`scan_inputs`: `inputs_for` gives one host batch per update), unless `chunk(update, length,
    log_every=, callback=, keep_going=, check_every=)` makes them (DPO's, which hands every
    update the same reference; with `host_loop` its chunks are host loops the runner calls
    without compiling: GRPO's async mode). `after_chunk(state, step, chunk_index)` may return a
    metrics row (an evaluation)."""
    hp = jax.device_put(hparams.hparams(run.config), sharding.replicated(run.mesh))
    state = algorithm.init(jax.random.PRNGKey(run.flat.seed), hp)
    custom = None
    if chunk is not None:

        def custom(
            length: int, block: int, sink: Callable, keep_going: Callable | None, check: int
        ):
            return chunk(
                algorithm.update,
                length,
                log_every=block,
                callback=sink,
                keep_going=keep_going,
                check_every=check,
            )

    return runner.Job(
        name=run.name,
        description=description,
        num_steps=run.config.num_steps,
        init_states=lambda: state,
        hparams=hp,
        update=algorithm.update,
        scan_inputs=scan_inputs,
        make_chunk=custom,
        units_per_step=units_per_step,
        units_name=units_name,
        runs_axis=False,
        inputs_for=inputs_for,
        per_run=(),
        after_chunk=after_chunk,
        out_shardings=(training.state_shardings(state), sharding.replicated(run.mesh)),
        host_loop=host_loop,
    )


def model_config(section: ml_collections.ConfigDict) -> ModelConfig:
    """The `model` section as a `ModelConfig`."""
    try:
        model = ModelConfig(**section.to_dict())
        check_attention(model)
        return model
    except ConfigError as error:
        fail(f"config.model.{error}")
    except TypeError as error:
        fail(f"config.model: {error}")


def make_mesh(mesh_shape: tuple[int, int, int]) -> Any:
    """The (data, fsdp, tensor) device mesh."""
    try:
        return sharding.make_mesh(*mesh_shape)
    except ConfigError as error:
        fail(f"config.mesh_shape: {error}")


def make_text_task(flat: ml_collections.ConfigDict, given: type | None = None) -> ProblemTask:
    """The `task` section's task: config.task.name (a task of `envs.text.TASKS`, or the class
    `given`, a user's, which config.task.name names as 'module.path:Class' or
    'path/to/file.py:Class') with its options (config.task.options, and the digit tasks'
    config.task.num_digits)."""
    from envs.text import build_task, task_options

    section = flat.task
    from_data = section.get("train_jsonl") or section.get("train_tfds")
    if section.options and from_data:
        fail(
            "config.task.options: options of an in-program task, whose problems the prompts "
            "of a file or dataset replace, so they would be ignored; drop it"
        )
    try:
        task = build_task(
            section.name, section.options, {"num_digits": section.num_digits}, cls=given
        )
    except ConfigError as error:
        fail(f"config.task.{error}")
    if (
        not from_data
        and "num_digits" not in task_options(task)
        and section.num_digits != flat.get("defaults", {}).get("task", {}).get("num_digits")
    ):
        fail(
            f"config.task.num_digits: an option of the digit tasks, which the {task.name} task "
            "does not have, so this flag would be ignored; drop it (config.task.options gives "
            "a task its own options)"
        )
    return task


def start_checkpoint(
    flat: ml_collections.ConfigDict, given: Checkpoint | None = None
) -> Checkpoint:
    """Where a run starts: the config's model (random init), init_from's, or parameters `given` in
    memory, which bring their architecture; a model field other than the runtime ones
    (`RUNTIME_FIELDS`) would then be ignored, so it is an error where it differs from the config
    files' tiny model, unless the checkpoint agrees with it. A preset that raises the tiny model's
    positions (`grpo.py:repeat_digit_long`) so starts from a checkpoint that has at least as
    many."""
    if given is None and not flat.init_from:
        model = model_config(flat.model)
        return Checkpoint("random", "", model, BYTE, "random init")

    def refuse(field: str) -> None:
        fail(
            f"config.model.{field}: the architecture comes from --config.init_from="
            f"{flat.init_from}, so this flag would be ignored; drop it (only model.dtype, "
            "model.param_dtype, model.remat, model.attention and model.decode_unroll apply to an "
            "imported model)"
        )

    source = given
    try:
        source = source or find_checkpoint(flat.init_from)
    except (ConfigError, ValueError, OSError) as error:
        fail(f"config.init_from: {error}")
    for field, tiny in TINY_MODEL.items():
        if field in RUNTIME_FIELDS or field not in flat.model or flat.model[field] == tiny:
            continue
        held = getattr(source.model, field, None)
        agrees = held == flat.model[field] or (
            field == "max_position_embeddings" and held is not None and held >= flat.model[field]
        )
        if not agrees:
            refuse(field)
    return source.with_runtime(flat.model)


# A digit task's sequence shapes where the config leaves them 0: room for its prompts and answers
# with the byte tokenizer, fixed so that a run's programs and what it learns do not depend on the
# problems drawn (SFT, and DPO, which continues such a run).
TASK_LENGTHS = (16, 28)


def check_length_section(section: ml_collections.ConfigDict) -> None:
    """config.task's token-length settings (max_prompt_length, max_length, length_percentile,
    max_cut_fraction) on their own, a problem one error line."""
    from jaxrl.data.chat import check_length_settings

    try:
        check_length_settings(
            section.max_prompt_length,
            section.max_length,
            section.length_percentile,
            section.max_cut_fraction,
        )
    except ConfigError as error:
        fail(f"config.task.{error}")


def task_lengths(section: ml_collections.ConfigDict) -> tuple[int, int]:
    """(max_prompt_length, max_length) for a digit task: the config's, or TASK_LENGTHS where it
    leaves them 0 (a file's rows choose theirs from the data)."""
    return section.max_prompt_length or TASK_LENGTHS[0], section.max_length or TASK_LENGTHS[1]


def split_problems(task: Any, section: ml_collections.ConfigDict) -> tuple[list[str], list[str]]:
    """Held-out problems and training problems that never include them. With
    `section.held_out == "hash"` they come from the task's hashed splits, the ones GRPO's
    in-program sampler respects (use it for an SFT model that GRPO will continue); "random"
    draws the held-out set at random."""
    rng = np.random.default_rng(section.data_seed)
    try:
        if section.held_out == "hash":
            eval_problems = task.sample_problems(rng, section.num_eval, split="eval")
            train_problems = task.sample_problems(rng, section.num_train, split="train")
        else:
            eval_problems = task.sample_problems(rng, section.num_eval)
            train_problems = task.sample_problems(
                rng, section.num_train, exclude=set(eval_problems)
            )
    except ConfigError as error:
        fail(f"config.task.num_train/num_eval: {error}")
    return train_problems, eval_problems


def initial_params(run: Setup) -> tuple[Any, ModelConfig, str]:
    """The starting parameters, placed on the run's mesh: random ones (config.seed), or those of
    init_from in the run's param_dtype. Returns them, the model and a description of the source."""
    params = load_params(run.source, run.model, run.mesh, seed=run.flat.seed)
    return params, run.model, run.source.description


def recorded_config(flat: ml_collections.ConfigDict, model: ModelConfig) -> dict[str, Any]:
    """The settings a run directory records (config.json): the config, with the model section
    the model built (init_from's architecture)."""
    resolved = flat.to_dict()
    resolved["model"] = dataclasses.asdict(model)
    return resolved


def as_recorded_by(
    flat: ml_collections.ConfigDict, workdir: str
) -> tuple[ml_collections.ConfigDict, dict[str, Any]] | None:
    """`flat` filled in as the run in `workdir` recorded its starting point (its model.json: the
    architecture and whether it descends from a pretrained model), without reading the
    checkpoint: (the filled config, the config.json it would record), or None where there is no
    such record or a model field given differs from both the tiny model's and the record's
    (`start_checkpoint` decides then)."""
    record = retention.read_json(os.path.join(workdir, MODEL_FILE))
    if not isinstance(record, dict) or not isinstance(record.get("model"), dict):
        return None
    pretrained, model = record.get("pretrained"), dict(record["model"])
    if not isinstance(pretrained, bool):
        return None
    for field, tiny in TINY_MODEL.items():
        given = flat.model.get(field, tiny)
        if field not in RUNTIME_FIELDS and given not in (tiny, model.get(field)):
            return None
    filled = flat.copy_and_resolve_references()
    for name, value in starting_point_defaults(flat, pretrained).items():
        filled[name] = value
    if filled.run.get("keep_final_state", True) is None:
        filled.run.keep_final_state = not pretrained
    model |= {name: flat.model[name] for name in RUNTIME_FIELDS if name in flat.model}
    resolved = filled.to_dict()
    resolved["model"] = model
    return filled, resolved


def keeps_final_state(flat: ml_collections.ConfigDict) -> bool:
    """Whether a finished run keeps its final training state (config.run.keep_final_state; by
    default, unless the model descends from a pretrained one, whose optimizer moments are twice
    its size and which params/ holds for what comes next)."""
    return flat.run.get("keep_final_state", True) is not False


def finish(run: Setup, run_dir: RunDirectory) -> str:
    """`retention.finish` for an LM run, once its summary is written: the end of its last line."""
    return retention.finish(run_dir, keeps_final_state(run.flat))


class FinishedState:
    """The state a finished run called again hands back, read from its files only when asked:
    `params`, its final parameters (params/, as saved, on one device), and `step`."""

    def __init__(self, run_dir: str, step: int):
        self.run_dir, self.step = run_dir, step

    @functools.cached_property
    def params(self) -> Any:
        """The run's final parameters."""
        return read_saved_params(os.path.join(self.run_dir, PARAMS_DIR))

    def __repr__(self) -> str:
        return f"FinishedState(run_dir={self.run_dir!r}, step={self.step})"


class Finished(Exception):  # noqa: N818  (a result, not an error)
    """`setup` found the run asked for finished: `result` (a `base.Result`'s fields: state,
    summary, run_dir) is what the trainer returns."""

    def __init__(self, result: tuple[FinishedState, dict[str, Any], str]):
        super().__init__("finished")
        self.result = result


def finished_result(
    flat: ml_collections.ConfigDict, workdir: str, summary: dict[str, Any]
) -> tuple[FinishedState, dict[str, Any], str]:
    """What a finished run called again returns (its recorded summary, its final parameters
    read when asked), after one line saying so; a final state left by a run killed before
    `finish` removed it is removed now."""
    run_dir = RunDirectory(workdir)
    retention.report_finished(run_dir, summary["steps"], keeps_final_state(flat))
    return FinishedState(run_dir.path, summary["steps"]), summary, run_dir.path


def open_run(run: Setup, head: str = LM_HEAD) -> RunDirectory:
    """`runner.open_run` recording what the run really trains: config.json's model section is the
    model built (init_from's architecture), model.json records it with the tokenizer and its
    special-token ids, and a Hugging Face tokenizer's files are copied into tokenizer/, so that a
    later init_from, generate.py or export.py rebuilds this model with this tokenizer. `head`
    says what its params/ hold: a language model's, or ("reward") a reward model's, which no
    language-model script starts from."""
    run_dir = runner.open_run(run.workdir, recorded_config(run.flat, run.model))
    if run_dir.writes:
        tokenizer = BYTE
        if run.tokenizer_source != BYTE:
            copy_tokenizer_files(run.tokenizer_source, run_dir.file(TOKENIZER_DIR))
            tokenizer = TOKENIZER_DIR
        record = {
            "model": dataclasses.asdict(run.model),
            "tokenizer": tokenizer,
            "special_token_ids": special_token_ids(run.tokenizer),
            "init_from": run.source.description,
            "pretrained": run.source.pretrained,
            # the settings the user left to the starting point and the values they took
            "starting_point_defaults": dict(run.defaults),
            "head": head,
        }
        write_json(run_dir.file(MODEL_FILE), record)
    return run_dir


def load_reward_model(path: str, run: Setup, field: str = "config.reward_model") -> tuple:
    """A finished reward_model.py run directory as (its parameters on the run's mesh, its
    ModelConfig in the run's dtypes): one error line, naming `field`, for a directory that is
    not such a run or whose tokenizer is not the run's (the reward model must read the policy's
    token ids)."""
    record_path = os.path.join(path, MODEL_FILE)
    if not os.path.isdir(os.path.join(path, PARAMS_DIR)) or not os.path.isfile(record_path):
        fail(
            f"{field}: {path} is not a finished reward_model.py run (no {PARAMS_DIR}/ or "
            f"{MODEL_FILE}); pass the run directory of experiments/reward_model.py"
        )
    record = read_json(record_path)
    if record.get("head") != REWARD_HEAD:
        fail(
            f"{field}: {path} is a {record.get('head', LM_HEAD)} model's run, not a reward "
            "model's; pass the run directory of experiments/reward_model.py"
        )
    tokenizer = record.get("tokenizer", BYTE)
    if tokenizer == TOKENIZER_DIR:
        tokenizer = load_tokenizer(os.path.join(path, TOKENIZER_DIR)).source
    if tokenizer_bytes(tokenizer) != tokenizer_bytes(run.tokenizer_source):
        fail(
            f"{field}: {path} reads another tokenizer ({tokenizer}) than the policy's "
            f"({run.tokenizer_source}), so it would score other token ids than the policy "
            "writes; train the reward model from the policy's checkpoint"
        )
    runtime = {name: run.flat.model[name] for name in RUNTIME_FIELDS}
    try:
        model = ModelConfig(**{**record["model"], **runtime})
    except (ConfigError, TypeError) as error:
        fail(f"{field}: {record_path}: model: {error}")
    from algos import reward_model

    # The backbone as the run saved it (its param_dtype), sharded like a language model; the
    # head in float32, replicated.
    where, head = placement(model, run.mesh), sharding.replicated(run.mesh)
    shape = jax.eval_shape(
        lambda: reward_model.init_params(
            init_params(model, jax.random.key(0)), model, jax.random.key(0)
        )
    )
    saved = saved_param_dtype(path, model)
    like = {
        "backbone": {
            name: jax.tree.map(
                lambda leaf, at: jax.ShapeDtypeStruct(leaf.shape, saved, sharding=at),
                leaves,
                where[name],
            )
            for name, leaves in shape["backbone"].items()
        },
        "score_kernel": jax.ShapeDtypeStruct(shape["score_kernel"].shape, "float32", sharding=head),
        "score_bias": jax.ShapeDtypeStruct((), "float32", sharding=head),
    }
    params = training.restore_params(os.path.abspath(os.path.join(path, PARAMS_DIR)), like)
    dtype = jax.numpy.dtype(model.param_dtype)
    params["backbone"] = jax.tree.map(lambda x: x.astype(dtype), params["backbone"])
    return params, model
