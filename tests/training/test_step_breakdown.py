"""step_breakdown: ms per step by component and phase, from GPU, TPU and CPU
traces.

The GPU and TPU traces are small XSpace protos in tests/testdata/traces/
(gpu.xplane.pb, tpu.xplane.pb), written by `gpu_space` and `tpu_space`
below from the event tables `GPU_KERNELS`, `GPU_COPIES` and `TPU_OPS`
(`PYTHONPATH=tests python tests/training/test_step_breakdown.py` rewrites
them; `test_fixtures_are_what_the_generators_write` checks they match). The
XSpace message class is built at run time from the schema of
tsl/profiler/protobuf/xplane.proto (`XPLANE_PROTO`, same field numbers:
`test_schema_is_tensorflows` compares them), so writing them needs no
TensorFlow. Both traces are of one program, `HLO`, and the expected values
are worked out by hand from the tables, in microseconds (µs), in comments.
The CPU trace is recorded by the test itself. A real GPU trace is there too:
one ALBERT-large step recorded on an H100 (h100_large_step.xplane.pb.gz
with ../h100_step_large_seq512_b32.hlo.gz, see
`test_a_recorded_h100_step_ties_every_library_kernel_to_its_call`).
"""

import gzip
import io
import pathlib
import re
import sys

from google.protobuf import descriptor_pb2
from google.protobuf import descriptor_pool
from google.protobuf import message_factory
import fresh_process
import jax
import jax.numpy as jnp
from locations import EXPERIMENTS
from locations import TESTDATA
import pytest

from albert_jax.training import step_breakdown as sb

TRACES = TESTDATA / "traces"

HLO = """\
HloModule jit_step, is_scheduled=true

%body (p.1: (s32[], f32[8,16])) -> (s32[], f32[8,16]) {
  %p.1 = (s32[], f32[8,16]{1,0}) parameter(0)
  %loop_add_fusion.3 = f32[8,16]{1,0} fusion(%p.1), kind=kLoop, calls=%add, metadata={op_name="jit(step)/jvp(Albert)/encoder/while/body/layers/FFNBlock/add"}
  ROOT %tuple.1 = (s32[], f32[8,16]{1,0}) tuple(%p.1, %loop_add_fusion.3)
}

ENTRY %main.9 (x.1: f32[8,16], w.1: f32[16,16]) -> f32[16,16] {
  %x.1 = f32[8,16]{1,0} parameter(0), metadata={op_name="x"}
  %w.1 = f32[16,16]{1,0} parameter(1), metadata={op_name="w"}
  %gemm_fusion_dot.1 = f32[8,16]{1,0} fusion(%x.1, %w.1), kind=kCustom, calls=%dot, metadata={op_name="jit(step)/jvp(Albert)/encoder/layers/AttentionBlock/query/dot_general"}
  %while.5 = (s32[], f32[8,16]{1,0}) while(%tuple.2), condition=%cond, body=%body, metadata={op_name="jit(step)/jvp(Albert)/encoder/while"}
  %input_reduce_fusion.2 = f32[8]{0} fusion(%x.1), kind=kInput, calls=%reduce, metadata={op_name="jit(step)/transpose(jvp(Albert))/encoder/layers/AttentionBlock/layer_norm/reduce_sum"}
  %custom-call.4 = (f32[16,16]{1,0}, s8[64]{0}) custom-call(%x.1, %x.1), custom_call_target="__cublas$gemm", metadata={op_name="jit(step)/transpose(jvp(Albert))/encoder/layers/FFNBlock/intermediate/dot_general"}
  %copy.6 = f32[8,16]{1,0} copy(%x.1)
  ROOT %loop_multiply_fusion = f32[16,16]{1,0} fusion(%w.1), kind=kLoop, calls=%mul, metadata={op_name="jit(step)/mul"}
}
"""


class Ref(str):
  """A string stat written as a reference to an interned name, as XPlane
  writes many (jax.profiler reads both forms the same)."""


CUDNN = ("cudnn_generated_fort_native_sdpa_sm90_knob_7_64x128x128_4x1x1_"
         "kernel0_0")
