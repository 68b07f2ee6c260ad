#!/usr/bin/env bash
# GPU run 3, 2026-11-26 session 2: the converged Table 3 (issue 35) on one GPU.
#  1. python train.py -m experiment=multi30k_cpu_table3 sweep=table3_core, the 15 jobs at once
#     through submitit's local launcher on the one GPU (fp32, TF32 matmuls);
#  2. the base row's 3 seeds continued from their last.ckpt to 4 000 updates (the curve).
# DRY=1: the same on the CPU in a few updates (checks the script, not the numbers).
export PYTHONUNBUFFERED=1 WANDB_MODE=offline WANDB_SILENT=true MULTI30K_ROOT=$PWD/.gpu/multi30k
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false OMP_NUM_THREADS=2
OUT=${OUT:-/tmp/gpu_out}; mkdir -p $OUT
LOGS=${LOGS:-/tmp/t3}; rm -rf $LOGS
START=$SECONDS; LIMIT=${LIMIT:-575}
step() { echo "=== $(date +%T) +$((SECONDS-START))s $*"; }
left() { echo $((LIMIT - (SECONDS - START))); }
pack() { tar --exclude='*.ckpt' --exclude='checkpoints' -czf $OUT/t3.tgz -C $LOGS . 2>/dev/null; }
if [ -z "$DRY" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir .whl/*.whl 2>&1 | tail -3
  SITE=$(python3 -c "import site; print(site.getsitepackages()[0])")
  echo "$PWD/src" > "$SITE/aiayn-src.pth"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  lscpu | grep -E "Model name|^CPU\(s\)"
  DEV="trainer=gpu trainer.precision=32-true hydra.launcher.gpus_per_node=1"
  STEPS=${STEPS:-}; MORE=4000
else
  DEV="trainer=cpu hydra.sweeper.params.ablation='base,base_seed1235' trainer.limit_val_batches=2"
  STEPS="trainer.max_steps=4 trainer.val_check_interval=2 trainer.limit_test_batches=2"; MORE=6
fi
python3 -c "import torch, lightning, hydra, submitit, aiayn; print('torch', torch.__version__, 'lightning', lightning.__version__, 'submitit', submitit.__version__)"
git log -1 --format='commit %H' 2>/dev/null
step sweep
timeout -k 10 $(( $(left) - 150 )) python3 train.py -m experiment=multi30k_cpu_table3 sweep=table3_core \
  hydra/launcher=submitit_local hydra.launcher.timeout_min=30 $DEV $STEPS logger=csv \
  trainer.enable_progress_bar=false hydra.sweep.dir=$LOGS/core > $OUT/sweep.log 2>&1
echo "sweep rc=$?"; pkill -9 -f "$LOGS/core/.submitit"; tail -n 30 $OUT/sweep.log
grep -h "test/bleu" $LOGS/core/*/metrics.json 2>/dev/null | head -20
pack
step curve: the 3 base seeds continued to $MORE updates
if [ $(left) -gt 60 ]; then
  for job in 0 1 2; do
    [ -f $LOGS/core/$job/checkpoints/last.ckpt ] || continue
    mkdir -p $LOGS/curve; cp -r $LOGS/core/$job $LOGS/curve/$job
    overrides=$(python3 -c "import yaml; print(' '.join(o for o in yaml.safe_load(open('$LOGS/curve/$job/.hydra/overrides.yaml')) if not o.startswith(('hydra', 'trainer.max_steps='))))")
    timeout -k 10 $(( $(left) - 20 )) python3 train.py $overrides trainer.max_steps=$MORE \
      ckpt_path=$LOGS/curve/$job/checkpoints/last.ckpt > $OUT/curve$job.log 2>&1 &
  done
  wait
  tail -n 5 $OUT/curve*.log
fi
pack
step done; ls -la $OUT
