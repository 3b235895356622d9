r"""ALBERT-xxlarge: 223M parameters, the paper's best model.

12 layers, H=4096, 64 heads, FFN 16384, E=128, every layer shared. Fewer
stored parameters than BERT-large but ~7.5x its training FLOPs per token:
the one shared layer is very wide and still runs 12 times.

Argument (`:k=v` after the file name): `version=1|2` (default 2). The two
model sections are the same: the paper found dropout hurt xxlarge, so
neither release uses it, and both were trained with gelu_new (tanh), the
official code's "gelu" (HF's v1 config.json files say "gelu", the erf form;
see config_lib.albert_model). v2 differs in its training data and length.

  python -m albert_jax.tools.summary --config=configs/albert_xxlarge.py
  python -m albert_jax.tools.summary --config=configs/albert_xxlarge.py:version=1
"""

from albert_jax import config_lib


def get_config(arg=None):
  args = config_lib.parse_arg(arg, version=2)
  return config_lib.base_config(
      config_lib.albert_model("xxlarge", args.version))
