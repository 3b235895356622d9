"""The deviceless GPU report: kernels, HBM bytes, attention rates, roofline.

  * `hlo_stats.kernels` on hand-written HLO (every rule of its byte count:
    slices read at their size, in-place updates, tuples, loop trip counts,
    cuDNN attention) and on a toy step compiled for an H100 here, whose
    kernels are counted by hand;
  * `hopper_rates`: the measured table, interpolation, the backward and
    masked rates derived from it, and `faster`;
  * `roofline`: one kernel of each kind priced by hand, the recorded
    kernels of the calibration steps (tests/testdata/h100_step_*.hlo.gz),
    whose modelled times are the calibration the report states, and the
    large one's categories against its trace on the H100;
  * the CLI: `--compile_only --topology=h100` on a tiny config.
The GPU compiles need XLA:GPU's compiler (the `gpu_aot` extra).
"""

import gzip
import math
import pathlib
import subprocess
import sys

import jax
import jax.numpy as jnp
import pytest

from albert_jax.ops import hopper_rates
from albert_jax.tools import hlo_stats
from albert_jax.tools import roofline
from albert_jax.tools import topology

ROOT = pathlib.Path(__file__).resolve().parents[2]
TESTDATA = ROOT / "tests" / "testdata"
H100 = roofline.CARDS["NVIDIA H100 80GB HBM3"]
needs_gpu_compiler = pytest.mark.skipif(
    not topology.gpu_plugin_available(),
    reason=f"no CUDA plugin; {topology.GPU_INSTALL_HINT}")

