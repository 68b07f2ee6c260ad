#!/usr/bin/env bash
# GPU run 4 (issue 51), prepared on the CPU: Table 3 at the base row's converged budget, 3 100
# updates a job (experiments/table3_converged.md), every row of sweep=table3_converged, as two
# device calls that each stand alone (one call holds about 15 jobs of this size at once):
#   PART=1: sweep=table3_core (the base row's 3 seeds and the core rows), 15 jobs;
#   PART=2: the other 14 rows of sweep=table3_converged (big among them), one -m command.
# Each part is one `python train.py -m` through submitit's local launcher, its jobs at once on
# the one GPU (fp32 with TF32 matmuls, as the 2 000-update record). A part stopped by its
# guard is relaunched with `resume_sweep=<its dir>` (the script adds it when $LOGS/part<N>
# holds a multirun): its finished jobs are kept; checkpoints do not come back from a device
# call, so its stopped jobs start again. On a fresh machine: unpack part<N>.tgz into a
# git-ignored folder, `touch <folder>/.run4`, carry it and set LOGS=$PWD/<folder>.
# Needs (carried, git-ignored; `bash experiments/gpu_carry.sh` makes both): .whl (hydra-core,
# omegaconf, antlr4, sacremoses, submitit, hydra-submitit-launcher), .gpu/multi30k. Output
# under $OUT: part<N>.log, part<N>.tgz (the jobs' directories without checkpoints). The
# report, here on the CPU, from both parts:
#   python -m aiayn.sweeps <part1 dir> <part2 dir> --paper table3
# DRY=1: two rows of the part in a few updates on the CPU (checks the script, not numbers).
export PYTHONUNBUFFERED=1 WANDB_MODE=offline WANDB_SILENT=true HF_HUB_OFFLINE=1
export TOKENIZERS_PARALLELISM=false OMP_NUM_THREADS=2
OUT=${OUT:?OUT: the folder that comes back}; mkdir -p "$OUT"
LOGS=${LOGS:-/tmp/t3c}
START=$SECONDS; LIMIT=${LIMIT:-560}
step() { echo "=== $(date +%T) +$((SECONDS - START))s $*"; }
case ${PART:?PART=1 or 2} in
  1) GRID="sweep=table3_core" ;;
  2) GRID="ablation=A_h2,A_h8,A_h32,B_dk32,C_N4,C_N8,C_dmodel_double,C_dff_half,C_dff_double,D_dropout_up,D_ls2,big,norm_post_nowarmup,norm_pre_nowarmup" ;;
  *) echo "PART is 1 or 2, not $PART" >&2; exit 2 ;;
esac
DIR=$LOGS/part$PART
[ -e "$LOGS" ] && [ ! -e "$LOGS/.run4" ] && { echo "LOGS=$LOGS is not this script's scratch" >&2; exit 2; }
mkdir -p "$LOGS" && touch "$LOGS/.run4"
if [ -z "$DRY" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PWD/src MULTI30K_ROOT=$PWD/.gpu/multi30k
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  DEV="trainer=gpu trainer.precision=32-true hydra.launcher.gpus_per_node=1"
  STEPS="trainer.max_steps=3100"
else  # on this CPU: the part's first two rows, 4 updates each
  [ "$PART" = 1 ] && GRID="ablation=base,base_seed1235" || GRID="ablation=A_h2,big"
  DEV="trainer=cpu trainer.limit_val_batches=2"
  STEPS="trainer.max_steps=4 trainer.val_check_interval=2 trainer.limit_test_batches=2"
fi
lscpu | grep -E "Model name|^CPU\(s\)"
python3 -c "import torch, lightning, hydra, submitit, hydra_plugins.hydra_submitit_launcher; print('torch', torch.__version__, 'lightning', lightning.__version__, 'submitit', submitit.__version__)" || exit 1
git log -1 --format='commit %H' 2>/dev/null
RESUME=""; [ -f "$DIR/multirun.yaml" ] && RESUME="resume_sweep=$DIR"
step "part $PART: $GRID $STEPS $RESUME"
# shellcheck disable=SC2086  # one override a word
timeout -k 10 $((LIMIT - (SECONDS - START) - 40)) python3 train.py -m experiment=multi30k_cpu_table3 \
  $GRID $STEPS $DEV hydra/launcher=submitit_local hydra.launcher.timeout_min=30 logger=csv \
  trainer.enable_progress_bar=false hydra.sweep.dir="$DIR" $RESUME > "$OUT/part$PART.log" 2>&1
echo "sweep rc=$?"
pkill -9 -f "$DIR/.submitit"
tail -n 20 "$OUT/part$PART.log"
for job in "$DIR"/[0-9]*; do
  echo "$(basename "$job") $(grep -o 'ablation=[A-Za-z0-9_]*' "$job/.hydra/overrides.yaml" | head -1)" \
    "$(python3 -c "import json,sys; m=json.load(open(sys.argv[1])); print('finished', m.get('finished', True), 'min', m.get('wall_clock_min'), 'tok/s', m.get('train_tokens_per_sec'), 'test', (m.get('test') or {}).get('test/bleu'))" "$job/metrics.json" 2>/dev/null || echo no metrics.json)"
done
tar --exclude='*.ckpt' --exclude='checkpoints' --exclude='*.pt' -czf "$OUT/part$PART.tgz" -C "$LOGS" "part$PART"
step done; ls -la "$OUT"
