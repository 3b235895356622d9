r"""Factorised embedding size, the ALBERT paper's Table 3.

Embedding width E × cross-layer sharing (not shared, all shared). Below the
hidden width H the vocabulary is embedded in E dimensions and projected to H
(ALBERT's factorisation); the last trial of each half sets E = H with no
projection, as BERT (the official ALBERT code also drops the projection
when E = H).

The widths depend on H, so the scale is an argument here and the base
config must match it (the trials of one scale are invalid on the other's
model, which `--config` alone cannot tell):

  # Demo scale (CPU, bundled corpus; H=128, E = 16, 32, 64, 128):
  python -m albert_jax.sweep experiments/ablate_embedding.py \
      --workdir_root=/tmp/ablate_embedding
  python -m albert_jax.report /tmp/ablate_embedding/*/ \
      --out=/tmp/ablate_embedding

  # Paper scale (ALBERT-base; H=768, E = 64, 128, 256, 768; your corpus
  # after `--`):
  python -m albert_jax.sweep experiments/ablate_embedding.py:paper \
      --config=configs/albert_base.py --workdir_root=gs://BUCKET/embedding \
      -- --config.data.corpus=gs://BUCKET/corpus

Arguments: `paper` (the paper's widths, for configs/albert_base.py), `quick`
(30 steps a trial, evaluated every 10: a smoke run).
"""

from albert_jax import config_lib
from albert_jax import sweep

CONFIG = "configs/demo.py:steps=400,finetune_steps=0"
QUICK = {"config.num_train_steps": 30, "config.optimizer.warmup_steps": 3,
         "config.eval_every_steps": 10}
# (factorised widths, H) of each scale's base model.
WIDTHS = {"demo": ((16, 32, 64), 128), "paper": ((64, 128, 256), 768)}


def get_sweep(arg=None):
  args = config_lib.parse_arg(arg, paper=False, quick=False)
  factorised, hidden = WIDTHS["paper" if args.paper else "demo"]
  sizes = sweep.chain(
      sweep.product(sweep.axis("config.model.embedding_size", factorised),
                    sweep.fixed({"config.model.embedding_projection": True})),
      sweep.fixed({"config.model.embedding_size": hidden,
                   "config.model.embedding_projection": False}))
  return sweep.product(
      sweep.axis("config.model.share", ["none", "all"]), sizes,
      sweep.fixed(QUICK if args.quick else {}))
