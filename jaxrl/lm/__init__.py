"""Language-model policies: the transformer, its sampler, tokenizers and weight import."""

from jaxrl.lm.tokenizer import ByteTokenizer, HFTokenizer, Tokenizer, load_tokenizer

__all__ = ["ByteTokenizer", "HFTokenizer", "Tokenizer", "load_tokenizer"]
