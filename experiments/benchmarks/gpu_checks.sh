#!/usr/bin/env bash
# Every GPU check of the open issues in one command, on a lent GPU machine (README.md, "On a lent
# GPU"): run from the repository root there, after gpu_kit.sh has filled .whl and .gpukit here.
#
#     bash experiments/benchmarks/gpu_checks.sh [--smoke] [--budget S] [--second | --third | STEPS]
#
# STEPS: a comma list, run in the order given. Default: the first call's (FIRST below: install,
# equal, gen17, ckpt17, grpo17, dpo17); --third: issue 46's second call (install, attn17,
# train06, lora7);
# --second: issue 39's (install, psft, psync, ppartial, pasync, gen135, main).
# The steps:
#   install  wheels into $SITE (--no-index --no-deps; the image's jax is never touched), the
#            versions, `import jaxrl`, and experiments/grpo.py for 2 tiny updates on the GPU
#            (issue 37: the GPU install that works, one LM script)
#   equal    gpu_equalities.py: cuDNN's attention against XLA's (logits, gradients) and the
#            unrolled decode step against the scanned one, on a small bf16 model (seconds)
#   gen17    generation.py, 1.7B shape, bf16, batches 32, 128, 1, 256 ($GEN_BATCHES), each with
#            the decode step unrolled (decode_unroll 0: auto, the GPU's default) and scanned (1)
#            ($GEN_UNROLL), roofline measured in the run; a jax.profiler trace of one decode call
#            at batch 32, unrolled
#   attn17   decode_attention.py: a decode step's attention alone at the 1.7B shape, batch 32 and
#            128, keys as the sampler keeps them ([D, S]), as [S, D], and through cuDNN
#   share17  issue 47: shared_prompt_update.py, GRPO's whole update with and without shared
#            prompts, 1.7B shape, bf16, 4 prompts x 8 of 256 + 64 tokens (not in a preset)
#   ckpt17   a random-weight 1.7B Hugging Face checkpoint (make_random_hf.py; without torch, our
#            own exporter) with SmolLM2's tokenizer, for grpo17 and dpo17
#   grpo17   grpo_throughput.py on it: ours (bf16 compute, defaults: no remat) against TRL 1.16
#            GRPOTrainer bf16 on the GPU, 4 prompts x 8 x (128 + 256) tokens (issue 35)
#   dpo17    dpo_throughput.py on it: ours bf16 against TRL bf16, 8 pairs of 128 + 128 tokens,
#            MFU against the bf16 matmul peak; the reference in each step (TRL's default) and
#            precomputed (dpo.Config's default), a row each
#   train06  train_throughput.py: trainer-only tokens/s and MFU (prime-rl's FLOP count) of our GRPO
#            optimizer step, Qwen3-0.6B shape, every parameter, bf16 over fp32 weights, 2 sequences
#            of 16,384 tokens per step (micro-batches of 1), remat chosen by the memory check; if
#            that runs out of memory, remat full, then 8,192 tokens; then, when the call's time
#            allows, the Qwen3-4B shape with LoRA rank 16 over bf16 weights ($TRAIN06_ROWS); a
#            profile of one more step of the 0.6B row (dpo17 profiles its rows too)
#   lora7    grpo_update.py: one GRPO update of the 7B Llama shape, LoRA rank 16, bf16 weights,
#            2 prompts x 8 x (128 + 256) tokens, the defaults: s/update, XLA's planned peak memory
#   gen135   generation.py, SmolLM2-135M shape, bf16, batches 1, 32, 128
#   psft     issue 39: repeat_digit_long (answers of 1 to 256 digits), SFT of $PARTIAL_SHAPE
#            (1.7b, the default, or smollm2; byte vocabulary) for $PARTIAL_SFT_STEPS (120) steps
#            of 32 (lr 3e-4, 10 warmup), so that its completions have the task's long-tailed lengths
#   psync, ppartial, pasync
#            GRPO from it (lr 1e-5), $PARTIAL_UPDATES (12) updates, length_buckets=8 in every mode: sync;
#            partial (budget $PARTIAL_BUDGET (64), staleness 4, 24 slot groups); async (staleness 1; one GPU:
#            both programs on it). Trained tokens/s of each. Checkpoints (~19 GB at 1.7B) go to
#            /dev/shm when it has 48 GB free; each mode's is deleted after it
#   main     the README's main command (experiments/ppo.py, CartPole-v1 to 500) (issue 37)
# Each step runs in its own process group under a time limit (its own, cut to what is left of
# --budget), so the whole command ends inside the budget; a step that does not fit is skipped
# and named. Logs and JSON go to $WORK/out and, after every step, into $OUT/checks.tgz beside
# $OUT/summary.txt (the device returns at most 8 files). A rerun can name only the missing steps.
#
# ATTENTION=xla, DECODE_UNROLL=1: the training steps with XLA's attention, the samplers with the
# scanned decode step (ModelConfig.attention, .decode_unroll; default auto: cuDNN, unrolled).
# --smoke: tiny sizes on this CPU in seconds to minutes ($PYTHON: a Python 3.12 venv mimicking
# the image; $TRL_PYTHON: a Python with torch, transformers and TRL, or none: TRL rows left out).
set -uo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
FIRST=install,equal,gen17,ckpt17,grpo17,dpo17
SECOND=install,psft,psync,ppartial,pasync,gen135,main
THIRD=install,attn17,train06,lora7
SMOKE=${GPU_CHECKS_SMOKE:-0}
BUDGET=540
STEPS=$FIRST
INNER=""
if [[ ${1:-} == __step ]]; then # one step, run by step() below in its own process group
    INNER=$2
    set --