# A loop of 4 iterations that stacks a GEMM's output (in-place update of a
# stack), reads one slice of a stack, runs a LayerNorm fusion, an
# activation fusion and a cuDNN attention call; around it a zero fill, an
# optimizer update and a copy.
HLO = """\
HloModule jit_step

%fused_fill () -> bf16[4,8,128] {
  %constant.0 = bf16[] constant(0)
  ROOT %broadcast.0 = bf16[4,8,128]{2,1,0} broadcast(%constant.0), dimensions={}
}

%gemm (p0: bf16[8,64], p1: bf16[64,128]) -> bf16[8,128] {
  %p0 = bf16[8,64]{1,0} parameter(0)
  %p1 = bf16[64,128]{1,0} parameter(1)
  ROOT %dot.1 = bf16[8,128]{1,0} dot(%p0, %p1), lhs_contracting_dims={1}, rhs_contracting_dims={0}, metadata={op_name="jit(step)/jvp(Albert)/dense/dot_general"}
}

%fused_stack (param_0: bf16[4,8,128], param_1: s32[], param_2: bf16[8,128]) -> bf16[4,8,128] {
  %param_0 = bf16[4,8,128]{2,1,0} parameter(0)
  %param_2 = bf16[8,128]{1,0} parameter(2)
  %bitcast.1 = bf16[1,8,128]{2,1,0} bitcast(%param_2)
  %param_1 = s32[] parameter(1)
  %constant.1 = s32[] constant(0)
  ROOT %dynamic-update-slice.1 = bf16[4,8,128]{2,1,0} dynamic-update-slice(%param_0, %bitcast.1, %param_1, %constant.1, %constant.1), metadata={op_name="jit(step)/jvp(Albert)/while/body/dynamic_update_slice"}
}

%fused_norm (param_0: bf16[4,8,128], param_1: s32[]) -> f32[8,128] {
  %param_0 = bf16[4,8,128]{2,1,0} parameter(0)
  %param_1 = s32[] parameter(1)
  %constant.2 = s32[] constant(0)
  %dynamic-slice.1 = bf16[1,8,128]{2,1,0} dynamic-slice(%param_0, %param_1, %constant.2, %constant.2), dynamic_slice_sizes={1,8,128}
  %bitcast.2 = bf16[8,128]{1,0} bitcast(%dynamic-slice.1)
  ROOT %convert.1 = f32[8,128]{1,0} convert(%bitcast.2), metadata={op_name="jit(step)/jvp(Albert)/layer_norm/convert_element_type"}
}

%fused_act (param_0: f32[8,128]) -> (f32[8,128], f32[8]) {
  %param_0 = f32[8,128]{1,0} parameter(0)
  %tanh.1 = f32[8,128]{1,0} tanh(%param_0), metadata={op_name="jit(step)/transpose(jvp(Albert))/ffn/activation/tanh"}
  %constant.3 = f32[] constant(0)
  %reduce.1 = f32[8]{0} reduce(%tanh.1, %constant.3), dimensions={1}, to_apply=%add
  ROOT %tuple.1 = (f32[8,128]{1,0}, f32[8]{0}) tuple(%tanh.1, %reduce.1)
}

%add (x: f32[], y: f32[]) -> f32[] {
  %x = f32[] parameter(0)
  %y = f32[] parameter(1)
  ROOT %add.0 = f32[] add(%x, %y)
}

%fused_update (param_0: f32[64,128], param_1: f32[64,128]) -> f32[64,128] {
  %param_0 = f32[64,128]{1,0} parameter(0)
  %param_1 = f32[64,128]{1,0} parameter(1)
  ROOT %subtract.1 = f32[64,128]{1,0} subtract(%param_0, %param_1), metadata={op_name="jit(step)/sub"}
}

%fused_counter (param_0: s32[]) -> s32[] {
  %param_0 = s32[] parameter(0)
  %constant.4 = s32[] constant(1)
  ROOT %add.2 = s32[] add(%param_0, %constant.4)
}

%body (arg: (s32[], bf16[4,8,128], bf16[8,64], bf16[64,128], bf16[2,8,4,64])) -> (s32[], bf16[4,8,128], bf16[8,64], bf16[64,128], bf16[2,8,4,64]) {
  %arg = (s32[], bf16[4,8,128]{2,1,0}, bf16[8,64]{1,0}, bf16[64,128]{1,0}, bf16[2,8,4,64]{3,2,1,0}) parameter(0)
  %i = s32[] get-tuple-element(%arg), index=0
  %stack = bf16[4,8,128]{2,1,0} get-tuple-element(%arg), index=1
  %x = bf16[8,64]{1,0} get-tuple-element(%arg), index=2
  %w = bf16[64,128]{1,0} get-tuple-element(%arg), index=3
  %q = bf16[2,8,4,64]{3,2,1,0} get-tuple-element(%arg), index=4
  %gemm_fusion = bf16[8,128]{1,0} fusion(%x, %w), kind=kCustom, calls=%gemm
  %stack_fusion = bf16[4,8,128]{2,1,0} fusion(%stack, %i, %gemm_fusion), kind=kLoop, calls=%fused_stack
  %norm_fusion = f32[8,128]{1,0} fusion(%stack_fusion, %i), kind=kLoop, calls=%fused_norm
  %act_fusion = (f32[8,128]{1,0}, f32[8]{0}) fusion(%norm_fusion), kind=kInput, calls=%fused_act
  %attention = (bf16[2,4,8,64]{3,1,2,0}, f32[2,4,8]{2,1,0}, u8[0]{0}) custom-call(%q, %q, %q), custom_call_target="__cudnn$fmhaSoftmax", metadata={op_name="jit(step)/jvp(Albert)/AttentionBlock/dot_product_attention_fwd"}, backend_config={"cudnn_fmha_backend_config": {"intermediate_tensor_shape": {"element_type": "BF16", "dimensions": ["2", "4", "8", "8"]}, "mask_type": "NO_MASK"}}
  %next = s32[] fusion(%i), kind=kLoop, calls=%fused_counter
  ROOT %out = (s32[], bf16[4,8,128]{2,1,0}, bf16[8,64]{1,0}, bf16[64,128]{1,0}, bf16[2,8,4,64]{3,2,1,0}) tuple(%next, %stack_fusion, %x, %w, %q)
}

%cond (arg: (s32[], bf16[4,8,128], bf16[8,64], bf16[64,128], bf16[2,8,4,64])) -> pred[] {
  %arg = (s32[], bf16[4,8,128]{2,1,0}, bf16[8,64]{1,0}, bf16[64,128]{1,0}, bf16[2,8,4,64]{3,2,1,0}) parameter(0)
  %i = s32[] get-tuple-element(%arg), index=0
  %limit = s32[] constant(4)
  ROOT %lt = pred[] compare(%i, %limit), direction=LT
}

ENTRY %main (x: bf16[8,64], w: bf16[64,128], q: bf16[2,8,4,64], p: f32[64,128], g: f32[64,128]) -> (bf16[4,8,128], f32[64,128], f32[16]) {
  %x = bf16[8,64]{1,0} parameter(0)
  %w = bf16[64,128]{1,0} parameter(1)
  %q = bf16[2,8,4,64]{3,2,1,0} parameter(2)
  %p = f32[64,128]{1,0} parameter(3)
  %g = f32[64,128]{1,0} parameter(4)
  %fill = bf16[4,8,128]{2,1,0} fusion(), kind=kLoop, calls=%fused_fill
  %zero = s32[] constant(0)
  %init = (s32[], bf16[4,8,128]{2,1,0}, bf16[8,64]{1,0}, bf16[64,128]{1,0}, bf16[2,8,4,64]{3,2,1,0}) tuple(%zero, %fill, %x, %w, %q)
  %loop = (s32[], bf16[4,8,128]{2,1,0}, bf16[8,64]{1,0}, bf16[64,128]{1,0}, bf16[2,8,4,64]{3,2,1,0}) while(%init), condition=%cond, body=%body, backend_config={"known_trip_count":{"n":"4"}}
  %stacked = bf16[4,8,128]{2,1,0} get-tuple-element(%loop), index=1
  %update = f32[64,128]{1,0} fusion(%p, %g), kind=kLoop, calls=%fused_update
  %small = f32[16]{0} copy(%g)
  ROOT %result = (bf16[4,8,128]{2,1,0}, f32[64,128]{1,0}, f32[16]{0}) tuple(%stacked, %update, %small)
}
"""


