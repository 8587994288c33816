"""Every script, fed the bad inputs a careless user types: each must exit 2 with exactly one
`error:` line naming the field (or flag, or file) and the fix, before anything compiles and
without writing anything.

The cases run as subprocesses, two at a time. Each one's time is compared with the script's
start (`bare_start`: its `--helpfull`, with gymnax loaded first for the control scripts), so a
check that runs only after compiling something would show up as slow.
"""

import json
import os
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.script_runs import tree_digest

# Each case's time is bounded by its script's bare start time: run with nothing else on the
# machine (the README's test command runs the `serial` tests after the parallel ones).
pytestmark = pytest.mark.serial

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRAINERS = (
    "ppo.py",
    "sac.py",
    "cql.py",
    "sft.py",
    "dpo.py",
    "grpo.py",
    "reward_model.py",
    "ppo_lm.py",
    "online_dpo.py",
    "multiturn.py",
    "mappo.py",
)

PROMPTS = "--config.task.train_jsonl=tests/fixtures/prompts/"
REWARD = "--config.rewards.host=tests.fixtures.host_reward:"
SAY_DIGIT = f"{PROMPTS}say_digit.jsonl --config.task.num_eval=8"
VOWELS = "tests/fixtures/vowel_task.py:VowelCount"  # a text task of one's own
TRIED = (
    "config.rewards.host: on the first 4 prompts with empty completions (tried before training), "
    "reward function tests.fixtures.host_reward:"
)

