"""hlo_stats: Mosaic kernels and collectives per step, from HLO text.

The program below is written in the form the TPU compiler prints (its
asynchronous all-gather as an "AsyncCollectiveStart" / "Done" pair of
fusions, each holding a copy of the collective; its reduce-scatter as an
"all-reduce-scatter" fusion) with XLA's own forms beside them, inside loops
whose trip counts are read from a `known_trip_count` and from a `lax.scan`
condition; and the matmul FLOPs of a lowered program, in the form
`Lowered.as_text(dialect="hlo")` prints.
"""

import pytest

from albert_jax.tools import hlo_stats

HLO = """\
HloModule jit_step, entry_computation_layout={(f32[8,128]{1,0})->f32[8,128]{1,0}}

%add (x: f32[], y: f32[]) -> f32[] {
  %x = f32[] parameter(0)
  %y = f32[] parameter(1)
  ROOT %add.1 = f32[] add(%x, %y)
}

%fused_computation.1 (param_0: bf16[128,32]) -> (bf16[128,32], bf16[128,128], u32[]) {
  %param_0 = bf16[128,32]{0,1:T(8,128)(2,1)S(1)} parameter(0)
  %all-gather.1 = bf16[128,128]{0,1:T(8,128)(2,1)} all-gather(%param_0), channel_id=1, replica_groups=mesh['axis_0'=4] {'axis_0'}, dimensions={1}
  ROOT %custom-call.1 = (bf16[128,32]{0,1:T(8,128)(2,1)S(1)}, bf16[128,128]{0,1:T(8,128)(2,1)S(1)}, u32[]{:S(2)}) custom-call(%all-gather.1), custom_call_target="AsyncCollectiveStart"
}

%fused_computation.2 (param_0.1: bf16[128,32], param_1: bf16[128,128]) -> bf16[128,128] {
  %param_0.1 = bf16[128,32]{0,1} parameter(0)
  %param_1 = bf16[128,128]{0,1} parameter(1)
  %all-gather.2 = bf16[128,128]{0,1:T(8,128)(2,1)} all-gather(%param_0.1), channel_id=1, replica_groups=mesh['axis_0'=4] {'axis_0'}, dimensions={1}
  ROOT %custom-call.2 = bf16[128,128]{0,1} custom-call(%param_0.1, %param_1, %all-gather.2), custom_call_target="AsyncCollectiveDone"
}

%all-reduce-scatter.1 (input: f32[128,32]) -> f32[32,32] {
  %input = f32[128,32]{1,0:T(8,128)S(1)} parameter(0)
  %all-reduce.5 = f32[128,32]{1,0:T(8,128)} all-reduce(%input), channel_id=2, replica_groups={{0,1,2,3}}, to_apply=%add
  %partition-id.1 = u32[] partition-id()
  %constant.1 = u32[] constant(0)
  ROOT %dynamic-slice.1 = f32[32,32]{1,0:T(8,128)S(1)} dynamic-slice(%all-reduce.5, %partition-id.1, %constant.1), dynamic_slice_sizes={32,32}
}

%body (param: (s32[], f32[8,128])) -> (s32[], f32[8,128]) {
  %param = (s32[], f32[8,128]{1,0}) parameter(0)
  %gte.0 = s32[] get-tuple-element(%param), index=0
  %gte.1 = f32[8,128]{1,0} get-tuple-element(%param), index=1
  %albert_flash_fwd.1 = (f32[8,128]{1,0}, f32[8,128]{1,0}) custom-call(%gte.1), custom_call_target="tpu_custom_call", backend_config={"custom_call_config":{"body":"TUzvUg"}}
  %transpose_jvp_albert_flash_bwd_dq__.3 = f32[8,128]{1,0} custom-call(%gte.1), custom_call_target="tpu_custom_call"
  %all-reduce.1 = f32[8,128]{1,0:T(8,128)} all-reduce(%gte.1), channel_id=3, replica_groups={{0,1,2,3}}, to_apply=%add
  %p.1 = bf16[128,32]{0,1} parameter(1)
  %async-collective-start.1 = (bf16[128,32]{0,1}, bf16[128,128]{0,1}, u32[]) fusion(%p.1), kind=kCustom, calls=%fused_computation.1
  %gte.2 = bf16[128,32]{0,1} get-tuple-element(%async-collective-start.1), index=0
  %gte.3 = bf16[128,128]{0,1} get-tuple-element(%async-collective-start.1), index=1
  %async-collective-done.1 = bf16[128,128]{0,1} fusion(%gte.2, %gte.3), kind=kCustom, calls=%fused_computation.2
  %fusion.1 = f32[32,32]{1,0:T(8,128)S(1)} fusion(%gte.1), kind=kCustom, calls=%all-reduce-scatter.1
  ROOT %tuple.1 = (s32[], f32[8,128]{1,0}) tuple(%gte.0, %all-reduce.1)
}

%cond (param.1: (s32[], f32[8,128])) -> pred[] {
  %constant.7 = s32[]{:T(128)} constant(12)
  %param.1 = (s32[]{:T(128)}, f32[8,128]{1,0}) parameter(0)
  %gte.4 = s32[]{:T(128)} get-tuple-element(%param.1), index=0
  ROOT %lt.1 = pred[]{:T(512)} compare(%gte.4, %constant.7), direction=LT, metadata={op_name="jit(step)/while/cond/lt"}
}

%body.2 (param.2: (s32[], f32[4,128])) -> (s32[], f32[4,128]) {
  %param.2 = (s32[], f32[4,128]{1,0}) parameter(0)
  %gte.5 = f32[4,128]{1,0} get-tuple-element(%param.2), index=1
  %collective-permute.1 = f32[4,128]{1,0} collective-permute(%gte.5), channel_id=4, source_target_pairs={{0,1},{1,0}}
  ROOT %tuple.2 = (s32[], f32[4,128]{1,0}) tuple(%gte.0, %collective-permute.1)
}

%cond.2 (param.3: (s32[], f32[4,128])) -> pred[] {
  %param.3 = (s32[], f32[4,128]{1,0}) parameter(0)
  ROOT %constant.8 = pred[] constant(true)
}

%body.3 (param.4: (s32[], s4[64])) -> (s32[], s4[64]) {
  %param.4 = (s32[], s4[64]{0}) parameter(0)
  %gte.6 = s4[64]{0} get-tuple-element(%param.4), index=1
  %all-to-all.1 = s4[64]{0} all-to-all(%gte.6), channel_id=5, replica_groups={{0,1}}, dimensions={0}
  ROOT %tuple.3 = (s32[], s4[64]{0}) tuple(%gte.0, %all-to-all.1)
}

%cond.3 (param.5: (s32[], s4[64])) -> pred[] {
  %param.5 = (s32[], s4[64]{0}) parameter(0)
  ROOT %constant.9 = pred[] constant(true)
}

ENTRY %main.1_spmd (param.0: f32[8,128]) -> f32[8,128] {
  %param.0 = f32[8,128]{1,0} parameter(0)
  %tuple.0 = (s32[], f32[8,128]{1,0}) tuple(%constant.0, %param.0)
  %while.1 = (s32[], f32[8,128]{1,0}) while(%tuple.0), condition=%cond, body=%body
  %while.2 = (s32[], f32[4,128]{1,0}) while(%tuple.0), condition=%cond.2, body=%body.2
  %while.3 = (s32[], s4[64]{0}) while(%tuple.0), condition=%cond.3, body=%body.3, backend_config={"known_trip_count":{"n":"3"}}
  %reduce-scatter.1 = f32[2,128]{1,0} reduce-scatter(%param.0), channel_id=6, replica_groups={{0,1,2,3}}, dimensions={0}, to_apply=%add
  %all-gather-start.1 = ((f32[2,128]{1,0}), f32[8,128]{1,0}) all-gather-start(%reduce-scatter.1), channel_id=7, replica_groups={{0,1,2,3}}, dimensions={0}
  %all-gather-done.1 = f32[8,128]{1,0} all-gather-done(%all-gather-start.1)
  %all-reduce-start.1 = f32[8,128]{1,0} all-reduce-start(%all-gather-done.1), channel_id=8, replica_groups={{0,1,2,3}}, to_apply=%add
  ROOT %all-reduce-done.1 = f32[8,128]{1,0} all-reduce-done(%all-reduce-start.1)
}
"""


