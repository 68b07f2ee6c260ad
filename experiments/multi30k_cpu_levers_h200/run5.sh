#!/usr/bin/env bash
# GPU run 5: more multi30k_cpu levers (issue 34) beside the default test layer with CUDA visible.
export PYTHONUNBUFFERED=1 WANDB_MODE=offline WANDB_SILENT=true MULTI30K_ROOT=$PWD/.gpu/multi30k
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false OMP_NUM_THREADS=1
OUT=${OUT:-/tmp/gpu_out}; mkdir -p $OUT; LOGS=/tmp/lev5; rm -rf $LOGS
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir .whl/*.whl 2>&1 | tail -3
SITE=$(python3 -c "import site; print(site.getsitepackages()[0])"); echo "$PWD/src" > "$SITE/aiayn-src.pth"
COMMON="experiment=multi30k_cpu trainer.max_time=null hydra/launcher=submitit_local
 hydra.launcher.timeout_min=30 trainer=gpu trainer.precision=32-true hydra.launcher.gpus_per_node=1 logger=csv
 trainer.enable_progress_bar=false ablation=norm_pre"
i=0
for grid in "trainer.max_steps=2450 optim.lr=2.5e-3 data.tokenizer.vocab_size=6000" \
            "trainer.max_steps=2450 optim.lr=3.5e-3" "trainer.max_steps=2450 optim.lr=2.5e-3 callbacks.average.last=8" \
            "trainer.max_steps=3200 optim.lr=2.5e-3"; do
  timeout -k 5 ${T:-190} python3 train.py -m $COMMON $grid hydra.sweep.dir=$LOGS/m$i > $OUT/m$i.log 2>&1 &
  i=$((i+1))
done
CUDA_VISIBLE_DEVICES=0 timeout -k 5 185 python3 -m pytest -n 8 -p no:cacheprovider -q -rf --timeout 120 -o addopts="" -m "not slow or gpu" > $OUT/default_layer.log 2>&1 &
wait; pkill -9 -f "$LOGS/"
tail -n 40 $OUT/default_layer.log
for f in $LOGS/m*/*/metrics.json; do python3 -c "
import json; m=json.load(open('$f')); print('$f', 'val_bleu %.2f test %.2f'%(m['fit'].get('val/bleu',0),(m.get('test') or {}).get('test/bleu',0)))"; done
tar --exclude='*.ckpt' --exclude='checkpoints' -czf $OUT/lev5.tgz -C $LOGS .