# (script, arguments, the start of the error line after "error: ")
CASES = [
    # --- flags and config files, the same path for every trainer
    ("ppo.py", "--config.learning_rat=1e-3", "--config.learning_rat: not a setting"),
    ("ppo.py", "--config=experiments/configs/ppo.py:hopper", "--config: unknown preset"),
    ("ppo.py", "--config=experiments/configs/nope.py", "--config=experiments/configs/nope.py"),
    ("ppo.py", "--config.num_envs=abc", "--config.num_envs: invalid literal"),
    ("ppo.py", "--num_seeds=x", "--num_seeds: invalid literal"),
    ("ppo.py", "--bogus=1", "--bogus: unknown flag"),
    ("ppo.py", "positional", "unexpected arguments"),
    ("ppo.py", "--config.run.num_chunk=3", "--config.run.num_chunk: not a setting"),
    (
        "sac.py",
        "--config.hidden_sizes=(8,8) --config.hidden_sizes=(4,4)",
        "--config.hidden_sizes: given more than once (a tuple's repeats are joined",
    ),
    ("sac.py", "--config.critc_lr=1", "--config.critc_lr: not a setting"),
    ("sac.py", "--config=experiments/configs/sac.py:walker", "--config: unknown preset"),
    ("cql.py", "--config.cql_alpah=1", "--config.cql_alpah: not a setting"),
    ("sft.py", "--config.learning_rat=1", "--config.learning_rat: not a setting"),
    ("dpo.py", "--config.bta=1", "--config.bta: not a setting"),
    ("grpo.py", "--config.group_sise=4", "--config.group_sise: not a setting"),
    ("grpo.py", "--config=experiments/configs/grpo.py:nope", "--config: unknown preset"),
    # no close name at all: the bare KeyError, still named by its flag
    ("sft.py", "--config.run.workdir=/tmp/x", "--config.run.workdir: not a setting"),
    ("grpo.py", "--config.zzz=1", "--config.zzz: not a setting"),
    # the objects' and TRL's spellings: the line names the flat flag that works
    (
        "grpo.py",
        "--config.sampling.max_new_tokens=8",
        "--config.sampling: not a setting of this config; sampling settings are flat: "
        "--config.max_new_tokens",
    ),
    (
        "grpo.py",
        "--config.rollout=partial",
        "--config.rollout: not a setting of this config; the rollout is --config.rollout_mode",
    ),
    (
        "grpo.py",
        "--config.loss_type=cispo",
        "--config.loss_type: not a setting of this config; GRPO's loss is --config.variant",
    ),
    # cuDNN's attention asked for where it cannot run (fp32 compute; off an NVIDIA GPU)
    ("sft.py", "--config.model.attention=cudnn", "config.model.attention: cudnn takes bfloat16"),
    # --- PPO settings: type, range, finiteness, cross-field
    ("ppo.py", "--config.learning_rate=inf", "config.learning_rate: must be a finite number"),
    ("ppo.py", "--config.learning_rate=nan", "config.learning_rate: must be a finite number"),
    ("ppo.py", "--config.learning_rate=-1", "config.learning_rate: must be positive"),
    ("ppo.py", "--config.num_envs=0", "config.num_envs: must be positive"),
    ("ppo.py", "--config.gamma=1.5", "config.gamma: must lie in [0.0, 1.0]"),
    ("ppo.py", "--config.gae_lambda=nan", "config.gae_lambda: must lie in [0.0, 1.0]"),
    ("ppo.py", "--config.clip_eps=0", "config.clip_eps: must be positive"),
    ("ppo.py", "--config.ent_coef=-0.1", "config.ent_coef: must be >= 0"),
    ("ppo.py", "--config.vf_coef=inf", "config.vf_coef: must be a finite number"),
    ("ppo.py", "--config.max_grad_norm=0", "config.max_grad_norm: must be positive"),
    ("ppo.py", "--config.num_minibatches=3", "config.num_minibatches: num_envs * rollout_length"),
    ("ppo.py", "--config.total_timesteps=100", "config.total_timesteps: (100) is less than"),
    ("ppo.py", "--config.total_timesteps=100000000000000", "config.total_timesteps: (1000"),
    ("ppo.py", "--config.activation=sigmoidal", "config.activation: unknown activation"),
    ("ppo.py", "--config.hidden_sizes=(0,64)", "config.hidden_sizes: every layer width"),
    ("ppo.py", "--config.env_name=CartPol-v1", "config.env_name: Unknown environment"),
    # --- control breadth: host environments, HL-Gauss critics, multi-agent PPO
    ("ppo.py", "--config.env_name=gymnasium:NoSuch-v0", "config.env_name: Gymnasium cannot make"),
    ("ppo.py", "--config.env_name=gymnasium:Blackjack-v1", "config.env_name: gymnasium:Black"),
    ("sac.py", "--config.env_name=gymnasium:Pendulum-v1", "config.env_name: 'gymnasium:Pendu"),
    ("ppo.py", "--config.hl_gauss_bins=51 --config.clip_value=False", "config.hl_gauss_range:"),
    ("ppo.py", "--config.hl_gauss_range=(0,100)", "config.hl_gauss_range: is set but"),
    ("ppo.py", "--config.hl_gauss_bins=51 --config.hl_gauss_range=(0,100)", "config.clip_value:"),
    ("sac.py", "--config.hl_gauss_bins=51 --config.hl_gauss_range=(5,1)", "config.hl_gauss_range"),
    ("mappo.py", "--config.critic=shared", "config.critic: unknown critic 'shared'"),
    ("mappo.py", "--config.env_name=jaxmarl:MPE_simple_tag_v3", "config.env_name: 'jaxmarl:MPE"),
    ("mappo.py", "--config.num_minibatches=7", "config.num_minibatches: num_envs * rollout"),
    ("mappo.py", "--config.reward_shaping_horizon=1000", "config.reward_shaping_horizon: 'jaxma"),
    ("ppo.py", "--config.env_name=envpool:NoSuch-v0", "config.env_name: EnvPool has no task"),
    ("ppo.py", "--config.env_options=episodic_life", "config.env_options: 'episodic_life' is"),
    ("ppo.py", "--config.env_options=max_steps=9", "config.env_options: Environment 'Cart"),
    ("ppo.py", "--config.torso=resnet", "config.torso: unknown torso 'resnet'"),
    ("ppo.py", "--config.torso=nature_cnn", "config.torso: nature_cnn takes stacked frames"),
    ("ppo.py", "--config.rollout_length=-5", "config.rollout_length: must be positive"),
    ("ppo.py", "--config.adam_eps=0", "config.adam_eps: must be positive"),
    ("ppo.py", "--config.eval_episodes=0", "config.eval_episodes: must be positive"),
    ("ppo.py", "--config.num_epochs=0", "config.num_epochs: must be positive"),
    ("ppo.py", "--num_seeds=0", "--num_seeds must be >= 1"),
    ("ppo.py", "--config.run.num_chunks=0", "config.run.num_chunks must be >= 1"),
    ("ppo.py", "--config.run.log_every=0", "config.run.log_every must be >= 1"),
    ("ppo.py", "--config.run.checkpoint_every=0", "config.run.checkpoint_every must be >= 1"),
    ("ppo.py", "--config.run.keep_checkpoints=0", "config.run.keep_checkpoints must be >= 1"),
    # --- SAC
    ("sac.py", "--config.actor_lr=inf", "config.actor_lr: must be a finite number"),
    ("sac.py", "--config.target_entropy=nan", "config.target_entropy: must be a finite number"),
    ("sac.py", "--config.buffer_size=100", "config.batch_size: (256) exceeds the replay buffer"),
    ("sac.py", "--config.batch_size=100000 --config.total_timesteps=2000", "config.batch_size"),
    ("sac.py", "--config.env_name=CartPole-v1", "config.env_name: 'CartPole-v1' has discrete"),
    ("sac.py", "--config.tau=2", "config.tau: must lie in [0.0, 1.0]"),
    ("sac.py", "--config.gamma=-0.1", "config.gamma: must lie in [0.0, 1.0]"),
    ("sac.py", "--config.utd_ratio=0", "config.utd_ratio: must be positive"),
    ("sac.py", "--config.learning_starts=0", "config.learning_starts: must be positive"),
    ("sac.py", "--config.total_timesteps=500", "config.total_timesteps: (500) must exceed"),
    ("sac.py", "--config.num_critics=0", "config.num_critics: must be positive"),
    ("sac.py", "--config.init_alpha=nan", "config.init_alpha: must be a finite number"),
    ("sac.py", "--config.total_timesteps=100000000000000", "config.total_timesteps: (1000"),
    ("sac.py", "--config.num_envs=3", "config.total_timesteps: (20000) must be a multiple"),
    # --- CQL (the dataset is checked after the settings)
    ("cql.py", "", "config.dataset.path is required"),
    ("cql.py", "--config.dataset.path=/nonexistent", "config.dataset.path: /nonexistent"),
    ("cql.py", "--config.cql_alpha=-1 --config.dataset.path=x", "config.cql_alpha: must be >= 0"),
    (
        "cql.py",
        "--config.reference.random_return=nan --config.reference.expert_return=1",
        "config.reference.random_return: must be a finite number",
    ),
    ("cql.py", "--config.reference.expert_return=inf", "config.reference.expert_return: must be"),
    ("cql.py", "--config.num_steps=0 --config.dataset.path=x", "config.num_steps: must be"),
    ("cql.py", "--config.batch_size=0 --config.dataset.path=x", "config.batch_size: must be"),
    ("cql.py", "--num_seeds=0", "--num_seeds must be >= 1"),
    # --- collect.py and compare.py
    ("collect.py", "--policy=/nonexistent", "/nonexistent: no such run directory"),
    ("collect.py", "--num_steps=0", "--num_steps must be >= 1"),
    ("collect.py", "--mixture=bogus", "--mixture: value should be one of"),
    ("collect.py", "--env_name=Nope-v1", ""),
    ("compare.py", "/nonexistent", "/nonexistent: no such directory"),
    ("compare.py", "--bogus", "--bogus: unknown flag"),
    # --- SFT / DPO / GRPO settings
    ("sft.py", "--config.learning_rate=inf", "config.learning_rate: must be a finite number"),
    ("sft.py", "--config.batch_size=0", "config.batch_size: must be positive"),
    ("sft.py", "--config.grad_accum_steps=3", "config.grad_accum_steps"),
    ("sft.py", "--config.mesh_shape=(3,1,1)", "config.batch_size"),
    ("sft.py", "--config.task.name=multiply", "config.task"),
    ("sft.py", "--config.init_from=/nonexistent", "config.init_from"),
    (
        "sft.py",
        "--config.init_from=smolm2",
        "config.init_from: smolm2: no such file or directory; did you mean 'smollm2'",
    ),
    ("sft.py", "--config.run.num_chunks=0", "config.run.num_chunks must be >= 1"),
    ("sft.py", "--config.task.max_prompt_length=5", "config.task.max_prompt_length: 4000 of"),
    (
        "sft.py",
        "--config.model.tie_embeddings=True --config.lora_rank=4 "
        "--config.lora_targets=('lm_head',)",
        "config.lora_targets: 'lm_head' names no parameter",
    ),
    ("dpo.py", "--config.lora_rank=4 --config.lora_targets=('qproj',)", "config.lora_targets"),
    ("dpo.py", "--config.loss_type=hinge", "config.loss_type"),
    ("dpo.py", "--config.beta=-1", "config.beta"),
    ("dpo.py", "--config.beta=nan", "config.beta"),
    ("dpo.py", "--config.learning_rate=inf", "config.learning_rate: must be a finite number"),
    ("dpo.py", "positional", "unexpected arguments"),
    ("grpo.py", "--config.variant=ppo", "config.variant"),
    ("grpo.py", "--config.temperature=inf", "config.temperature"),
    ("grpo.py", "--config.kl_beta=nan", "config.kl_beta"),
    ("grpo.py", "--config.group_size=1", "config.group_size"),
    ("grpo.py", "--config.rewards.host=no_such_module:f", "config.rewards.host"),
    ("grpo.py", "--config.max_new_tokens=100", "config.max_new_tokens"),
    ("grpo.py", "--config.task.name=multiply", "config.task"),
    ("grpo.py", "--config.learning_rate=0", "config.learning_rate: must be positive"),
    # --- partial rollouts (issue 39): budget, slots, staleness bound, what partial cannot do
    ("grpo.py", "--config.rollout_mode=later", "config.rollout_mode: unknown mode 'later'"),
    ("grpo.py", "--config.max_staleness=1", "config.max_staleness: got 1, but it is read only"),
    (
        "grpo.py",
        "--config.rollout_mode=partial --config.rollout_budget=9",
        "config.rollout_budget: got 9, more decode steps than a completion of max_new_tokens=4",
    ),
    (
        "grpo.py",
        "--config.rollout_mode=partial --config.rollout_budget=1 --config.max_staleness=2",
        "config.max_staleness: a completion of max_new_tokens=4 takes 4 updates of 1 decode",
    ),
    (
        "grpo.py",
        "--config.rollout_mode=partial --config.rollout_groups=64",
        "config.rollout_groups: got 64, fewer than the batch_size=128 groups",
    ),
    ("grpo.py", "--config.rollout_mode=partial --config.max_staleness=-1", "config.max_staleness"),
    (
        "grpo.py",
        "--config.rollout_mode=partial --config.max_staleness=1.5",
        "--config.max_staleness: invalid literal for int()",
    ),
    (
        "grpo.py",
        "--config.rollout_mode=partial --config.variant=remax",
        "config.rollout_mode: partial rollouts do not generate ReMax",
    ),
    (
        "grpo.py",
        "--config.rollout_mode=partial --config.lora_rank=4",
        "config.rollout_mode: partial rollouts train every parameter",
    ),
    # --- real checkpoints: init_from and tokenizer guards, generate.py, export.py
    ("sft.py", "--config.init_from=tests/fixtures/hf/tiny_llama", "config.task.tokenizer: the"),
    (
        "sft.py",
        "--config.init_from=tests/fixtures/hf/tiny_llama "
        "--config.task.tokenizer=tests/fixtures/hf/tokenizer --config.model.hidden_size=32",
        "config.model.hidden_size: the architecture comes from",
    ),
    ("sft.py", "--config.init_from=README.md", "config.init_from: README.md is a file but not"),
    ("dpo.py", "--config.init_from=tests/fixtures", "config.init_from: tests/fixtures holds"),
    # --- reward models: their settings, and the pairs dpo.py reads
    ("reward_model.py", "--config.center_rewards_coefficient=-1", "config.center_rewards_coeff"),
    ("reward_model.py", "--config.lora_rank=4", "config.lora_rank: a reward model trains every"),
    ("reward_model.py", "--config.task.train_jsonl=nope.jsonl", "config.task.train_jsonl: nope"),
    ("reward_model.py", "--config.batch_size=8192", "config.batch_size: 8192 exceeds the 4000"),
    ("reward_model.py", "--config.init_from=README.md", "config.init_from: README.md is a file"),
    # --- PPO for language models: its settings and the reward models it reads
    ("ppo_lm.py", "--config.critic=shared", "config.critic: unknown critic 'shared'"),
    ("ppo_lm.py", "--config.gae_lambda=1.5", "config.gae_lambda: "),
    ("ppo_lm.py", "--config.batch_size=6 --config.num_minibatches=4", "config.num_minibatches: "),
    ("ppo_lm.py", "--config.ensemble_rule=min", "config.ensemble_rule: combines a reward-model"),
    ("ppo_lm.py", "--config.reward_model=tests/fixtures", "config.reward_model: tests/fixtures is"),
    ("ppo_lm.py", "--config.max_new_tokens=60", "config.max_new_tokens: prompts of 9 tokens"),
    ("online_dpo.py", "--config.num_samples=1", "config.num_samples: got 1; a pair needs two"),
    ("online_dpo.py", "--config.reference=precomputed", "config.reference: online pairs are"),
    ("online_dpo.py", "--config.ensemble_rule=min", "config.ensemble_rule: combines a reward"),
    ("online_dpo.py", "--config.label_noise=-1", "config.label_noise: got -1.0"),
    (
        "sft.py",
        "--config.task.tokenizer=tests/fixtures/hf/tokenizer --config.model.vocab_size=100",
        "config.task.tokenizer: the tokenizer has 128 ids",
    ),
    (
        "grpo.py",
        "--config.init_from=tests/fixtures/hf/tiny_llama "
        "--config.task.tokenizer=tests/fixtures/hf/tokenizer --config.max_new_tokens=200",
        "config.max_new_tokens: prompts of 8 tokens + 200 new ones exceed",
    ),
    # --- GRPO on a prompt file: the file, its split, its lengths and the reward functions
    ("grpo.py", f"{PROMPTS}nope.jsonl", "tests/fixtures/prompts/nope.jsonl: no such file"),
    ("grpo.py", f"{PROMPTS}malformed.jsonl", "tests/fixtures/prompts/malformed.jsonl:2: invalid"),
    ("grpo.py", f"{PROMPTS}no_prompt.jsonl", "tests/fixtures/prompts/no_prompt.jsonl:2: no 'pro"),
    ("grpo.py", f"{PROMPTS}empty.jsonl", "tests/fixtures/prompts/empty.jsonl: no rows"),
    ("grpo.py", f"{PROMPTS}number_prompt.jsonl", "tests/fixtures/prompts/number_prompt.jsonl:1:"),
    ("grpo.py", f"{PROMPTS}missing_column.jsonl", "tests/fixtures/prompts/missing_column.jsonl:2"),
    ("grpo.py", f"{PROMPTS}mixed_kinds.jsonl", "tests/fixtures/prompts/mixed_kinds.jsonl:2: mix"),
    (
        "grpo.py",
        f"{PROMPTS}bad_role.jsonl",
        "tests/fixtures/prompts/bad_role.jsonl:1: 'prompt' message 0",
    ),
    (
        "grpo.py",
        f"{PROMPTS}say_digit_chat.jsonl --config.task.num_eval=8 {REWARD}says_answer",
        "config.task.train_jsonl: tests/fixtures/prompts/say_digit_chat.jsonl:",
    ),
    ("grpo.py", f"{PROMPTS}say_digit.jsonl --config.task.num_eval=40", "config.task.num_eval: 40"),
    ("grpo.py", f"{SAY_DIGIT}", "config.rewards.host: a prompt file needs at least one reward"),
    (
        "grpo.py",
        f"{SAY_DIGIT} {REWARD}needs_solution",
        "config.rewards.host: needs_solution needs column(s) ['solution']",
    ),
    (
        "grpo.py",
        f"{SAY_DIGIT} {REWARD}no_keyword_arguments",
        "config.rewards.host: no_keyword_arguments does not take column(s) ['level']",
    ),
    (
        "grpo.py",
        f"{SAY_DIGIT} {REWARD}returns_nan",
        f"{TRIED}returns_nan: returned nan for completion 0",
    ),
    (
        "grpo.py",
        f"{SAY_DIGIT} {REWARD}returns_one_too_few",
        f"{TRIED}returns_one_too_few: returned shape (3,)",
    ),
    ("grpo.py", f"{SAY_DIGIT} {REWARD}returns_strings", f"{TRIED}returns_strings: returned str"),
    (
        "grpo.py",
        f"{SAY_DIGIT} {REWARD}raises_on_empty",
        f"{TRIED}raises_on_empty: raised ZeroDivisionError",
    ),
    (
        "grpo.py",
        f"{PROMPTS}long_prompt.jsonl --config.task.num_eval=1 {REWARD}says_answer "
        "--config.max_new_tokens=40",
        "config.max_new_tokens: prompts of ",
    ),
    (
        "grpo.py",
        f"{SAY_DIGIT} {REWARD}says_answer --config.task.max_prompt_length=4",
        "config.task.max_prompt_length: 32 of 32 prompts have more than 4 tokens",
    ),
    (
        "grpo.py",
        f"{SAY_DIGIT} {REWARD}says_answer --config.rewards.host_weights=1,2",
        "config.rewards.host_weights: 2 weights for 1 reward functions",
    ),
    (
        "grpo.py",
        f"{SAY_DIGIT} {REWARD}says_answer --config.rewards.format_weight=0.5",
        "config.rewards.format_weight: the format reward is the digit tasks'",
    ),
    (
        "grpo.py",
        f"{SAY_DIGIT} {REWARD}says_answer "
        "--config.task.eval_jsonl=tests/fixtures/prompts/other_columns.jsonl",
        "config.task.eval_jsonl: tests/fixtures/prompts/other_columns.jsonl:1 has columns",
    ),
    (
        "grpo.py",
        f"{SAY_DIGIT} {REWARD}says_answer --config.task.length_percentile=0",
        "config.task.length_percentile: got 0",
    ),
    (
        "grpo.py",
        f"{SAY_DIGIT} {REWARD}says_answer --config.task.num_digits=4",
        "config.task.num_digits: a setting of the built-in digit tasks",
    ),
    # --- a text task's name and options (envs.text.registry; a task of one's own by its file)
    (
        "grpo.py",
        "--config.task.options=num_digit=3",
        "config.task.options: the reverse_digits task has no option 'num_digit'",
    ),
    (
        "sft.py",
        "--config.task.options=num_digits=x",
        "config.task.options.num_digits: got 'x' (str) for the reverse_digits task",
    ),
    (
        "grpo.py",
        f"--config.task.name={VOWELS} --config.task.num_digits=4",
        "config.task.num_digits: an option of the digit tasks, which the vowel_count task",
    ),
    (
        "ppo_lm.py",
        f"--config.task.name={VOWELS} --config.task.options=letters=12",
        "config.task.options.letters: got 12 for vowel_count",
    ),
    ("grpo.py", "--config.task.name=tests/fixtures/nope.py:Task", "config.task.name: cannot load"),
    (
        "grpo.py",
        f"{SAY_DIGIT} {REWARD}says_answer --config.task.options=num_digits=3",
        "config.task.options: options of an in-program task",
    ),
    (
        "reward_model.py",
        f"--config.task.name={VOWELS}",
        "config.task.name: the vowel_count task gives no preference pairs",
    ),
    (
        "grpo.py",
        f"--config.task.name={VOWELS} --config.rewards.format_weight=0.5",
        "config.rewards.format_weight: the vowel_count task has no format reward",
    ),
    # --- GRPO on a built TFDS dataset instead of a file
    (
        "grpo.py",
        "--config.task.train_tfds=nope --config.task.tfds_data_dir=tests/fixtures",
        "config.task.train_tfds: ",
    ),
    (
        "grpo.py",
        f"{SAY_DIGIT} --config.task.train_tfds=nope",
        "config.task.train_jsonl: set together with train_tfds",
    ),
    (
        "grpo.py",
        f"{SAY_DIGIT} {REWARD}says_answer --config.task.eval_split=test",
        "config.task.eval_split: 'test' is read only with a TFDS dataset",
    ),
    (
        "grpo.py",
        f"{SAY_DIGIT} {REWARD}says_answer --config.task.prompt_column=question",
        "tests/fixtures/prompts/say_digit.jsonl:1: no 'question' column (prompt_column",
    ),
    ("multiturn.py", "--config.task.game=chess", "config.task.game: unknown game 'chess'"),
    ("multiturn.py", "--config.task.max_turns=0", "config.task.max_turns: got 0"),
    ("multiturn.py", "--config.credit=step", "config.credit: unknown credit"),
    (
        "multiturn.py",
        "--config.rollout_mode=partial --config.rollout_budget=1 --config.task.max_turns=3",
        "config.max_staleness: a conversation of max_turns=3 takes 3 updates of 1 turns",
    ),
    ("multiturn.py", "--config.gamma=0.9", "config.gamma: is read only by credit=turn"),
    (
        "multiturn.py",
        "--config.task.game=word_game --config.task.maximum=10",
        "config.task.maximum: is read only by guess_my_number",
    ),
    ("multiturn.py", "--config.task.system=Hi", "config.task.system: a system prompt needs"),
    ("multiturn.py", "--config.task.teacher=scripted", "--config.task.teacher: not a setting"),
    (
        "multiturn.py",
        "--config.task.game=tests.fixtures.host_games:NoOpening",
        "config.task.game: tests.fixtures.host_games:NoOpening: reset(0) returned 42",
    ),
    ("multiturn.py", "--config.task.game=no_such_module:Game", "config.task.game: cannot load"),
    ("multiturn.py", "--config.task.timeout_s=3", "config.task.timeout_s: is read only by games"),
    (
        "sft.py",
        "--config=experiments/configs/sft.py:guess_my_number "
        "--config.task.game=tests.fixtures.host_games:GuessEight",
        "config.task.game: a game of your own has no teacher",
    ),
    (
        "sft.py",
        "--config=experiments/configs/sft.py:guess_my_number --config.task.teacher=oracle",
        "config.task.teacher: got 'oracle'",
    ),
    (
        "sft.py",
        "--config=experiments/configs/sft.py:guess_my_number --config.task.scripted_fraction=2",
        "config.task.scripted_fraction: got 2",
    ),
    # --- issue 36: values of the wrong type, references, destinations
    ("sac.py", "--config.hidden_sizes=abc", "config.hidden_sizes: expected ints such as"),
    ("ppo.py", "--config.hidden_sizes=(64,x)", "config.hidden_sizes: expected ints such as"),
    ("sft.py", "--config.mesh_shape=abc", "config.mesh_shape: expected ints such as (1, 1, 1)"),
    ("grpo.py", "--config.eval_samples=-1", "config.eval_samples: got -1"),
    (
        "cql.py",
        "--config.reference.random_return=1 --config.dataset.path=x",
        "config.reference: only one of random_return and expert_return is given; give both",
    ),
    (
        "collect.py",
        "--env=Pendulum-v1 --policy=random --ref_min_return=nan --ref_max_return=nan",
        "--ref_min_return: must be a finite number, got nan",
    ),
    (
        "collect.py",
        "--env=Pendulum-v1 --policy=random --ref_min_return=0 --ref_max_return=inf",
        "--ref_max_return: must be a finite number, got inf",
    ),
    (
        "collect.py",
        "--env=Pendulum-v1 --policy=random --ref_min_return=-1200",
        "--ref_min_return and --ref_max_return: only one is given; give both",
    ),
    ("compare.py", "tests --out_dir=README.md", "--out_dir=README.md: is a file, not a directory"),
    ("generate.py", "--prompt=hi", "--model: missing"),
    ("generate.py", "--model=tests/fixtures/hf/tiny_llama --prompt=hi", "--model=tests/fixtures"),
    ("export.py", "--out=/nonexistent/export", "--run: missing"),
    ("export.py", "--run=tests/fixtures/hf/tiny_llama --out=/nonexistent/x", "--run=tests/fix"),
]


