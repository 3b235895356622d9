"""ALBERT and its BERT-family relatives: the encoder with a pooler and heads.

`Albert` is the model every objective and task builds on: the shared
encoder (`albert_jax.model.encoder`), the pooler, and whichever pre-training
heads a run needs (`albert_jax.model.heads`). BERT is `share="none"` of the
same code; GPT-1 is the same stack with `causal` attention and the tied
next-token "lm" head.

Shapes: B batch, T sequence, H hidden, E embedding, V vocab, P predictions.
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from albert_jax.model import encoder as encoder_lib
from albert_jax.model import heads as heads_lib
from albert_jax.model import layers
from albert_jax.model.config import ModelConfig

# The pre-training heads built by default; ALL_HEADS adds ELECTRA's
# replaced-token-detection head and the causal next-token head, which a model
# builds only when asked.
HEADS = ("mlm", "sop")
ALL_HEADS = ("mlm", "sop", "rtd", "lm")


def check_right_padded(attention_mask: Any) -> None:
  """Refuses a concrete [B, T] mask whose rows are not one sequence then
  padding (non-zero values all equal, then zeros), which `right_padded`
  promises. Inside jit the values are not known and nothing is checked.

  Raises:
    ValueError: naming the first row that breaks it.
  """
  if isinstance(attention_mask, jax.core.Tracer):
    return
  mask = np.asarray(attention_mask)
  for row, values in enumerate(mask):
    length = int(np.count_nonzero(values))
    real = values[:length]
    if np.any(values[length:] != 0) or (length and np.any(real != real[0])):
      raise ValueError(
          f"right_padded=True, but row {row} of attention_mask is not one "
          f"sequence followed by padding ({values.tolist()}); pass "
          "right_padded=False for packed or left-padded rows.")


def check_ids(input_ids: Any, vocab_size: int,
              name: str = "input_ids") -> None:
  """Refuses token ids the embedding would silently clip or misread: not
  [B, T], not integers, or (when the values are known, outside jit)
  outside [0, vocab_size). A JAX gather clips an out-of-range id to the
  last row instead of failing, so a tokenizer larger than the model would
  otherwise give wrong results without an error.

  Raises:
    ValueError: naming the problem and the fix.
  """
  shape = getattr(input_ids, "shape", None)
  dtype = getattr(input_ids, "dtype", None)
  if shape is None or len(shape) != 2:
    raise ValueError(
        f"{name} must be [batch, seq] token ids, got shape {shape}; add a "
        "batch axis for one sequence (ids[None]).")
  if not jnp.issubdtype(dtype, jnp.integer):
    raise ValueError(f"{name} must be integer token ids, got dtype {dtype}; "
                     "tokenize the text first (Tokenizer.encode).")
  if isinstance(input_ids, jax.core.Tracer) or not shape[0] * shape[1]:
    return  # inside jit: the values are not known here
  # numpy, not jnp: inside a trace even a concrete array's jnp.min is traced.
  values = np.asarray(input_ids)
  low, high = int(values.min()), int(values.max())
  if low < 0 or high >= vocab_size:
    raise ValueError(
        f"{name} holds ids in [{low}, {high}] but the model's vocabulary has "
        f"{vocab_size} entries ([0, {vocab_size - 1}]); use the tokenizer the "
        "model was trained with.")


class Albert(nn.Module):
  """The encoder with its pooler and pre-training heads.

  Attributes:
    config: the model's hyperparameters.
    pooler: build the pooler (dense + tanh) of the [CLS] token, or of the
      last non-padding token in a causal model (position 0 of a causal
      model has seen only itself; GPT-1 classifies from the final token).
    heads: which of "mlm" (tied masked-LM head), "sop" (2-way sentence
      head on the pooler: SOP for ALBERT, NSP for BERT), "rtd" (ELECTRA's
      per-token replaced-token detection) and "lm" (a causal model's tied
      next-token head) to build.
  """
  config: ModelConfig
  pooler: bool = True
  heads: tuple[str, ...] = HEADS

  def setup(self):
    unknown = set(self.heads) - set(ALL_HEADS)
    if unknown:
      raise ValueError(
          f"Unknown heads {sorted(unknown)}; choose from {ALL_HEADS}.")
    if "sop" in self.heads and not self.pooler:
      raise ValueError("The 'sop' head reads the pooled output; keep pooler.")
    self.config.check_heads(self.heads)

  @nn.compact
  def __call__(self,
               input_ids: jax.Array,
               token_type_ids: jax.Array | None = None,
               attention_mask: jax.Array | None = None,
               position_ids: jax.Array | None = None,
               masked_positions: jax.Array | None = None,
               deterministic: bool = True,
               right_padded: bool = False,
               cls_positions: jax.Array | None = None) -> dict[str, Any]:
    """Runs the model.

    Args:
      input_ids: [B, T] int token ids.
      token_type_ids: [B, T] segment A/B ids (default zeros).
      attention_mask: [B, T] int; 0 = padding. Values > 1 mark packed
        sequences: a token attends only to tokens with the same value.
      position_ids: [B, T] (default `encoder.position_ids`: 0..T-1, or
        RoBERTa's counted over the real tokens with
        `config.position_ids_from_padding`; restart them per packed
        sequence).
      masked_positions: [B, P] int. If given, MLM logits are computed only
        at these positions ([B, P, V]); otherwise at all positions.
      deterministic: False enables dropout (needs the "dropout" rng).
      right_padded: the promise that every row of `attention_mask` is one
        sequence then padding (1…1 0…0), as the pre-training loader and the
        fine-tuning features write them: attention may then take row
        lengths instead of a mask (cuDNN's padding mask). Checked when the
        mask's values are known (outside jit).
      cls_positions: [B, K] int, the [CLS] of each packed sequence: the
        pooler and the "sop" head then read every one of them
        ("pooled_output" [B, K, H], "sop_logits" [B, K, 2]). Default: the
        row's first token (or a causal model's last).

    Returns:
      dict with "sequence_output" [B, T, H], and where built
      "pooled_output" [B, H], "mlm_logits" [B, T or P, V], "sop_logits" [B, 2],
      "rtd_logits" [B, T], "lm_logits" [B, T, V] (position t's scores for
      token t + 1).
    """
    cfg = self.config
    check_ids(input_ids, cfg.vocab_size)
    batch, length = input_ids.shape
    if length > cfg.max_length:
      if cfg.position_ids_from_padding:
        raise ValueError(
            f"Sequence length {length} exceeds {cfg.max_length}: positions "
            f"from padding start at pad_token_id + 1 = "
            f"{cfg.pad_token_id + 1}, and max_position_embeddings is "
            f"{cfg.max_position_embeddings}.")
      raise ValueError(
          f"Sequence length {length} exceeds max_position_embeddings "
          f"{cfg.max_position_embeddings}.")
    if token_type_ids is None:
      token_type_ids = jnp.zeros_like(input_ids)
    if position_ids is None:
      # From the ids, as transformers counts them (a real token equal to the
      # pad id is skipped); the masked-LM objective passes its own.
      position_ids = encoder_lib.position_ids(cfg, input_ids)
    if attention_mask is None:
      attention_mask = jnp.ones_like(input_ids)
    if right_padded:
      check_right_padded(attention_mask)
    segment_ids = attention_mask.astype(jnp.int32)

    embeddings = encoder_lib.Embeddings(cfg, name="embeddings")
    x = embeddings(input_ids, token_type_ids, position_ids, deterministic)
    x = encoder_lib.Encoder(cfg, name="encoder")(x, segment_ids,
                                                 deterministic, right_padded)
    out = {"sequence_output": x}
    if self.pooler:
      if cls_positions is not None:
        summary = heads_lib.gather_positions(x, cls_positions)
      elif cfg.causal:
        summary = jnp.take_along_axis(
            x, encoder_lib.last_token_index(attention_mask)[:, None, None],
            axis=1)[:, 0]
      else:
        summary = x[:, 0]
      pooled = layers.Dense((cfg.hidden_size,), ("embed", "embed_out"),
                            name="pooler", **cfg.layer_kwargs)(summary)
      out["pooled_output"] = jnp.tanh(pooled)
    if "mlm" in self.heads:
      hidden = x if masked_positions is None else heads_lib.gather_positions(
          x, masked_positions)
      out["mlm_logits"] = heads_lib.MLMHead(cfg, name="mlm")(hidden,
                                                             embeddings)
    if "sop" in self.heads:
      out["sop_logits"] = layers.Dense(
          (cfg.num_sentence_labels,), ("embed", "classes"), name="sop",
          **cfg.layer_kwargs)(out["pooled_output"])
    if "rtd" in self.heads:
      out["rtd_logits"] = heads_lib.RTDHead(cfg, name="rtd")(x)
    if "lm" in self.heads:
      out["lm_logits"] = heads_lib.LMHead(cfg, name="lm")(x, embeddings)
    return out


def abstract_params(cfg: ModelConfig, pooler: bool = True,
                    heads: tuple[str, ...] = HEADS) -> Any:
  """The unboxed parameters of `Albert(cfg, pooler, heads)` as
  ShapeDtypeStructs: traced for shapes only, nothing allocated."""
  module = Albert(cfg, pooler=pooler, heads=tuple(heads))
  shapes = jax.eval_shape(module.init, jax.random.key(0),
                          jnp.zeros((1, 1), jnp.int32))
  return nn.meta.unbox(shapes["params"])