def test_counts_per_step():
  stats = hlo_stats.analyse(HLO)
  # Twelve layers: each kernel of the loop body runs twelve times.
  assert stats.mosaic_kernels == {"albert_flash_bwd_dq": 12,
                                  "albert_flash_fwd": 12}
  assert stats.num_mosaic_kernels == 24
  assert stats.collectives == {
      # 12 async all-gathers of bf16[128,128] (the Done copy not counted),
      # and one XLA all-gather-start of f32[8,128].
      "all-gather": {"count": 13, "bytes": 12 * 128 * 128 * 2 + 8 * 128 * 4},
      # 12 fused all-reduce + slice of f32[32,32], one plain f32[2,128].
      "reduce-scatter": {"count": 13,
                         "bytes": 12 * 32 * 32 * 4 + 2 * 128 * 4},
      # 12 in the loop, one all-reduce-start at the end.
      "all-reduce": {"count": 13, "bytes": 13 * 8 * 128 * 4},
      # known_trip_count 3; s4 packs two to a byte.
      "all-to-all": {"count": 3, "bytes": 3 * 32},
      # A condition that is not `counter < N`: counted once.
      "collective-permute": {"count": 1, "bytes": 4 * 128 * 4},
  }
  assert stats.unknown_loops == 1


def test_array_bytes():
  assert hlo_stats.array_bytes("f32[8,128]{1,0:T(8,128)}") == 4096
  assert hlo_stats.array_bytes(
      "(bf16[2,3]{1,0}, pred[5], s32[], u32[]{:S(2)})") == 12 + 5 + 4 + 4
  assert hlo_stats.array_bytes("s4[3]") == 2
  assert hlo_stats.array_bytes("token[]") == 0


