"""Every script's presets: `jaxrl.trainers.presets.<algo>.get_config(NAME)` is the config
`experiments/<algo>.py --config=experiments/configs/<algo>.py:NAME` runs and
`jaxrl.trainers.<algo>.config(NAME)` returns; `lm` holds what the language-model presets share
(the tiny model, the task section, the defaults by starting point)."""
