#!/usr/bin/env bash
# GPU speed, run 4 (issue 48): the base update at 25k target tokens eager, compiled for its
# shape (static) and replayed as CUDA graphs (graphs), beside HF Marian and torch.nn.Transformer,
# with each variant's compilation time; the real command (Lightning, data, logging: now only
# at log steps) beside the harness at its shape; the 3 125-token micro-batch eager and as
# graphs; the profile of the static compiled update.
# Needs (carried, git-ignored): .whl (hydra-core, omegaconf, antlr4, sacremoses), .gpu/multi30k.
export PYTHONUNBUFFERED=1 WANDB_MODE=offline WANDB_SILENT=true HF_HUB_OFFLINE=1
export TOKENIZERS_PARALLELISM=false MULTI30K_ROOT=$PWD/.gpu/multi30k
step() { echo "=== $(date +%T) $*"; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD/src
SHAPE25="--batch-size 520 --src-len 48 --tgt-len 48 --vocab 37000"
quiet() { grep -v "^W1128\|^ *$"; }
{
step harness base at 25k: eager, static
timeout -k 5 ${T_H25:-140} python3 benchmarks/train_speed.py --device cuda --shapes base $SHAPE25 --aiayn eager,static --repeats 3
step harness base at 25k: graphs
timeout -k 5 ${T_G25:-120} python3 benchmarks/train_speed.py --device cuda --shapes base $SHAPE25 --aiayn graphs --repeats 3
} 2>&1 | quiet | tee $OUT/harness25k.txt
{
step harness at the real command shape '(Multi30k at 25k tokens: 1316 x 19 + 19, vocab 10k)'
timeout -k 5 40 python3 benchmarks/train_speed.py --device cuda --shapes base --batch-size 1316 --src-len 19 --tgt-len 19 --vocab 10000 --repeats 3
step real command: train.py experiment=paper_base data=multi30k, 120 updates
SECONDS=0
timeout -k 5 80 python3 train.py experiment=paper_base data=multi30k trainer.max_steps=120 \
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
step harness base at 3125: eager, graphs
timeout -k 5 ${T_H3:-110} python3 benchmarks/train_speed.py --device cuda --shapes base --batch-size 65 --src-len 48 --tgt-len 48 --vocab 37000 --aiayn eager,graphs --repeats 5
step profile base at 25k, static
timeout -k 5 ${T_PROF:-80} python3 benchmarks/profile_step.py --device cuda --shape base $SHAPE25 --variant static --steps 3 --rows 20
} 2>&1 | quiet | tee $OUT/after.txt | grep -E "^===|^\| |per update|peak memory|first two|Error|error"
step done
