"""albert_jax: ALBERT and the BERT family in JAX/Flax, from pre-training to fine-tuning."""

__version__ = "0.1.0"

from albert_jax import storage as _storage  # noqa: E402  pylint: disable=g-import-not-at-top

# Before any storage layer reads its settings: tensorstore reads its endpoint
# once per process.
_storage.use_emulator_from_env()

# name → module. Loaded on first use: config files and the data tools import
# this package and should not pay for Flax, safetensors or SentencePiece.
_LAZY = {
    "Albert": "albert_jax.model.albert",
    "ModelConfig": "albert_jax.model.config",
    "load_pretrained": "albert_jax.finetune.serving.load_pretrained",
    "Pretrained": "albert_jax.interop.pretrained",
    "Tokenizer": "albert_jax.text.tokenizer",
}

__all__ = sorted(_LAZY) + ["__version__"]


def __getattr__(name):
  if name in _LAZY:
    import importlib  # pylint: disable=g-import-not-at-top
    return getattr(importlib.import_module(_LAZY[name]), name)
  raise AttributeError(f"module 'albert_jax' has no attribute {name!r}")


def __dir__():
  return __all__
