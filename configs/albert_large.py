r"""ALBERT-large: 18M parameters, BERT-large's shape with one shared layer.

24 layers, H=1024, 16 heads, FFN 4096, E=128, every layer shared.

Argument (`:k=v` after the file name): `version=1|2` (default 2). v1 has
dropout 0.1 and exact gelu; v2 no dropout and gelu_new (tanh), as released.

  python -m albert_jax.tools.summary --config=configs/albert_large.py
  python -m albert_jax.tools.summary --config=configs/albert_large.py:version=1
"""

from albert_jax import config_lib


def get_config(arg=None):
  args = config_lib.parse_arg(arg, version=2)
  return config_lib.base_config(config_lib.albert_model("large", args.version))
