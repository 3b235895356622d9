"""Setup shared by the TPU and GPU flash-attention kernels: segment ids.

Both kernels take the model's optional segment ids, pad the sequences to
whole blocks, and give the padding segment id 0 so that it meets nothing.
The per-backend pieces (tile layouts, specs, masks inside a tile) live in
`flash_tpu_common` and `flash_gpu_common`.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp


class SegmentIds(NamedTuple):
  """Padded segment ids of one call.

  Attributes:
    q: [batch, q_len + q_pad] int32, 0 = padding.
    kv: [batch, kv_len + kv_pad] int32.
    masked: whether any (query, key) pair can be masked by ids or padding;
      False lets the kernels drop the segment mask altogether.
  """
  q: jax.Array
  kv: jax.Array
  masked: bool


def padded_segment_ids(q_segment_ids: jax.Array | None,
                       kv_segment_ids: jax.Array | None, batch: int,
                       q_len: int, kv_len: int, q_pad: int,
                       kv_pad: int) -> SegmentIds:
  """The kernels' segment ids: defaults filled in, padding appended as id 0.

  Args:
    q_segment_ids: [batch, q_len] int, 0 = padding; None = one segment.
    kv_segment_ids: [batch, kv_len] int; None = `q_segment_ids`.
    batch, q_len, kv_len: the unpadded shapes.
    q_pad, kv_pad: positions appended to each sequence.

  Returns:
    `SegmentIds` for the padded sequences.
  """
  if kv_segment_ids is None:
    kv_segment_ids = q_segment_ids
  if (q_segment_ids is None) != (kv_segment_ids is None):
    raise ValueError("Give segment ids for both queries and keys or neither.")
  # Without ids and padding no pair is masked: the kernels drop the mask.
  masked = q_segment_ids is not None or bool(q_pad) or bool(kv_pad)
  if q_segment_ids is None:
    q_segment_ids = jnp.ones((batch, q_len), jnp.int32)
    kv_segment_ids = jnp.ones((batch, kv_len), jnp.int32)
  q_ids = jnp.pad(q_segment_ids.astype(jnp.int32), ((0, 0), (0, q_pad)))
  kv_ids = jnp.pad(kv_segment_ids.astype(jnp.int32), ((0, 0), (0, kv_pad)))
  return SegmentIds(q_ids, kv_ids, masked)
