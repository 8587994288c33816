"""Settings the language-model experiments share (sft.py, dpo.py, grpo.py, reward_model.py,
ppo_lm.py): the model, the text task and how the run is driven. Each algorithm's config file adds
its Config's fields on top."""

from typing import Any

import ml_collections

from jaxrl.config import config_dict, run_section

# A tiny Llama-shaped model that learns reverse-digits on a CPU in a minute or two. For a real
# model, pass --config.init_from=<a run directory, a Hugging Face directory or a .gguf file>: its
# architecture replaces this one (setting another field here is then an error), and only dtype,
# param_dtype, remat, attention and decode_unroll below apply to it.
TINY_MODEL = dict(
    vocab_size=259,  # the byte tokenizer: 256 bytes + pad/bos/eos
    hidden_size=64,
    intermediate_size=128,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    head_dim=None,
    max_position_embeddings=64,
    rope_theta=10_000.0,
    rms_norm_eps=1e-6,
    tie_embeddings=False,
    qkv_bias=False,
    dtype="float32",
    param_dtype="float32",
    remat="none",
    attention="auto",  # cuDNN's fused attention on an NVIDIA GPU with 16-bit compute
    decode_unroll=0,  # auto: a decode step's layers unrolled on a GPU
)


def task_config(**overrides: Any) -> ml_collections.ConfigDict:
    """The `task` section: which text task with its options, its tokenizer, and the problems
    drawn for it."""
    return ml_collections.ConfigDict(
        dict(
            # A task of envs.text.TASKS, or a class of your own: "module.path:Class" or
            # "path/to/file.py:Class" (docs/add-a-text-task.md)
            name="reverse_digits",
            # The task's own options, comma-separated name=value pairs (e.g. "letters=4"): its
            # dataclass fields. The digit tasks' one option also has its own field, num_digits.
            options="",
            num_digits=6,
            # "" is the init_from checkpoint's own tokenizer (the byte tokenizer without one);
            # or "byte", or a tokenizer.json / a directory holding one
            tokenizer="",
            num_train=4000,
            num_eval=256,
            data_seed=0,
            # "random" held-out problems, or "hash": the task's hashed eval split, which GRPO
            # never trains on (set it for an SFT model that GRPO continues)
            held_out="random",
            # Token lengths: 0 takes them from the data (the length_percentile-th percentile
            # of its rows; 100 is the longest). Rows cut by a limit are counted and reported;
            # more than max_cut_fraction of them is an error.
            max_prompt_length=0,
            max_length=0,
            length_percentile=100.0,
            max_cut_fraction=0.05,
            # Your own data instead of the task's, in the formats TRL takes: GRPO prompts
            # ("prompt", a string or chat messages, plus any columns the rewards read), SFT
            # rows ("prompt"/"completion" or "messages"), DPO pairs ("prompt"/"chosen"/
            # "rejected", strings or messages). eval_jsonl is the held-out split; "" holds out
            # num_eval rows of train_jsonl.
            train_jsonl="",
            eval_jsonl="",
            # SFT on "messages": the loss covers "all" assistant turns or the "last" one
            assistant_turns="all",
        )
        | overrides
    )


