"""Settings the language-model experiments share (sft.py, dpo.py): the model, the text task and
how the run is driven. Algorithm configs in sft.py / dpo.py add their own top-level fields."""

import ml_collections

# A tiny Llama-shaped model that learns reverse-digits on a CPU in a minute or two. For a real
# model, pass --config.init_from=/path/to/hf_checkpoint (its config.json replaces this one).
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
    remat=False,
)


def task_config() -> ml_collections.ConfigDict:
    return ml_collections.ConfigDict(
        dict(
            name="reverse_digits",
            num_digits=6,
            tokenizer="byte",  # or a tokenizer.json / directory holding one
            num_train=4000,
            num_eval=256,
            data_seed=0,
            # "random" held-out problems, or "hash": the task's hashed eval split, which GRPO
            # never trains on (set it for an SFT model that GRPO continues)
            held_out="random",
            max_prompt_length=16,
            max_length=28,
            # DPO only: your own preference JSONL files (prompt/chosen/rejected) instead of
            # synthetic pairs from the task; both must be set.
            train_jsonl="",
            eval_jsonl="",
        )
    )


def run_config(steps_per_chunk: int = 50) -> ml_collections.ConfigDict:
    return ml_collections.ConfigDict(
        dict(
            # optimizer steps per compiled call; a checkpoint between chunks
            steps_per_chunk=steps_per_chunk,
            checkpoint_every=1,  # chunks
            keep_checkpoints=2,
            log_every=10,  # steps
            tensorboard=True,
            progress=True,
        )
    )


def with_sections(algorithm_fields: dict) -> ml_collections.ConfigDict:
    config = ml_collections.ConfigDict(algorithm_fields)
    config.mesh_shape = tuple(config.mesh_shape)
    config.model = ml_collections.ConfigDict(TINY_MODEL)
    config.task = task_config()
    config.run = run_config()
    config.init_from = ""
    config.seed = 0
    return config
