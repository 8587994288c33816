"""Multi-turn agents learn, end to end through the scripts: SFT on a game's demonstrations
(experiments/sft.py, a game preset), then multi-turn GRPO from that model (experiments/multiturn.py)
raises the success rate of the same evaluation episodes, and on the multiplication task the rate
at which the policy calls the calculator."""

import os

from tests.script_runs import read_json, run_script

SFT = "--config=experiments/configs/sft.py:"
RL = "--config=experiments/configs/multiturn.py:"


def sft_then_rl(tmp_path, game: str, *rl_args: str) -> dict:
    sft_dir, rl_dir = str(tmp_path / "sft"), str(tmp_path / "rl")
    run_script("sft.py", f"{SFT}{game}", f"--workdir={sft_dir}")
    run_script(
        "multiturn.py",
        f"{RL}{game}",
        f"--config.init_from={sft_dir}",
        f"--workdir={rl_dir}",
        *rl_args,
    )
    for name in ("transcripts_before.txt", "transcripts_after.txt", "eval_success.png"):
        assert os.path.getsize(os.path.join(rl_dir, name)) > 0, name
    return read_json(rl_dir, "summary.json")


def test_rl_raises_the_success_of_an_sft_guesser(tmp_path):
    summary = sft_then_rl(tmp_path, "guess_my_number")
    # Paired over the same 256 games and sampling keys: the interval of the change excludes 0.
    assert summary["eval_success_change_ci95"][0] > 0.0, summary
    assert summary["eval_success"] >= summary["initial_eval_success"] + 0.05, summary


def test_rl_teaches_the_tiny_model_to_call_the_calculator(tmp_path):
    # 20 of the preset's 40 updates: the tool habit is learned in the first 20.
    summary = sft_then_rl(
        tmp_path, "multiplication", "--config.num_steps=20", "--config.run.num_chunks=2"
    )
    assert summary["eval_success"] >= summary["initial_eval_success"] + 0.2, summary
    assert summary["eval_success_tool_calls"] > summary["initial_eval_success_tool_calls"], summary
