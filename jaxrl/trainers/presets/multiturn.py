"""Multi-turn RL presets for `experiments/multiturn.py`:
`--config=experiments/configs/multiturn.py[:NAME]`.

Each preset starts from an SFT run on the same game's demonstrations, made by
`experiments/sft.py --config=experiments/configs/sft.py:NAME` (pass its workdir as
`--config.init_from`); the task section must match the SFT run's (the same game, turns and
rendering), which the presets' defaults do.

- guess_my_number: find a number in 1..32 within 6 guesses, told higher or lower (the tiny
  byte-level model).
- twenty_questions: find one of 16 objects with yes/no questions about 18 properties, in 6
  turns.
- word_game: a 4-letter Wordle over 40 words in 6 guesses.
- multiplication: two-digit multiplication in 3 turns, with a calculator the policy may call
  ("calc: 37 * 48"; a host game through io_callback). The tiny model cannot multiply; RL
  teaches it to call the tool.
"""

import ml_collections

from jaxrl.config import preset_of
from jaxrl.trainers.presets.lm import lm_config

PRESETS = {
    "guess_my_number": dict(
        num_steps=60,
        batch_size=8,  # games per update
        group_size=8,  # episodes of each game
        learning_rate=5e-4,
        max_new_tokens=4,  # per turn: up to two digits and the end of turn, with room to spare
        task=dict(game="guess_my_number", maximum=32, max_turns=6),
    ),
    # Long turns ("Is it bigger than a person?") in bytes: one wrong byte makes a question the
    # game cannot answer, so the sampled policy starts far below its greedy one; a smaller
    # learning rate keeps RL from collapsing it (5e-4 did).
    "twenty_questions": dict(
        num_steps=40,
        batch_size=8,
        group_size=8,
        learning_rate=1e-4,
        max_new_tokens=28,  # the longest question, 27 bytes, and the end of turn
        task=dict(game="twenty_questions", max_turns=6),
    ),
    "word_game": dict(
        num_steps=40,
        batch_size=8,
        group_size=8,
        learning_rate=5e-4,
        max_new_tokens=6,  # a 4-letter word and the end of turn
        task=dict(game="word_game", max_turns=6),
    ),
    "multiplication": dict(
        num_steps=40,
        batch_size=8,
        group_size=8,
        learning_rate=5e-4,
        max_new_tokens=16,  # "calc: 37 * 48" and its end of turn
        task=dict(game="multiplication", digits=2, max_turns=3),
    ),
}


def get_config(preset: str = "guess_my_number") -> ml_collections.ConfigDict:
    """The preset's config: `algos.multiturn.Config` fields, the rollout mode's settings, the LM
    sections with a game's task section (`jaxrl/trainers/game_play.game_task`), and how often to
    evaluate."""
    from algos import multiturn
    from jaxrl.trainers import game_play, rollout_modes

    chosen = dict(preset_of(PRESETS, preset))
    game = chosen.pop("task")
    # 10 updates per compiled chunk; every update's metrics logged (the learning curve).
    config = lm_config(
        multiturn.Config(),
        chosen,
        num_chunks=max(1, chosen["num_steps"] // 10),
        eval_every=0,  # evaluation episodes every N chunks (0: at the start and the end only)
        eval_samples=4,  # episodes of each evaluation game sampled for pass@k (0: none)
    )
    config.task = game_play.game_task(**game)
    config.run.log_every = 1
    # How generation meets training: rollout_mode and each mode's settings, flat
    # (`jaxrl.trainers.rollout_modes`); partial mode's rollout_budget counts turns.
    config.update(rollout_modes.defaults())
    return config
