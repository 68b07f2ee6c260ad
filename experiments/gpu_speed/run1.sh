#!/usr/bin/env bash
# GPU speed, run 1 (issue 48): before (f5393e6, from .gpu/before) and after, in one call:
# the harness at the paper's 25k-token batch (base, big) and at an 8-GPU run's 3 125-token
# micro-batch, aiayn eager and compiled beside HF Marian and torch.nn.Transformer; the
# profile of a base update before and after (big's peak memory before).
# Needs (carried, git-ignored): .whl (hydra-core, omegaconf, antlr4, sacremoses) and
# .gpu/before (`git archive f5393e6 src benchmarks`, plus this commit's profile_step.py).
export PYTHONUNBUFFERED=1 WANDB_MODE=offline WANDB_SILENT=true HF_HUB_OFFLINE=1
export TOKENIZERS_PARALLELISM=false
step() { echo "=== $(date +%T) $*"; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl || exit 1
NEW=/tmp/site:$PWD/src OLD=/tmp/site:$PWD/.gpu/before/src
SHAPE25="--batch-size 520 --src-len 48 --tgt-len 48 --vocab 37000"
quiet() { grep -v "^W1127\|^ *$"; }
{
step env; nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
lscpu | grep -E "Model name|^CPU\(s\)"
step BEFORE f5393e6 harness, 25k tokens
PYTHONPATH=$OLD timeout -k 5 100 python3 .gpu/before/benchmarks/train_speed.py --device cuda --shapes base,big $SHAPE25 --repeats 3
} 2>&1 | quiet | tee $OUT/before.txt | grep -E "^===|^\| |datasheet|Error|error|^NVIDIA|^torch"
{
step AFTER harness, 25k tokens
PYTHONPATH=$NEW timeout -k 5 200 python3 benchmarks/train_speed.py --device cuda --shapes base,big $SHAPE25 --repeats 3 --aiayn eager,compiled
step AFTER harness, 3125 tokens '(an 8-GPU run micro-batch)'
PYTHONPATH=$NEW timeout -k 5 90 python3 benchmarks/train_speed.py --device cuda --shapes base --batch-size 65 --src-len 48 --tgt-len 48 --vocab 37000 --repeats 5 --aiayn eager,compiled
} 2>&1 | quiet | tee $OUT/harness.txt | grep -E "^===|^\| |MFU peak|Error|error"
{
step BEFORE f5393e6 profile base, 25k tokens
PYTHONPATH=$OLD timeout -k 5 60 python3 .gpu/before/benchmarks/profile_step.py --device cuda --shape base $SHAPE25 --steps 3 --rows 15
step AFTER profile base, 25k tokens, compiled
PYTHONPATH=$NEW timeout -k 5 80 python3 benchmarks/profile_step.py --device cuda --shape base $SHAPE25 --steps 3 --rows 15 --compile
step BEFORE f5393e6 profile big, 25k tokens '(its peak memory)'
PYTHONPATH=$OLD timeout -k 5 50 python3 .gpu/before/benchmarks/profile_step.py --device cuda --shape big $SHAPE25 --steps 2 --rows 3
} 2>&1 | quiet | tee $OUT/profiles.txt | grep -E "^===|per update|peak memory|Error|error"
step done
