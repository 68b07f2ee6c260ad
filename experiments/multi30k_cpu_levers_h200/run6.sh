#!/usr/bin/env bash
# GPU run 6 (2026-11-26, session 5): multi30k_cpu levers at the 3 930 updates the recipe's CPU
# hour now holds (experiments/peers/aiayn_same), chiefly optim.cooldown (warmup-stable-decay);
# each job's averaged checkpoint then scored on val and test2016 at alpha 1.5 and 2.0.
export PYTHONUNBUFFERED=1 WANDB_MODE=offline WANDB_SILENT=true MULTI30K_ROOT=$PWD/.gpu/multi30k
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false OMP_NUM_THREADS=1
OUT=${OUT:-/tmp/gpu_out}; mkdir -p $OUT; LOGS=/tmp/lev6; rm -rf $LOGS; mkdir -p $LOGS
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir .whl/*.whl 2>&1 | tail -3
SITE=$(python3 -c "import site; print(site.getsitepackages()[0])"); echo "$PWD/src" > "$SITE/aiayn-src.pth"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $OUT/machine.txt
python3 -c "import torch; print('torch', torch.__version__)" >> $OUT/machine.txt; lscpu | grep "Model name" >> $OUT/machine.txt
DEADLINE=${DEADLINE:-540}  # seconds from the start: scoring stops here, the summary follows
COMMON="experiment=multi30k_cpu trainer.max_time=null trainer=gpu trainer.precision=32-true logger=csv
 trainer.enable_progress_bar=false"
JOBS=(
 "trainer.max_steps=3930"
 "trainer.max_steps=3930 seed=1235"
 "trainer.max_steps=3930 optim.cooldown=0.4"
 "trainer.max_steps=3930 optim.cooldown=0.4 seed=1235"
 "trainer.max_steps=3930 optim.cooldown=0.4 optim.schedule=constant optim.lr=1e-3"
 "trainer.max_steps=3930 optim.cooldown=0.4 callbacks.average.last=3"
 "trainer.max_steps=3930 ablation=norm_pre optim.lr=2.5e-3 data.tokenizer.vocab_size=6000"
 "trainer.max_steps=3930 ablation=norm_pre optim.lr=2.5e-3 data.tokenizer.vocab_size=6000 optim.cooldown=0.4"
 "trainer.max_steps=5240 data.max_tokens=1500 optim.cooldown=0.4"
 "trainer.max_steps=3930 optim.cooldown=1.0"
)
printf "%s\n" "${JOBS[@]}" > $OUT/jobs.txt
score() {  # score <job>: val and test2016 of the averaged checkpoint, alpha 1.5 and 2.0
  local run=$LOGS/j$1 split alpha
  for alpha in 2.0 1.5; do for split in val test; do
    [ $((DEADLINE - SECONDS)) -gt 25 ] || return 0
    timeout -k 5 $((DEADLINE - SECONDS)) python3 evaluate.py ckpt_path=$run/checkpoints/averaged.ckpt split=$split tok_bleu=true \
      device=cuda decode.length_penalty=$alpha hydra.run.dir=$LOGS/eval_j$1_${split}_$alpha > $run/eval_${split}_$alpha.log 2>&1
  done; done
}
for i in "${!JOBS[@]}"; do
  ( timeout -k 5 ${T:-440} python3 train.py $COMMON ${JOBS[$i]} hydra.run.dir=$LOGS/j$i > $LOGS/j$i.log 2>&1
    echo "j$i train rc=$?" >> $OUT/progress.txt; score $i; echo "j$i scored" >> $OUT/progress.txt ) &
done
wait
python3 - "$LOGS" > $OUT/summary.tsv <<'PY'
import json, sys, pathlib
logs = pathlib.Path(sys.argv[1])
print("job\tlast_lr\tgreedy_val_last\ttest13a_run\tval_tok_a2\ttest_tok_a2\tval_tok_a1.5\ttest_tok_a1.5\tminutes")
for run in sorted(logs.glob("j*/"), key=lambda p: int(p.name[1:])):
    m = json.loads((run / "metrics.json").read_text()) if (run / "metrics.json").exists() else {"fit": {}}
    def tok(split, a):
        f = logs / f"eval_{run.name}_{split}_{a}" / "bleu.json"  # beside the run, not in it
        return "%.2f" % json.loads(f.read_text())["bleu_tok"] if f.exists() else "-"
    fit = m.get("fit") or {}
    print(run.name, "%.2e" % fit.get("train/lr", 0), "%.2f" % fit.get("val/bleu", 0),
          "%.2f" % ((m.get("test") or {}).get("test/bleu", 0)), tok("val", "2.0"), tok("test", "2.0"),
          tok("val", "1.5"), tok("test", "1.5"), "%.1f" % m.get("wall_clock_min", 0), sep="\t")
PY
cat $OUT/summary.tsv
tar --exclude='*.ckpt' --exclude='checkpoints' -czf $OUT/lev6.tgz -C $LOGS .
