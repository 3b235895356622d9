"""SQuAD heads: start/end span logits, and ALBERT's official v2.0 head.

Both read `sequence_output` [N, T, H] and mask non-context tokens with the
batch's `p_mask` [N, T] (True for the query, [SEP]s and padding; [CLS] stays
open because it is the "no answer" position) at -1e30, as the official code.
Scores leave the heads in float32 whatever the compute dtype.

`SpanHead` is SQuAD v1.1's dense(2) (BERT/ALBERT `cls/squad`), also used as
the "simple" v2.0 head where the [CLS] span means "no answer".
`AlbertV2Head` is the XLNet-style head of ALBERT's `run_squad_v2`: a start
dense; an end network conditioned on the start token's feature (the gold
start in training, a start_n_top × end_n_top beam at inference); and an
answerability logit from the start-probability-weighted feature and [CLS].
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from albert_jax.model import layers
from albert_jax.model.config import ModelConfig
from albert_jax.training import objectives

NEG_INF = -1e30


def mask_logits(logits: jax.Array, p_mask: jax.Array) -> jax.Array:
  """float32 logits [..., T] with p_mask [..., T] (True/1 = masked) at -1e30."""
  return jnp.where(p_mask.astype(bool), NEG_INF, logits.astype(jnp.float32))


class SpanHead(nn.Module):
  """dense(2) on every token → masked start and end logits [N, T]."""
  config: ModelConfig

  @nn.compact
  def __call__(self, encoded: dict, batch: dict,
               deterministic: bool = True) -> dict:
    del deterministic  # the official head has no dropout
    logits = layers.Dense((2,), ("embed", "classes"), name="output",
                          **self.config.layer_kwargs)(encoded["sequence_output"])
    return {"start_logits": mask_logits(logits[..., 0], batch["p_mask"]),
            "end_logits": mask_logits(logits[..., 1], batch["p_mask"])}


class ConcatDense(nn.Module):
  """dense(concat([a, b], -1)) without materialising the concatenation.

  The kernel is the official [Ha + Hb, features] one; `a` and `b` broadcast
  against each other, so a [N, T, 1, H] sequence meets [N, 1, k, H] start
  features as [N, T, k, features] without a [N, T, k, 2H] input.
  """
  features: int
  init_range: float = 0.02
  initializer: str = "truncated_normal"
  dtype: layers.Dtype = jnp.float32
  param_dtype: layers.Dtype = jnp.float32

  @nn.compact
  def __call__(self, a: jax.Array, b: jax.Array) -> jax.Array:
    split = a.shape[-1]
    kernel = self.param(
        "kernel", nn.with_logical_partitioning(
            layers.kernel_init(self.init_range, self.initializer),
            ("embed", "embed_out")),
        (split + b.shape[-1], self.features), self.param_dtype)
    bias = self.param(
        "bias", nn.with_logical_partitioning(nn.initializers.zeros,
                                             ("embed_out",)),
        (self.features,), self.param_dtype)
    kernel = kernel.astype(self.dtype)
    ya = jnp.einsum("...h,hf->...f", a.astype(self.dtype), kernel[:split])
    yb = jnp.einsum("...h,hf->...f", b.astype(self.dtype), kernel[split:])
    return ya + yb + bias.astype(self.dtype)


class AlbertV2Head(nn.Module):
  """ALBERT's official SQuAD v2.0 head.

  Attributes:
    config: the encoder's config (hidden size, init, dtypes, LayerNorm eps,
      `classifier_dropout_prob` for the answer-class dropout).
    start_n_top, end_n_top: the inference beam.

  Outputs: always "start_logits" [N, T] and "cls_logits" [N] (answerability,
  higher = unanswerable). With "start_positions" in the batch, "end_logits"
  [N, T] conditioned on the gold start (the training loss). When
  `deterministic` (inference), or without gold starts, the beam:
  "start_top_log_probs"/"start_top_index" [N, k] and
  "end_top_log_probs"/"end_top_index" [N, k·k'], end j of start i at i·k'+j.
  """
  config: ModelConfig
  start_n_top: int = 5
  end_n_top: int = 5

  @nn.compact
  def __call__(self, encoded: dict, batch: dict,
               deterministic: bool = True) -> dict:
    cfg = self.config
    kw = cfg.layer_kwargs
    x = encoded["sequence_output"]  # [N, T, H]
    p_mask = batch["p_mask"]
    start_logits = mask_logits(
        layers.Dense((1,), ("embed", "classes"), name="start_dense",
                     **kw)(x)[..., 0], p_mask)
    end_dense = ConcatDense(cfg.hidden_size, name="end_dense_0", **kw)
    end_norm = layers.LayerNorm(**cfg.norm_kwargs,
                                name="end_layer_norm")
    end_out = layers.Dense((1,), ("embed", "classes"), name="end_dense_1",
                           **kw)

    def end_logits_given(hidden, start_features):
      h = end_norm(jnp.tanh(end_dense(hidden, start_features)))
      return end_out(h)[..., 0]

    out = {"start_logits": start_logits}
    if "start_positions" in batch:
      gold = batch["start_positions"].astype(jnp.int32)[:, None, None]
      start_features = jnp.take_along_axis(x, gold, axis=1)  # [N, 1, H]
      out["end_logits"] = mask_logits(end_logits_given(x, start_features),
                                      p_mask)
    if deterministic or "start_positions" not in batch:
      start_log_probs = jax.nn.log_softmax(start_logits, axis=-1)
      top_lp, top_index = jax.lax.top_k(start_log_probs, self.start_n_top)
      start_features = jnp.take_along_axis(x, top_index[..., None], axis=1)
      end_logits = end_logits_given(x[:, :, None, :],
                                    start_features[:, None, :, :])
      end_logits = mask_logits(jnp.swapaxes(end_logits, 1, 2),
                               p_mask[:, None, :])  # [N, k, T]
      end_lp, end_index = jax.lax.top_k(
          jax.nn.log_softmax(end_logits, axis=-1), self.end_n_top)
      n = x.shape[0]
      out.update(start_top_log_probs=top_lp, start_top_index=top_index,
                 end_top_log_probs=end_lp.reshape(n, -1),
                 end_top_index=end_index.reshape(n, -1))
    # Answerability reads no end feature, so it is one logit per window.
    start_probs = jax.nn.softmax(start_logits, axis=-1).astype(x.dtype)
    start_feature = jnp.einsum("nth,nt->nh", x, start_probs)
    h = jnp.tanh(ConcatDense(cfg.hidden_size, name="answer_dense_0", **kw)(
        start_feature, x[:, 0]))
    h = nn.Dropout(cfg.classifier_dropout_prob)(h, deterministic=deterministic)
    cls_logits = layers.Dense((1,), ("embed", "classes"), use_bias=False,
                              name="answer_dense_1", **kw)(h)[..., 0]
    out["cls_logits"] = cls_logits.astype(jnp.float32)
    return out


def span_loss(outputs: dict, batch: dict) -> jax.Array:
  """(start NLL + end NLL) / 2 per row [N], the official span loss."""
  return 0.5 * (objectives.cross_entropy(outputs["start_logits"], batch["start_positions"])
                + objectives.cross_entropy(outputs["end_logits"], batch["end_positions"]))


def answer_class_loss(outputs: dict, batch: dict) -> jax.Array:
  """Sigmoid BCE of "cls_logits" against "is_impossible", per row [N]."""
  return optax.sigmoid_binary_cross_entropy(
      outputs["cls_logits"], batch["is_impossible"].astype(jnp.float32))