fi
while (($#)); do
    case $1 in
    --smoke) SMOKE=1 ;;
    --budget)
        BUDGET=$2
        shift
        ;;
    --second) STEPS=$SECOND ;;
    --third) STEPS=$THIRD ;;
    -h | --help)
        sed -n '2,58p' "$0"
        exit 0
        ;;
    -*)
        echo "error: gpu_checks.sh: unknown option $1; see --help" >&2
        exit 2
        ;;
    *) STEPS=$1 ;;
    esac
    shift
done
for step in ${STEPS//,/ }; do
    case $step in
    install | equal | gen17 | attn17 | share17 | ckpt17 | grpo17 | dpo17 | train06 | lora7 | gen135 | psft | psync | \
        ppartial | pasync | main) ;;
    *)
        echo "error: gpu_checks.sh: unknown step '$step'; choose from $FIRST,$SECOND,$THIRD" >&2
        exit 2
        ;;
    esac
done

START=$(date +%s)
# A step's own process (`__step`) reads the call's deadline and its limit from its parent.
DEADLINE=${GPU_CHECKS_DEADLINE:-$((START + BUDGET))}
OUT=${OUT:-/tmp/gpu_checks_out}
WORK=${WORK:-/tmp/gpu_checks}
SITE=${SITE:-/tmp/site}
mkdir -p "$OUT" "$WORK/out"
LOGS=$WORK/out
if ((SMOKE)); then
    PY=${PYTHON:-python3}
    TPY=${TRL_PYTHON:-}
else
    PY=python3 # the image's: /opt/torch/.venv/bin/python3, with torch, transformers and jax
    TPY=python3
fi
export PYTHONPATH=$SITE:$ROOT
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1
# One process uses the GPU at a time (the harness runs workers one after another).
export XLA_PYTHON_CLIENT_MEM_FRACTION=${XLA_PYTHON_CLIENT_MEM_FRACTION:-0.92}
CKPT=$WORK/hf_1.7b
# ModelConfig.attention and .decode_unroll of every training step: auto (cuDNN's fused
# attention, the decode step unrolled) unless a rerun names xla or 1 (the scanned step).
ATTENTION=${ATTENTION:-auto}
DECODE_UNROLL=${DECODE_UNROLL:-0}
PARTIAL_SHAPE=${PARTIAL_SHAPE:-1.7b}

left() { echo $((DEADLINE - $(date +%s))); }

pack() { # the logs and JSON so far, in the one archive the device returns
    local metrics # a GRPO mode stopped at its limit leaves its metrics in its run directory
    for metrics in "$(partial_dir)"/{sync,partial,async}/metrics.jsonl; do
        [[ -f $metrics ]] && cp "$metrics" "$LOGS/partial_$(basename "$(dirname "$metrics")").jsonl"
    done
    # Profiles travel as Perfetto traces; their xplane.pb twins (several MB each) stay.
    tar -czf "$OUT/checks.tgz.tmp" --exclude='*.xplane.pb' -C "$WORK" out &&
        mv "$OUT/checks.tgz.tmp" "$OUT/checks.tgz"
}

