#!/usr/bin/env bash
# Prepare, on a machine with pip and the registry, what gpu_checks.sh needs on a lent GPU machine
# (no network there; README.md, "On a lent GPU"). Run from the repository root:
#
#     PYTHON=/path/to/python-with-jaxrl bash experiments/benchmarks/gpu_kit.sh
#
# Writes two git-ignored folders, both carried with the `run` call:
#   .whl/          wheels for CPython 3.12 manylinux x86-64 (the GPU image's Python):
#     *.whl          jaxrl's core + [lm] dependencies the image lacks, at constraints-py312.txt's
#                    versions (marl, envpool and mujoco are left out);
#     ranged/*.whl   flax, optax, chex, orbax-checkpoint at the same pins: the image has these,
#                    at versions not read yet; gpu_checks.sh installs one only when the image's
#                    is outside pyproject.toml's range;
#     trl/*.whl      TRL 1.16.0 and what it needs beyond the image (datasets, dill, multiprocess).
#   .gpukit/       peers/make_random_hf.py (from ../shared/peers, or $PEER_DIR) and smollm2_src/
#                  (SmolLM2-135M-Instruct's config.json and tokenizer files, no weights: what
#                  make_random_hf.py copies into a random-weight checkpoint of another shape).
# Then checks that the tree that travels plus both folders stay under the 64 MiB limit.
set -euo pipefail

ROOT=$(git rev-parse --show-toplevel)
cd "$ROOT"
PYTHON=${PYTHON:-python3}
PEER_DIR=${PEER_DIR:-$ROOT/../shared/peers}
CONSTRAINTS=constraints-py312.txt
LIMIT_MIB=64

# Ignored twice: .gitignore (committed) and this clone's info/exclude (in case .gitignore is old).
exclude="$(git rev-parse --git-common-dir)/info/exclude"
mkdir -p "$(dirname "$exclude")"
for pattern in /.whl/ /.gpukit/; do
    grep -qxF "$pattern" "$exclude" 2>/dev/null || echo "$pattern" >>"$exclude"
done

# jaxrl's dependencies (core + lm) absent from the GPU image's package list
# (/work/.library/device/KINDS.md, read 2026-11-17): the closure of `pip install -c
# constraints-py312.txt '.[lm]'` on Python 3.12, less the image's names. huggingface_hub's
# httpx2/truststore and python-dateutil's tzdata are left out: the image has its own
# huggingface_hub and python-dateutil, which these would not serve.
MISSING=(
    antlr4-python3-runtime array_record decorator distrax dm-tree docstring_parser
    Farama-Notifications gast gguf googleapis-common-protos gymnasium gymnax immutabledict
    latex2sympy2_extended math-verify ml_collections simple-parsing tensorboardX
    tensorflow-datasets tensorflow-metadata termcolor tfp-nightly toml
)
# Published as a source archive only (pure Python): built into a wheel here.
SDIST_ONLY=(promise)
RANGED=(flax optax chex orbax-checkpoint)
# TRL 1.16.0 (the release of every TRL comparison in the README) and datasets 5.2.0 (the peers'
# README); dill and multiprocess at the newest datasets 5.2.0 accepts. The image has accelerate,
# transformers, torch, pyarrow, xxhash, pandas, fsspec and huggingface_hub.
TRL=(trl==1.16.0 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19)

pin() {  # NAME -> NAME==VERSION from the constraints file (names compared as pip normalises them)
    local want line
    want=$(echo "$1" | tr 'A-Z_.' 'a-z--')
    while IFS= read -r line; do
        [[ $line == *==* ]] || continue
        if [[ $(echo "${line%%==*}" | tr 'A-Z_.' 'a-z--') == "$want" ]]; then
            echo "$line"
            return
        fi
    done <"$CONSTRAINTS"
    echo "error: $CONSTRAINTS: no pin for $1; add it or drop it from gpu_kit.sh" >&2
    exit 2
}

download() {  # DIR REQUIREMENT...: wheels only, for CPython 3.12 on manylinux x86-64
    local dir=$1
    shift
    mkdir -p "$dir"
    "$PYTHON" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
        --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
        --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        --platform manylinux1_x86_64 -d "$dir" "$@" 2>&1 | grep -v "is ignored: it is neither" || true
}

rm -rf .whl .gpukit
pins=()
for name in "${MISSING[@]}"; do pins+=("$(pin "$name")"); done
download .whl "${pins[@]}"
for name in "${SDIST_ONLY[@]}"; do
    "$PYTHON" -m pip wheel -q --no-deps -w .whl "$(pin "$name")"
done
pins=()
for name in "${RANGED[@]}"; do pins+=("$(pin "$name")"); done
download .whl/ranged "${pins[@]}"
download .whl/trl "${TRL[@]}"

expected=$((${#MISSING[@]} + ${#SDIST_ONLY[@]} + ${#RANGED[@]} + ${#TRL[@]}))
found=$(find .whl -type f -name '*.whl' | wc -l)
if [[ $found -ne $expected ]]; then
    echo "error: .whl: $found wheels for $expected requirements; read pip's output above" >&2
    exit 1
fi

# The peers' script and SmolLM2's tokenizer files (no weights).
mkdir -p .gpukit/peers .gpukit/smollm2_src
cp "$PEER_DIR/make_random_hf.py" .gpukit/peers/
src=$(PYTHONPATH="$ROOT" "$PYTHON" -c \
    'from jaxrl.lm.gguf import smollm2_hf_dir; print(smollm2_hf_dir())' | tail -1)
for name in config.json tokenizer.json tokenizer_config.json generation_config.json; do
    cp "$src/$name" .gpukit/smollm2_src/
done

# What travels: tracked and untracked-not-ignored files, plus the carried folders.
tree=$(git ls-files -z --cached --others --exclude-standard | xargs -0 du -cb 2>/dev/null |
    tail -1 | cut -f1)
wheels=$(du -sb .whl | cut -f1)
kit=$(du -sb .gpukit | cut -f1)
total=$((tree + wheels + kit))
mib() { awk -v b="$1" 'BEGIN { printf "%.1f MiB", b / 1048576 }'; }
echo "wheels: $(find .whl -maxdepth 1 -type f -name '*.whl' | wc -l) jaxrl ($(du -sb .whl --exclude=ranged \
    --exclude=trl | cut -f1 | xargs -I{} awk 'BEGIN { printf "%.1f MiB", {} / 1048576 }')), \
$(find .whl/ranged -type f -name '*.whl' | wc -l) ranged ($(mib "$(du -sb .whl/ranged | cut -f1)")), \
$(find .whl/trl -type f -name '*.whl' | wc -l) TRL ($(mib "$(du -sb .whl/trl | cut -f1)"))"
echo "travels: tree $(mib "$tree") + .whl $(mib "$wheels") + .gpukit $(mib "$kit") = $(mib "$total")" \
    "of $LIMIT_MIB MiB"
if ((total > LIMIT_MIB * 1048576)); then
    echo "error: $(mib "$total") would travel, over the $LIMIT_MIB MiB limit" >&2
    exit 1
fi