# Defaults by starting point. The settings below depend on the model: the Config's and the
# presets' values suit the tiny random model (and runs continuing it), while a pretrained
# checkpoint (GGUF, Hugging Face directory, "smollm2", or a run continuing one) is wrecked by
# them (GRPO at lr 1e-3 turned SmolLM2's answers into one repeated phrase within 6 updates).
# From a pretrained checkpoint these values apply instead, unless the setting is given; with
# lora_rank > 0 (SFT, DPO, GRPO, online DPO) the PRETRAINED_LORA ones take precedence: adapters
# start at zero and are scaled down, so they take about 10x the learning rate. Chosen by
# measurement on SmolLM2-135M-Instruct (README, "Defaults by starting point"). Keyed by the
# algos module.
PRETRAINED = {
    "sft": dict(learning_rate=2e-5),
    "dpo": dict(learning_rate=5e-6, beta=0.1),
    # The random-init preset's regularisers (reverse_digits: a uniform KL and a floored
    # entropy bonus that keep a random model's digits alive) are off from a pretrained start:
    # on SmolLM2 they raised its sampled entropy 2.20 -> 3.20 in 3 updates and collapsed its
    # greedy answers onto one template (the word_problems preset, which sets none: 2.20 -> 2.36).
    "grpo": dict(learning_rate=2e-5, uniform_kl_coef=0.0, entropy_coef=0.0, entropy_floor=0.0),
    "multiturn": dict(learning_rate=1e-5),
    "ppo_lm": dict(learning_rate=2e-6),
    "online_dpo": dict(learning_rate=5e-6, beta=0.1),
    "reward_model": dict(learning_rate=1e-5),
}
PRETRAINED_LORA = {
    "sft": dict(learning_rate=2e-4),
    "dpo": dict(learning_rate=5e-5),
    "grpo": dict(learning_rate=2e-4),
    "online_dpo": dict(learning_rate=5e-5),
}


# Task settings that only in-program tasks read (a prompt file brings its own prompts).
DIGIT_TASK_FIELDS = ("name", "num_digits", "num_train", "held_out")


def lm_config(
    config: Any,
    preset: dict[str, Any],
    num_chunks: int,
    pretrained: dict[str, Any] | None = None,
    pretrained_lora: dict[str, Any] | None = None,
    **sections: Any,
) -> ml_collections.ConfigDict:
    """A config file's `get_config()`: the algorithm Config's fields with the preset's values,
    the tiny model, the task (a preset's `task` entries override the defaults), the run section
    (`num_chunks` compiled chunks with a checkpoint after each), `init_from` (an earlier run
    directory, a Hugging Face checkpoint directory or a GGUF file; "" is random
    initialisation), the `seed` of the initialisation and the batch order, and any further
    `sections`.

    Defaults by starting point: each field named in `pretrained` (by default the algorithm's
    entry of PRETRAINED) is left None, "by starting point", and a `defaults` section records
    its values: `defaults.random` (the preset's, or the Config's, for the tiny random model and
    runs that continue one) and `defaults.pretrained` (for a pretrained checkpoint and runs that
    continue one), which `defaults.pretrained_lora` overrides when lora_rank > 0. The script
    fills each field still None once it knows where the model starts
    (`jaxrl/trainers/lm_runs.resolve_defaults`); a value given on the command line is never
    replaced."""

    preset = dict(preset)
    task = task_config(**preset.pop("task", {}))
    algorithm = type(config).__module__.rsplit(".", 1)[-1]
    if pretrained is None:
        pretrained = PRETRAINED.get(algorithm, {})
    if pretrained_lora is None:
        pretrained_lora = PRETRAINED_LORA.get(algorithm, {})
    flat = config_dict(
        config,
        preset,
        model=ml_collections.ConfigDict(TINY_MODEL),
        task=task,
        # The newest checkpoint only (a language model's holds its parameters and AdamW's two
        # moments: SmolLM2's is 1.6 GB); keep_final_state, by starting point (None: kept unless
        # the model descends from a pretrained one), whether a finished run keeps it.
        run=run_section(
            num_chunks=num_chunks,
            keep_checkpoints=1,
            keep_final_state=ml_collections.FieldReference(None, field_type=bool),
        ),
        init_from="",
        seed=0,
        **sections,
    )
    if pretrained:
        random = {name: flat[name] for name in pretrained}
        for name, value in random.items():
            flat[name] = ml_collections.FieldReference(None, field_type=type(value))
        flat.defaults = ml_collections.ConfigDict(
            dict(random=random, pretrained=pretrained, pretrained_lora=pretrained_lora)
        )
    # The preset's task settings that only in-program tasks read: one changed where it would be
    # ignored (beside a prompt file, or a task without that option) is refused
    # (`jaxrl.trainers.lm_runs.make_text_task`, `jaxrl.trainers.prompt_data`).
    if "defaults" not in flat:
        flat.defaults = ml_collections.ConfigDict()
    flat.defaults.task = {name: flat.task[name] for name in DIGIT_TASK_FIELDS if name in flat.task}
    return flat


