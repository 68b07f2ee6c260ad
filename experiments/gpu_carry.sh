#!/usr/bin/env bash
# What a device call carries beside the working tree, built here on the CPU (PyPI is the only
# network it needs) into the two git-ignored folders every device script reads:
#   .whl/          wheels of the pure-Python packages the GPU image lacks (it has torch, CUDA,
#                  Lightning, transformers, tokenizers, sacreBLEU), at the versions of this
#                  checkout's .venv: hydra-core, omegaconf, antlr4-python3-runtime (an sdist
#                  on PyPI, built into a wheel here), sacremoses, and for Table 3's
#                  submitit_local launcher submitit and hydra-submitit-launcher
#   .gpu/multi30k  the Multi30k files the recipes train on (train, val, test2016 .en/.de)
# Usage, from the repo root with the venv made: MULTI30K_ROOT=<dir> bash experiments/gpu_carry.sh
# then a device call with carry [".whl", ".gpu"], e.g. `PART=a bash experiments/gpu_speed/run5.sh`.
set -euo pipefail
cd "$(dirname "$0")/.."
: "${MULTI30K_ROOT:?set MULTI30K_ROOT to the Multi30k directory (train.en, val.de, ...)}"
if [ "$(realpath -m "$MULTI30K_ROOT")" = "$(realpath -m .gpu/multi30k)" ]; then
  echo "MULTI30K_ROOT is .gpu/multi30k itself, the folder this script remakes: point it at" \
    "the corpus elsewhere (e.g. ../shared/data/multi30k)" >&2
  exit 1
fi
PY=${PY:-.venv/bin/python}
PACKAGES=(hydra-core omegaconf antlr4-python3-runtime sacremoses submitit hydra-submitit-launcher)
pinned=()
for name in "${PACKAGES[@]}"; do
  version=$("$PY" -c "import importlib.metadata as m, sys; print(m.version(sys.argv[1]))" "$name") \
    || { echo "$name is not installed in $PY's environment: pip install -e '.[dev]' first" >&2; exit 1; }
  pinned+=("$name==$version")
done
rm -rf .whl && mkdir -p .whl
"$PY" -m pip wheel -q --no-deps --wheel-dir .whl "${pinned[@]}"
rm -rf .gpu/multi30k && mkdir -p .gpu/multi30k
for split in train val test2016; do
  for lang in en de; do cp "$MULTI30K_ROOT/$split.$lang" .gpu/multi30k/; done
done
echo "carry: .whl ($(ls .whl | wc -l) wheels: ${pinned[*]}), .gpu/multi30k ($(du -sh .gpu | cut -f1))"