def _by_name(hlo: str) -> dict[str, hlo_stats.Kernel]:
  return {k.name: k for k in hlo_stats.kernels(hlo)}


def test_kernels_bytes_flops_and_runs_by_hand():
  k = _by_name(HLO)
  # Every non-free top-level instruction of the entry, the loop body and
  # its condition; tuples, parameters, get-tuple-elements are free.
  assert set(k) == {"fill", "update", "small", "gemm_fusion", "stack_fusion",
                    "norm_fusion", "act_fusion", "attention", "next", "lt"}
  # The body runs 4 times, the condition 5 (the last check ends the loop).
  assert {n: v.runs for n, v in k.items()} == {
      "fill": 1, "update": 1, "small": 1, "gemm_fusion": 4,
      "stack_fusion": 4, "norm_fusion": 4, "act_fusion": 4, "attention": 4,
      "next": 4, "lt": 5}
  # A fill writes its result.
  assert k["fill"].bytes == 4 * 8 * 128 * 2
  # A GEMM reads both operands and writes its result; 2·M·N·K FLOPs.
  assert k["gemm_fusion"].bytes == (8 * 64 + 64 * 128 + 8 * 128) * 2
  assert k["gemm_fusion"].flops == 2 * 8 * 128 * 64
  # An in-place update reads the update (and the index), writes it; the
  # stack it updates is neither read nor written whole.
  assert k["stack_fusion"].bytes == 4 + 2 * 8 * 128 * 2
  # A stack read through a dynamic slice counts at the slice's size.
  assert k["norm_fusion"].bytes == 8 * 128 * 2 + 4 + 8 * 128 * 4
  # A multi-output fusion writes every output.
  assert k["act_fusion"].bytes == 8 * 128 * 4 + (8 * 128 + 8) * 4
  # Unfused ops read their operands and write their results.
  assert k["small"].bytes == 64 * 128 * 4 + 16 * 4
  assert k["update"].bytes == 3 * 64 * 128 * 4
  # cuDNN's forward: 4·B·N·T·S·D FLOPs from its intermediate [B, N, T, S].
  a = k["attention"].attention
  assert (a.impl, a.direction, a.seq, a.mask) == ("cudnn", "fwd", 8, "none")
  assert k["attention"].flops == a.forward_flops == 4 * 2 * 4 * 8 * 8 * 64
  assert k["attention"].bytes == (3 * 2 * 8 * 4 * 64 * 2 + 2 * 4 * 8 * 64 * 2
                                  + 2 * 4 * 8 * 4)


def test_kernel_categories():
  k = _by_name(HLO)
  assert {n: v.category for n, v in k.items()} == {
      "fill": hlo_stats.COPIES, "stack_fusion": hlo_stats.COPIES,
      "small": hlo_stats.COPIES, "next": hlo_stats.COPIES,
      "lt": hlo_stats.COPIES, "gemm_fusion": hlo_stats.MATMUL,
      "attention": hlo_stats.ATTENTION, "norm_fusion": hlo_stats.LAYER_NORM,
      "act_fusion": hlo_stats.ACTIVATION,
      # Outside autodiff's passes in a program that has them.
      "update": hlo_stats.OPTIMIZER}
  # A program without autodiff has no optimizer: its arithmetic is
  # elementwise work.
  forward_only = HLO.replace("jvp(", "f(")
  assert _by_name(forward_only)["update"].category == hlo_stats.ELEMENTWISE


