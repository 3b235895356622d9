"""Pieces shared by the Pallas TPU flash-attention kernels.

Per-row values (running max, normaliser, log-sum-exp, segment ids) live in
VMEM as [rows, 128] tiles with the value repeated across the 128 lanes, and
per-column values as [8, cols] tiles repeated across the 8 sublanes: both
are whole (8, 128) vreg tiles, so broadcasting them against a [rows, cols]
block is a lane tile or a sublane slice, never a relayout.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

LANES = 128
SUBLANES = 8
# Finite: a masked logit must not make max() or exp() produce inf - inf.
MASK_VALUE = -0.7 * float(jnp.finfo(jnp.float32).max)
# Contract the last dimension of both operands: x @ yᵀ without a transpose.
NT_DIMS = (((1,), (1,)), ((), ()))


class Static(NamedTuple):
  """Compile-time parameters of one attention call (hashable)."""
  scale: float
  masked: bool
  blocks: Any  # flash_tpu._Blocks
  interpret: Any  # None or pltpu.InterpretParams


def lanes(x: jax.Array, width: int) -> jax.Array:
  """[rows, LANES] lane-replicated values → [rows, width]."""
  if width == LANES:
    return x
  if width < LANES:
    return x[:, :width]
  return jnp.tile(x, (1, width // LANES))


def lane_layout(x: jax.Array) -> jax.Array:
  """[..., T] → [..., T, LANES]: one row per position, repeated on lanes."""
  return lax.broadcast_in_dim(x, (*x.shape, LANES), tuple(range(x.ndim)))


def sublane_layout(x: jax.Array) -> jax.Array:
  """[B, ..., T] → [B, ..., SUBLANES, T]: positions on lanes."""
  shape = (*x.shape[:-1], SUBLANES, x.shape[-1])
  dims = (*range(x.ndim - 1), x.ndim)
  return lax.broadcast_in_dim(x, shape, dims)


def segment_mask(row_ids: jax.Array, col_ids: jax.Array,
                 num_cols: int) -> jax.Array:
  """Which (row, col) pairs attend: equal ids, and not padding (id 0).

  Args:
    row_ids: [rows, LANES] lane-replicated ids of the block's rows.
    col_ids: [1, num_cols] ids of the block's columns.
    num_cols: width of the block, a multiple of LANES.

  Returns:
    [rows, num_cols] bool.
  """
  rows = jnp.tile(row_ids, (1, num_cols // LANES))
  return (rows == col_ids) & (col_ids != 0)


def block_ranges(ids: jax.Array, block: int) -> tuple[jax.Array, jax.Array]:
  """Smallest and largest non-padding id of every block of `block` positions.

  Args:
    ids: [batch, length] int32, length a multiple of `block`.
    block: positions per block.

  Returns:
    (lo, hi), each [batch * length // block] int32 (flat, for SMEM), block
    n of row b at b * (length // block) + n. A block of padding only gets
    lo > hi, so it meets nothing.
  """
  batch, length = ids.shape
  blocks = ids.reshape(batch, length // block, block)
  valid = blocks != 0
  info = jnp.iinfo(jnp.int32)
  lo = jnp.min(jnp.where(valid, blocks, info.max), axis=-1)
  hi = jnp.max(jnp.where(valid, blocks, info.min), axis=-1)
  return lo.reshape(-1), hi.reshape(-1)


def blocks_meet(q_lo, q_hi, kv_lo, kv_hi, q_index, kv_index) -> jax.Array:
  """Whether a query block and a key block can share a segment id.

  Equal ids need overlapping [lo, hi] ranges, so disjoint ranges prove the
  whole [block_q, block_kv] tile masked; overlapping ones are computed.
  The refs are the SMEM-prefetched outputs of `block_ranges`.
  """
  return ((q_lo[q_index] <= kv_hi[kv_index])
          & (kv_lo[kv_index] <= q_hi[q_index]))
