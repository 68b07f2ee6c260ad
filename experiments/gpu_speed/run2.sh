#!/usr/bin/env bash
# GPU speed, run 2 (issue 48): the real command beside the harness at its shape, the GPU
# tests of the blocked loss and of a step that never waits for the GPU, decoding beside HF
# generate, then big at 25k, base at 3 125 and the profile of the eager base update.
# Needs (carried, git-ignored): .whl (hydra-core, omegaconf, antlr4, sacremoses), .gpu/multi30k.
export PYTHONUNBUFFERED=1 WANDB_MODE=offline WANDB_SILENT=true HF_HUB_OFFLINE=1
export TOKENIZERS_PARALLELISM=false MULTI30K_ROOT=$PWD/.gpu/multi30k
step() { echo "=== $(date +%T) $*"; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD/src
SHAPE25="--batch-size 520 --src-len 48 --tgt-len 48 --vocab 37000"
quiet() { grep -v "^W1127\|^ *$"; }
{
step harness at the real command shape '(Multi30k at 25k tokens: 1316 x 19 + 19, vocab 10k)'
timeout -k 5 45 python3 benchmarks/train_speed.py --device cuda --shapes base --batch-size 1316 --src-len 19 --tgt-len 19 --vocab 10000 --repeats 3
step real command: train.py experiment=paper_base data=multi30k, 120 updates
SECONDS=0
timeout -k 5 90 python3 train.py experiment=paper_base data=multi30k trainer.max_steps=120 \
   test=false logger=csv trainer.log_every_n_steps=10 paths.log_dir=/tmp/real trainer.enable_progress_bar=false \
   trainer.num_sanity_val_steps=0
echo "rc=$? wall=${SECONDS}s"
RUN=$(ls -d /tmp/real/train/runs/* | head -1)
cp $RUN/metrics.json $OUT/real_metrics.json; cp $(find $RUN -name metrics.csv | head -1) $OUT/real_metrics.csv
python3 - $OUT/real_metrics.csv <<'PY'
import csv, statistics, sys
rows = [r for r in csv.DictReader(open(sys.argv[1])) if r.get("train/mfu")]
late = [r for r in rows if float(r["step"]) >= 30]
for key in ("train/mfu", "train/tokens_per_sec"):
    values = [float(r[key]) for r in late]
    print(key, "from update 30: median", statistics.median(values), "max", max(values), "n", len(values))
PY
} 2>&1 | quiet | tee $OUT/real.txt | grep -E "^===|^\| |rc=|median|Error|error|data:"
{
step GPU tests: the blocked loss, a step that never waits
timeout -k 5 100 python3 -m pytest -m gpu tests/gpu -p no:cacheprovider -q -rA -k "blocked_cuda_loss or never_waits" 2>&1 | tail -n 30
} 2>&1 | quiet | tee $OUT/gpu_tests.txt | grep -E "^===|passed|failed|PASSED|FAILED|Error"
{
step decode, base shape, 512 sentences in batches of 128
timeout -k 5 80 python3 benchmarks/decode_speed.py --device cuda --shape base --sentences 512 --batch-size 128 --repeats 2
} 2>&1 | quiet | tee $OUT/decode.txt | grep -E "^===|^\| |whole run|Error|error"
{
step harness big at 25k, eager
timeout -k 5 45 python3 benchmarks/train_speed.py --device cuda --shapes big $SHAPE25 --repeats 3
step harness base at 3125, eager
timeout -k 5 30 python3 benchmarks/train_speed.py --device cuda --shapes base --batch-size 65 --src-len 48 --tgt-len 48 --vocab 37000 --repeats 5
step AFTER profile base, 25k tokens, eager
timeout -k 5 35 python3 benchmarks/profile_step.py --device cuda --shape base $SHAPE25 --steps 3 --rows 15
} 2>&1 | quiet | tee $OUT/after.txt | grep -E "^===|^\| |per update|peak memory|Error|error"
step done
