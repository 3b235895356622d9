r"""BERT-base (110M parameters): ALBERT with nothing shared or factorised.

12 layers, H=E=768, 12 heads, FFN 3072, vocab 30522, dropout 0.1, exact
gelu. Argument `recipe=bert|albert` (default bert):
  bert    BERT's own pre-training: masked LM + next-sentence prediction,
          single-token masking, Adam (official, no bias correction) at 1e-4
          with 10k warmup, batch 256 × 512, 1M steps
          (config_lib.bert_config). Prepare its data with
          `--objective nsp`.
  albert  the ALBERT paper's BERT baseline: ALBERT's recipe (n-gram masking,
          SOP, LAMB at 0.00176, batch 4096, 125k steps).

  python -m albert_jax.tools.summary --config=configs/bert_base.py
  python -m albert_jax.main --config=configs/bert_base.py:recipe=albert \
      --workdir=/tmp/bert_base
"""

from albert_jax import config_lib


def get_config(arg=None):
  args = config_lib.parse_arg(arg, recipe="bert")
  return config_lib.bert_config("base", args.recipe)
