r"""BERT-large (335M parameters) as ALBERT with nothing shared or factorised.

24 layers, H=E=1024, 16 heads, FFN 4096, vocab 30522, dropout 0.1, exact
gelu: the baseline of the ALBERT paper's comparisons. No arguments.

  python -m albert_jax.tools.summary --config=configs/bert_large.py
"""

from albert_jax import config_lib


def get_config(arg=None):
  config_lib.parse_arg(arg)  # takes none; refuses a stray `:arg`
  return config_lib.base_config(config_lib.bert_model("large"))
