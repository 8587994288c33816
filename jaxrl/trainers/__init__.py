"""Trainers: one call from Python runs what an `experiments/<algo>.py` script runs.

Filled in by the trainer modules; the pipeline pieces the trainers share live beside them:
`lm_runs` (the starting model, tokenizer and run directory of a language-model run),
`prompt_rl` (prompts, reward functions and held-out evaluation of RL on prompts), `game_play`
(text games and their transcripts), `preference_data` (preference pairs) and `offline_sources`
(behaviour policies for offline datasets).
"""
