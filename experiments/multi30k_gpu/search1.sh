#!/usr/bin/env bash
# GPU recipe search, call 1 (issue 51), prepared on the CPU for the next session lent a GPU:
# nine candidates for experiment=multi30k_gpu at once on one card, each budgeted in updates
# (so that sharing the card changes their wall clock, not their numbers), with a time guard
# that stops a job early, gracefully, if the card is slower than planned. Each job's averaged
# checkpoint is then decoded on val at alpha 1.0, 1.5 and 2.0 (beam 4, tokenized BLEU), and on
# test2016 at the alpha val chose only: choices are made on val. The headline run (alone,
# timed, 3 seeds) is a later call with the chosen settings.
# From the repo root, with the carried .gpu/multi30k and .whl (hydra-core, omegaconf, antlr4,
# sacremoses; both made by `bash experiments/gpu_carry.sh`): bash experiments/multi30k_gpu/search1.sh
# Dry run on a CPU: DEVICE=cpu TRAINER="trainer=cpu" DRY=1 ONLY="0 6" bash ...search1.sh
export PYTHONUNBUFFERED=1 WANDB_MODE=offline WANDB_SILENT=true MULTI30K_ROOT=$PWD/.gpu/multi30k
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false OMP_NUM_THREADS=1
OUT=${OUT:-/tmp/gpu_out}; mkdir -p $OUT; LOGS=${LOGS:-/tmp/search1}
if [ -e "$LOGS" ] && [ ! -e "$LOGS/.search1" ]; then  # scratch space: never someone's run
  echo "LOGS=$LOGS exists and is not an earlier search1 scratch directory; choose another" >&2; exit 2