def starting_point_defaults(flat: ml_collections.ConfigDict, pretrained: bool) -> dict[str, Any]:
    """{setting: default} for the settings of `flat` left None (by starting point):
    `defaults.random`'s values, or `defaults.pretrained`'s (`defaults.pretrained_lora`'s first
    where lora_rank > 0)."""
    if "defaults" not in flat:
        return {}
    chosen = dict(flat.defaults.random)
    if pretrained:
        chosen |= dict(flat.defaults.pretrained)
        if flat.get("lora_rank", 0) > 0:
            chosen |= dict(flat.defaults.pretrained_lora)
    return {name: value for name, value in chosen.items() if name in flat and flat[name] is None}


def described_values(values: dict[str, Any]) -> str:
    """Settings and their values as the runs print them: "learning_rate 5e-06, beta 0.1" (the
    learning rate first)."""
    ordered = sorted(values.items(), key=lambda item: item[0] != "learning_rate")
    return ", ".join(
        f"{name} {value:g}" if isinstance(value, int | float) else f"{name} {value!r}"
        for name, value in ordered
    )


def for_start(flat: ml_collections.ConfigDict, pretrained: bool) -> ml_collections.ConfigDict:
    """A copy of a config file's config with every setting left to the starting point filled
    with its default for a random (`pretrained` False) or a pretrained model, e.g. to build the
    algorithm's Config in Python: `for_start(get_config("reverse_digits"), pretrained=False)`."""
    filled = flat.copy_and_resolve_references()
    for name, value in starting_point_defaults(flat, pretrained).items():
        filled[name] = value
    return filled


def prompt_rl_config(
    config: Any, preset: dict[str, Any], settings: dict[str, Any], num_chunks: int, **sections: Any
) -> ml_collections.ConfigDict:
    """`lm_config` for RL on prompts (grpo.py, ppo_lm.py, online_dpo.py): the reward settings,
    the held-out evaluation's, the prompt sources beside the digit tasks (a JSONL file, a built
    TFDS dataset), and the preset's `settings` outside the algorithm's Config (init_from, the
    host reward, the evaluation's batch size)."""
    rewards = ml_collections.ConfigDict(
        dict(
            # weight of the digit tasks' format reward (digits, then EOS) next to their answer
            # reward; a prompt file's rewards are its functions in `host`
            format_weight=0.0,
            # host Python rewards, "module.path:function" (comma-separated for several), each
            # called as f(prompts, completions, **columns) -> list[float] through io_callback;
            # on a prompt file the first one also measures held-out accuracy
            host=settings.get("host", ""),
            host_weights="",  # comma-separated, one per function; "" weighs each 1
        )
    )
    flat = lm_config(
        config,
        preset,
        num_chunks=num_chunks,
        rewards=rewards,
        # Held-out prompts per generation call; with eval_samples, each call also decodes
        # eval_batch_size x eval_samples sampled rows from the same prefill.
        eval_batch_size=settings.get("eval_batch_size", 256),
        eval_every=0,  # held-out evaluation every N chunks (0: at the start and the end only)
        eval_samples=4,  # sampled completions per held-out prompt, for pass@k (0: none)
        **sections,
    )
    # Prompts from a built TFDS dataset (array_record) instead of train_jsonl: a name
    # NAME[/CONFIG][:X.Y.Z] under tfds_data_dir ("" is TFDS's default) or a directory; its
    # eval_split is held out ("" holds out num_eval rows of train_split). prompt_column names
    # the column (or feature) holding the prompt in either source, e.g. gsm8k's "question".
    flat.task.train_tfds = ""
    flat.task.tfds_data_dir = ""
    flat.task.train_split = "train"
    flat.task.eval_split = ""
    flat.task.prompt_column = "prompt"
    flat.init_from = settings.get("init_from", "")
    return flat