# The TPU compiler nests fusions: the stack is sliced in the inner one.
NESTED = """\
HloModule jit_step

%inner (param_0: bf16[12,64,128], param_1: s32[]) -> bf16[64,128] {
  %param_0 = bf16[12,64,128]{2,1,0} parameter(0)
  %param_1 = s32[] parameter(1)
  %zero = s32[] constant(0)
  %slice = bf16[1,64,128]{2,1,0} dynamic-slice(%param_0, %param_1, %zero, %zero), dynamic_slice_sizes={1,64,128}
  ROOT %bitcast.1 = bf16[64,128]{1,0} bitcast(%slice)
}

%outer (param_0: bf16[12,64,128], param_1: s32[], param_2: bf16[128,32]) -> bf16[64,32] {
  %param_0 = bf16[12,64,128]{2,1,0} parameter(0)
  %param_1 = s32[] parameter(1)
  %param_2 = bf16[128,32]{1,0} parameter(2)
  %sliced = bf16[64,128]{1,0} fusion(%param_0, %param_1), kind=kLoop, calls=%inner
  ROOT %convolution.1 = bf16[64,32]{1,0} convolution(%sliced, %param_2), dim_labels=bf_io->bf, metadata={op_name="jit(step)/transpose(jvp(Albert))/ffn/dot_general"}
}

ENTRY %main (stack: bf16[12,64,128], i: s32[], w: bf16[128,32]) -> bf16[64,32] {
  %stack = bf16[12,64,128]{2,1,0} parameter(0)
  %i = s32[] parameter(1)
  %w = bf16[128,32]{1,0} parameter(2)
  ROOT %conv_fusion = bf16[64,32]{1,0} fusion(%stack, %i, %w), kind=kOutput, calls=%outer
}
"""


def test_nested_fusions_read_slices_and_convolutions_are_matmuls():
  kernel, = hlo_stats.kernels(NESTED)
  assert kernel.bytes == 64 * 128 * 2 + 4 + 128 * 32 * 2 + 64 * 32 * 2
  assert kernel.category == hlo_stats.MATMUL
  assert kernel.flops == 0  # not read off a convolution


def test_hopper_rates_table_interpolation_and_derived_rates():
  assert hopper_rates.rate("cudnn", "none", "fwd+bwd", 512) == 214.7
  assert hopper_rates.rate("pallas", "padded", "fwd+bwd", 128) == 79.0
  assert hopper_rates.rate("cudnn", "lengths", "fwd+bwd", 512) == 202.2
  # The kernel reads segment ids either way: its "lengths" is "padded".
  assert hopper_rates.rate("pallas", "lengths", "fwd", 2048) == 231.2
  # Linear in log(seq) between measured lengths, held outside them.
  assert hopper_rates.rate("cudnn", "none", "fwd", 1024) == pytest.approx(
      (248.5 + 409.0) / 2)
  assert hopper_rates.rate("cudnn", "none", "fwd", 64) == 76.9
  assert hopper_rates.rate("cudnn", "none", "fwd", 16384) == 409.0
  # The backward's time is forward + backward less forward; 2.5 forwards.
  assert hopper_rates.rate("cudnn", "none", "bwd", 512) == pytest.approx(
      2.5 / (3.5 / 214.7 - 1 / 248.5))
  # cuDNN with a dense bias: measured per call only, put on the table's
  # footing by the no-mask rates' back-to-back / per-call ratio.
  assert hopper_rates.rate("cudnn", "padded", "fwd+bwd", 512) == (
      pytest.approx(104.5 * 214.7 / 138.7))
  # A masked pass without its own measurement: the unmasked one scaled.
  assert hopper_rates.rate("cudnn", "padded", "fwd", 512) == pytest.approx(
      248.5 * (104.5 * 214.7 / 138.7) / 214.7)
  # What auto chooses by: Pallas at s128 (79.0 with segment ids against
  # cuDNN's 74.3 with lengths); at s512 cuDNN with lengths (202.2 vs 165.3)
  # and without a mask (214.7 vs 191.0), Pallas against cuDNN's bias
  # (165.3 vs 161.8).
  assert hopper_rates.faster(128, "padded", "lengths", True) == "pallas"
  assert hopper_rates.faster(512, "padded", "lengths", True) == "cudnn"
  assert hopper_rates.faster(512, "none", "none", True) == "cudnn"
  assert hopper_rates.faster(512, "padded", "padded", True) == "pallas"
  assert hopper_rates.faster(2048, "none", "none", True) == "cudnn"
  with pytest.raises(ValueError, match="No measured rate"):
    hopper_rates.rate("xla", "none", "fwd", 128)