step() { # NAME LIMIT RESERVE: runs the function step_NAME in its own process group, at most
    # LIMIT s; RESERVE: the seconds the later steps' limits add up to (a step's optional part,
    # train06's second row, runs only if it leaves them that much)
    local name=$1 limit=$2 reserve=${3:-0} remaining t0 pid watcher rc
    remaining=$(($(left) - 15))
    if ((remaining < 20)); then
        echo "$name: skipped, $((remaining + 15)) s of the budget left" | tee -a "$LOGS/summary.txt"
        return
    fi
    ((limit > remaining)) && limit=$remaining
    echo "=== $name: at most $limit s ($(date -u +%H:%M:%S) UTC)"
    t0=$(date +%s)
    GPU_CHECKS_SMOKE=$SMOKE GPU_CHECKS_DEADLINE=$DEADLINE STEP_END=$((t0 + limit)) \
        STEP_RESERVE=$reserve setsid bash "$0" __step "$name" > >(tee "$LOGS/$name.log") 2>&1 &
    pid=$!
    # The watcher is a process group of its own too, away from our output (an open pipe would
    # keep the caller waiting), so that ending it ends its sleep.
    setsid bash -c "sleep $limit; kill -TERM -- -$pid; sleep 5; kill -KILL -- -$pid" \
        >/dev/null 2>&1 &
    watcher=$!
    wait "$pid"
    rc=$?
    kill -- "-$watcher" 2>/dev/null
    wait "$watcher" 2>/dev/null
    # A step killed at its limit ends its shell first; its Python may still hold the GPU's memory
    # for seconds (on 2026-11-26 the next step then died allocating), so wait for the whole group.
    for _ in $(seq 60); do kill -0 -- "-$pid" 2>/dev/null || break; sleep 0.5; done
    sleep 0.2 # tee's last lines
    local what="rc $rc"
    ((rc == 143 || rc == 137)) && what="killed at its limit"
    echo "$name: $what, $(($(date +%s) - t0)) s" | tee -a "$LOGS/summary.txt"
    pack
}

# --------------------------------------------------------------------------------------------
# The steps (each runs as `gpu_checks.sh __step NAME`, with the variables above).