def command(script: str, arguments: str, workdir: str) -> list[str]:
    extra = []
    if script in TRAINERS:
        extra = [f"--workdir={workdir}"]
    elif script == "collect.py":
        extra = [f"--data_dir={workdir}"]
    return [sys.executable, os.path.join("experiments", script), *arguments.split(), *extra]


# The environment families each control script's config checks import: gymnax (or JaxMARL,
# which builds on it, for mappo.py: its shared checks count samples per agent, and counting
# agents builds the environment) loads when a config is checked, not at start-up.
ENV_IMPORTS = {
    "ppo.py": "gymnax",
    "sac.py": "gymnax",
    "cql.py": "gymnax",
    "mappo.py": "gymnax, jaxmarl",
    "collect.py": "gymnax",
}


def bare_start(script: str) -> list[str]:
    """The command whose time bounds a script's cases: its `--helpfull` (every import, flag
    parsing, nothing else), with the environment family its config checks import loaded first."""
    if script not in ENV_IMPORTS:
        return [sys.executable, f"experiments/{script}", "--helpfull"]
    run = f"import {ENV_IMPORTS[script]}, runpy, sys; sys.argv = ['{script}', '--helpfull']; "
    run += f"runpy.run_path('experiments/{script}', run_name='__main__')"
    return [sys.executable, "-c", run]


