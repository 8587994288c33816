"""The XLA CPU deadlock of vmapped training programs (jaxlib 0.10.2) stays gone.

Its cause: Flax's orthogonal initialiser, vmapped over seeds, is a batched LAPACK QR, and jaxlib's
batched LAPACK kernels hand the batch to the CPU thread pool and block until it is done; with
XLA's concurrency-optimised scheduler (on by default) running other work on that pool the wait
could last forever. Vmapped PPO on CartPole (8 seeds, 4 updates) hung in nearly every run.
`jaxrl.nets.orthogonal` computes the same values one matrix at a time."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import flax.linen as nn
import jax
import numpy as np

from jaxrl.nets import orthogonal

REPO = Path(__file__).resolve().parents[1]


def test_orthogonal_equals_flax_under_nested_vmap_without_a_batched_qr():
    keys = jax.random.split(jax.random.key(0), 6).reshape(2, 3)
    ours = jax.vmap(jax.vmap(lambda k: orthogonal(1.4)(k, (4, 64))))(keys)
    flax = jax.vmap(jax.vmap(lambda k: nn.initializers.orthogonal(1.4)(k, (4, 64))))(keys)
    np.testing.assert_array_equal(np.asarray(ours), np.asarray(flax))
    compiled = jax.jit(jax.vmap(lambda k: orthogonal(1.0)(k, (64, 64)))).lower(keys[0]).compile()
    qr_calls = [line for line in compiled.as_text().splitlines() if "lapack_sgeqrf" in line]
    assert qr_calls and all('num_batch_dims="0"' in line for line in qr_calls), qr_calls
    one = np.asarray(orthogonal(1.0)(jax.random.key(1), (64, 64)))
    np.testing.assert_allclose(one @ one.T, np.eye(64), atol=1e-5)


PROGRAM = textwrap.dedent(
    """
    import jax
    from algos import ppo
    from jaxrl import hparams, loop

    config = ppo.Config(env_name="CartPole-v1", total_timesteps=4 * 4 * 128, num_envs=4)
    train = loop.make_train(ppo.make(config), config.num_steps, False)
    run = jax.jit(jax.vmap(lambda key: train(key, hparams.hparams(config))))
    keys = jax.random.split(jax.random.key(0), 8)
    for _ in range(5):
        jax.block_until_ready(run(keys))
    print("done")
    """
)


def test_vmapped_ppo_completes_with_the_default_scheduler():
    """In a fresh process with one CPU device and XLA's default flags, twice: before the fix this
    hung in each of 6 tries on this machine (a run takes about 7 s)."""
    env = {**os.environ, "XLA_FLAGS": "", "PYTHONPATH": str(REPO)}
    for _ in range(2):
        done = subprocess.run(
            [sys.executable, "-c", PROGRAM],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=180,
        )
        assert done.returncode == 0 and done.stdout.strip() == "done", done.stderr[-2000:]
