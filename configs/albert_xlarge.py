r"""ALBERT-xlarge: 59M parameters, twice BERT-large's width.

24 layers, H=2048, 16 heads, FFN 8192, E=128, every layer shared.

Argument (`:k=v` after the file name): `version=1|2` (default 2). v1 has
dropout 0.1, v2 none, as released; both use gelu_new (tanh), the official
code's "gelu" that both releases were trained with (HF's v1 config.json
files say "gelu", the erf form; see config_lib.albert_model).

  python -m albert_jax.tools.summary --config=configs/albert_xlarge.py
  python -m albert_jax.tools.summary --config=configs/albert_xlarge.py:version=1
"""

from albert_jax import config_lib


def get_config(arg=None):
  args = config_lib.parse_arg(arg, version=2)
  return config_lib.base_config(
      config_lib.albert_model("xlarge", args.version))