def test_kernels_priced_by_hand():
  k = _by_name(HLO)
  launch, bw = H100.launch_seconds, H100.hbm_bytes_per_second
  # Memory-bound: bytes / bandwidth + launch.
  assert roofline.seconds(k["update"], H100) == pytest.approx(
      3 * 64 * 128 * 4 / bw + launch)
  # A GEMM at the sustained GEMM rate or its bytes, whichever is slower.
  gemm = k["gemm_fusion"]
  assert roofline.seconds(gemm, H100) == pytest.approx(
      max(gemm.flops / H100.gemm_flops, gemm.bytes / bw) + launch)
  # Attention at the rate measured for its length (held at s128 for s8),
  # or its bytes (this tiny one is memory-bound).
  attention = k["attention"]
  assert roofline.seconds(attention, H100) == pytest.approx(
      max(attention.flops / 76.9e12, attention.bytes / bw) + launch)
  big = hlo_stats.Kernel("a", 1, "custom-call", 1000, 4 * 10**12,
                         hlo_stats.ATTENTION, "", hlo_stats.Attention(
                             "cudnn", "fwd", 512, "padding", 4 * 10**12))
  # Row lengths (cuDNN's PADDING mask): its "lengths" rate.
  assert roofline.seconds(big, H100) == pytest.approx(4 / 237.8 + launch)
  summary = roofline.summarize(k.values(), H100, analytic_flops=1e9)
  assert summary.kernels == 1 + 1 + 1 + 4 * 6 + 5
  assert summary.bytes == sum(v.runs * v.bytes for v in k.values())
  assert summary.ms == pytest.approx(1e3 * sum(
      v.runs * roofline.seconds(v, H100) for v in k.values()))
  assert summary.mfu == pytest.approx(1e9 / (summary.ms / 1e3 * 989e12))
  assert list(summary.categories) == [c for c in hlo_stats.CATEGORIES
                                      if c != hlo_stats.COLLECTIVE
                                      and c != hlo_stats.ELEMENTWISE]
  # No card: bytes and launches, no time.
  unpriced = roofline.summarize(k.values(), None)
  assert unpriced.ms == 0 and unpriced.mfu is None
  assert unpriced.bytes == summary.bytes


@pytest.mark.parametrize("name, kernels, gbytes, ms, matmul_tflop", [
    ("large_seq512_b32", 1558, 121.865971887, roofline.CALIBRATION["large"],
     29.715183566848),
    ("base_seq128_b128", 903, 45.400508743, roofline.CALIBRATION["base"],
     8.42003709952),
])
def test_calibration_steps(name, kernels, gbytes, ms, matmul_tflop):
  """The steps the report's calibration line names: large as the H100
  compiled it on 2026-11-27, base as compiled here for an H100 from the
  same code; their kernel tables and modelled times."""
  hlo = gzip.open(TESTDATA / f"h100_step_{name}.hlo.gz", "rt").read()
  found = hlo_stats.kernels(hlo)
  summary = roofline.summarize(found, H100)
  assert summary.kernels == kernels
  assert summary.bytes / 1e9 == pytest.approx(gbytes, abs=1e-9)
  assert round(summary.ms, 1) == ms
  matmuls = sum(k.runs * k.flops for k in found
                if k.category == hlo_stats.MATMUL)
  assert matmuls / 1e12 == pytest.approx(matmul_tflop, abs=1e-12)


