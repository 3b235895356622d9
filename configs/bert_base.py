r"""BERT-base (110M parameters) as ALBERT with nothing shared or factorised.

12 layers, H=E=768, 12 heads, FFN 3072, vocab 30522, dropout 0.1, exact
gelu: the baseline of the ALBERT paper's comparisons. No arguments.

  python -m albert_jax.tools.summary --config=configs/bert_base.py
"""

from albert_jax import config_lib


def get_config(arg=None):
  config_lib.parse_arg(arg)  # takes none; refuses a stray `:arg`
  return config_lib.base_config(config_lib.bert_model("base"))
