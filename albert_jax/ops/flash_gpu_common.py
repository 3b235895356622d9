"""Pieces shared by the Mosaic GPU flash-attention kernels."""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import jax
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu
import jax.numpy as jnp

LOG2E = math.log2(math.e)
# Finite: a masked logit must not make max() or exp2() produce inf - inf.
MASK_VALUE = -0.7 * float(jnp.finfo(jnp.float32).max)


class Static(NamedTuple):
  """Compile-time parameters of one attention call (hashable)."""
  scale: float
  masked: bool
  sizes: Any  # flash_gpu.BlockSizes


def row_spec(block: int, head_dim: int) -> plgpu.BlockSpec:
  """Pipeline spec of [length, head_dim] rows, `block` rows per step."""
  return plgpu.BlockSpec(block_shape=(block, head_dim),
                         index_map=lambda i: (i, 0))


def vector_spec(block: int) -> plgpu.BlockSpec:
  """Pipeline spec of a [length] vector (ids, lse, delta) per step."""
  return plgpu.BlockSpec(block_shape=(block,), index_map=lambda i: (i,))


def compiler_params() -> plgpu.CompilerParams:
  # Warpgroup semantics: Mosaic GPU infers register layouts and shared-memory
  # tilings/swizzles, as in the upstream pipeline-emitter kernel.
  return plgpu.CompilerParams(
      approx_math=True,
      lowering_semantics=plgpu.LoweringSemantics.Warpgroup)


def mma(acc: jax.Array, a, b) -> jax.Array:
  """acc + a @ b on the tensor cores (WGMMA), accumulating in place.

  Args:
    acc: [m, n] float32 accumulator (registers).
    a: [m, k] array in registers or a shared-memory ref.
    b: [k, n] shared-memory ref (possibly a `plgpu.transpose_ref` view).

  Returns:
    [m, n] float32.
  """
  def accumulate(acc_ref):
    plgpu.wgmma(acc_ref, a, b)
  return pl.run_state(accumulate)(plgpu.ACC.init(acc))


def matmul(a, b, shape) -> jax.Array:
  """a @ b into a fresh float32 accumulator of `shape`."""
  def product(acc_ref):
    plgpu.wgmma(acc_ref, a, b)
    return acc_ref[...]
  return pl.run_scoped(product, plgpu.ACC(shape, jnp.float32))


def pair_mask(row_ids: jax.Array, col_ids: jax.Array,
              shape: tuple[int, int]) -> jax.Array:
  """[rows, cols] bool: equal segment ids and the column not padding (0).

  Args:
    row_ids: [rows] int32.
    col_ids: [cols] int32.
    shape: (rows, cols).
  """
  rows = lax.broadcast_in_dim(row_ids, shape, [0])
  cols = lax.broadcast_in_dim(col_ids, shape, [1])
  return (rows == cols) & (cols != 0)