def test_model_against_the_h100_trace_of_the_same_step(tmp_path):
  """Each category of the large step, modelled, against the kernels its
  trace on the H100 measured (tied to their instructions by
  `step_breakdown`): the calibration the report states, within the bounds
  the module docstring gives (GEMMs and memory-bound kernels within 10%,
  attention over by under 30%, the total within 6% of the 72.8 ms
  measured)."""
  from albert_jax.training import step_breakdown  # pylint: disable=g-import-not-at-top
  hlo = gzip.open(TESTDATA / "h100_step_large_seq512_b32.hlo.gz", "rt").read()
  trace = tmp_path / "h100.xplane.pb"
  trace.write_bytes(gzip.decompress(
      (TESTDATA / "traces" / "h100_large_step.xplane.pb.gz").read_bytes()))
  measured = step_breakdown.breakdown(str(trace), hlo, steps=1, top=10**6)
  found = hlo_stats.kernels(hlo)
  category = {k.name: k.category for k in found}
  by_category = {}
  for entry in measured.top:
    if entry.name in category:
      c = category[entry.name]
      by_category[c] = by_category.get(c, 0.0) + entry.ms
  modelled = roofline.summarize(found, H100).categories
  memory_bound = (hlo_stats.LAYER_NORM, hlo_stats.ACTIVATION,
                  hlo_stats.ELEMENTWISE)
  ratio = {c: modelled[c]["ms"] / by_category[c]
           for c in (hlo_stats.MATMUL, hlo_stats.ATTENTION, *memory_bound)}
  assert 0.95 < ratio[hlo_stats.MATMUL] < 1.05
  assert 1.0 < ratio[hlo_stats.ATTENTION] < 1.3
  together = (sum(modelled[c]["ms"] for c in memory_bound)
              / sum(by_category[c] for c in memory_bound))
  assert 0.9 < together < 1.1
  for c in memory_bound:
    assert 0.85 < ratio[c] < 1.15, c
  assert round(sum(by_category.values()), 1) == roofline.MEASURED["large"]
  assert 1.0 < roofline.CALIBRATION["large"] / roofline.MEASURED["large"] < (
      1.06)


@needs_gpu_compiler
def test_toy_step_compiled_for_an_h100_counted_by_hand():
  """A GEMM, an elementwise pass and a loop of in-place row updates,
  compiled by XLA:GPU for an H100 on this host, counted by hand."""
  mesh = jax.sharding.Mesh(topology.devices("h100"), ("x",))
  whole = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())

  def step(x, w, buf):
    y = jnp.dot(x, w)
    z = y.astype(jnp.float32) * 2.0 + 1.0
    buf = jax.lax.fori_loop(
        0, 8, lambda i, b: jax.lax.dynamic_update_slice(b, z[i][None],
                                                        (i, 0)), buf)
    return z, buf

  args = (jax.ShapeDtypeStruct((4096, 1024), jnp.bfloat16, sharding=whole),
          jax.ShapeDtypeStruct((1024, 1024), jnp.bfloat16, sharding=whole),
          jax.ShapeDtypeStruct((8, 1024), jnp.float32, sharding=whole))
  compiled = jax.jit(step, donate_argnums=(2,)).lower(*args).compile()
  found = hlo_stats.kernels(compiled.as_text())
  by_category = {}
  for k in found:
    by_category.setdefault(k.category, []).append(k)
  gemm, = by_category[hlo_stats.MATMUL]
  assert gemm.flops == 2 * 4096 * 1024 * 1024
  assert gemm.bytes == (4096 * 1024 + 1024 * 1024 + 4096 * 1024) * 2
  elementwise, = by_category[hlo_stats.ELEMENTWISE]
  assert elementwise.bytes == 4096 * 1024 * (2 + 4)  # bf16 in, f32 out
  rows = [k for k in found if k.runs == 8 and k.bytes > 8]
  assert len(rows) == 1 and rows[0].bytes == 2 * 1024 * 4 + 4
  summary = roofline.summarize(found, H100)
  assert summary.ms == pytest.approx(1e3 * sum(
      k.runs * roofline.seconds(k, H100) for k in found))


