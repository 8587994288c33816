"""Datasets as tensorflow-datasets builders (array_record files, read without TensorFlow) and
loaders that turn them into fixed-shape NumPy batches: preference pairs (`preferences`) and
offline RL episodes in RLDS shape, collected with `collect`, checked and converted in `episodes`,
written by `rlds_builder`, found by `locate`, read back by `rlds_reader` and flattened into
`transitions` for a learner. `step_batches` gives a training run's deterministic, resumable
per-step batches of a tokenised dataset."""

from jaxrl.data.episodes import EpisodeDataError
from jaxrl.data.locate import (
    CorruptDatasetError,
    DatasetNotFoundError,
    dataset_path,
    load_dataset_info,
)
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
from jaxrl.data.rlds_builder import build_episode_dataset
from jaxrl.data.rlds_reader import load_episodes
from jaxrl.data.transitions import (
    Transitions,
    episodes_to_transitions,
    load_transitions,
    normalized_score,
    sample_batch,
    sample_indices,
    to_device,
)
from jaxrl.data.transitions import batches as transition_batches

__all__ = [
    "CorruptDatasetError",
    "DatasetNotFoundError",
    "EpisodeDataError",
    "PreferenceDataError",
    "PreferenceRows",
    "Transitions",
    "batches",
    "build_episode_dataset",
    "build_preference_dataset",
    "dataset_path",
    "episodes_to_transitions",
    "load_dataset_info",
    "load_episodes",
    "load_preference_split",
    "load_transitions",
    "normalized_score",
    "read_preference_jsonl",
    "sample_batch",
    "sample_indices",
    "to_device",
    "tokenize_preferences",
    "tokenize_sft",
    "transition_batches",
]
