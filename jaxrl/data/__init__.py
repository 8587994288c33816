"""Datasets as tensorflow-datasets builders (array_record files, read without TensorFlow) and
loaders that turn them into fixed-shape NumPy batches: preference pairs (`preferences`) and
offline RL episodes in RLDS shape, collected with `collect`, checked and converted in `episodes`,
written by `rlds_builder`, found by `locate`, read back by `rlds_reader` and flattened into
`transitions` for a learner. `step_batches` gives a training run's deterministic, resumable
per-step batches of a tokenised dataset."""

from __future__ import annotations

from jaxrl import lazy

# {public name: (the module of `jaxrl.data` that defines it, its name there)}. A name's module is
# imported when the name is first used: most of them import tensorflow-datasets, a good part of a
# second at every start that a language-model script's --help or mistyped flag need not wait for.
_MODULES = {
    "EpisodeDataError": ("episodes", "EpisodeDataError"),
    "CorruptDatasetError": ("locate", "CorruptDatasetError"),
    "DatasetNotFoundError": ("locate", "DatasetNotFoundError"),
    "dataset_path": ("locate", "dataset_path"),
    "load_dataset_info": ("locate", "load_dataset_info"),
    "PreferenceDataError": ("preferences", "PreferenceDataError"),
    "PreferenceRows": ("preferences", "PreferenceRows"),
    "batches": ("preferences", "batches"),
    "build_preference_dataset": ("preferences", "build_preference_dataset"),
    "load_preference_split": ("preferences", "load_preference_split"),
    "read_preference_jsonl": ("preferences", "read_preference_jsonl"),
    "tokenize_preferences": ("preferences", "tokenize_preferences"),
    "tokenize_sft": ("preferences", "tokenize_sft"),
    "build_episode_dataset": ("rlds_builder", "build_episode_dataset"),
    "load_episodes": ("rlds_reader", "load_episodes"),
    "Transitions": ("transitions", "Transitions"),
    "episodes_to_transitions": ("transitions", "episodes_to_transitions"),
    "load_transitions": ("transitions", "load_transitions"),
    "normalized_score": ("transitions", "normalized_score"),
    "sample_batch": ("transitions", "sample_batch"),
    "sample_indices": ("transitions", "sample_indices"),
    "to_device": ("transitions", "to_device"),
    "transition_batches": ("transitions", "batches"),
}

__all__ = sorted(_MODULES)

__getattr__, __dir__ = lazy.exports(__name__, _MODULES)
