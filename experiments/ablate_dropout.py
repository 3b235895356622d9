r"""Dropout on and off, the ALBERT paper's Section 4.8 (Table 8, Figure 2b).

Two trials: hidden and attention-probability dropout both 0.1 (BERT's and
ALBERT v1's setting), then both 0 (ALBERT v2's). The paper found that
removing dropout raised MLM accuracy of its largest model, which had not
begun to overfit after 1M steps.

Demo scale (CPU, bundled corpus, minutes a trial):

  python -m albert_jax.tools.sweep experiments/ablate_dropout.py \
      --workdir_root=/tmp/ablate_dropout
  python -m albert_jax.tools.report /tmp/ablate_dropout/*/ --out=/tmp/ablate_dropout

Paper scale (ALBERT-xxlarge, as in the paper; give your corpus after `--`):

  python -m albert_jax.tools.sweep experiments/ablate_dropout.py \
      --config=configs/albert_xxlarge.py --workdir_root=gs://BUCKET/dropout \
      -- --config.data.corpus=gs://BUCKET/corpus

Arguments: `quick` (30 steps a trial, evaluated every 10: a smoke run).
"""

from albert_jax.tools import sweep

CONFIG = sweep.ABLATION_CONFIG


def get_sweep(arg=None):
  return sweep.ablation(arg, sweep.zip_(
      {"config.model.hidden_dropout_prob": [0.1, 0.0],
       "config.model.attention_probs_dropout_prob": [0.1, 0.0]}))
