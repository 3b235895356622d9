"""The pre-training heads that sit on the encoder's output.

- `MLMHead`: ALBERT's / BERT's masked-LM decoder, tied to the word table;
  also ELECTRA's generator head.
- `RTDHead`: ELECTRA's replaced-token-detection discriminator head.
- `LMHead`: GPT-1's next-token decoder, tied to the word table.

`models.Albert` builds them under the names "mlm", "rtd" and "lm" (its
"sop" head is a single Dense on the pooler, built there); `models`
re-exports every name here.

Shapes: B batch, T sequence, H hidden, E embedding, V vocab, P predictions.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import flax.linen as nn
import jax
import jax.numpy as jnp

from albert_jax import layers
from albert_jax.model_config import ModelConfig

if TYPE_CHECKING:  # models imports this module; the type is for readers.
  from albert_jax.models import Embeddings


def gather_positions(x: jax.Array, positions: jax.Array) -> jax.Array:
  """[B, T, H] at [B, P] int positions → [B, P, H]."""
  return jnp.take_along_axis(x, positions[..., None].astype(jnp.int32), axis=1)


class MLMHead(nn.Module):
  """dense H→E → activation → LayerNorm → x·Wordᵀ + output_bias."""
  config: ModelConfig

  @nn.compact
  def __call__(self, x, embeddings: Embeddings):
    """[..., H] → [..., V], tied to `embeddings`' word table."""
    cfg = self.config
    y = layers.Dense((cfg.embedding_size,), ("embed", "embedding"),
                     init_range=cfg.initializer_range,
                     dtype=cfg.compute_dtype,
                     param_dtype=cfg.parameter_dtype, name="transform")(x)
    y = layers.activation(cfg.mlm_activation)(y)
    y = layers.LayerNorm(cfg.layer_norm_eps, axis_name="embedding",
                         dtype=cfg.compute_dtype,
                         param_dtype=cfg.parameter_dtype,
                         name="layer_norm")(y)
    logits = embeddings.attend(y)
    bias = self.param("output_bias",
                      nn.with_logical_partitioning(nn.initializers.zeros,
                                                   ("vocab",)),
                      (cfg.vocab_size,), cfg.parameter_dtype)
    return logits + bias.astype(logits.dtype)


class RTDHead(nn.Module):
  """ELECTRA's discriminator: dense H→H → activation → dense H→1."""
  config: ModelConfig

  @nn.compact
  def __call__(self, x):
    """[B, T, H] → [B, T] logits that each token was replaced."""
    cfg = self.config
    kw = dict(init_range=cfg.initializer_range, dtype=cfg.compute_dtype,
              param_dtype=cfg.parameter_dtype)
    y = layers.Dense((cfg.hidden_size,), ("embed", "embed_out"),
                     name="transform", **kw)(x)
    y = layers.activation(cfg.hidden_act)(y)
    y = layers.Dense((1,), ("embed_out", "classes"), name="output", **kw)(y)
    return y[..., 0]


class LMHead(nn.Module):
  """GPT-1's next-token decoder: logits = h·Wordᵀ, tied to the word table.

  GPT-1 decodes the last block's output directly (no transform, no bias).
  With ALBERT's factorised embedding (an E→H projection) the hidden state is
  first mapped back H→E by a learned linear layer: the table is [V, E], and
  the transpose of the input projection would tie the output to a map that
  was learned for the other direction.
  """
  config: ModelConfig

  @nn.compact
  def __call__(self, x, embeddings: Embeddings):
    """[..., H] → [..., V]."""
    cfg = self.config
    if cfg.embedding_projection:
      x = layers.Dense((cfg.embedding_size,), ("embed", "embedding"),
                       init_range=cfg.initializer_range,
                       dtype=cfg.compute_dtype,
                       param_dtype=cfg.parameter_dtype, name="transform")(x)
    return embeddings.attend(x)
