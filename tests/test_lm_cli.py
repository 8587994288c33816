"""Real checkpoints through the command line: runs remember the model and tokenizer they trained,
so a Hugging Face checkpoint -> SFT -> DPO -> GRPO chain works through --config.init_from;
experiments/export.py writes an HF directory that our loader reads back with the run's logits;
experiments/generate.py samples from SmolLM2; and bad inputs of this area fail in one line.

That transformers loads such exports (and matches their logits) is checked offline, where torch
is installed, by tests/fixtures/check_export_with_transformers.py.
"""

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

from jaxrl.lm import ByteTokenizer, load_tokenizer
from jaxrl.lm.hf import load_hf_checkpoint
from jaxrl.lm.model import ModelConfig, Transformer
from tests.script_runs import REPO, read_json, run_script

TINY_LLAMA = os.path.join(REPO, "tests", "fixtures", "hf", "tiny_llama")
QUIET = ["--config.run.progress=False", "--config.run.tensorboard=False"]
ONE_CHUNK = [*QUIET, "--config.run.num_chunks=1"]
SMALL_SFT = ["--config.num_steps=4", "--config.batch_size=8", "--config.task.num_train=64"]
SMALL_SFT += ["--config.task.num_eval=16", "--config.task.held_out=hash"]
TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)


def write_digit_tokenizer(directory) -> str:
    """A character-level tokenizer.json (BPE without merges) whose 77 ids fit tiny_llama's
    128-token vocabulary with its special ids (pad 0, bos 1, eos 2), and a tokenizer_config.json
    with a chat template. The fixture tokenizer beside tiny_llama has no digit tokens, and the
    digit tasks' in-program prompts (GRPO) need one token per digit."""
    from tokenizers import Tokenizer, decoders, models

    os.makedirs(directory, exist_ok=True)
    specials = ["<pad>", "<bos>", "<eos>", "<unk>"]
    chars = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ =+:,.?!'-\n"
    vocab = {token: i for i, token in enumerate([*specials, *chars])}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    tokenizer.add_special_tokens(specials)
    tokenizer.decoder = decoders.Fuse()
    tokenizer.save(os.path.join(directory, "tokenizer.json"))
    config = dict(bos_token="<bos>", eos_token="<eos>", pad_token="<pad>", unk_token="<unk>")
    with open(os.path.join(directory, "tokenizer_config.json"), "w") as f:
        json.dump({**config, "chat_template": TEMPLATE}, f)
    return str(directory)


def run_params(workdir):
    with ocp.StandardCheckpointer() as checkpointer:
        return jax.device_get(checkpointer.restore(os.path.join(workdir, "params")))


def logits(model: ModelConfig, params, tokens) -> np.ndarray:
    return np.asarray(Transformer(model).apply({"params": params}, np.asarray(tokens))[0])


def assert_export_matches_run(run_dir, out_dir, tokens):
    """The exported directory loads with our HF loader into the run's architecture and gives the
    run's final parameters' logits exactly."""
    model = ModelConfig(**read_json(run_dir, "model.json")["model"])
    exported_model, exported = load_hf_checkpoint(out_dir)
    fields = ("vocab_size", "hidden_size", "num_layers", "num_heads", "num_kv_heads")
    assert [getattr(exported_model, f) for f in fields] == [getattr(model, f) for f in fields]
    np.testing.assert_array_equal(
        logits(exported_model, exported, tokens), logits(model, run_params(run_dir), tokens)
    )
    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"):
        assert os.path.isfile(os.path.join(out_dir, name)), name
    generation = read_json(out_dir, "generation_config.json")
    assert {"bos_token_id", "eos_token_id", "pad_token_id"} <= set(generation)
    assert not [n for n in os.listdir(os.path.dirname(out_dir)) if ".tmp-" in n]  # atomic


@pytest.fixture(scope="module")
def sft_run(tmp_path_factory):
    """A tiny SFT run with the default model and byte tokenizer."""
    workdir = str(tmp_path_factory.mktemp("cli") / "sft")
    run_script("sft.py", *SMALL_SFT, *ONE_CHUNK, f"--workdir={workdir}")
    return workdir


def test_export_of_an_sft_run_reimports_with_identical_logits(sft_run, tmp_path):
    out = str(tmp_path / "export")
    run_script("export.py", f"--run={sft_run}", f"--out={out}")
    prompt = ByteTokenizer().encode("rev 408127=")
    assert_export_matches_run(sft_run, out, [[1, *prompt]])
    # The byte tokenizer travels as an equivalent tokenizer.json: same ids, same text back.
    exported = load_tokenizer(out)
    text = "rev 408127=721804 ¿ü€"
    assert exported.encode(text) == ByteTokenizer().encode(text)
    assert exported.decode([1, *ByteTokenizer().encode(text), 2]) == text
    assert (exported.bos_id, exported.eos_id, exported.pad_id) == (1, 2, 0)
    # --overwrite replaces the directory; the byte-tokenizer run records no tokenizer files.
    run_script("export.py", f"--run={sft_run}", f"--out={out}", "--overwrite", "--dtype=bfloat16")
    assert read_json(out, "config.json")["vocab_size"] == 259
    assert load_hf_checkpoint(out, dtype="bfloat16")[1]["embedding"].dtype.name == "bfloat16"
    assert read_json(sft_run, "model.json")["tokenizer"] == "byte"