XMMA = "sm90_xmma_gemm_f32f32_f32f32_f32_tn_n_tilesize128x128x8_cublas"
NVJET = "nvjet_tst_64x8_64x16_4x1_v_bz_TNT"
# Stream #14's kernels in one step, back to back with 10 µs gaps: (symbol,
# µs in step 1, stats). Step 2 starts 100 µs after step 1 ends and runs each
# 3× as long, so each is 2× its step-1 time per step.
GPU_KERNELS = (
    ("gemm_fusion_dot_1", 100, {}),  # attention Q/K/V, forward
    ("loop_add_fusion_3", 50, {}),  # FFN GELU, bias, residual, forward
    (CUDNN, 150, {}),  # attention (library kernel)
    ("input_reduce_fusion_2", 25, {}),  # LayerNorm, backward
    # Its `hlo_op` (a ref to an interned string) wins over its symbol.
    (XMMA, 200, {"hlo_op": Ref("custom-call.4"),
                 "hlo_module": "jit_step"}),
    (NVJET, 75, {}),  # GEMM (library kernel)
    ("copy_6", 10, {}),  # XLA-inserted copies, other
    ("loop_multiply_fusion", 20, {}),  # optimizer, other
    # Another program's instruction of the same name: not this HLO's.
    ("loop_add_fusion_3", 5, {"hlo_op": "loop_add_fusion.3",
                              "hlo_module": "jit_other"}),
)
# (stream, name, µs in step 1, stats, index of the kernel it starts with).
GPU_COPIES = (
    ("Stream #18(MemcpyD2D)", "MemcpyD2D", 40, {}, 0),
    # The loop's predicate, copied to the host for `while.5`.
    ("Stream #15(MemcpyD2H)", "MemcpyD2H", 4,
     {"hlo_op": "while.5", "hlo_module": "jit_step"}, 1),
)
# One step on a TPU core's "XLA Ops" line: (name, start µs, µs, stats).
TPU_OPS = (
    ("gemm_fusion_dot.1", 0, 300, {}),
    ("while.5", 300, 125, {}),  # holds the next two: 25 µs its own
    ("loop_add_fusion.3", 305, 50, {"hlo_category": "loop fusion"}),
    ("loop_add_fusion.3", 360, 50, {}),
    ("custom-call.4", 430, 200, {}),
    ("input_reduce_fusion.2", 640, 50, {"hlo_op": "input_reduce_fusion.2"}),
    ("copy.6", 700, 20, {}),
    ("outfeed.9", 730, 30, {}),  # in no HLO here
)

# tsl/profiler/protobuf/xplane.proto: message → (field, number, type,
# "repeated" | "" | the oneof it is in); "map:V" is map<int64, V>.
XPLANE_PROTO = {
    "XSpace": [("planes", 1, "XPlane", "repeated"),
               ("errors", 2, "string", "repeated"),
               ("warnings", 3, "string", "repeated"),
               ("hostnames", 4, "string", "repeated")],
    "XPlane": [("id", 1, "int64", ""), ("name", 2, "string", ""),
               ("lines", 3, "XLine", "repeated"),
               ("event_metadata", 4, "map:XEventMetadata", ""),
               ("stat_metadata", 5, "map:XStatMetadata", ""),
               ("stats", 6, "XStat", "repeated")],
    "XLine": [("id", 1, "int64", ""), ("display_id", 10, "int64", ""),
              ("name", 2, "string", ""), ("display_name", 11, "string", ""),
              ("timestamp_ns", 3, "int64", ""),
              ("duration_ps", 9, "int64", ""),
              ("events", 4, "XEvent", "repeated")],
    "XEvent": [("metadata_id", 1, "int64", ""),
               ("offset_ps", 2, "int64", "data"),
               ("num_occurrences", 5, "int64", "data"),
               ("duration_ps", 3, "int64", ""),
               ("stats", 4, "XStat", "repeated")],
    "XStat": [("metadata_id", 1, "int64", ""),
              ("double_value", 2, "double", "value"),
              ("uint64_value", 3, "uint64", "value"),
              ("int64_value", 4, "int64", "value"),
              ("str_value", 5, "string", "value"),
              ("bytes_value", 6, "bytes", "value"),
              ("ref_value", 7, "uint64", "value")],
    "XEventMetadata": [("id", 1, "int64", ""), ("name", 2, "string", ""),
                       ("display_name", 4, "string", ""),
                       ("metadata", 3, "bytes", ""),
                       ("stats", 5, "XStat", "repeated"),
                       ("child_id", 6, "int64", "repeated")],
    "XStatMetadata": [("id", 1, "int64", ""), ("name", 2, "string", ""),
                      ("description", 3, "string", "")],
}
_F = descriptor_pb2.FieldDescriptorProto
_SCALARS = {"int64": _F.TYPE_INT64, "uint64": _F.TYPE_UINT64,
            "double": _F.TYPE_DOUBLE, "string": _F.TYPE_STRING,
            "bytes": _F.TYPE_BYTES}