def timed(cmd: list[str]) -> tuple[subprocess.CompletedProcess, float]:
    start = time.perf_counter()
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=REPO)
    return result, time.perf_counter() - start


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory):
    """Every case's result and time, and each script's bare start time, run two at a time."""
    scratch = str(tmp_path_factory.mktemp("bad_inputs"))
    jobs = [
        (f"case{i}", command(script, arguments, os.path.join(scratch, f"case{i}")))
        for i, (script, arguments, _) in enumerate(CASES)
    ]
    scripts = sorted({script for script, _, _ in CASES})
    jobs += [(f"bare:{s}", bare_start(s)) for s in scripts]
    before = set(os.listdir(REPO))
    with ThreadPoolExecutor(2) as pool:
        timings = pool.map(timed, [cmd for _, cmd in jobs])
        results = dict(zip([name for name, _ in jobs], timings, strict=True))
    return results, scratch, before


def test_there_are_at_least_80_distinct_cases_covering_every_script():
    assert len({(s, a) for s, a, _ in CASES}) == len(CASES) >= 80
    assert {s for s, _, _ in CASES} >= {*TRAINERS, "collect.py", "compare.py"}


@pytest.mark.parametrize("index", range(len(CASES)), ids=[f"{s} {a}" for s, a, _ in CASES])
def test_bad_input_is_one_line_exit_2_nothing_written(outcomes, index):
    results, scratch, _ = outcomes
    script, arguments, expected = CASES[index]
    result, seconds = results[f"case{index}"]
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    lines = [line for line in lines if "Warning" not in line and not line.startswith("  warn")]
    assert result.returncode == 2, result.stderr[-2000:]
    assert len(lines) == 1, result.stderr[-2000:]
    assert lines[0].startswith(f"error: {expected}"), lines[0]
    assert ";" in lines[0] or "?" in lines[0], f"no fix given: {lines[0]}"
    assert not os.path.exists(os.path.join(scratch, f"case{index}")), "it wrote its directory"
    start = start_time(results, script)
    # Start plus one second, with slack for the other case running beside it and for a loaded
    # CI machine.
    assert seconds < 2.0 * start + 1.0, f"{seconds:.1f}s against a start of {start:.1f}s"


