"""Backward kernels of the Mosaic GPU flash attention: dq, then dk and dv.

As in the upstream FlashAttention-3 example, each kernel keeps one block of
its output rows in a compute warpgroup's registers and streams the other
sequence through a warp-specialised TMA pipeline: dq streams keys/values,
dk/dv stream queries, output cotangents, the base-2 log-sum-exp and
delta = rowsum(dO ∘ O). Probabilities are recomputed, P = 2^(s·scale·log2e
- lse), masked to exactly 0 off-segment, and dS = P ∘ (dO vᵀ - delta).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu
import jax.numpy as jnp

from albert_jax.ops.flash_gpu_common import compiler_params
from albert_jax.ops.flash_gpu_common import LOG2E
from albert_jax.ops.flash_gpu_common import matmul
from albert_jax.ops.flash_gpu_common import mma
from albert_jax.ops.flash_gpu_common import pair_mask
from albert_jax.ops.flash_gpu_common import row_spec
from albert_jax.ops.flash_gpu_common import Static
from albert_jax.ops.flash_gpu_common import vector_spec

_MEMORY_REGISTERS = 40


def _load_all(copies, barriers):
  """Starts every (gmem, smem) copy on its own barrier, then waits for all."""
  for n, (src, dst) in enumerate(copies):
    plgpu.copy_gmem_to_smem(src, dst, barriers.at[n])
  for n in range(len(copies)):
    plgpu.barrier_wait(barriers.at[n])


class _DqCarry(NamedTuple):
  acc: jax.Array  # [block_q, head_dim] float32
  lse: jax.Array  # [block_q]
  delta: jax.Array  # [block_q]
  q_ids: Any  # [block_q] int32 or None


def dq(q, k, v, q_ids, kv_ids, d_out, lse, delta, static: Static):
  """Gradient wrt q.

  Args:
    q: [batch, q_len, heads, head_dim] (padded).
    k: [batch, kv_len, heads, head_dim].
    v: [batch, kv_len, heads, head_dim].
    q_ids: [batch, q_len] int32, 0 = padding.
    kv_ids: [batch, kv_len] int32.
    d_out: [batch, q_len, heads, head_dim], cotangent of the output.
    lse: [batch, heads, q_len] float32, base-2 log-sum-exp of the forward.
    delta: [batch, heads, q_len] float32, rowsum(d_out ∘ out).
    static: the call's compile-time parameters.

  Returns:
    [batch, q_len, heads, head_dim] in q's dtype.
  """
  batch, q_len, heads, head_dim = q.shape
  kv_len = k.shape[1]
  dtype = q.dtype
  block_q, block_kv = static.sizes.block_q_dq, static.sizes.block_kv_dq
  kv_steps = kv_len // block_kv
  logit_scale = static.scale * LOG2E

  def kernel(q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, q_ids_ref,
             kv_ids_ref, dq_ref, smem, barriers):
    b, h = lax.axis_index("batch"), lax.axis_index("heads")
    q_smem, do_smem, lse_smem, delta_smem, ids_smem = smem
    rows = pl.ds(lax.axis_index("q_seq") * block_q, block_q)

    def compute_thread(run_pipeline):
      copies = [(q_ref.at[b, rows, h], q_smem),
                (do_ref.at[b, rows, h], do_smem),
                (lse_ref.at[b, h, rows], lse_smem),
                (delta_ref.at[b, h, rows], delta_smem)]
      if static.masked:
        copies.append((q_ids_ref.at[b, rows], ids_smem))
      _load_all(copies, barriers)
      carry = _DqCarry(jnp.zeros((block_q, head_dim), jnp.float32),
                       lse_smem[...], delta_smem[...],
                       ids_smem[...] if static.masked else None)
      acc = run_pipeline(carry).acc
      q_smem[...] = (acc * static.scale).astype(dtype)
      plgpu.commit_smem()
      plgpu.copy_smem_to_gmem(q_smem, dq_ref.at[b, rows, h])
      plgpu.wait_smem_to_gmem(0)

    def kv_step(_, *args):
      carry = args[-1]
      if static.masked:
        k_smem, v_smem, kv_ids_smem, k_done, v_done, ids_done = args[:-1]
      else:
        k_smem, v_smem, k_done, v_done = args[:-1]
      shape = (block_q, block_kv)
      s = matmul(q_smem, plgpu.transpose_ref(k_smem, (1, 0)), shape)
      p = jnp.exp2(s * logit_scale - lax.broadcast_in_dim(carry.lse, shape,
                                                          [0]))
      if static.masked:
        p = jnp.where(pair_mask(carry.q_ids, kv_ids_smem[...], shape), p, 0.0)
        plgpu.barrier_arrive(ids_done)
      dp = matmul(do_smem, plgpu.transpose_ref(v_smem, (1, 0)), shape)
      plgpu.barrier_arrive(v_done)
      ds = p * (dp - lax.broadcast_in_dim(carry.delta, shape, [0]))
      acc = mma(carry.acc, ds.astype(dtype), k_smem)
      plgpu.barrier_arrive(k_done)
      return carry._replace(acc=acc)

    specs = [row_spec(block_kv, head_dim)] * 2
    operands = [k_ref.at[b, :, h, :], v_ref.at[b, :, h, :]]
    if static.masked:
      specs.append(vector_spec(block_kv))
      operands.append(kv_ids_ref.at[b])
    pipeline = plgpu.emit_pipeline_warp_specialized(
        kv_step, grid=(kv_steps,),
        max_concurrent_steps=min(static.sizes.max_concurrent_steps,
                                 kv_steps),
        num_compute_wgs=1, memory_registers=_MEMORY_REGISTERS, wg_axis="wg",
        manual_consumed_barriers=True, compute_context=compute_thread,
        in_specs=specs)
    pipeline(*operands)

  smem = (plgpu.SMEM((block_q, head_dim), dtype),
          plgpu.SMEM((block_q, head_dim), dtype),
          plgpu.SMEM((block_q,), jnp.float32),
          plgpu.SMEM((block_q,), jnp.float32),
          plgpu.SMEM((block_q,), jnp.int32))
  return plgpu.kernel(
      kernel,
      out_type=jax.ShapeDtypeStruct(q.shape, dtype),
      scratch_types=(smem, plgpu.Barrier(num_barriers=5)),
      grid=(heads, q_len // block_q, batch),
      grid_names=("heads", "q_seq", "batch"),
      num_threads=2, thread_name="wg",
      compiler_params=compiler_params(),
  )(q, k, v, d_out, lse, delta, q_ids, kv_ids)


class _DkvCarry(NamedTuple):
  dk: jax.Array  # [block_kv, head_dim] float32
  dv: jax.Array  # [block_kv, head_dim] float32
  kv_ids: Any  # [block_kv] int32 or None


def dkv(q, k, v, q_ids, kv_ids, d_out, lse, delta,
        static: Static) -> tuple[jax.Array, jax.Array]:
  """Gradients wrt k and v; arguments as for `dq`.

  Works on the transposed scores sᵀ = k qᵀ [block_kv, block_q], so that
  Pᵀ dO and dSᵀ q are plain WGMMAs with the key block's rows as M.

  Returns:
    (dk, dv), each [batch, kv_len, heads, head_dim] in k's dtype.
  """
  batch, q_len, heads, head_dim = q.shape
  kv_len = k.shape[1]
  dtype = k.dtype
  block_q, block_kv = static.sizes.block_q_dkv, static.sizes.block_kv_dkv
  q_steps = q_len // block_q
  logit_scale = static.scale * LOG2E

  def kernel(q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, q_ids_ref,
             kv_ids_ref, dk_ref, dv_ref, smem, barriers):
    b, h = lax.axis_index("batch"), lax.axis_index("heads")
    k_smem, v_smem, ids_smem = smem
    rows = pl.ds(lax.axis_index("kv_seq") * block_kv, block_kv)

    def compute_thread(run_pipeline):
      copies = [(k_ref.at[b, rows, h], k_smem), (v_ref.at[b, rows, h], v_smem)]
      if static.masked:
        copies.append((kv_ids_ref.at[b, rows], ids_smem))
      _load_all(copies, barriers)
      zeros = jnp.zeros((block_kv, head_dim), jnp.float32)
      carry = run_pipeline(_DkvCarry(
          zeros, zeros, ids_smem[...] if static.masked else None))
      k_smem[...] = (carry.dk * static.scale).astype(dtype)
      v_smem[...] = carry.dv.astype(dtype)
      plgpu.commit_smem()
      plgpu.copy_smem_to_gmem(k_smem, dk_ref.at[b, rows, h])
      plgpu.copy_smem_to_gmem(v_smem, dv_ref.at[b, rows, h])
      plgpu.wait_smem_to_gmem(0)

    def q_step(_, *args):
      carry = args[-1]
      if static.masked:
        (q_smem, do_smem, lse_smem, delta_smem, q_ids_smem, q_done, do_done,
         lse_done, delta_done, ids_done) = args[:-1]
      else:
        (q_smem, do_smem, lse_smem, delta_smem, q_done, do_done, lse_done,
         delta_done) = args[:-1]
      shape = (block_kv, block_q)
      st = matmul(k_smem, plgpu.transpose_ref(q_smem, (1, 0)), shape)
      pt = jnp.exp2(st * logit_scale
                    - lax.broadcast_in_dim(lse_smem[...], shape, [1]))
      plgpu.barrier_arrive(lse_done)
      if static.masked:
        pt = jnp.where(pair_mask(carry.kv_ids, q_ids_smem[...], shape), pt,
                       0.0)
        plgpu.barrier_arrive(ids_done)
      dv = mma(carry.dv, pt.astype(dtype), do_smem)
      dpt = matmul(v_smem, plgpu.transpose_ref(do_smem, (1, 0)), shape)
      plgpu.barrier_arrive(do_done)
      dst = pt * (dpt - lax.broadcast_in_dim(delta_smem[...], shape, [1]))
      plgpu.barrier_arrive(delta_done)
      dk = mma(carry.dk, dst.astype(dtype), q_smem)
      plgpu.barrier_arrive(q_done)
      return carry._replace(dk=dk, dv=dv)

    specs = [row_spec(block_q, head_dim)] * 2 + [vector_spec(block_q)] * 2
    operands = [q_ref.at[b, :, h, :], do_ref.at[b, :, h, :], lse_ref.at[b, h],
                delta_ref.at[b, h]]
    if static.masked:
      specs.append(vector_spec(block_q))
      operands.append(q_ids_ref.at[b])
    pipeline = plgpu.emit_pipeline_warp_specialized(
        q_step, grid=(q_steps,),
        max_concurrent_steps=min(static.sizes.max_concurrent_steps, q_steps),
        num_compute_wgs=1, memory_registers=_MEMORY_REGISTERS, wg_axis="wg",
        manual_consumed_barriers=True, compute_context=compute_thread,
        in_specs=specs)
    pipeline(*operands)

  smem = (plgpu.SMEM((block_kv, head_dim), dtype),
          plgpu.SMEM((block_kv, head_dim), dtype),
          plgpu.SMEM((block_kv,), jnp.int32))
  kv_type = jax.ShapeDtypeStruct(k.shape, dtype)
  return plgpu.kernel(
      kernel,
      out_type=(kv_type, kv_type),
      scratch_types=(smem, plgpu.Barrier(num_barriers=3)),
      grid=(heads, kv_len // block_kv, batch),
      grid_names=("heads", "kv_seq", "batch"),
      num_threads=2, thread_name="wg",
      compiler_params=compiler_params(),
  )(q, k, v, d_out, lse, delta, q_ids, kv_ids)