def xplane_file() -> descriptor_pb2.FileDescriptorProto:
  """`XPLANE_PROTO` as a file descriptor (package tensorflow.profiler)."""
  pkg = "tensorflow.profiler"
  f = descriptor_pb2.FileDescriptorProto(
      name="xplane_fixture.proto", package=pkg, syntax="proto3")
  for message, fields in XPLANE_PROTO.items():
    m = f.message_type.add(name=message)
    oneofs = []
    for name, number, kind, label in fields:
      d = m.field.add(name=name, number=number, label=(
          _F.LABEL_REPEATED if label == "repeated" else _F.LABEL_OPTIONAL))
      if kind.startswith("map:"):
        entry = m.nested_type.add(
            name=name.title().replace("_", "") + "Entry")
        entry.options.map_entry = True
        entry.field.add(name="key", number=1, type=_F.TYPE_INT64,
                        label=_F.LABEL_OPTIONAL)
        entry.field.add(name="value", number=2, type=_F.TYPE_MESSAGE,
                        label=_F.LABEL_OPTIONAL,
                        type_name=f".{pkg}.{kind[4:]}")
        d.label, d.type = _F.LABEL_REPEATED, _F.TYPE_MESSAGE
        d.type_name = f".{pkg}.{message}.{entry.name}"
      elif kind in _SCALARS:
        d.type = _SCALARS[kind]
      else:
        d.type, d.type_name = _F.TYPE_MESSAGE, f".{pkg}.{kind}"
      if label not in ("", "repeated"):
        if label not in oneofs:
          oneofs.append(label)
          m.oneof_decl.add(name=label)
        d.oneof_index = oneofs.index(label)
  return f


def xspace_class():
  """The XSpace message class, in a pool of its own (no clash with
  TensorFlow's, should it be imported)."""
  pool = descriptor_pool.DescriptorPool()
  pool.Add(xplane_file())
  return message_factory.GetMessageClass(
      pool.FindMessageTypeByName("tensorflow.profiler.XSpace"))


class Plane:
  """Adds lines and events to one XPlane, interning names as XPlane does."""

  def __init__(self, space, name: str):
    self.plane = space.planes.add(id=len(space.planes), name=name)
    self.lines = {}

  def _id(self, table, name: str) -> int:
    for key, value in table.items():
      if value.name == name:
        return key
    key = len(table) + 1
    table[key].id, table[key].name = key, name
    return key

  def event(self, line: str, name: str, start_us: float, us: float,
            stats: dict):
    """An event on `line` (made at 1 ms) from `start_us`, `us` long."""
    if line not in self.lines:
      self.lines[line] = self.plane.lines.add(
          id=len(self.lines) + 1, name=line, timestamp_ns=1_000_000)
    e = self.lines[line].events.add(
        metadata_id=self._id(self.plane.event_metadata, name),
        offset_ps=round(start_us * 1e6), duration_ps=round(us * 1e6))
    for key, value in stats.items():
      stat = e.stats.add(
          metadata_id=self._id(self.plane.stat_metadata, key))
      if isinstance(value, Ref):
        stat.ref_value = self._id(self.plane.stat_metadata, value)
      else:
        stat.str_value = value