def start_time(results: dict, script: str) -> float:
    """A script's start (`bare:`): `--helpfull`, which imports everything but the environment
    family a config names; for the control scripts with that family imported first
    (ENV_IMPORTS), as the cases that check an environment import it."""
    _, seconds = results[f"bare:{script}"]
    return seconds


def test_no_case_left_files_in_the_repository(outcomes):
    _, _, before = outcomes
    assert set(os.listdir(REPO)) - before == set()


def test_an_existing_run_directory_stays_byte_identical(tmp_path):
    workdir = tmp_path / "run"
    workdir.mkdir()
    (workdir / "config.json").write_text('{"a": 1}\n')
    (workdir / "metrics.jsonl").write_text('{"step": 10}\n')
    before = tree_digest(str(workdir))
    result, _ = timed(command("ppo.py", "--config.gamma=2", str(workdir)))
    assert result.returncode == 2
    assert tree_digest(str(workdir)) == before


# --- Issue 36's bad inputs that need files made first (one error line, exit 2, nothing written,
# and the same command with the input fixed is not blocked by anything the refusal left).


def one_error_line(result: subprocess.CompletedProcess, expected: str) -> None:
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    lines = [line for line in lines if "Warning" not in line and not line.startswith("  warn")]
    assert result.returncode == 2, result.stderr[-3000:]
    assert len(lines) == 1, result.stderr[-3000:]
    assert lines[0].startswith(f"error: {expected}"), lines[0]
    assert ";" in lines[0], f"no fix given: {lines[0]}"