step_install() {
    local marker=$SITE/.gpu_checks_installed
    if [[ -f $marker ]]; then # a warm machine: the first call's install.log has the checks
        echo "installed earlier on this machine into $SITE; the checks are in that call's log"
        return 0
    fi
    # flax, optax, chex and orbax only when the image's are outside pyproject.toml's range.
    local ranged
    ranged=$("$PY" - <<'EOF'
import tomllib
from importlib import metadata
from pathlib import Path
from packaging.requirements import Requirement
deps = tomllib.loads(Path("pyproject.toml").read_text())["project"]["dependencies"]
wanted = {Requirement(d).name: Requirement(d).specifier for d in deps}
for wheel in sorted(Path(".whl/ranged").glob("*.whl")):
    name = wheel.name.split("-")[0].replace("_", "-")
    try:
        have = metadata.version(name)
    except metadata.PackageNotFoundError:
        have = None
    ok = have is not None and wanted[name].contains(have, prereleases=True)
    print(f"# {name}: image has {have}, jaxrl wants {wanted[name]}: "
          f"{'kept' if ok else 'installing ' + wheel.name}")
    if not ok:
        print(wheel)
EOF
    ) || return 1
    grep '^#' <<<"$ranged"
    # shellcheck disable=SC2046
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target "$SITE" .whl/*.whl .whl/trl/*.whl $(grep -v '^#' <<<"$ranged") || return 1
    touch "$marker"
    echo "--- pip's plan for 'pip install -e .[lm]' against this image, offline (not run):"
    timeout 60 "$PY" -m pip install --dry-run --no-index --find-links .whl \
        --find-links .whl/ranged --no-build-isolation -e ".[lm]" 2>&1 |
        grep -v "^Requirement already" | tail -8
    echo "--- versions"
    "$PY" - <<'EOF'
import platform
from importlib import metadata
import jax, jaxlib
import jaxrl, algos.grpo, envs.text, jaxrl.lm.model  # noqa: F401
names = ["jax", "jaxlib", "jax-cuda13-plugin", "flax", "optax", "chex", "orbax-checkpoint",
         "numpy", "tokenizers", "safetensors", "torch", "transformers", "accelerate", "trl",
         "datasets", "gymnax", "distrax", "tensorflow-datasets"]
found = []
for name in names:
    try:
        found.append(f"{name} {metadata.version(name)}")
    except metadata.PackageNotFoundError:
        found.append(f"{name} -")
print(f"python {platform.python_version()}; " + ", ".join(found))
print("jax devices:", jax.devices(), "| backend:", jax.default_backend(),
      "| jaxrl from", jaxrl.__file__)
EOF
    [[ $? -eq 0 ]] || return 1
    if ((!SMOKE)); then
        nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm \
            --format=csv,noheader
    fi
    ((${INSTALL_RUN:-1})) || return 0 # INSTALL_RUN=0: no tiny run (the later steps run scripts)
    echo "--- experiments/grpo.py, 2 tiny updates (the reverse_digits preset's model)"
    rm -rf "$WORK/grpo_tiny"
    "$PY" experiments/grpo.py --workdir="$WORK/grpo_tiny" --config.num_steps=2 \
        --config.batch_size=16 --config.run.num_chunks=1 --config.run.log_every=1 \
        --config.run.progress=False --config.run.tensorboard=False --config.task.num_eval=16 2>&1 |
        tail -4
}

step_equal() { # the GPU's defaults (cuDNN attention, unrolled decode) against the older engine
    "$PY" experiments/benchmarks/gpu_equalities.py
}

gen_args() { # MODEL: generation.py's flags
    if ((SMOKE)); then
        echo "--model tiny --batches 1,2 --prompt_length 8 --new_tokens 4 --repeats 1 --peak_n 256" \
            "--decode_unroll 0,4"
    else
        echo "--model $1 --batches ${GEN_BATCHES:-32,128,1,256} --repeats 3 --peak_n 8192" \
            "--decode_unroll ${GEN_UNROLL:-0,1}"
    fi
}

step_gen17() { # and a profile of one decode call (issue 46: "profile the 1.7B decode step")
    local batch=32
    ((SMOKE)) && batch=2
    "$PY" experiments/benchmarks/generation.py $(gen_args 1.7b) --dtype bfloat16 \
        --json "$LOGS/gen17.json" --trace "$LOGS/gen17_trace" --trace_batch $batch
}

step_attn17() { # a decode step's attention alone, per cache layout
    local args="--batches 32,128 --repeats 5"
    ((SMOKE)) && args="--model tiny --batches 2 --repeats 1 --dtype float32"
    # shellcheck disable=SC2086
    "$PY" experiments/benchmarks/decode_attention.py $args --json "$LOGS/attn17.json"
}

step_share17() { # issue 47: GRPO's update with and without shared prompts at the 1.7B shape
    local args="--model 1.7b --dtype bfloat16 --batch_size 4 --group_size 8 --grad_accum_steps 4"
    args+=" --prompt 256 --new 64 --repeats 2"
    ((SMOKE)) && args="--model tiny --batch_size 2 --group_size 2 --grad_accum_steps 1 --prompt 8"
    ((SMOKE)) && args+=" --new 4 --repeats 1"
    # shellcheck disable=SC2086
    JAX_PLATFORMS=${JAX_PLATFORMS:-} "$PY" experiments/benchmarks/shared_prompt_update.py $args \
        --out "$LOGS/share17.json"
}

step_gen135() {
    "$PY" experiments/benchmarks/generation.py $(gen_args smollm2) --dtype bfloat16 \
        --json "$LOGS/gen135.json"
}

step_ckpt17() {
    rm -rf "$CKPT"
    local src=.gpukit/smollm2_src shape=1.7b
    if ((SMOKE)); then # a 2-layer model with SmolLM2's vocabulary and tokenizer
        src=$WORK/smoke_src
        shape=135m # make_random_hf.py's "the source's own shape"
        mkdir -p "$src"
        cp .gpukit/smollm2_src/* "$src/"
        "$PY" - "$src/config.json" <<'EOF'
import json, sys
config = json.load(open(sys.argv[1]))
config.update(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, head_dim=16)
json.dump(config, open(sys.argv[1], "w"), indent=1)
EOF
    fi
    if [[ -n $TPY ]] && "$TPY" -c "import torch, transformers" 2>/dev/null; then
        "$TPY" .gpukit/peers/make_random_hf.py "$src" "$CKPT" "$shape" || return 1
    else
        echo "no torch: the checkpoint from our own exporter (jaxrl.lm.hf.save_hf_checkpoint)"
        "$PY" - "$src" "$CKPT" "$shape" <<'EOF' || return 1
import json, os, shutil, sys
import jax
from jaxrl.lm.hf import config_from_hf, save_hf_checkpoint
from jaxrl.lm.model import init_params
src, out, shape = sys.argv[1:4]
hf = json.load(open(os.path.join(src, "config.json")))
if shape == "1.7b":
    hf.update(hidden_size=2048, intermediate_size=8192, num_hidden_layers=24,
              num_attention_heads=32, num_key_value_heads=32, head_dim=64)
config = config_from_hf(hf)
params = jax.jit(lambda: init_params(config, jax.random.key(0)))()
ids = {k: hf[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id") if k in hf}
save_hf_checkpoint(out, config, params, extra_config=ids)
for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
    shutil.copy(os.path.join(src, name), out)
print(f"{out}: {sum(x.size for x in jax.tree.leaves(params)) / 1e6:.1f}M parameters")
EOF
    fi
    du -sh "$CKPT"
}

trl_flags() { # the TRL row: bf16 autocast on the GPU, no fp32 row (TRL's on a 1.7B model)
    if [[ -n $TPY ]]; then
        echo "--trl_python $TPY --trl_extra=--bf16 --skip_trl_fp32"
    fi
}

step_grpo17() {
    [[ -f $CKPT/config.json ]] || {
        echo "no checkpoint at $CKPT: run ckpt17 first"
        return 1
    }
    local sizes="--prompts_per_update 4 --group_size 8 --prompt_len 128 --max_new_tokens 256"
    # TRL's worker runs first (~70 s), then ours, then the matmul peak: all inside the limit.
    local timing="--repeats 1 --steps 4 --warmup 1 --timeout 170 --peak_n 8192"
    if ((SMOKE)); then
        sizes="--prompts_per_update 1 --group_size 2 --prompt_len 16 --max_new_tokens 4 --rows 8"
        timing="--repeats 1 --steps 2 --warmup 1 --timeout 300 --peak_n 256"
    fi
    # shellcheck disable=SC2046
    "$PY" experiments/benchmarks/grpo_throughput.py --model smollm2 --smollm2_dir "$CKPT" \
        $sizes $timing --steps_per_call 1 --rollout_trials "${ROLLOUT_TRIALS:-0}" \
        --dtype bfloat16 --peak_dtype bfloat16 --attention "$ATTENTION" \
        --decode_unroll "$DECODE_UNROLL" $(trl_flags) --out "$LOGS/grpo17.json"
}

step_dpo17() {
    [[ -f $CKPT/config.json ]] || {
        echo "no checkpoint at $CKPT: run ckpt17 first"
        return 1
    }
    local sizes="--batch_pairs 8 --prompt_len 128 --completion_len 128"
    local timing="--repeats 1 --steps 10 --warmup 2 --timeout 150 --peak_n 8192"
    if ((SMOKE)); then
        sizes="--batch_pairs 1 --prompt_len 8 --completion_len 8 --rows 8"
        timing="--repeats 1 --steps 2 --warmup 1 --timeout 300 --peak_n 256"
    fi
    # shellcheck disable=SC2046
    "$PY" experiments/benchmarks/dpo_throughput.py --model smollm2 --smollm2_dir "$CKPT" \
        $sizes $timing --steps_per_call 1 --reference in_step,precomputed --dtype bfloat16 \
        --peak_dtype bfloat16 --attention "$ATTENTION" --trace "$LOGS/dpo17_trace" $(trl_flags) \
        --out "$LOGS/dpo17.json"
}

# Issue 46: trainer-only throughput at 16k tokens (prime-rl's benchmark) and the 7B LoRA update.
step_train06() {
    # Each row at most its seconds (a slow 0.6B row leaves the later steps theirs); the 4B row
    # only when its seconds are left beside the later steps' limits (STEP_RESERVE).
    local rows=${TRAIN06_ROWS:-0.6b,4b} rc=0 row own spare
    local timing="--steps 3 --warmup 1 --peak_n 8192" full_s=150 lora_s=120
    # Where 16k tokens do not fit (XLA's attention scores: README), 16k with remat full, then 8k.
    local full="--shape qwen3-0.6b --seq_len 16384 --fallback 16384:full,8192"
    local lora="--shape qwen3-4b --lora_rank 16 --param_dtype bfloat16 --seq_len 16384"
    lora+=" --fallback 8192:full"
    if ((SMOKE)); then # the tiny Llama at 256 tokens (its fallbacks never needed)
        timing="--steps 2 --warmup 1 --peak_n 256" lora_s=90
        full="--shape tiny --seq_len 256 --prompt_len 16 --fallback 256:full,128"
        lora="--shape tiny --lora_rank 16 --param_dtype bfloat16 --seq_len 256 --prompt_len 16"
    fi
    for row in ${rows//,/ }; do
        case $row in
        0.6b)
            # shellcheck disable=SC2086
            timeout --foreground -k 5 "$full_s" \
                "$PY" experiments/benchmarks/train_throughput.py $full $timing \
                --attention "$ATTENTION" --trace "$LOGS/train06_trace" \
                --json "$LOGS/train06.json" || rc=1
            ;;
        4b)
            own=$((STEP_END - $(date +%s))) spare=$(($(left) - STEP_RESERVE - 15))
            ((spare < own)) && own=$spare
            if ((own < lora_s)); then
                echo "train06: the 4B LoRA row skipped: $own s left of the $lora_s it may take" \
                    "(TRAIN06_ROWS=4b runs it alone)"
                continue
            fi
            # shellcheck disable=SC2086
            timeout --foreground -k 5 "$lora_s" \
                "$PY" experiments/benchmarks/train_throughput.py $lora --attention "$ATTENTION" \
                ${timing/--steps 3/--steps 2} --json "$LOGS/train06_4b.json" || rc=1
            ;;
        *)
            echo "TRAIN06_ROWS: unknown row '$row'; use 0.6b, 4b or both"
            return 1
            ;;
        esac
    done
    return $rc
}

step_lora7() {
    local sizes="--shape 7b --prompt_len 128 --new_tokens 256"
    ((SMOKE)) && sizes="--shape tiny --prompt_len 8 --new_tokens 16"
    # shellcheck disable=SC2086
    "$PY" experiments/benchmarks/grpo_update.py $sizes --lora_rank 16 --prompts 2 --group_size 8 \
        --attention "$ATTENTION" --decode_unroll "$DECODE_UNROLL" \
        --dtype bfloat16 --param_dtype bfloat16 --steps 2 --warmup 1 --json "$LOGS/lora7.json"
}

# Issue 39 on the GPU: repeat_digit_long (answers of 1 to 256 digits) at $PARTIAL_SHAPE, SFT'd
# briefly so that its completions have the task's long-tailed lengths, then GRPO from it in each
# rollout mode, every mode with length_buckets=8 so that only the rollout differs.
partial_dir() { # big checkpoints (~19 GB at 1.7B) go to memory when it has room: writes in seconds
    local shm_gb
    shm_gb=$(df -BG --output=avail /dev/shm 2>/dev/null | tail -1 | tr -dc 0-9)
    if ((SMOKE == 0 && ${shm_gb:-0} >= 48)); then echo /dev/shm/gpu_checks_partial; else
        echo "$WORK/partial"; fi
}

partial_model() { # the model flags of $PARTIAL_SHAPE (the byte vocabulary of the task)
    ((SMOKE)) && return 0 # the presets' tiny model
    case $PARTIAL_SHAPE in
    smollm2) echo "hidden_size=576 intermediate_size=1536 num_layers=30 num_heads=9 num_kv_heads=3" ;;
    1.7b) echo "hidden_size=2048 intermediate_size=8192 num_layers=24 num_heads=32 num_kv_heads=32" ;;
    *)
        echo "PARTIAL_SHAPE=$PARTIAL_SHAPE: choose smollm2 or 1.7b" >&2
        return 1
        ;;
    esac
}

step_psft() {
    local model dir steps=${PARTIAL_SFT_STEPS:-120} lr=3e-4 batch=32
    model=$(partial_model) || return 1
    dir=$(partial_dir)
    local shape=$PARTIAL_SHAPE
    ((SMOKE)) && steps=2 && batch=8 && shape="the preset's tiny model"
    local overrides=(--config.run.num_chunks=1 --config.run.progress=False
        --config.run.tensorboard=False --config.num_steps="$steps" --config.batch_size="$batch"
        --config.model.dtype=bfloat16 --config.learning_rate="$lr" --config.warmup_steps=10)
    for field in $model; do overrides+=(--config.model.$field); done
    rm -rf "$dir" "$LOGS"/partial_*.jsonl
    mkdir -p "$dir"
    df -h "$dir" | tail -1
    echo "--- SFT on repeat_digit_long ($steps steps of $batch, lr $lr, $shape) in $dir"
    "$PY" experiments/sft.py --config=experiments/configs/sft.py:repeat_digit_long \
        --workdir="$dir/sft" "${overrides[@]}" 2>&1 | tail -3
    [[ -f $dir/sft/summary.json ]] || return 1
    cp "$dir/sft/summary.json" "$LOGS/partial_sft_summary.json"
}

partial_mode() { # MODE: GRPO from the SFT run in one rollout mode; its metrics to $LOGS
    local mode=$1 dir updates=${PARTIAL_UPDATES:-12}
    dir=$(partial_dir)
    [[ -f $dir/sft/summary.json ]] || {
        echo "no SFT run in $dir: run psft first"
        return 1
    }
    ((SMOKE)) && updates=6
    local grpo=(--config=experiments/configs/grpo.py:repeat_digit_long
        --config.init_from="$dir/sft" --config.num_steps="$updates" --config.length_buckets=8
        --config.run.num_chunks=1 --config.run.log_every=1 --config.run.progress=False
        --config.run.tensorboard=False --config.run.keep_checkpoints=1
        --config.model.dtype=bfloat16)
    # A small step at 1.7B: the modes are compared on the SFT model's length distribution.
    ((SMOKE)) || grpo+=(--config.learning_rate=1e-5)
    case $mode in
    sync) ;;
    partial) grpo+=(--config.rollout_mode=partial --config.rollout_budget=${PARTIAL_BUDGET:-64}
        --config.max_staleness=4 --config.rollout_groups=24) ;;
    async) grpo+=(--config.rollout_mode=async --config.max_staleness=1) ;;
    esac
    echo "--- GRPO $mode, $updates updates"
    rm -rf "${dir:?}/$mode"
    "$PY" experiments/grpo.py "${grpo[@]}" --workdir="$dir/$mode" 2>&1 | tail -3
    local rc=0
    cp "$dir/$mode/metrics.jsonl" "$LOGS/partial_$mode.jsonl" || rc=1
    rm -rf "${dir:?}/$mode" # its checkpoint: room for the next mode's
    return $rc
}

step_psync() { partial_mode sync; }
step_ppartial() { partial_mode partial; }
step_pasync() { partial_mode async; }

step_main() {
    if ((SMOKE)); then
        "$PY" experiments/ppo.py --config.total_timesteps=20000 --num_seeds=1 \
            --workdir="$WORK/ppo" --config.run.progress=False 2>&1 | tail -3
    else
        "$PY" experiments/ppo.py --workdir="$WORK/ppo" 2>&1 | tail -3
    fi
}

if [[ -n $INNER ]]; then
    "step_$INNER"
    exit $?
fi

# --------------------------------------------------------------------------------------------
echo "gpu_checks.sh: steps $STEPS, budget $BUDGET s, smoke $SMOKE, logs in $LOGS, archive" \
    "$OUT/checks.tgz ($(date -u +%Y-%m-%dT%H:%M:%SZ))"
echo "--- gpu_checks.sh $STEPS, budget $BUDGET s ($(date -u +%H:%M:%S) UTC)" >>"$LOGS/summary.txt"
declare -A LIMIT=([install]=120 [equal]=90 [gen17]=210 [attn17]=90 [share17]=240 [ckpt17]=120 [grpo17]=280 [dpo17]=150
    [train06]=270 [lora7]=150 [gen135]=90 [psft]=170 [psync]=150 [ppartial]=150
    [pasync]=190 [main]=150)
read -ra ORDER <<<"${STEPS//,/ }"
for i in "${!ORDER[@]}"; do
    reserve=0
    for later in "${ORDER[@]:i+1}"; do reserve=$((reserve + LIMIT[$later])); done
    step "${ORDER[$i]}" "${LIMIT[${ORDER[$i]}]}" "$reserve"
done
"$PY" experiments/benchmarks/gpu_summary.py "$LOGS" | tee "$LOGS/summary_table.txt"
pack
cp "$LOGS/summary.txt" "$OUT/summary.txt"
cat "$LOGS/summary_table.txt" >>"$OUT/summary.txt"
echo "done in $(($(date +%s) - START)) s of $BUDGET"