@needs_gpu_compiler
def test_cli_reports_an_h100_step():
  """`--compile_only --topology=h100`: the XLA:GPU compiler's memory, the
  card's HBM and the kernel table, for a tiny bfloat16 ALBERT. In the
  default suite: the one test that traces the whole model for a GPU, where
  its GPU-only paths run (a vmapped cuDNN call once broke its init)."""
  out = subprocess.run(
      [sys.executable, "-m", "albert_jax.main", "--config=configs/tiny.py",
       "--compile_only", "--topology=h100", "--config.batch_size=8",
       "--config.model.dtype=bfloat16"],
      cwd=ROOT, capture_output=True, text=True, timeout=600, check=False)
  assert out.returncode == 0, out.stderr[-3000:]
  text = out.stdout
  assert "by the XLA:GPU compiler for 1 NVIDIA H100 80GB HBM3 GPU" in text
  assert f"fits {84942979072 / 2**30:.3g} GiB/GPU" in text
  table = text[text.index("Kernels, HBM traffic"):]
  for category in ("matmul", "attention", "LayerNorm", "activation (GELU)",
                   "optimizer, guard, metrics"):
    assert f"\n  {category} " in table
  total = next(line for line in table.splitlines()
               if line.strip().startswith("total"))
  assert "modelled step" in total and "MFU" in total
  assert math.isfinite(float(total.split("modelled step ")[1].split()[0]))


def test_gpu_topology_names():
  assert topology.gpu_topology("h100") == ("h100", "1x1x1")
  assert topology.gpu_topology("H200:8") == ("h200", "1x1x8")
  assert topology.gpu_topology("h100:2x8") == ("h100", "1x2x8")
  assert topology.is_gpu("h100:8") and not topology.is_gpu("v5e:4x4")
  with pytest.raises(ValueError, match="not a GPU topology"):
    topology.gpu_topology("a100")
  spec = topology.gpu_spec("h100")
  assert spec == {"device_kind": "NVIDIA H100 80GB HBM3",
                  "memory_bytes": 84942979072,
                  "hbm_bytes_per_second": 3.35232e12, "sm_count": 132}
  assert topology.hbm_gib("NVIDIA H200") == pytest.approx(150754820096
                                                          / 2**30)


MOSAIC = """\\
HloModule jit_step

ENTRY %main (q: bf16[2,128,4,64], ids: s32[2,128]) -> (bf16[2,128,4,64], bf16[2,128,4,64], bf16[2,128,4,64], bf16[2,128,4,64]) {
  %q = bf16[2,128,4,64]{3,2,1,0} parameter(0)
  %ids = s32[2,128]{1,0} parameter(1)
  %fwd = bf16[2,128,4,64]{3,2,1,0} custom-call(%q, %q, %q, %ids, %ids), custom_call_target="mosaic_gpu_v2", metadata={op_name="jit(step)/jvp(Albert)/encoder/layers/AttentionBlock/kernel/mpmd_map"}
  %dq = bf16[2,128,4,64]{3,2,1,0} custom-call(%q, %q, %q, %q, %ids, %ids), custom_call_target="mosaic_gpu_v2", metadata={op_name="jit(step)/transpose(jvp(Albert))/encoder/layers/AttentionBlock/kernel/mpmd_map"}
  %dkv = (bf16[2,128,4,64]{3,2,1,0}, bf16[2,128,4,64]{3,2,1,0}) custom-call(%q, %q, %q, %q, %ids, %ids), custom_call_target="mosaic_gpu_v2", metadata={op_name="jit(step)/transpose(jvp(Albert))/encoder/layers/AttentionBlock/kernel/mpmd_map"}
  %dk = bf16[2,128,4,64]{3,2,1,0} get-tuple-element(%dkv), index=0
  %dv = bf16[2,128,4,64]{3,2,1,0} get-tuple-element(%dkv), index=1
  ROOT %out = (bf16[2,128,4,64]{3,2,1,0}, bf16[2,128,4,64]{3,2,1,0}, bf16[2,128,4,64]{3,2,1,0}, bf16[2,128,4,64]{3,2,1,0}) tuple(%fwd, %dq, %dk, %dv)
}
"""


def test_mosaic_gpu_attention_kernels_share_the_backward():
  """The Mosaic GPU flash kernels: the forward counts 4·B·N·T²·D, and the
  backward's 2.5 forwards are split over its dq kernel (3 of 7 matmuls)
  and its dk/dv kernel (4 of 7); segment ids make its mask "segments"."""
  k = _by_name(MOSAIC)
  forward = 4 * 2 * 4 * 128 * 128 * 64
  assert k["fwd"].flops == forward
  assert k["dq"].flops == forward * 5 // 2 * 3 // 7
  assert k["dkv"].flops == forward * 5 // 2 * 4 // 7
  for name in ("fwd", "dq", "dkv"):
    a = k[name].attention
    assert (a.impl, a.seq, a.mask) == ("pallas", 128, "segments")
  assert k["dq"].attention.direction == k["dkv"].attention.direction == "bwd"