def gpu_space():
  """Two steps on /device:GPU:0 (see `GPU_KERNELS`), with derived lines and
  a host plane whose events must not count."""
  space = xspace_class()()
  gpu = Plane(space, "/device:GPU:0")
  t = 0
  for factor in (1, 3):
    step_start = t
    for i, (name, us, stats) in enumerate(GPU_KERNELS):
      for stream, copy, copy_us, copy_stats, at in GPU_COPIES:
        if at == i:
          gpu.event(stream, copy, t, copy_us * factor, copy_stats)
      gpu.event("Stream #14(Compute)", name, t, us * factor, stats)
      t += us * factor + 10
    t += -10 + 100
    # Derived from the kernels: counting them would double the time.
    gpu.event("XLA Modules", "jit_step(1)", step_start, t - step_start, {})
    gpu.event("Steps", str(factor), step_start, t - step_start, {})
    gpu.event("XLA Ops", "gemm_fusion_dot.1", step_start, 100_000, {})
    gpu.event("XLA Ops", "custom-call.4", step_start, 100_000,
              {"hlo_op": "custom-call.4"})
  Plane(space, "/host:CPU").event(
      "tf_pjrt_thread", "loop_add_fusion.3", 0, 10_000,
      {"hlo_op": "loop_add_fusion.3", "hlo_module": "jit_step"})
  return space


def tpu_space():
  """One step on /device:TPU:0 (see `TPU_OPS`), with derived lines and a
  host plane whose events must not count."""
  space = xspace_class()()
  tpu = Plane(space, "/device:TPU:0")
  for name, start, us, stats in TPU_OPS:
    tpu.event("XLA Ops", name, start, us, stats)
  tpu.event("XLA Modules", "jit_step(3)", 0, 760, {})
  tpu.event("Steps", "0", 0, 760, {})
  Plane(space, "/host:CPU").event(
      "tf_pjrt_thread", "copy.6", 0, 10_000,
      {"hlo_op": "copy.6", "hlo_module": "jit_step"})
  return space


def write_fixtures(directory=TRACES):
  directory.mkdir(parents=True, exist_ok=True)
  for name, space in (("gpu", gpu_space()), ("tpu", tpu_space())):
    (directory / f"{name}.xplane.pb").write_bytes(
        space.SerializeToString(deterministic=True))


def flat(rows):
  return {(c, p): ms for c, phases in rows for p, ms in phases.items()}


GPU_ROWS = {  # per step: twice the step-1 µs of each kernel, in ms
    ("FFN matmuls", "backward"): 0.4,
    ("attention (library kernel)", "unknown"): 0.3,
    ("attention Q/K/V/output projections", "forward"): 0.2,
    ("GEMM (library kernel)", "unknown"): 0.15,
    ("FFN GELU, bias, residual", "forward"): 0.1,
    ("memcpy/memset", "unknown"): 0.08,
    ("LayerNorm", "backward"): 0.05,
    ("optimizer, clipping, non-finite guard, metrics", "other"): 0.04,
    ("XLA-inserted copies (no op metadata)", "other"): 0.02,
    (sb.OTHER_KERNELS, "unknown"): 0.01,
    ("layer scan bookkeeping", "forward"): 0.008,
}


def test_fixtures_are_what_the_generators_write(tmp_path):
  write_fixtures(tmp_path)
  cls = xspace_class()
  for name in ("gpu", "tpu"):
    committed = cls.FromString((TRACES / f"{name}.xplane.pb").read_bytes())
    assert committed == cls.FromString(
        (tmp_path / f"{name}.xplane.pb").read_bytes()), name


def test_schema_is_tensorflows():
  xplane_pb2 = pytest.importorskip(
      "tensorflow.tsl.profiler.protobuf.xplane_pb2")
  real = descriptor_pb2.FileDescriptorProto()
  xplane_pb2.DESCRIPTOR.CopyToProto(real)
  def fields(file):
    return [(m.name, n.name, f.name, f.number, f.type, f.label, f.type_name,
             f.HasField("oneof_index") and f.oneof_index)
            for m in file.message_type for n in [m, *m.nested_type]
            for f in n.field]
  assert fields(xplane_file()) == fields(real)