def test_hf_checkpoint_sft_dpo_grpo_export_chain(tmp_path):
    tokenizer_dir = write_digit_tokenizer(tmp_path / "digit_tokenizer")
    sft, dpo, grpo, out = (str(tmp_path / name) for name in ("sft", "dpo", "grpo", "export"))
    run_script(
        "sft.py",
        f"--config.init_from={TINY_LLAMA}",
        f"--config.task.tokenizer={tokenizer_dir}",
        *SMALL_SFT,
        *ONE_CHUNK,
        f"--workdir={sft}",
    )
    # DPO and GRPO name no model and no tokenizer: both come from the run before.
    run_script(
        "dpo.py",
        f"--config.init_from={sft}",
        "--config.num_steps=2",
        "--config.batch_size=8",
        "--config.task.num_train=32",
        "--config.task.num_eval=16",
        "--config.task.held_out=hash",
        "--config.eval_batch_size=16",
        *ONE_CHUNK,
        f"--workdir={dpo}",
    )
    run_script(
        "grpo.py",
        f"--config.init_from={dpo}",
        "--config.num_steps=2",
        "--config.batch_size=4",
        "--config.group_size=2",
        "--config.max_new_tokens=8",
        "--config.task.num_eval=8",
        "--config.eval_batch_size=8",
        "--config.model.remat=full",  # applies to the imported architecture
        *ONE_CHUNK,
        f"--workdir={grpo}",
    )
    run_script("export.py", f"--run={grpo}", f"--out={out}")

    hf_model, _ = load_hf_checkpoint(TINY_LLAMA)
    for workdir in (sft, dpo, grpo):
        recorded = read_json(workdir, "model.json")
        assert recorded["model"]["vocab_size"] == hf_model.vocab_size == 128
        assert recorded["model"]["intermediate_size"] == hf_model.intermediate_size == 96
        assert read_json(workdir, "config.json")["model"] == recorded["model"]
        assert recorded["tokenizer"] == "tokenizer"
        assert recorded["special_token_ids"] == {
            "bos_token_id": 1,
            "eos_token_id": 2,
            "pad_token_id": 0,
        }
        copied = os.path.join(workdir, "tokenizer", "tokenizer.json")
        original = os.path.join(tokenizer_dir, "tokenizer.json")
        with open(copied) as f, open(original) as g:
            assert f.read() == g.read()
    assert read_json(grpo, "model.json")["model"]["remat"] == "full"
    assert read_json(dpo, "summary.json")["init_from"] == f"run {sft}"

    tokenizer = load_tokenizer(out)
    prompt = tokenizer.encode("rev 408127=")
    assert_export_matches_run(grpo, out, [[tokenizer.bos_id, *prompt]])
    assert tokenizer.encode("408127") == [4 + int(c) for c in "408127"]
    messages = [{"role": "user", "content": "rev 12="}]
    assert tokenizer.apply_chat_template(messages, add_generation_prompt=True) == (
        "<bos>user: rev 12=\nassistant: "
    )


@pytest.mark.smollm2
def test_generate_answers_paris_with_smollm2():
    from jaxrl.lm.gguf import smollm2_hf_dir

    result = run_script(
        "generate.py",
        f"--model={smollm2_hf_dir()}",
        "--chat",
        "--prompt=What is the capital of France?",
        "--max_new_tokens=12",
    )
    assert "Paris" in result.stdout.split("<|im_start|>assistant")[-1], result.stdout
    assert "tokens/s" in result.stderr.strip().splitlines()[-1], result.stderr


