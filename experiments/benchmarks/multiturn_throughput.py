"""Multi-turn episodes per second on CPU: whole conversations in one compiled program
(`jaxrl.lm.dialogue.converse`: turns decoded into one KV cache, the game's JAX step between
them) against a host loop of the same model, the way agent frameworks around an inference call
run them: per turn, generate from the whole context (re-encoded, no cache kept between turns),
decode the turn to text, step the game in Python, tokenise its answer, append, repeat.

    python experiments/benchmarks/multiturn_throughput.py --repeats 3 --steps 6 --warmup 1

Both sides sample from the same random model (the LM benchmarks' shape) with the same turn
budget on guess-my-number; a step is one batch of episodes played to the end. Tokens count what
the policy said.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from experiments.benchmarks import harness  # noqa: E402

EPISODES = 32
TURN_TOKENS = 4
GAME = dict(maximum=32, max_turns=6)


def setup(params: dict[str, Any]) -> tuple[Any, ...]:
    import jax

    from envs.text import multiturn
    from jaxrl.lm.model import ModelConfig, init_params
    from jaxrl.lm.sampler import SamplingConfig
    from jaxrl.lm.tokenizer import ByteTokenizer

    tokenizer = ByteTokenizer()
    # The LM benchmarks' shape with the byte vocabulary: every sampled id is a byte or special.
    model = ModelConfig(**{**harness.MODEL_SHAPE, "vocab_size": tokenizer.vocab_size})
    weights = init_params(model, jax.random.key(params["seed"]))
    env = multiturn.make_guess_my_number(tokenizer, **GAME)
    sampling = SamplingConfig(TURN_TOKENS, tokenizer.eos_id, tokenizer.pad_id, 1.0)
    return tokenizer, model, weights, env, sampling


def build_ours(params: dict[str, Any]) -> harness.Step:
    """One call: EPISODES episodes to the end, in one compiled program."""
    import jax

    from jaxrl.lm import dialogue

    tokenizer, model, weights, env, sampling = setup(params)
    n = params["episodes"]

    def play(weights: Any, key: Any) -> Any:
        reset_key, sample_key = jax.random.split(key)
        episodes, _ = dialogue.converse(
            model, weights, env, jax.random.split(reset_key, n), jax.random.split(sample_key, n),
            sampling,
        )  # fmt: skip
        return episodes.policy_mask.sum(), episodes.spoke.sum()

    compiled, compile_s = harness.compile_timed(jax.jit(play), weights, jax.random.key(0))

    def call(state: Any, index: int) -> tuple[Any, dict[str, float]]:
        tokens, turns = jax.device_get(compiled(weights, jax.random.key(index)))
        return state, {"episodes": n, "tokens": float(tokens), "turns": float(turns)}

    return harness.Step(call, None, 1, compile_s, {"episodes": n})


def build_host_loop(params: dict[str, Any]) -> harness.Step:
    """One call: EPISODES episodes to the end, a jitted generate per turn on the whole context
    (left-padded to the longest a conversation can be, so it compiles once), the game in Python
    (`tests/test_text_games.Reference`'s rules, written here again for independence)."""
    import re

    import jax
    import jax.numpy as jnp
    import numpy as np

    from envs.text import multiturn
    from jaxrl.lm import dialogue
    from jaxrl.lm.sampler import generate

    tokenizer, model, weights, env, sampling = setup(params)
    n = params["episodes"]
    opening = tokenizer.encode(multiturn.plain_render(env.messages[0], True))
    width = dialogue.episode_length(
        len(opening), env.max_turns, TURN_TOKENS, env.max_message_tokens
    )
    sample = jax.jit(
        lambda w, tokens, mask, key: generate(model, w, tokens, mask, key, sampling).tokens
    )
    blank = jnp.zeros((n, width), jnp.int32)
    _, compile_s = harness.compile_timed(sample, weights, blank, blank > 0, jax.random.key(0))

    def answer(secret: int, text: str) -> tuple[str, bool]:
        numbers = [int(x) for x in re.findall(r"[0-9]+", text) if len(x) <= 9]
        if not numbers:
            return "Please guess a whole number.", False
        if numbers[-1] == secret:
            return "Correct!", True
        return ("Higher." if numbers[-1] < secret else "Lower."), False

    def call(state: Any, index: int) -> tuple[Any, dict[str, float]]:
        rng = np.random.default_rng(index)
        secrets = rng.integers(1, GAME["maximum"] + 1, n)
        contexts = [list(opening) for _ in range(n)]
        done = np.zeros(n, bool)
        tokens_said = turns = 0
        for turn in range(env.max_turns):
            tokens = np.full((n, width), tokenizer.pad_id, np.int32)
            for row, context in enumerate(contexts):  # left-padded
                tokens[row, width - len(context) :] = context
            said = np.asarray(
                sample(weights, jnp.asarray(tokens), jnp.asarray(tokens != tokenizer.pad_id),
                       jax.random.fold_in(jax.random.key(index), turn))
            )  # fmt: skip
            for row in np.flatnonzero(~done):
                ids = said[row].tolist()
                ids = ids[: ids.index(tokenizer.eos_id) + 1] if tokenizer.eos_id in ids else ids
                tokens_said, turns = tokens_said + len(ids), turns + 1
                reply, solved = answer(int(secrets[row]), tokenizer.decode(ids))
                contexts[row] += ids if ids[-1] == tokenizer.eos_id else [*ids, tokenizer.eos_id]
                done[row] = solved or turn + 1 == env.max_turns
                if not done[row]:
                    contexts[row] += tokenizer.encode(multiturn.plain_render(reply, False))
            if done.all():
                break
        return state, {"episodes": n, "tokens": tokens_said, "turns": turns}

    return harness.Step(call, None, 1, compile_s, {"episodes": n})


def variants(args: argparse.Namespace) -> list[harness.Variant]:
    params = dict(seed=args.seed, episodes=args.episodes)
    return [
        harness.Variant("", "host loop", "host_loop", params),
        harness.Variant("", "ours, one program", "ours", params),
    ]


def add_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--episodes", type=int, default=EPISODES, help="episodes per step")


def note(args: argparse.Namespace) -> str:
    return (
        f"guess-my-number 1-{GAME['maximum']} in {GAME['max_turns']} turns, {args.episodes} "
        f"episodes per step, at most {TURN_TOKENS} tokens a turn, sampled at temperature 1 from "
        "a random model of the LM benchmarks' shape with the 259-token byte vocabulary. The host "
        "loop re-encodes the whole context every turn; ours keeps one KV cache per conversation."
    )


WORKLOAD = harness.Workload(
    module=globals(),
    builders={"ours": build_ours, "host_loop": build_host_loop},
    variants=variants,
    columns=[
        harness.Column("episodes/s", "episodes_per_s", ".2f"),
        harness.Column("tokens/s", "tokens_per_s", ",.0f"),
        harness.Column("turns/s", "turns_per_s", ",.1f"),
        harness.Column("s/step", "steady_s_per_step", ".2f"),
    ],
    defaults=dict(steps=6, warmup=1, repeats=2, timeout=900.0, steps_help="batches of episodes"),
    add_flags=add_flags,
    note=note,
)

if __name__ == "__main__":
    harness.main(WORKLOAD)