def test_gpu_reads_stream_lines_only_and_names_every_kernel():
  r = sb.breakdown(str(TRACES / "gpu.xplane.pb"), HLO, steps=2)
  assert (r.platform, r.steps, r.devices) == ("gpu", 2, 1)
  assert list(flat(r.rows)) == list(GPU_ROWS)  # slowest first
  assert flat(r.rows) == pytest.approx(GPU_ROWS)
  assert r.total_ms == pytest.approx(1.358)


def test_gpu_busy_idle_wall_and_streams(tmp_path):
  # A directory works too: the newest trace under it is read.
  run = tmp_path / "plugins" / "profile" / "2026_11_27"
  run.mkdir(parents=True)
  (run / "host.xplane.pb").write_bytes(
      (TRACES / "gpu.xplane.pb").read_bytes())
  r = sb.breakdown(str(tmp_path), HLO, steps=2)
  # Stream #14: 635 µs of kernels, 715 µs from first to last in step 1;
  # step 2 100 µs later, 3 × 635 + 80 µs long; the copies run beside.
  assert r.streams == pytest.approx({"Stream #14(Compute)": 1.27,
                                     "Stream #15(MemcpyD2H)": 0.008,
                                     "Stream #18(MemcpyD2D)": 0.08})
  assert r.wall_ms == pytest.approx((715 + 100 + 1985) / 2 / 1e3)
  assert r.busy_ms == pytest.approx(1.27)
  assert r.idle_ms == pytest.approx(0.13)
  measured = sb.breakdown(str(tmp_path), HLO, steps=2, wall_ms=2.0)
  assert measured.idle_ms == pytest.approx(0.73)


def test_gpu_slowest_kernels_tie_back_to_instructions():
  r = sb.breakdown(str(TRACES / "gpu.xplane.pb"), HLO, steps=2, top=3)
  lines = {l.split(" = ")[0].split("%")[-1]: l.strip()
           for l in HLO.splitlines() if " = " in l}
  assert [e[:3] for e in r.top] == [
      ("custom-call.4", "backward", "FFN matmuls"),
      (CUDNN, "unknown", "attention (library kernel)"),
      ("gemm_fusion_dot.1", "forward", "attention Q/K/V/output projections")]
  assert [e.ms for e in r.top] == pytest.approx([0.4, 0.3, 0.2])
  assert [e.calls for e in r.top] == [1, 1, 1]  # 2 calls in 2 steps
  assert [e.hlo for e in r.top] == [lines["custom-call.4"], "",
                                    lines["gemm_fusion_dot.1"]]


def test_tpu_reads_xla_ops_and_counts_nested_ops_once():
  r = sb.breakdown(str(TRACES / "tpu.xplane.pb"), HLO, steps=1, top=2)
  assert (r.platform, r.devices) == ("tpu", 1)
  assert flat(r.rows) == pytest.approx({
      ("attention Q/K/V/output projections", "forward"): 0.3,
      ("FFN matmuls", "backward"): 0.2,
      ("FFN GELU, bias, residual", "forward"): 0.1,
      ("LayerNorm", "backward"): 0.05,
      (sb.OTHER_KERNELS, "unknown"): 0.03,
      ("layer scan bookkeeping", "forward"): 0.025,  # 125 - 2 × 50 µs
      ("XLA-inserted copies (no op metadata)", "other"): 0.02})
  assert r.total_ms == pytest.approx(0.725)
  # Busy: the ops' union, [0, 425) [430, 630) [640, 690) [700, 720)
  # [730, 760) µs; wall: 0 to 760 µs.
  assert (r.busy_ms, r.wall_ms, r.idle_ms) == pytest.approx(
      (0.725, 0.76, 0.035))
  assert r.streams == {}
  assert [e[:3] for e in r.top] == [
      ("gemm_fusion_dot.1", "forward", "attention Q/K/V/output projections"),
      ("custom-call.4", "backward", "FFN matmuls")]
  assert [e.ms for e in r.top] == pytest.approx([0.3, 0.2])
  calls = sb.breakdown(str(TRACES / "tpu.xplane.pb"), HLO, steps=1).top
  assert {e.name: e.calls for e in calls}["loop_add_fusion.3"] == 2


