#!/usr/bin/env bash
# GPU speed, run 3 (issue 48): decoding with the decoder step as one CUDA graph (greedy and
# beam 4, beside aiayn without graphs and HF generate), and the GPU tests of what changed: CUDA
# graph decoding, translate/evaluate on the GPU (graphs by default), a step that never waits.
# Needs (carried, git-ignored): .whl (hydra-core, omegaconf, antlr4, sacremoses).
export PYTHONUNBUFFERED=1 WANDB_MODE=offline WANDB_SILENT=true HF_HUB_OFFLINE=1
export TOKENIZERS_PARALLELISM=false MULTI30K_ROOT=$PWD/.gpu/multi30k
step() { echo "=== $(date +%T) $*"; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD/src
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "import torch, transformers, lightning; print('torch', torch.__version__, 'transformers', transformers.__version__, 'lightning', lightning.__version__)"
git log -1 --format="commit %h %s" 2>/dev/null
{
step GPU tests
timeout -k 5 ${T_TESTS:-180} python3 -m pytest -m gpu tests/gpu -p no:cacheprovider -q -rA -n 3 \
  -k "cuda_graph_decoding or never_waits or beam_search_evaluate" \
  --junitxml=$OUT/gpu_tests.xml 2>&1 | tail -n 40
} 2>&1 | tee $OUT/gpu_tests.txt
{
step decode, base shape, 512 sentences in batches of 128
timeout -k 5 ${T_DECODE:-150} python3 benchmarks/decode_speed.py --device cuda --shape base --sentences 512 --batch-size 128 --repeats 2
} 2>&1 | grep -v "^W1128\|^ *$" | tee $OUT/decode.txt
step done
