"""SFT presets for `experiments/sft.py`: `--config=experiments/configs/sft.py[:NAME]`."""

import ml_collections

from jaxrl.config import preset_of
from jaxrl.trainers.presets.lm import lm_config

PRESETS = {
    # Deliberately short: an SFT model that is right on some problems and wrong on many, so DPO
    # has something to improve (raise num_steps for a strong SFT model).
    "reverse_digits": dict(num_steps=150, batch_size=64, learning_rate=3e-3),
    # The starting point of GRPO's addition preset: short on purpose, partly right.
    "addition": dict(
        num_steps=300,
        batch_size=64,
        learning_rate=3e-3,
        task=dict(name="addition", num_digits=2, held_out="hash"),
    ),
    # The starting point of GRPO's repeat_digit preset (long-tailed lengths, partial rollouts).
    "repeat_digit": dict(
        num_steps=300,
        batch_size=64,
        learning_rate=3e-3,
        task=dict(name="repeat_digit", num_digits=5, held_out="hash", num_train=94, num_eval=6)
        | dict(max_length=44),
    ),
    # ... and of its repeat_digit_long preset (1 to 256 digits).
    "repeat_digit_long": dict(
        num_steps=300,
        batch_size=64,
        learning_rate=3e-3,
        task=dict(name="repeat_digit", num_digits=8, held_out="hash", num_train=94, num_eval=6)
        | dict(max_length=268),
    ),
}
# SFT on a game's demonstrations (jaxrl/trainers/game_play.py), the start of
# experiments/multiturn.py:
# a teacher that never contradicts an answer but picks at random among what is still possible,
# near-optimal in 40% of episodes, so the SFT policy wins sometimes and RL has room to improve.
GAMES = {
    "guess_my_number": dict(
        num_steps=300,
        batch_size=32,
        learning_rate=2e-3,
        task=dict(game="guess_my_number", maximum=32, max_turns=6, scripted_fraction=0.4),
    ),
    "twenty_questions": dict(
        num_steps=300,
        batch_size=32,
        learning_rate=2e-3,
        task=dict(game="twenty_questions", max_turns=6, scripted_fraction=0.4),
    ),
    "word_game": dict(
        num_steps=300,
        batch_size=32,
        learning_rate=2e-3,
        task=dict(game="word_game", max_turns=6, scripted_fraction=0.4),
    ),
    # Two-digit multiplication with a calculator: 30% of the teacher's episodes call it, the
    # rest answer right without it, which the tiny model cannot imitate reliably. 600 steps: at
    # 300 one seed in three copied the numbers into and out of the calculator too poorly for
    # a single win, so RL had nothing to learn from.
    "multiplication": dict(
        num_steps=600,
        batch_size=32,
        learning_rate=2e-3,
        task=dict(game="multiplication", digits=2, max_turns=3, scripted_fraction=0.3),
    ),
}


def get_config(preset: str = "reverse_digits") -> ml_collections.ConfigDict:
    """The preset's config: `algos.sft.Config` fields and the LM sections."""
    from algos import sft
    from jaxrl.trainers import game_play

    # 50 optimizer steps per compiled chunk.
    chosen = dict(preset_of(PRESETS | GAMES, preset))
    game = chosen.pop("task") if preset in GAMES else None
    config = lm_config(sft.Config(), chosen, num_chunks=chosen["num_steps"] // 50)
    if game is not None:  # a game's section replaces the text task's
        config.task = game_play.game_task(demonstrations=True, **game)
    if preset == "repeat_digit_long":  # 268 tokens: beyond the tiny model's 64 positions
        config.model.max_position_embeddings = 272
    return config