def _h100_step(tmp_path):
  """The recorded H100 step (see `test_a_recorded_h100_step...`): its trace
  file and HLO text."""
  trace = tmp_path / "h100.xplane.pb"
  trace.write_bytes(gzip.decompress(
      (TRACES / "h100_large_step.xplane.pb.gz").read_bytes()))
  hlo = gzip.decompress(
      (TESTDATA / "h100_step_large_seq512_b32.hlo.gz").read_bytes()).decode()
  return str(trace), hlo


def test_a_recorded_h100_step_ties_every_library_kernel_to_its_call(
    tmp_path):
  """A real trace: one ALBERT-large step (seq 512, batch 32, bf16) on an
  H100, run as a CUDA graph, so cuBLAS and cuDNN kernels carry the graph's
  `hlo_op` ("command_buffer_1") and no instruction's name. Recorded
  2026-11-27 by experiments/benchmarks/gpu_session.sh (jax 0.11.2); kept:
  the GPU plane of the trace and the HLO's ENTRY computation.

  Every cuBLAS kernel goes to one of the 317 cuBLAS calls, one each (the
  MLM decoder's [640, 30000] GEMM runs two), every cuDNN kernel to one of
  the 24 forward attention calls (one each) or the 24 backward ones (three
  each), in the pass of its call; only memsets stay unattributed.
  """
  trace, hlo = _h100_step(tmp_path)
  r = sb.breakdown(trace, hlo, steps=1, top=100_000)
  calls = {e.name: e for e in r.top}
  targets = {}
  for line in hlo.splitlines():
    m = re.search(r'%([\w.\-]+) = .* custom_call_target="([^"]+)"', line)
    if m:
      targets[m.group(1)] = m.group(2)
  cublas = [n for n, t in targets.items() if t == "__cublas$lt$matmul"]
  forward = [n for n, t in targets.items() if t == "__cudnn$fmhaSoftmax"]
  backward = [n for n, t in targets.items()
              if t == "__cudnn$fmhaSoftmaxBackward"]
  assert (len(cublas), len(forward), len(backward)) == (317, 24, 24)
  assert sorted(calls[n].calls for n in cublas) == [1] * 316 + [2]
  decoder = next(n for n in cublas if calls[n].calls == 2)
  assert "bf16[640,30000]" in calls[decoder].hlo
  assert {calls[n].calls for n in forward} == {1}
  assert {calls[n].calls for n in backward} == {3}
  assert {calls[n].phase for n in forward} == {"forward"}
  assert {calls[n].phase for n in backward} == {"backward"}
  unknown = {c for c, phases in r.rows if "unknown" in phases}
  assert unknown == {"memcpy/memset"}

  # Time is moved, not made: each library's kernels (by symbol, straight
  # from the trace) add up to what its calls got, and all events to the
  # total.
  events = [e for p in jax.profiler.ProfileData.from_file(trace).planes
            if p.name.startswith("/device:GPU:") for l in p.lines
            for e in l.events]
  def ms(pattern):
    return sum(e.duration_ns for e in events
               if re.search(pattern, e.name)) / 1e6
  assert sum(calls[n].ms for n in cublas) == pytest.approx(
      ms("^nvjet|cutlass|cublasLt"))
  assert sum(calls[n].ms for n in forward + backward) == pytest.approx(
      ms("cudnn"))
  assert r.total_ms == pytest.approx(
      sum(e.duration_ns for e in events) / 1e6)
  assert len(events) == 1921


@pytest.mark.parametrize("symbol, component", [
    (XMMA, "GEMM (library kernel)"),
    ("cutlass_80_tensorop_s1688gemm_128x128_32x3_nn_align4",
     "GEMM (library kernel)"),
    ("fmha_cutlassF_f16_aligned_64x64_rf_sm80", "attention (library kernel)"),
    ("flash_fwd_kernel", "attention (library kernel)"),
    ("Memset (Device)", "memcpy/memset"),
    ("redzone_checker", sb.OTHER_KERNELS),
])
def test_library_kernels_by_symbol(symbol, component):
  assert sb.library_component(symbol) == component