def test_dpo_refuses_an_assistant_message_with_empty_content(tmp_path):
    """The chat form of an empty response is refused as the string form "" is."""
    data = tmp_path / "pairs.jsonl"
    row = {
        "prompt": [{"role": "user", "content": "Say hi"}],
        "chosen": [{"role": "assistant", "content": " "}],
        "rejected": [{"role": "assistant", "content": "no"}],
    }
    data.write_text(json.dumps(row) + "\n")
    workdir = str(tmp_path / "run")
    result, _ = timed(
        command(
            "dpo.py",
            "--config.init_from=tests/fixtures/hf/tiny_llama "
            f"--config.task.tokenizer=tests/fixtures/hf/tokenizer --config.task.train_jsonl={data}",
            workdir,
        )
    )
    one_error_line(result, f"{data}:1: field 'chosen' is an assistant message with empty content")
    assert not os.path.exists(workdir)


def test_a_cut_safetensors_file_is_one_line(tmp_path):
    model = tmp_path / "hf"
    shutil.copytree(os.path.join(REPO, "tests", "fixtures", "hf", "tiny_llama"), model)
    weights = model / "model.safetensors"
    os.truncate(weights, os.path.getsize(weights) // 2)
    workdir = str(tmp_path / "run")
    args = f"--config.init_from={model} --config.task.tokenizer=tests/fixtures/hf/tokenizer"
    result, _ = timed(command("sft.py", args, workdir))
    one_error_line(result, f"config.init_from: {model}: cannot read its safetensors")
    assert not os.path.exists(workdir)


def test_a_run_with_cut_parameter_files_is_one_line(tmp_path):
    """init_from a run whose params/ files were cut in half: orbax's tracebacks (one per array,
    and more from its reads in flight) become one line."""
    sft = str(tmp_path / "sft")
    small = "--config.num_steps=2 --config.batch_size=8 --config.task.num_eval=8"
    result, _ = timed(command("sft.py", f"{small} --config.run.progress=False", sft))
    assert result.returncode == 0, result.stderr[-3000:]
    for root, _, files in os.walk(os.path.join(sft, "params")):
        for name in files:
            if os.path.basename(root) == "d":  # the arrays' data, not the metadata
                os.truncate(
                    os.path.join(root, name), os.path.getsize(os.path.join(root, name)) // 2
                )
    workdir = str(tmp_path / "dpo")
    result, _ = timed(command("dpo.py", f"--config.init_from={sft}", workdir))
    one_error_line(result, f"config.init_from: {sft}/params: cannot read the parameters")
    assert not os.path.exists(workdir)


def test_collect_into_a_directory_it_cannot_write_is_one_line_before_collecting(tmp_path):
    """A data_dir that cannot be written (here under /proc, which refuses even root) is refused
    before collection; so are NaN reference returns (a CASES row), which used to be refused only
    after the dataset was written, blocking the corrected command."""
    args = ["--env=Pendulum-v1", "--policy=random", "--num_steps=400"]
    cmd = [sys.executable, "experiments/collect.py", *args, "--data_dir=/proc/jaxrl_data"]
    result, _ = timed(cmd)
    one_error_line(result, "--data_dir=/proc/jaxrl_data: cannot write there")
    data_dir = str(tmp_path / "data")
    refs = ["--ref_min_return=nan", "--ref_max_return=nan"]
    result, _ = timed(
        [sys.executable, "experiments/collect.py", *args, *refs, f"--data_dir={data_dir}"]
    )
    one_error_line(result, "--ref_min_return: must be a finite number")
    assert not os.path.exists(data_dir)
    fixed = ["--ref_min_return=-1200", "--ref_max_return=-150"]
    result, _ = timed(
        [sys.executable, "experiments/collect.py", *args, *fixed, f"--data_dir={data_dir}"]
    )
    assert result.returncode == 0, result.stderr[-3000:]


def test_compare_refuses_raw_returns_of_two_environments_under_one_label(tmp_path):
    runs = []
    for env, returns in (("CartPole-v1", [500.0, 480.0]), ("Pendulum-v1", [-150.0, -170.0])):
        path = tmp_path / env
        path.mkdir()
        summary = {"algo": "ppo", "env": env, "num_seeds": 2, "final_eval_return": 0.0}
        (path / "summary.json").write_text(
            json.dumps(summary | {"final_eval_return_per_seed": returns})
        )
        runs.append(f"mix={path}")
    out = tmp_path / "cmp"
    result, _ = timed([sys.executable, "experiments/compare.py", *runs, f"--out_dir={out}"])
    one_error_line(result, "the runs cover 2 tasks (CartPole-v1, Pendulum-v1)")
    assert not os.path.exists(out)


@pytest.mark.parametrize("script", ["sac.py", "sft.py"])
def test_another_scripts_run_directory_is_named_as_such(script, tmp_path):
    """A PPO run's directory (checkpoints, versions.json naming experiments/ppo.py): SAC and SFT
    say it holds a PPO run, rather than naming the first setting that differs."""
    workdir = tmp_path / "ppo"
    (workdir / "checkpoints" / "10").mkdir(parents=True)
    (workdir / "config.json").write_text(json.dumps({"activation": "tanh"}))
    (workdir / "versions.json").write_text(json.dumps({"argv": ["experiments/ppo.py"]}))
    before = tree_digest(str(workdir))
    result, _ = timed(command(script, "", str(workdir)))
    one_error_line(result, f"--workdir={workdir} holds a PPO run (experiments/ppo.py)")
    assert tree_digest(str(workdir)) == before


def test_a_malformed_jsonl_line_names_the_column_of_the_error(tmp_path):
    """The missing comma is at column 148 of line 2, and the line says so."""
    data = tmp_path / "prompts.jsonl"
    prompt = "x" * (148 - len('{"prompt": "", "answer": "6" ') - 1)
    bad = f'{{"prompt": "{prompt}", "answer": "6" "level": 1}}'
    assert bad.index('"level"') + 1 == 148
    data.write_text('{"prompt": "say 6:", "answer": "6"}\n' + bad + "\n")
    result, _ = timed(command("grpo.py", f"--config.task.train_jsonl={data}", str(tmp_path / "r")))
    one_error_line(result, f"{data}:2: invalid JSON (Expecting ',' delimiter at column 148)")
