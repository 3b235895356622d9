"""The pre-training heads that sit on the encoder's output.

- `MLMHead`: ALBERT's / BERT's masked-LM decoder, tied to the word table;
  also ELECTRA's generator head.
- `RTDHead`: ELECTRA's replaced-token-detection discriminator head.
- `LMHead`: GPT-1's next-token decoder, tied to the word table.

`albert.Albert` builds them under the names "mlm", "rtd" and "lm" (its
"sop" head is a single Dense on the pooler, built there). The tied heads
take the word table as anything with `attend` ([..., E] → [..., V]): the
model's `Embeddings`. Under a mesh that splits the vocabulary (tensor
parallelism) their logits have V' ≥ V columns, the table's padding
(`layers.Embed`), masked to the lowest value: zero probability, never
predicted.

Shapes: B batch, T sequence, H hidden, E embedding, V vocab, P predictions.
"""

from __future__ import annotations

from typing import Protocol

import flax.linen as nn
import jax
import jax.numpy as jnp

from albert_jax.model import layers
from albert_jax.model.config import ModelConfig


class WordTable(Protocol):
  """The tied decoder's table: `encoder.Embeddings` (or its `word_embeddings`)."""

  def attend(self, x: jax.Array) -> jax.Array:
    """[..., E] → [..., V]: x · tableᵀ."""


def gather_positions(x: jax.Array, positions: jax.Array) -> jax.Array:
  """[B, T, H] at [B, P] int positions → [B, P, H]."""
  return jnp.take_along_axis(x, positions[..., None].astype(jnp.int32), axis=1)


class MLMHead(nn.Module):
  """dense H→E → activation → LayerNorm → x·Wordᵀ + output_bias."""
  config: ModelConfig

  @nn.compact
  def __call__(self, x, embeddings: WordTable):
    """[..., H] → [..., V], tied to `embeddings`' word table."""
    cfg = self.config
    y = layers.Dense((cfg.embedding_size,), ("embed", "embedding"),
                     **cfg.layer_kwargs, name="transform")(x)
    y = layers.activation(cfg.mlm_activation)(y)
    y = layers.LayerNorm(axis_name="embedding", name="layer_norm",
                         **cfg.norm_kwargs)(y)
    logits = embeddings.attend(y)
    bias = self.param("output_bias",
                      nn.with_logical_partitioning(nn.initializers.zeros,
                                                   ("vocab",)),
                      (cfg.vocab_size,), cfg.parameter_dtype)
    if logits.shape[-1] != cfg.vocab_size:  # `layers.Embed`'s padding
      bias = jnp.pad(bias, (0, logits.shape[-1] - cfg.vocab_size))
    return layers.mask_padded_logits(logits + bias.astype(logits.dtype),
                                     cfg.vocab_size)


class RTDHead(nn.Module):
  """ELECTRA's discriminator: dense H→H → activation → dense H→1."""
  config: ModelConfig

  @nn.compact
  def __call__(self, x):
    """[B, T, H] → [B, T] logits that each token was replaced."""
    cfg = self.config
    kw = cfg.layer_kwargs
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
  def __call__(self, x, embeddings: WordTable):
    """[..., H] → [..., V]."""
    cfg = self.config
    if cfg.embedding_projection:
      x = layers.Dense((cfg.embedding_size,), ("embed", "embedding"),
                       **cfg.layer_kwargs, name="transform")(x)
    return layers.mask_padded_logits(embeddings.attend(x), cfg.vocab_size)