def write_gguf(path, arch="llama"):
    """A tiny GGUF file, enough for the refusal of another architecture."""
    import gguf

    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_block_count(1)
    writer.add_tensor("token_embd.weight", np.zeros((8, 4), np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return str(path)


def bad_cases(sft_run, scratch):
    """(script, arguments, start of the error line after "error: ") for each bad input."""
    prompts = os.path.join(scratch, "prompts.jsonl")
    with open(prompts, "w") as f:
        f.write('{"prompt": "rev 12="}\n{"text": "no prompt"}\n')
    messages = os.path.join(scratch, "messages.jsonl")
    with open(messages, "w") as f:
        f.write('{"prompt": [{"role": "user", "content": "hi"}]}\n')
    empty = os.path.join(scratch, "empty.jsonl")
    open(empty, "w").close()
    not_gguf = os.path.join(scratch, "weights.bin")
    with open(not_gguf, "wb") as f:
        f.write(b"not a checkpoint")
    falcon = write_gguf(os.path.join(scratch, "falcon.gguf"), arch="falcon")
    existing = os.path.join(scratch, "existing")
    os.makedirs(existing)
    open(os.path.join(existing, "keep.txt"), "w").close()
    unfinished = os.path.join(scratch, "unfinished")
    os.makedirs(unfinished)
    with open(os.path.join(unfinished, "config.json"), "w") as f:
        json.dump({"run": {}, "model": {}}, f)
    tokenizer = os.path.join(REPO, "tests", "fixtures", "hf", "tokenizer")
    m, p = f"--model={sft_run}", "--prompt=rev 12="
    return [
        ("generate.py", [p], "--model: missing"),
        ("generate.py", ["--model=/nonexistent", p], "--model: /nonexistent: no such file"),
        ("generate.py", [m], "--prompt: no prompts"),
        ("generate.py", [m, p, f"--prompts_file={prompts}"], "--prompt / --prompts_file"),
        ("generate.py", [m, f"--prompts_file={prompts}"], f"--prompts_file={prompts}: line 2"),
        ("generate.py", [m, f"--prompts_file={empty}"], f"--prompts_file={empty}: holds no"),
        ("generate.py", [m, p, "--chat"], "--chat: chat messages need a chat template"),
        ("generate.py", [m, f"--prompts_file={messages}"], "--prompts_file: chat messages"),
        ("generate.py", [m, p, "--top_p=0.9"], "--top_p: only applies when sampling"),
        ("generate.py", [m, p, "--temperature=-1"], "--temperature: got -1"),
        ("generate.py", [m, p, "--max_new_tokens=1000"], "--max_new_tokens: the longest prompt"),
        ("generate.py", [m, p, "--batch_size=0"], "--batch_size: must be >= 1"),
        ("generate.py", [f"--model={falcon}", p], f"--model: {falcon}: general.architecture"),
        ("generate.py", [f"--model={not_gguf}", p], f"--model: {not_gguf} is a file but not"),
        ("export.py", [f"--out={scratch}/x"], "--run: missing"),
        ("export.py", [f"--run={sft_run}"], "--out: missing"),
        ("export.py", [f"--run={sft_run}", f"--out={existing}"], f"--out={existing}: exists"),
        ("export.py", [f"--run={unfinished}", f"--out={scratch}/x"], "--run: "),
        ("export.py", [f"--run={TINY_LLAMA}", f"--out={scratch}/x"], f"--run={TINY_LLAMA}: is"),
        # init_from guards of the trainers that need files made here (the others, with the
        # repository's fixtures, are in tests/test_bad_inputs.py)
        ("sft.py", [f"--config.init_from={falcon}"], f"config.init_from: {falcon}: general"),
        ("sft.py", [f"--config.init_from={unfinished}"], "config.init_from: "),
        (
            "dpo.py",
            [f"--config.init_from={sft_run}", f"--config.task.tokenizer={tokenizer}"],
            f"config.task.tokenizer: {tokenizer} is not the tokenizer",
        ),
    ]


TRAINERS = ("sft.py", "dpo.py", "grpo.py")


def test_bad_inputs_fail_in_one_line_writing_nothing(sft_run, tmp_path):
    scratch = str(tmp_path)
    cases = bad_cases(sft_run, scratch)
    assert len(cases) >= 15

    def command(index):
        script, arguments, _ = cases[index]
        extra = [f"--workdir={scratch}/case{index}"] if script in TRAINERS else []
        path = os.path.join(REPO, "experiments", script)
        return subprocess.run(
            [sys.executable, path, *arguments, *extra, *(QUIET if extra else [])],
            capture_output=True,
            text=True,
            timeout=300,
            cwd=REPO,
        )

    before = sorted(os.listdir(scratch))
    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(command, range(len(cases))))
    failures = []
    for (script, arguments, expected), result in zip(cases, results, strict=True):
        lines = [line for line in result.stderr.splitlines() if line.strip()]
        if (
            result.returncode != 2
            or len(lines) != 1
            or not lines[0].startswith(f"error: {expected}")
        ):
            failures.append(f"{script} {arguments}: rc {result.returncode}: {result.stderr[-800:]}")
        elif ";" not in lines[0] and "?" not in lines[0]:
            failures.append(f"{script} {arguments}: no fix given: {lines[0]}")
    assert not failures, "\n".join(failures)
    assert sorted(os.listdir(scratch)) == before  # no workdir, no --out, no temporary directory
    assert os.listdir(os.path.join(scratch, "existing")) == ["keep.txt"]
