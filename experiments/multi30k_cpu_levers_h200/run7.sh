#!/usr/bin/env bash
# GPU run 7 (2026-11-27, session 9): the multi30k_cpu levers not screened yet (issue 34) at the
# AVX2 hour's update count: more dropout (the hour now holds ~17 epochs, not the 11 the recipe's
# dropout 0.1 was chosen for), learned positions, fewer and wider layers at equal CPU time (step
# counts from the measured per-update cost ratio, multi30k_cpu_levers_h200.md), a deeper encoder
# with a shallower decoder; each job's averaged checkpoint scored on val and test2016 with
# tokenized BLEU at alpha 2.0 and 1.5. Beside them, the GPU test layer on the current code.
# From the repo root, with the carried .gpu/multi30k and .whl (hydra-core, omegaconf, antlr4,
# sacremoses): bash experiments/multi30k_cpu_levers_h200/run7.sh
# Dry run on a CPU: DEVICE=cpu TRAINER="trainer=cpu" DRY=1 ONLY="0 6" bash ...run7.sh
export PYTHONUNBUFFERED=1 WANDB_MODE=offline WANDB_SILENT=true MULTI30K_ROOT=$PWD/.gpu/multi30k
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false OMP_NUM_THREADS=1
OUT=${OUT:-/tmp/gpu_out}; mkdir -p $OUT; LOGS=${LOGS:-/tmp/lev7}; rm -rf $LOGS; mkdir -p $LOGS
DEVICE=${DEVICE:-cuda}; TRAINER=${TRAINER:-trainer=gpu trainer.precision=32-true}
if [ "$DEVICE" = cuda ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir .whl/*.whl 2>&1 | tail -3
  SITE=$(python3 -c "import site; print(site.getsitepackages()[0])"); echo "$PWD/src" > "$SITE/aiayn-src.pth"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $OUT/machine.txt
fi
python3 -c "import torch; print('torch', torch.__version__)" >> $OUT/machine.txt; lscpu | grep "Model name" >> $OUT/machine.txt
git rev-parse HEAD >> $OUT/machine.txt 2>/dev/null
DEADLINE=${DEADLINE:-530}  # seconds from the start: scoring stops here, the summary follows
COMMON="experiment=multi30k_cpu trainer.max_time=null $TRAINER logger=csv trainer.enable_progress_bar=false"
JOBS=(
 "trainer.max_steps=3930"
 "trainer.max_steps=3930 seed=1235"
 "trainer.max_steps=3930 model.dropout=0.2"
 "trainer.max_steps=3930 model.dropout=0.2 seed=1235"
 "trainer.max_steps=3930 model.dropout=0.3"
 "trainer.max_steps=3930 ablation=E_learned"
 "trainer.max_steps=4814 ablation=C_N2"
 "trainer.max_steps=2829 ablation=C_N2 model.d_model=384 model.num_heads=6 model.d_ff=1536"
 "trainer.max_steps=3930 model.dropout=0.2 model.attention_dropout=0.1 model.activation_dropout=0.1"
 "trainer.max_steps=3930 model.num_encoder_layers=4 model.num_decoder_layers=2"
)
printf "%s\n" "${JOBS[@]}" > $OUT/jobs.txt
score() {  # score <job>: val and test2016 of the averaged checkpoint, alpha 2.0 and 1.5
  local run=$LOGS/j$1 split alpha
  for alpha in 2.0 1.5; do for split in val test; do
    [ $((DEADLINE - SECONDS)) -gt 25 ] || return 0
    timeout -k 5 $((DEADLINE - SECONDS)) python3 evaluate.py ckpt_path=$run/checkpoints/averaged.ckpt split=$split tok_bleu=true \
      device=$DEVICE decode.length_penalty=$alpha hydra.run.dir=$LOGS/eval_j$1_${split}_$alpha > $run/eval_${split}_$alpha.log 2>&1
  done; done
}
for i in ${ONLY:-${!JOBS[@]}}; do
  job=${JOBS[$i]}; [ "$DRY" = 1 ] && job="$(sed -E 's/max_steps=[0-9]+/max_steps=6/' <<< "$job") trainer.limit_train_batches=3 trainer.limit_val_batches=2"
  ( timeout -k 5 ${T:-440} python3 train.py $COMMON $job hydra.run.dir=$LOGS/j$i > $LOGS/j$i.log 2>&1
    echo "j$i train rc=$? at ${SECONDS}s" >> $OUT/progress.txt; score $i; echo "j$i scored at ${SECONDS}s" >> $OUT/progress.txt ) &
done
if [ "$DEVICE" = cuda ]; then  # the GPU test layer on the code this run carries, beside the jobs
  timeout -k 5 ${T_GPU:-300} python3 -m pytest -m gpu tests/gpu -n 4 -k "not train_speed" -p no:cacheprovider \
    -o addopts="" -rA -v --timeout 240 --junitxml=$OUT/gpu_tests.xml > $OUT/gpu_tests.log 2>&1 &
fi
wait
python3 - "$LOGS" > $OUT/summary.tsv <<'PY'
import json, sys, pathlib
logs = pathlib.Path(sys.argv[1])
print("job\tupdates\tgreedy_val_last\tval_tok_a2\ttest_tok_a2\tval_tok_a1.5\ttest_tok_a1.5\tminutes")
for run in sorted(logs.glob("j*/"), key=lambda p: int(p.name[1:])):
    m = json.loads((run / "metrics.json").read_text()) if (run / "metrics.json").exists() else {}
    def tok(split, a):
        f = logs / f"eval_{run.name}_{split}_{a}" / "bleu.json"  # beside the run, not in it
        return "%.2f" % json.loads(f.read_text())["bleu_tok"] if f.exists() else "-"
    fit = m.get("fit") or {}
    print(run.name, m.get("updates", "-"), "%.2f" % fit.get("val/bleu", 0), tok("val", "2.0"),
          tok("test", "2.0"), tok("val", "1.5"), tok("test", "1.5"), "%.1f" % m.get("wall_clock_min", 0), sep="\t")
PY
cat $OUT/summary.tsv
tar --exclude='*.ckpt' --exclude='checkpoints' -czf $OUT/lev7.tgz -C $LOGS .
