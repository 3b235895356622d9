#!/usr/bin/env bash
# The ALBERT paper's ablations at one scale (REPRODUCTION.md): every sweep of
# experiments/ablate_*.py on the demo's model and corpus, each trial
# pre-trained and then fine-tuned (configs/demo.py's task; TASK=spam by
# default, the bundled spam/ham e-mails the committed results used), then each
# sweep's report and Table 5's cross-evaluation (NSP-trained models scored
# on SOP pairs and the reverse).
#
#   bash experiments/run_ablations.sh ROOT [STEPS] [PARALLEL] [FINETUNE_STEPS]
#
# ROOT: where the trials' workdirs go (local or gs://). STEPS: pre-training
# steps a trial (default 400, the committed CPU tables'). PARALLEL: trials run at once in
# each sweep, the sweeps themselves side by side (1 on a laptop; on one GPU
# every trial at once fits: 8). Done trials are skipped, so a rerun finishes
# an interrupted sweep. FINETUNE_STEPS: the fine-tune's steps (default 150,
# the demo's). SWEEPS (environment): which ablations, default all four. TASK
# (environment): the fine-tune, spam (default) or source (the demo's default,
# configs/demo.py).
set -euo pipefail
root=${1:?usage: bash experiments/run_ablations.sh ROOT [STEPS] [PARALLEL]}
steps=${2:-400}
parallel=${3:-1}
finetune_steps=${4:-150}
sweeps=${SWEEPS:-embedding sharing sentence_objective dropout}
config="configs/demo.py:steps=${steps},finetune_steps=${finetune_steps},task=${TASK:-spam}"
mkdir -p "$root"

# One vocabulary for every trial, trained as the demo trains its own (seed
# 0, 5000 pieces), so Table 5's models can read each other's data.
tok="$root/spiece.model"
if [ ! -e "$tok" ]; then
  python -m albert_jax.text.train_tokenizer --input albert_jax/data/bundled/corpus/*.txt.gz \
    --vocab_size 5000 --seed 0 --input_sentence_size 2000000 --output "$tok"
fi

# The sentence-order instances every sweep but the objective one trains on,
# prepared once as the demo prepares its own; the objective sweep's trials
# prepare theirs. Evaluation reads 27 batches: 864 of the 895 held-out rows.
data="$root/data_sop"
if [ ! -e "$data/dataset.json" ]; then
  python -m albert_jax.data.prepare --input="albert_jax/data/bundled/corpus/*.txt.gz" \
    --tokenizer="$tok" --output_dir="$data" --max_seq_length=128 --objective=sop \
    --dupe_factor=2 --seed=0 --eval_fraction=0.02 --num_workers=8
fi

pids=()
for name in $sweeps; do
  shared=()
  [ "$name" = sentence_objective ] || shared=(--config.data.data_dir="$data")
  python -m albert_jax.tools.sweep "experiments/ablate_${name}.py" \
    --config="$config" --workdir_root="$root/$name" --parallel="$parallel" \
    -- --config.data.tokenizer="$tok" --config.finetune.compare_random_init=false \
    --config.eval_batches=27 "${shared[@]}" > "$root/$name.log" 2>&1 &
  pids+=($!)
done
failed=0
for pid in "${pids[@]}"; do wait "$pid" || failed=1; done

for name in $sweeps; do
  python -m albert_jax.tools.report "$root/$name"/*/ --out="$root/$name" || failed=1
done
if [[ " $sweeps " == *" sentence_objective "* ]]; then
  python -m albert_jax.tools.cross_eval "$root/sentence_objective"/*/ \
    --out="$root/sentence_objective" || failed=1
fi
exit "$failed"
