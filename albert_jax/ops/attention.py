"""Scaled dot-product attention behind one entry point.

Every attention call in the model goes through `dot_product_attention`, so a
kernel can be swapped in by name (`model.attention_impl`) without touching the
model. Masking is expressed with segment ids rather than an additive mask:
id 0 is padding, and a query attends to the keys that carry its own id. That
one convention covers padded batches and packed sequences alike, and it is the
form flash kernels take.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

# "xla" is the reference every other path is tested against.
IMPLEMENTATIONS = ("auto", "xla", "cudnn")


def segment_mask(q_segment_ids: jax.Array,
                 kv_segment_ids: jax.Array) -> jax.Array:
  """Boolean attention mask from segment ids.

  Args:
    q_segment_ids: [batch, q_len] int, 0 = padding.
    kv_segment_ids: [batch, kv_len] int, 0 = padding.

  Returns:
    [batch, 1, q_len, kv_len] bool, True where the query may attend the key.
  """
  q = q_segment_ids[:, :, None]
  kv = kv_segment_ids[:, None, :]
  return ((q == kv) & (kv != 0))[:, None, :, :]


def _check_shapes(q, k, v, segment_ids, kv_segment_ids):
  """Refuses mismatched inputs with a message naming every shape."""
  shapes = f"got q {q.shape}, k {k.shape}, v {v.shape}"
  if q.ndim != 4 or k.ndim != 4 or k.shape != v.shape:
    raise ValueError("q, k, v must be [batch, seq, heads, head_dim] with k "
                     f"and v of one shape; {shapes}.")
  if (q.shape[0], q.shape[2:]) != (k.shape[0], k.shape[2:]):
    raise ValueError("q, k, v must agree in batch, heads and head_dim; "
                     f"{shapes}.")
  if segment_ids is None:
    if kv_segment_ids is not None:
      raise ValueError("kv_segment_ids needs segment_ids (the queries' ids).")
    return
  if segment_ids.shape != q.shape[:2]:
    raise ValueError(f"segment_ids must be [batch, q_len] = {q.shape[:2]}, "
                     f"got {segment_ids.shape}.")
  kv_ids = segment_ids if kv_segment_ids is None else kv_segment_ids
  if kv_ids.shape != k.shape[:2]:
    name = "segment_ids" if kv_segment_ids is None else "kv_segment_ids"
    raise ValueError(f"{name} must be [batch, kv_len] = {k.shape[:2]} for "
                     f"the keys, got {kv_ids.shape}.")


def _xla_attention(q, k, v, mask, dropout_rate, dropout_rng, deterministic):
  """Reference path: [batch, seq, heads, head_dim] in and out."""
  depth = q.shape[-1]
  logits = jnp.einsum("bqhd,bkhd->bhqk", q, k,
                      preferred_element_type=jnp.float32)
  logits = logits * (1.0 / jnp.sqrt(depth).astype(jnp.float32))
  if mask is not None:
    # finfo.min rather than -inf: a row with no valid key stays finite and is
    # zeroed below instead of turning into NaN.
    logits = jnp.where(mask, logits, jnp.finfo(jnp.float32).min)
  probs = jax.nn.softmax(logits, axis=-1)
  if mask is not None:
    probs = jnp.where(mask, probs, 0.0)
  if not deterministic and dropout_rate > 0.0:
    keep = jax.random.bernoulli(dropout_rng, 1.0 - dropout_rate, probs.shape)
    probs = jnp.where(keep, probs / (1.0 - dropout_rate), 0.0)
  probs = probs.astype(v.dtype)
  return jnp.einsum("bhqk,bkhd->bqhd", probs, v)


def _cudnn_attention(q, k, v, mask):
  return jax.nn.dot_product_attention(q, k, v, mask=mask,
                                      implementation="cudnn")


def dot_product_attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    *,
    segment_ids: jax.Array | None = None,
    kv_segment_ids: jax.Array | None = None,
    dropout_rate: float = 0.0,
    dropout_rng: jax.Array | None = None,
    deterministic: bool = True,
    impl: str = "auto",
) -> jax.Array:
  """Multi-head attention softmax(q kᵀ / √d) v with segment masking.

  Args:
    q: [batch, q_len, heads, head_dim].
    k: [batch, kv_len, heads, head_dim].
    v: [batch, kv_len, heads, head_dim].
    segment_ids: [batch, q_len] int; 0 marks padding, equal ids attend to each
      other. None means every position is valid and in one segment.
    kv_segment_ids: [batch, kv_len]; defaults to `segment_ids`.
    dropout_rate: attention-probability dropout, applied when not
      `deterministic`.
    dropout_rng: PRNG key for dropout.
    deterministic: disables dropout.
    impl: one of `IMPLEMENTATIONS`. "auto" picks the fastest correct path for
      the backend (XLA here; kernels register themselves in the attention
      issue's work).

  Returns:
    [batch, q_len, heads, head_dim] in q's dtype. Query rows whose segment id
    is 0 (or that see no valid key) are zeros.
  """
  if impl not in IMPLEMENTATIONS:
    raise ValueError(
        f"Unknown attention implementation {impl!r}; choose one of "
        f"{IMPLEMENTATIONS} (set model.attention_impl).")
  _check_shapes(q, k, v, segment_ids, kv_segment_ids)
  if kv_segment_ids is None:
    kv_segment_ids = segment_ids
  mask = None
  if segment_ids is not None:
    mask = segment_mask(segment_ids, kv_segment_ids)
  if not 0.0 <= dropout_rate < 1.0:
    raise ValueError(f"dropout_rate must be in [0, 1), got {dropout_rate}.")
  use_dropout = not deterministic and dropout_rate > 0.0
  if use_dropout and dropout_rng is None:
    raise ValueError("Attention dropout needs dropout_rng.")
  if impl == "cudnn":
    if use_dropout:
      raise ValueError(
          "impl='cudnn' has no attention dropout; use impl='xla' or set "
          "model.attention_probs_dropout_prob=0.")
    out = _cudnn_attention(q, k, v, mask)
    if mask is not None:
      # cuDNN leaves rows with no valid key undefined; the contract is zeros.
      row_valid = jnp.any(mask, axis=-1)[:, 0, :, None, None]
      out = jnp.where(row_valid, out, 0)
  else:
    out = _xla_attention(q, k, v, mask, dropout_rate, dropout_rng,
                         deterministic)
  return out.astype(q.dtype)