def test_kernel_names():
  assert hlo_stats.kernel_name("transpose_jvp_albert_flash_bwd_dkv__.7") == (
      "albert_flash_bwd_dkv")
  assert hlo_stats.kernel_name("albert_flash_fwd.1") == "albert_flash_fwd"


def test_no_entry_is_refused():
  with pytest.raises(ValueError) as e:
    hlo_stats.analyse("HloModule empty\n")
  assert str(e.value) == ("No ENTRY computation in the HLO text; pass "
                          "compiled.as_text() of a compiled step.")


# Lowered HLO as `Lowered.as_text(dialect="hlo")` prints it: no "%" before
# names, a custom call's backend config over several lines.
LOWERED = """\
HloModule jit_step, entry_computation_layout={(f32[8,64]{1,0})->f32[8,16]{1,0}}

region_0.1 {
  arg_tuple.1 = (s32[], f32[8,64]{1,0}, f32[64,16]{1,0}) parameter(0)
  get-tuple-element.1 = f32[8,64]{1,0} get-tuple-element(arg_tuple.1), index=1
  get-tuple-element.2 = f32[64,16]{1,0} get-tuple-element(arg_tuple.1), index=2
  dot_general.1 = f32[8,16]{1,0} dot(get-tuple-element.1, get-tuple-element.2), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  pallas_call.1 = f32[8,64]{1,0} custom-call(get-tuple-element.1), custom_call_target="tpu_custom_call", backend_config={"custom_call_config": {"body": "TUzvUg", "cost_estimate": {
"bytes_accessed":2048,
"flops":1000,
"transcendentals":0
}, "serialization_format": 1}}
  ROOT tuple.1 = (s32[], f32[8,64]{1,0}, f32[64,16]{1,0}) tuple(get-tuple-element.1, get-tuple-element.1, get-tuple-element.2)
}

region_1.2 {
  constant.1 = s32[] constant(12)
  arg_tuple.2 = (s32[], f32[8,64]{1,0}, f32[64,16]{1,0}) parameter(0)
  get-tuple-element.3 = s32[] get-tuple-element(arg_tuple.2), index=0
  ROOT lt.1 = pred[] compare(get-tuple-element.3, constant.1), direction=LT
}

ENTRY main.3 {
  Arg_0.1 = f32[8,64]{1,0} parameter(0)
  Arg_1.2 = f32[4,8,64]{2,1,0} parameter(1)
  dot_general.2 = f32[4,8,8]{2,1,0} dot(Arg_1.2, Arg_1.2), lhs_batch_dims={0}, lhs_contracting_dims={2}, rhs_batch_dims={0}, rhs_contracting_dims={2}
  tuple.2 = (s32[], f32[8,64]{1,0}, f32[64,16]{1,0}) tuple(Arg_0.1, Arg_0.1, Arg_0.1)
  while.1 = (s32[], f32[8,64]{1,0}, f32[64,16]{1,0}) while(tuple.2), condition=region_1.2, body=region_0.1
  ROOT get-tuple-element.4 = f32[8,16]{1,0} get-tuple-element(while.1), index=1
}
"""


def test_matmul_flops_of_lowered_hlo():
  assert hlo_stats.matmul_flops(LOWERED) == {
      # 12 loop iterations of an [8, 64] · [64, 16] dot, and one batched
      # [4, 8, 64] · [4, 8, 64]ᵀ outside the loop.
      "dots": 12 * 2 * 8 * 16 * 64 + 2 * 4 * 8 * 8 * 64,
      # The kernel's declared cost, every iteration.
      "kernels": 12 * 1000,
  }