fi
rm -rf $LOGS; mkdir -p $LOGS; touch $LOGS/.search1
DEVICE=${DEVICE:-cuda}; TRAINER=${TRAINER:-}
if [ "$DEVICE" = cuda ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir .whl/*.whl || exit 1
  SITE=$(python3 -c "import site; print(site.getsitepackages()[0])"); echo "$PWD/src" > "$SITE/aiayn-src.pth"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $OUT/machine.txt
fi
python3 -c "import torch; print('torch', torch.__version__)" >> $OUT/machine.txt; lscpu | grep "Model name" >> $OUT/machine.txt
git rev-parse HEAD >> $OUT/machine.txt 2>/dev/null
DEADLINE=${DEADLINE:-555}  # seconds from the start: scoring stops here, the summary follows
GUARD=${GUARD:-00:00:06:40}  # trainer.max_time of every job: the updates below are the budget
# test=false: the search reads val only (test2016 is decoded below, at val's alpha), and the
# recipe's own test decode would take the card from the other jobs
COMMON="trainer.max_time=$GUARD $TRAINER logger=csv trainer.enable_progress_bar=false test=false"
R=experiment=multi30k_gpu
JOBS=(
 "$R"
 "$R seed=1235"
 "$R model.dropout=0.2"
 "$R model.num_encoder_layers=4 model.num_decoder_layers=4"
 "$R model.d_model=512 model.num_heads=8 model.d_ff=2048 optim.lr=1e-3"
 "$R model.attention_dropout=0.1 model.activation_dropout=0.1"
 "$R data.max_tokens=8192 trainer.max_steps=3000 optim.lr=3e-3 optim.warmup_steps=500"
 "experiment=multi30k_tiny trainer=gpu"
 "$R data.regroup=true model.output_bias=true"
)
printf "%s\n" "${JOBS[@]}" > $OUT/jobs.txt
evaluate() {  # evaluate <job> <split> <alpha>: beam 4 (the tiny recipe: its beam 5), tokenized BLEU
  [ $((DEADLINE - SECONDS)) -gt 25 ] || return 1
  timeout -k 5 $((DEADLINE - SECONDS)) python3 evaluate.py ckpt_path=$LOGS/j$1/checkpoints/averaged.ckpt \
    split=$2 tok_bleu=true device=$DEVICE batch_size=128 decode.length_penalty=$3 $EVAL_EXTRA hydra.run.dir=$LOGS/eval_j$1_$2_$3 \
    > $LOGS/j$1/eval_$2_$3.log 2>&1
}
score() {  # score <job>: alpha on val, then test2016 at the alpha val chose
  local alpha best
  for alpha in 1.0 1.5 2.0; do evaluate $1 val $alpha || return 0; done
  best=$(python3 - $LOGS $1 <<'PY'
import json, pathlib, sys
logs, job = pathlib.Path(sys.argv[1]), sys.argv[2]
scores = {}
for a in ("1.0", "1.5", "2.0"):
    f = logs / f"eval_j{job}_val_{a}" / "bleu.json"
    if f.exists():
        scores[a] = json.loads(f.read_text())["bleu_tok"]
print(max(scores, key=scores.get) if scores else "")
PY
)
  [ -n "$best" ] && evaluate $1 test $best
}
for i in ${ONLY:-${!JOBS[@]}}; do
  job=${JOBS[$i]}
  [ "$DRY" = 1 ] && job="$job trainer.max_steps=6 trainer.limit_train_batches=3 trainer.limit_val_batches=2" \
    && EVAL_EXTRA="decode.max_len_a=0 decode.max_len_b=3"  # an untrained model decodes to the limit
  ( timeout -k 5 ${T:-440} python3 train.py $COMMON $job hydra.run.dir=$LOGS/j$i > $LOGS/j$i.log 2>&1
    echo "j$i train rc=$? at ${SECONDS}s" >> $OUT/progress.txt; score $i; echo "j$i scored at ${SECONDS}s" >> $OUT/progress.txt ) &
done
wait
python3 - "$LOGS" > $OUT/summary.tsv <<'PY'
import csv, json, sys, pathlib
logs = pathlib.Path(sys.argv[1])
print("job\tupdates\tepochs\ttrain_min\tgreedy_val_last\tval_a1.0\tval_a1.5\tval_a2.0\ttest_at_val_alpha")
for run in sorted(logs.glob("j*/"), key=lambda p: int(p.name[1:])):
    m = json.loads((run / "metrics.json").read_text()) if (run / "metrics.json").exists() else {}
    def tok(split, a):
        f = logs / f"eval_{run.name}_{split}_{a}" / "bleu.json"  # beside the run, not in it
        return json.loads(f.read_text())["bleu_tok"] if f.exists() else None
    val = {a: tok("val", a) for a in ("1.0", "1.5", "2.0")}
    test = [f"{tok('test', a):.2f} (α {a})" for a in val if tok("test", a) is not None]
    fit = m.get("fit") or {}
    rows = [r for f in run.rglob("metrics.csv") for r in csv.DictReader(open(f))]
    epochs = max((int(float(r["epoch"])) + 1 for r in rows if r.get("epoch")), default="-")
    cells = ["%.2f" % v if v is not None else "-" for v in val.values()]
    print(run.name, m.get("updates", "-"), epochs, "%.1f" % m.get("wall_clock_min", 0),
          "%.2f" % fit.get("val/bleu", 0), *cells, test[0] if test else "-", sep="\t")
PY
cat $OUT/summary.tsv
for run in $LOGS/j*/; do  # each job's record: its config, metrics and val curve, no checkpoints
  name=$(basename $run); mkdir -p $OUT/runs/$name
  cp -r $run/.hydra $run/metrics.json $OUT/runs/$name/ 2>/dev/null
  find $run -name metrics.csv -exec cp {} $OUT/runs/$name/metrics.csv \;
  for f in $LOGS/eval_${name}_*/bleu.json; do [ -f $f ] && cp $f $OUT/runs/$name/$(basename $(dirname $f) | sed "s/^eval_${name}_//").bleu.json; done
  tail -n 30 $LOGS/$name.log > $OUT/runs/$name/train_tail.log
done
