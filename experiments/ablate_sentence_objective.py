r"""The sentence-level objective, the ALBERT paper's Table 5.

One trial per `data.objective`: "none" (masked LM only, as XLNet and
RoBERTa), "nsp" (BERT's next-sentence prediction: segment B from a random
other document half of the time) and "sop" (ALBERT's sentence-order
prediction: the two segments swapped half of the time). Each trial prepares
its own instances in its workdir. Under "nsp" the eval column
`eval_sop_accuracy` is the sentence head's accuracy on NSP pairs; under
"none" there is no sentence head and no such column.

Demo scale (CPU, bundled corpus, minutes a trial):

  python -m albert_jax.tools.sweep experiments/ablate_sentence_objective.py \
      --workdir_root=/tmp/ablate_objective
  python -m albert_jax.tools.report /tmp/ablate_objective/*/ \
      --out=/tmp/ablate_objective

Paper scale (ALBERT-base; give your corpus after `--`):

  python -m albert_jax.tools.sweep experiments/ablate_sentence_objective.py \
      --config=configs/albert_base.py --workdir_root=gs://BUCKET/objective \
      -- --config.data.corpus=gs://BUCKET/corpus

Arguments: `quick` (30 steps a trial, evaluated every 10: a smoke run).
"""

from albert_jax.tools import sweep

CONFIG = sweep.ABLATION_CONFIG


def get_sweep(arg=None):
  return sweep.ablation(
      arg, sweep.axis("config.data.objective", ["none", "nsp", "sop"]))
