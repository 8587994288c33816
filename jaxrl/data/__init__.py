"""Datasets as tensorflow-datasets builders (array_record files, read without TensorFlow) and
loaders that turn them into fixed-shape NumPy batches."""

from jaxrl.data.preferences import (
    PreferenceDataError,
    PreferenceRows,
    batches,
    build_preference_dataset,
    load_preference_split,
    read_preference_jsonl,
    tokenize_preferences,
    tokenize_sft,
)

__all__ = [
    "PreferenceDataError",
    "PreferenceRows",
    "batches",
    "build_preference_dataset",
    "load_preference_split",
    "read_preference_jsonl",
    "tokenize_preferences",
    "tokenize_sft",
]
