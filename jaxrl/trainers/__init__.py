"""Trainers: one call from Python runs what an `experiments/<algo>.py` script runs.

Filled in by the trainer modules; the pipeline pieces the trainers share live beside them:
`lm_runs` (setting up a language-model run: its settings, starting model, tokenizer and run
directory), `prompt_data` (the prompts and reward functions of RL on prompts), `prompt_eval`
(their held-out evaluation and the run's summary), `presets` (every script's presets and the
defaults by starting point), `game_play`
(text games and their transcripts), `preference_data` (preference pairs), `data_sizes`
(held-out and batch sizes fitted to small data) and `offline_sources` (behaviour policies for
offline datasets).
"""