def _trace_a_jitted_step(directory: str) -> str:
  """Traces two steps of a jitted scan into `directory`; the step's HLO."""
  def loss(w, x):
    def layer(h, _):
      with jax.named_scope("FFNBlock/intermediate"):
        return jnp.tanh(h @ w), None
    return jnp.sum(jax.lax.scan(layer, x, None, length=2)[0] ** 2)

  w, x = jnp.full((64, 64), 0.01), jnp.ones((32, 64))
  compiled = jax.jit(lambda w, x: w - 0.1 * jax.grad(loss)(w, x)).lower(
      w, x).compile()
  compiled(w, x).block_until_ready()
  with jax.profiler.trace(directory):
    for _ in range(2):
      compiled(w, x).block_until_ready()
  return compiled.as_text()


def test_cpu_trace_of_a_jitted_step(tmp_path):
  text = fresh_process.run(_trace_a_jitted_step, str(tmp_path))
  r = sb.breakdown(str(tmp_path), text, steps=2, top=1000)
  assert (r.platform, r.busy_ms, r.idle_ms, r.streams) == ("cpu", None,
                                                           None, {})
  names = sb.hlo_op_names(text)
  assert r.top and all(e.name in names for e in r.top)
  assert not any(" while(" in e.hlo for e in r.top)  # its body counts
  ffn = dict(r.rows)["FFN matmuls"]
  assert ffn["forward"] > 0 and ffn["backward"] > 0
  assert r.total_ms > 0 and r.wall_ms > 0
  assert sum(flat(r.rows).values()) == pytest.approx(r.total_ms)


def test_markdown_and_summary(tmp_path):
  r = sb.breakdown(str(TRACES / "gpu.xplane.pb"), HLO, steps=2, top=1)
  text = sb.to_markdown(r, "fixture")
  assert text.splitlines()[:4] == [
      "Profile: fixture. GPU kernel time in ms per step and device (2 "
      "steps, 1 device traced), summed over streams (can exceed the wall "
      "time). Wall 1.400 ms per step: device busy 1.270, idle / launch gaps "
      "0.130.",
      "| component | forward | backward | other | unknown | total | share |",
      "|---|---:|---:|---:|---:|---:|---:|",
      "| FFN matmuls |  | 0.400 |  |  | 0.400 | 29.5% |"]
  assert "| total | | | | | 1.358 | 100% |" in text
  assert "| Stream #14(Compute) | 1.270 |" in text
  assert text.endswith(
      "| custom-call.4 | backward | FFN matmuls | 0.400 | 1 | "
      "`(f32[16,16]{1,0}, s8[64]{0}) custom-call(%x.1, %x.1), "
      'custom_call_target="__cublas$gemm"` |\n')
  path = sb.write_summary(r, str(tmp_path / "out"), "fixture")
  assert pathlib.Path(path).read_text(encoding="utf-8") == text


def test_no_events_is_an_error(tmp_path):
  space = xspace_class()()
  Plane(space, "/host:CPU").event("python", "$main.py:1 f", 0, 5, {})
  (tmp_path / "t.xplane.pb").write_bytes(space.SerializeToString())
  with pytest.raises(ValueError, match="No cpu XLA events"):
    sb.breakdown(str(tmp_path / "t.xplane.pb"), HLO, steps=1)


def test_step_profile_calls_the_package():
  sys.path.insert(0, str(EXPERIMENTS / "benchmarks"))
  import step_profile  # pylint: disable=g-import-not-at-top,import-outside-toplevel
  assert step_profile.classify is sb.classify
  rows, total, top = step_profile.profile_breakdown(
      str(TRACES / "gpu.xplane.pb"), HLO, 2, top=1)
  assert flat(rows) == pytest.approx(GPU_ROWS)
  assert total == pytest.approx(1.358)
  assert top[0][:3] == ("custom-call.4", "backward", "FFN matmuls")
  out = io.StringIO()
  step_profile.print_profile("t", rows, total, top, 1.5, file=out)
  assert out.getvalue().startswith("\nProfile: t. XLA:CPU thunk time ")
  assert "| FFN matmuls |  | 0.400 |  |  | 0.400 | 29.5% |" in out.getvalue()


if __name__ == "__main__":
  write_fixtures()
