r"""Cross-layer parameter sharing, the ALBERT paper's Table 4.

One trial per `model.share`: "all" (ALBERT), "attention" (attention shared,
FFN per layer), "ffn" (the reverse) and "none" (BERT-style, every layer its
own parameters). Sharing saves parameters, never compute: every trial does
the same training FLOPs, which `python -m albert_jax.tools.report` shows beside
the parameter counts.

Demo scale (CPU, bundled corpus, minutes a trial):

  python -m albert_jax.tools.sweep experiments/ablate_sharing.py \
      --workdir_root=/tmp/ablate_sharing
  python -m albert_jax.tools.report /tmp/ablate_sharing/*/ --out=/tmp/ablate_sharing

Paper scale (ALBERT-base, E=128: the lower half of Table 4; give your corpus
after `--`):

  python -m albert_jax.tools.sweep experiments/ablate_sharing.py \
      --config=configs/albert_base.py --workdir_root=gs://BUCKET/sharing \
      -- --config.data.corpus=gs://BUCKET/corpus

Arguments: `quick` (30 steps a trial, evaluated every 10: a smoke run).
"""

from albert_jax.tools import sweep

CONFIG = sweep.ABLATION_CONFIG


def get_sweep(arg=None):
  return sweep.ablation(arg, sweep.axis(
      "config.model.share", ["all", "attention", "ffn", "none"]))
