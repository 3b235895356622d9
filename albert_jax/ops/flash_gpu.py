"""Flash attention for Hopper GPUs as Pallas Mosaic GPU kernels, with segment
ids.

The design follows JAX's FlashAttention-3 example
(`jax.experimental.pallas.ops.gpu.attention_mgpu`, its pipeline-emitter
variant): a thread block owns 2 x block_q query rows, one compute warpgroup
per block_q rows, and a third warpgroup streams key/value blocks into shared
memory through TMA (`emit_pipeline_warp_specialized`). Scores and products
are WGMMA; the softmax runs in base 2 with the scale folded into one
multiply. The two compute warpgroups take turns on the tensor cores
(a schedule barrier) so that one's softmax overlaps the other's matmuls.

Added here: segment ids (0 = padding, equal ids attend), streamed next to
the keys and compared in registers, with masked probabilities set to exactly
0 so rows that see no key give zeros; a `jax.custom_vjp` whose backward is a
dq kernel and a dk/dv kernel (the upstream backward hard-codes float16);
sequence padding to whole blocks; the 1/√head_dim scale.

The kernels work on the model's [batch, seq, heads, head_dim] layout
directly: TMA reads a (block, head_dim) tile at any head with one strided
copy, so no transpose is needed.

Testing without a GPU: JAX 0.10.2 has a GPU interpret mode (private,
`jax._src.pallas.mosaic_gpu.interpret`), but it cannot run flash attention:
it has no `pl.run_state` (WGMMA accumulation into a live accumulator), no
transposed WGMMA operands (`plgpu.transpose_ref`, needed for q kᵀ) and no
WGMMA operand from registers (P @ v). So on CPU the kernels are lowered for
CUDA (Pallas → Mosaic GPU, layout inference included) without running, and
run against the XLA path only where a Hopper GPU is present.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, NamedTuple

import jax
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu
import jax.numpy as jnp

from albert_jax.ops import flash_gpu_bwd
from albert_jax.ops.flash_common import padded_segment_ids
from albert_jax.ops.flash_gpu_common import compiler_params
from albert_jax.ops.flash_gpu_common import LOG2E
from albert_jax.ops.flash_gpu_common import MASK_VALUE
from albert_jax.ops.flash_gpu_common import mma
from albert_jax.ops.flash_gpu_common import pair_mask
from albert_jax.ops.flash_gpu_common import row_spec
from albert_jax.ops.flash_gpu_common import Static
from albert_jax.ops.flash_gpu_common import vector_spec

SUPPORTED_DTYPES = (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))
SUPPORTED_HEAD_DIMS = (64, 128)
_COMPUTE_WGS = 2  # forward: two compute warpgroups per thread block


@dataclasses.dataclass(frozen=True)
class BlockSizes:
  """Tile sizes and pipelining of the Mosaic GPU kernels.

  Attributes:
    block_q: forward, query rows per compute warpgroup (a thread block has
      two); multiple of 64.
    block_kv: forward, keys per pipeline step; multiple of 64.
    max_concurrent_steps: pipeline depth (shared-memory buffers per input).
    block_q_dq: dq kernel, query rows per thread block.
    block_kv_dq: dq kernel, keys per pipeline step.
    block_q_dkv: dk/dv kernel, queries per pipeline step.
    block_kv_dkv: dk/dv kernel, key rows per thread block.
    use_schedule_barrier: alternate the forward's two compute warpgroups on
      the tensor cores.

  The backward's tiles are the fastest of a sweep on an H200 (experiments/
  benchmarks/flash_gpu_blocks.py, 2026-11-28; BENCHMARKS.md "On an H200"):
  128 query rows in both backward kernels, forward + backward 263 → 298
  TFLOP/s at seq 2048 without a mask and 165 → 186 at seq 512 with padded
  rows (64 everywhere before), the best of the 16 backward candidates at
  both lengths. The forward's are unchanged: its best at seq 512 (block_q
  128, 8% faster) pads sequences to 256, which costs more at 128 and 384.
  """
  block_q: int = 64
  block_kv: int = 128
  max_concurrent_steps: int = 2
  block_q_dq: int = 128
  block_kv_dq: int = 64
  block_q_dkv: int = 128
  block_kv_dkv: int = 64
  use_schedule_barrier: bool = True

  def __post_init__(self):
    for name in ("block_q", "block_kv", "block_q_dq", "block_kv_dq",
                 "block_q_dkv", "block_kv_dkv"):
      size = getattr(self, name)
      if not isinstance(size, int) or size <= 0 or size % 64:
        raise ValueError(f"BlockSizes.{name}={size!r}: GPU block sizes must "
                         "be positive multiples of 64 (the WGMMA tile).")
    if self.max_concurrent_steps < 1:
      raise ValueError("BlockSizes.max_concurrent_steps must be at least 1, "
                       f"got {self.max_concurrent_steps}.")

  def padding_multiple(self) -> int:
    """Sequence lengths are padded to a multiple of this."""
    return math.lcm(_COMPUTE_WGS * self.block_q, self.block_kv,
                    self.block_q_dq, self.block_kv_dq, self.block_q_dkv,
                    self.block_kv_dkv)


def check_supported(q: jax.Array, k: jax.Array, v: jax.Array) -> str | None:
  """Why the kernel cannot take these inputs, or None if it can.

  Args:
    q: [batch, q_len, heads, head_dim].
    k: [batch, kv_len, heads, head_dim].
    v: [batch, kv_len, heads, head_dim].
  """
  if jax.default_backend() == "gpu":
    capability = getattr(jax.devices()[0], "compute_capability", "")
    if not str(capability).startswith("9."):
      return (f"the Mosaic GPU kernel needs a Hopper GPU (sm_90a, WGMMA); "
              f"this one has compute capability {capability}")
  head_dim = q.shape[-1]
  if head_dim not in SUPPORTED_HEAD_DIMS:
    return (f"head_dim {head_dim} is not supported by the Mosaic GPU kernel "
            f"(it takes {SUPPORTED_HEAD_DIMS}); use impl='cudnn' or 'xla'")
  dtypes = {jnp.dtype(t.dtype) for t in (q, k, v)}
  if len(dtypes) != 1 or not dtypes <= set(SUPPORTED_DTYPES):
    return (f"the Mosaic GPU kernel takes q, k, v all bfloat16 or all "
            f"float16 (WGMMA operands), got {q.dtype}, {k.dtype}, {v.dtype}")
  return None


def flash_attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    q_segment_ids: jax.Array | None = None,
    kv_segment_ids: jax.Array | None = None,
    *,
    block_sizes: BlockSizes | None = None,
) -> jax.Array:
  """softmax(q kᵀ / √head_dim) v with segment masking, as Mosaic GPU kernels.

  Runs on Hopper (sm_90a) GPUs.

  Args:
    q: [batch, q_len, heads, head_dim], bfloat16 or float16; head_dim 64 or
      128.
    k: [batch, kv_len, heads, head_dim], q's dtype.
    v: [batch, kv_len, heads, head_dim], q's dtype.
    q_segment_ids: [batch, q_len] int, 0 = padding; None = all one segment.
    kv_segment_ids: [batch, kv_len] int; defaults to `q_segment_ids`.
    block_sizes: tile sizes; None = `BlockSizes()`.

  Returns:
    [batch, q_len, heads, head_dim] in q's dtype; rows whose query sees no
    key are zeros. Differentiable in q, k and v.
  """
  reason = check_supported(q, k, v)
  if reason:
    raise ValueError(reason[0].upper() + reason[1:] + ".")
  batch, q_len, _, head_dim = q.shape
  kv_len = k.shape[1]
  sizes = block_sizes or BlockSizes()
  multiple = sizes.padding_multiple()
  q_pad, kv_pad = -q_len % multiple, -kv_len % multiple
  ids = padded_segment_ids(q_segment_ids, kv_segment_ids, batch, q_len,
                           kv_len, q_pad, kv_pad)

  def pad(x, amount):
    return jnp.pad(x, ((0, 0), (0, amount), (0, 0), (0, 0)))

  static = Static(scale=1.0 / math.sqrt(head_dim), masked=ids.masked,
                  sizes=sizes)
  out = _flash(pad(q, q_pad), pad(k, kv_pad), pad(v, kv_pad), ids.q, ids.kv,
               static)
  return out[:, :q_len]


@functools.partial(jax.custom_vjp, nondiff_argnums=(5,))
def _flash(q, k, v, q_ids, kv_ids, static):
  """Padded [B, L, H, D] attention; see `flash_attention`."""
  return _forward(q, k, v, q_ids, kv_ids, static)[0]


def _flash_fwd(q, k, v, q_ids, kv_ids, static):
  out, lse = _forward(q, k, v, q_ids, kv_ids, static)
  return out, (q, k, v, q_ids, kv_ids, out, lse)


def _flash_bwd(static, residuals, d_out):
  q, k, v, q_ids, kv_ids, out, lse = residuals
  # delta = rowsum(dO ∘ O), [B, H, Lq] with the sequence minor for 1-D TMA.
  delta = jnp.einsum("bqhd,bqhd->bhq", out.astype(jnp.float32),
                     d_out.astype(jnp.float32))
  dq = flash_gpu_bwd.dq(q, k, v, q_ids, kv_ids, d_out, lse, delta, static)
  dk, dv = flash_gpu_bwd.dkv(q, k, v, q_ids, kv_ids, d_out, lse, delta,
                             static)
  return dq, dk, dv, None, None


_flash.defvjp(_flash_fwd, _flash_bwd)


class _FwdCarry(NamedTuple):
  acc: jax.Array  # [block_q, head_dim] float32, unnormalised output
  m: jax.Array  # [block_q] running max of the base-2 logits
  l: jax.Array  # [block_q] running sum of probabilities
  q_ids: Any  # [block_q] int32 segment ids, or None


def _forward(q, k, v, q_ids, kv_ids, static: Static):
  """Runs the forward kernel: out [B, Lq, H, D] and lse [B, H, Lq] (base 2)."""
  batch, q_len, heads, head_dim = q.shape
  kv_len = k.shape[1]
  dtype = q.dtype
  sizes = static.sizes
  block_q, block_kv = sizes.block_q, sizes.block_kv
  kv_steps = kv_len // block_kv
  logit_scale = static.scale * LOG2E

  def kernel(q_ref, k_ref, v_ref, q_ids_ref, kv_ids_ref, out_ref, lse_ref,
             smem, q_barriers, ids_barriers, schedule_barrier):
    b = lax.axis_index("batch")
    h = lax.axis_index("heads")
    wg = lax.axis_index("wg")
    qo_smem2, ids_smem2, lse_smem2 = smem
    q_base = lax.axis_index("q_seq") * (_COMPUTE_WGS * block_q) + wg * block_q

    def schedule():
      if sizes.use_schedule_barrier:
        plgpu.barrier_arrive(schedule_barrier)
        plgpu.barrier_wait(schedule_barrier)

    def compute_thread(run_pipeline):
      qo_smem = qo_smem2.at[wg]
      plgpu.copy_gmem_to_smem(q_ref.at[b, pl.ds(q_base, block_q), h], qo_smem,
                              q_barriers.at[wg])
      row_ids = None
      if static.masked:
        ids_smem = ids_smem2.at[wg]
        plgpu.copy_gmem_to_smem(q_ids_ref.at[b, pl.ds(q_base, block_q)],
                                ids_smem, ids_barriers.at[wg])
        plgpu.barrier_wait(ids_barriers.at[wg])
        row_ids = ids_smem[...]
      plgpu.barrier_wait(q_barriers.at[wg])
      carry = _FwdCarry(jnp.zeros((block_q, head_dim), jnp.float32),
                        jnp.full((block_q,), -jnp.inf, jnp.float32),
                        jnp.zeros((block_q,), jnp.float32), row_ids)
      pl.when(wg == 1)(schedule)
      carry = run_pipeline(carry)
      pl.when(wg == 0)(schedule)
      seen = carry.l > 0.0
      inv = jnp.where(seen, 1.0 / jnp.where(seen, carry.l, 1.0), 0.0)
      out = carry.acc * lax.broadcast_in_dim(inv, (block_q, head_dim), [0])
      qo_smem[...] = out.astype(dtype)
      lse_smem = lse_smem2.at[wg]
      lse_smem[...] = jnp.where(
          seen, carry.m + jnp.log2(jnp.where(seen, carry.l, 1.0)), 0.0)
      plgpu.commit_smem()
      plgpu.copy_smem_to_gmem(qo_smem,
                              out_ref.at[b, pl.ds(q_base, block_q), h])
      plgpu.copy_smem_to_gmem(lse_smem, lse_ref.at[b, h, pl.ds(q_base,
                                                                block_q)])
      plgpu.wait_smem_to_gmem(0)

    def kv_step(_, *args):
      carry = args[-1]
      if static.masked:
        k_smem, v_smem, ids_smem, k_done, v_done, ids_done = args[:-1]
      else:
        k_smem, v_smem, k_done, v_done = args[:-1]
      qo_smem = qo_smem2.at[wg]

      def scores(acc_ref):
        plgpu.wgmma(acc_ref, qo_smem, plgpu.transpose_ref(k_smem, (1, 0)))
        schedule()
        return acc_ref[...]

      s = pl.run_scoped(scores, plgpu.ACC((block_q, block_kv), jnp.float32))
      plgpu.barrier_arrive(k_done)
      s = s * logit_scale
      mask = None
      if static.masked:
        mask = pair_mask(carry.q_ids, ids_smem[...], (block_q, block_kv))
        plgpu.barrier_arrive(ids_done)
        s = jnp.where(mask, s, MASK_VALUE)
      m = jnp.maximum(carry.m, s.max(axis=1))
      alpha = jnp.exp2(carry.m - m)
      p = jnp.exp2(s - lax.broadcast_in_dim(m, s.shape, [0]))
      if mask is not None:
        # Rows with no valid key so far have m = MASK_VALUE and p = 1 on
        # masked pairs; zeroing keeps their normaliser at exactly 0.
        p = jnp.where(mask, p, 0.0)
      acc = carry.acc * lax.broadcast_in_dim(alpha, carry.acc.shape, [0])
      l = carry.l * alpha + p.sum(axis=1)
      schedule()
      acc = mma(acc, p.astype(dtype), v_smem)
      plgpu.barrier_arrive(v_done)
      return _FwdCarry(acc, m, l, carry.q_ids)

    specs = [row_spec(block_kv, head_dim)] * 2
    operands = [k_ref.at[b, :, h, :], v_ref.at[b, :, h, :]]
    if static.masked:
      specs.append(vector_spec(block_kv))
      operands.append(kv_ids_ref.at[b])
    pipeline = plgpu.emit_pipeline_warp_specialized(
        kv_step, grid=(kv_steps,),
        max_concurrent_steps=min(sizes.max_concurrent_steps, kv_steps),
        num_compute_wgs=_COMPUTE_WGS, memory_registers=40, wg_axis="wg",
        manual_consumed_barriers=True, compute_context=compute_thread,
        in_specs=specs)
    pipeline(*operands)

  smem = (plgpu.SMEM((_COMPUTE_WGS, block_q, head_dim), dtype),
          plgpu.SMEM((_COMPUTE_WGS, block_q), jnp.int32),
          plgpu.SMEM((_COMPUTE_WGS, block_q), jnp.float32))
  out, lse = plgpu.kernel(
      kernel,
      out_type=(jax.ShapeDtypeStruct(q.shape, dtype),
                jax.ShapeDtypeStruct((batch, heads, q_len), jnp.float32)),
      scratch_types=(smem,
                     plgpu.Barrier(num_barriers=_COMPUTE_WGS),
                     plgpu.Barrier(num_barriers=_COMPUTE_WGS),
                     plgpu.Barrier(num_arrivals=_COMPUTE_WGS)),
      grid=(heads, q_len // (_COMPUTE_WGS * block_q), batch),
      grid_names=("heads", "q_seq", "batch"),
      num_threads=_COMPUTE_WGS + 1, thread_name="wg",
      compiler_params=compiler_params(),
  )(q, k, v, q_ids, kv_ids)
  return out, lse
