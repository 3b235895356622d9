r"""Factorised embedding size, the ALBERT paper's Table 3.

Embedding width E × cross-layer sharing (not shared, all shared). Below the
hidden width H the vocabulary is embedded in E dimensions and projected to H
(ALBERT's factorisation); the last trial of each half sets E = H with no
projection, as BERT (the official ALBERT code also drops the projection
when E = H).

The widths follow the base config's H (the sweep reads it), so the base
config alone sets the scale, as in the other ablations:

  # Demo scale (CPU, bundled corpus; H=128, E = 16, 32, 64, 128):
  python -m albert_jax.tools.sweep experiments/ablate_embedding.py \
      --workdir_root=/tmp/ablate_embedding
  python -m albert_jax.tools.report /tmp/ablate_embedding/*/ \
      --out=/tmp/ablate_embedding

  # Paper scale (ALBERT-base; H=768, E = 64, 128, 256, 768; your corpus
  # after `--`):
  python -m albert_jax.tools.sweep experiments/ablate_embedding.py \
      --config=configs/albert_base.py --workdir_root=gs://BUCKET/embedding \
      -- --config.data.corpus=gs://BUCKET/corpus

Arguments: `quick` (30 steps a trial, evaluated every 10: a smoke run).
"""

from albert_jax.tools import sweep

CONFIG = sweep.ABLATION_CONFIG
# The factorised widths E below each base model's hidden width H: the demo's
# and Table 3's ALBERT-base.
WIDTHS = {128: (16, 32, 64), 768: (64, 128, 256)}


def get_sweep(arg=None, *, base):
  hidden = base.model.hidden_size
  if hidden not in WIDTHS:
    raise ValueError(
        f"The base config's model.hidden_size is {hidden}; this sweep knows "
        f"the embedding widths for H in {sorted(WIDTHS)} (the demo's and "
        "ALBERT-base's). Use one of those configs, or add H's widths to "
        "WIDTHS in experiments/ablate_embedding.py.")
  sizes = sweep.chain(
      sweep.product(sweep.axis("config.model.embedding_size", WIDTHS[hidden]),
                    sweep.fixed({"config.model.embedding_projection": True})),
      sweep.fixed({"config.model.embedding_size": hidden,
                   "config.model.embedding_projection": False}))
  return sweep.ablation(
      arg, sweep.axis("config.model.share", ["none", "all"]), sizes)
