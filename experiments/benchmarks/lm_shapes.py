"""The model shapes the language-model benchmarks build with random weights (the fields of
`jaxrl.lm.model.ModelConfig`): the peers' tiny Llama, SmolLM2-135M-Instruct's shape, the
SmolLM2-1.7B shape, a 7B Llama (Llama-2-7B's) and the Qwen3-0.6B and Qwen3-4B shapes (their
published config.json files: 28 x 1024 and 36 x 2560, 16 / 32 query heads over 8 key/value
heads of 128, QK-norm, tied embeddings, vocabulary 151,936). Standard library only, so a
driver can read them before it imports JAX."""

from __future__ import annotations

from typing import Any

MODEL_SHAPES: dict[str, dict[str, Any]] = {
    "tiny": dict(
        vocab_size=512,
        hidden_size=256,
        intermediate_size=688,
        num_layers=4,
        num_heads=4,
        num_kv_heads=2,
    ),
    "smollm2": dict(
        vocab_size=49_152,
        hidden_size=576,
        intermediate_size=1536,
        num_layers=30,
        num_heads=9,
        num_kv_heads=3,
        tie_embeddings=True,
        rope_theta=100_000.0,
    ),
    "1.7b": dict(
        vocab_size=49_152,
        hidden_size=2048,
        intermediate_size=8192,
        num_layers=24,
        num_heads=32,
        num_kv_heads=32,
        tie_embeddings=True,
        rope_theta=130_000.0,
    ),
    "7b": dict(
        vocab_size=32_000,
        hidden_size=4096,
        intermediate_size=11_008,
        num_layers=32,
        num_heads=32,
        num_kv_heads=32,
        tie_embeddings=False,
    ),
    "qwen3-0.6b": dict(
        vocab_size=151_936,
        hidden_size=1024,
        intermediate_size=3072,
        num_layers=28,
        num_heads=16,
        num_kv_heads=8,
        head_dim=128,
        max_position_embeddings=40_960,
        rope_theta=1_000_000.0,
        tie_embeddings=True,
        qk_norm=True,
    ),
    "qwen3-4b": dict(
        vocab_size=151_936,
        hidden_size=2560,
        intermediate_size=9728,
        num_layers=36,
        num_heads=32,
        num_kv_heads=8,
        head_dim=128,
        max_position_embeddings=40_960,
        rope_theta=1_000_000.0,
        tie_embeddings=True,
        qk_norm=True,
    ),
}
