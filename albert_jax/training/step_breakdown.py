"""Where a train step spends its time, from a `jax.profiler` trace.

`breakdown` reads a trace (an XSpace, `*.xplane.pb`) of a few steps of one
compiled program and the program's HLO text (`compiled.as_text()`), and
returns milliseconds per step by model component and phase, and the
slowest HLO instructions or kernels. Which events it reads depends on the
platform the trace came from:

  GPU  the `Stream #...` lines of the `/device:GPU:N` planes: one CUPTI
       event per kernel, memcpy or memset. The other lines of those planes
       ("XLA Ops", "XLA Modules", "Steps", ...) are derived from the same
       events and would count them twice.
  TPU  the "XLA Ops" line of the `/device:TPU:N` planes: one event per HLO
       instruction executed.
  CPU  the host plane's XLA thunk events (those with an `hlo_op` stat),
       one per HLO thunk run, on whatever thread ran it.

An event is tied to its HLO instruction by its `hlo_op` stat, else by its
name: an instruction's name, or the kernel name XLA:GPU gives a fusion (the
instruction's name with "." and "-" turned into "_"), unless its
`hlo_module` stat names another program. On GPU, a library kernel (cuBLAS,
cuDNN, a Mosaic GPU kernel) has neither when XLA runs the step as a CUDA
graph (its `hlo_op` is then the graph's, "command_buffer_1"): it is tied by
order instead. A stream runs the entry computation's kernels in schedule
order (the order of the HLO text), so such a kernel belongs to the first
instruction after the last one tied that calls that library (a
`custom-call` to cuBLAS, cuDNN or Mosaic GPU) and launches no kernel named
after itself; the kernels of one cuDNN call (its backward runs three) follow
each other and go to the same call. Kernels named after an instruction move
that place only when they run once a step: XLA:GPU gives identical fusions
one kernel, named after the first (an unrolled layer's fusions all run as
layer 0's), so such a name says nothing of where in the step it ran. The
instruction's
`op_name` metadata (the JAX name stack: Flax module paths, `jvp(...)` for
the forward pass, `transpose(jvp(...))` for the backward pass) gives its
component and phase (`classify`). An event that ties to no instruction (a
cuBLAS or cuDNN kernel run without XLA's annotation, a memcpy, a kernel of
another program) is counted too, by its symbol (`LIBRARY_KERNELS`), in
phase "unknown": every device event is in the total.

Times are per step (the events' time over the number of steps traced) and,
on a device, per device (averaged over the device planes with events):

  GPU  kernel time summed over streams: concurrent streams can add up to
       more than the wall time. `busy_ms` is the time at least one stream
       ran something; `idle_ms` the wall time less that (launch gaps,
       host-side work, waiting on the host).
  TPU  op time; an op nested in another (a loop's body in its `while`) is
       counted once: the outer op keeps only its own time.
  CPU  thunk time summed over threads, so it can exceed the wall time; no
       busy or idle time.
"""

from __future__ import annotations

import collections
import dataclasses
import glob
import math
import os
import re
import typing

import jax

from albert_jax import storage

# (component, op_name pattern); the first match wins.
COMPONENTS = (
    ("LayerNorm", r"layer_norm"),
    ("attention Q/K/V/output projections",
     r"AttentionBlock/(query|key|value|output)/"),
    ("attention scores, mask, softmax, context", r"AttentionBlock/"),
    ("FFN matmuls", r"FFNBlock/(intermediate|output)/"),
    ("FFN GELU, bias, residual", r"FFNBlock/"),
    # Writing and reading the stacked per-layer residuals, slicing the
    # parameters, zero-filling and summing the shared-parameter gradients.
    ("layer scan bookkeeping", r"encoder/(while|broadcast)"),
    ("embeddings, E→H projection",
     r"embeddings/|embedding_hidden_mapping_in"),
    ("MLM head (gather, dense, decoder)", r"/mlm/|take_along_axis"),
    ("pooler, SOP head", r"/pooler/|/sop/"),
)
# Outside the forward and backward passes: (component, op_name pattern),
# the name scopes `training.step.make_train_step` gives them; the first match
# wins, and an op of none counts in OTHER.
OTHER_COMPONENTS = (
    ("optimizer and gradient clipping", r"/optimizer/"),
    ("non-finite guard", r"/nonfinite_guard/"),
    ("metrics", r"/step_metrics/"),
)
OTHER = "optimizer, clipping, non-finite guard, metrics"
# Kernels tied to no instruction, by symbol: (component, pattern), the first
# match wins. Attention first: CUTLASS and cuDNN flash kernels are attention
# though their symbols may say "gemm" or "cutlass".
LIBRARY_KERNELS = (
    ("attention (library kernel)", r"cudnn|fmha|sdpa|flash|mha"),
    ("GEMM (library kernel)", r"gemm|nvjet|cutlass|xmma|cublas"),
    ("Pallas kernel (Mosaic GPU)", r"mosaic"),
    ("memcpy/memset", r"memcpy|memset"),
)
# Which custom calls launch which library's kernels: (library component,
# custom_call_target pattern). A kernel tied to none by name is matched by
# order to a call of its library (see the module docstring).
_LIBRARY_CALLS = (
    ("attention (library kernel)", r"cudnn"),
    ("GEMM (library kernel)", r"cublas|gemm"),
    ("Pallas kernel (Mosaic GPU)", r"mosaic"),
)
_TARGET = re.compile(r'custom_call_target="([^"]*)"')
OTHER_KERNELS = "other kernels (library, or not in this HLO)"
PHASES = ("forward", "backward", "other", "unknown")
# Control flow whose thunk runs others on CPU: its children are counted, on
# other threads too, so its own event would count them twice.
_CONTAINERS = ("while", "conditional", "call")
_INSTRUCTION = re.compile(r"^\s*(?:ROOT )?%?([\w.\-]+) = [^\n]*", re.M)
_OP_NAME = re.compile(r'metadata=\{[^}]*op_name="([^"]*)"')
# The opcode follows the result type, an array or a (nested) tuple.
_OPCODE = re.compile(r"= (?:\(.*?\)|\S+) ([\w\-]+)\(")


class Entry(typing.NamedTuple):
  """One instruction (or unmatched kernel symbol) and its time.

  Attributes:
    name: the HLO instruction, or the kernel's symbol if none matched.
    phase: "forward", "backward", "other" or "unknown".
    component: the row of the breakdown it counts in.
    ms: milliseconds per step (and device).
    calls: events per step (and device).
    hlo: the instruction's HLO line ("" for a kernel of no instruction).
  """
  name: str
  phase: str
  component: str
  ms: float
  calls: float
  hlo: str


@dataclasses.dataclass
class StepBreakdown:
  """Milliseconds per step of one traced program (see the module docstring).

  Attributes:
    platform: "cpu", "gpu" or "tpu": which events were read.
    steps: steps traced (the divisor).
    devices: device planes with events (1 on CPU).
    rows: (component, {phase: ms per step}) by total, slowest first.
    total_ms: sum of the rows, ms per step.
    top: the slowest instructions or kernels.
    wall_ms: wall time per step: as measured by the caller, else the span
      from the first to the last event read, over the steps.
    busy_ms: per step, time any stream (TPU: op) of a device ran; None on
      CPU.
    idle_ms: `wall_ms` less `busy_ms`; None on CPU.
    streams: GPU stream (line name) → ms per step of its events.
    wall_share: (component, ms per step) of wall time, slowest first: each
      instant a device (CPU: the host) ran events is shared equally among
      the events running then, so, unlike `rows`, these add up to the time
      something ran, however many streams or threads ran at once.
    span_ms: per step, the first event's start to the last event's end.
  """
  platform: str
  steps: int
  devices: int
  rows: list[tuple[str, dict[str, float]]]
  total_ms: float
  top: list[Entry]
  wall_ms: float | None = None
  busy_ms: float | None = None
  idle_ms: float | None = None
  streams: dict[str, float] = dataclasses.field(default_factory=dict)
  wall_share: list[tuple[str, float]] = dataclasses.field(
      default_factory=list)
  span_ms: float | None = None

  @property
  def unattributed_ms(self) -> float | None:
    """Per step, the wall time no counted event ran in (Python, dispatch,
    waiting on data, launch gaps): `wall_ms` less the wall shares."""
    if self.wall_ms is None or not self.wall_share:
      return None
    return self.wall_ms - sum(ms for _, ms in self.wall_share)


class _Instruction(typing.NamedTuple):
  op_name: str
  opcode: str
  text: str


class _Program(typing.NamedTuple):
  """What ties an event to an instruction of one HLO module."""
  instructions: dict[str, _Instruction]
  sanitised: dict[str, str]  # XLA:GPU's kernel name → instruction
  module: str | None  # the `hlo_module` its events carry
  # The entry computation's instructions in schedule order, and of those
  # the library calls: name → the library component of their kernels.
  schedule: list[str]
  library_calls: dict[str, str]


def _instructions(hlo_text: str) -> dict[str, _Instruction]:
  """HLO instruction name → its op_name metadata, opcode and line."""
  found = {}
  for m in _INSTRUCTION.finditer(hlo_text):
    op_name, opcode = _OP_NAME.search(m.group(0)), _OPCODE.search(m.group(0))
    found.setdefault(m.group(1), _Instruction(
        op_name.group(1) if op_name else "",
        opcode.group(1) if opcode else "", m.group(0).strip()))
  return found


def _entry_schedule(hlo_text: str) -> list[str]:
  """The ENTRY computation's instruction names, in the text's order: a
  scheduled module prints them in the order they run."""
  entry = re.search(r"^ENTRY [^\n]*\n(.*?)^\}", hlo_text, re.M | re.S)
  if entry is None:
    return []
  return [m.group(1) for m in _INSTRUCTION.finditer(entry.group(1))]


def _program(hlo_text: str) -> _Program:
  instructions = _instructions(hlo_text)
  sanitised = {}
  for name in instructions:
    sanitised.setdefault(name.replace(".", "_").replace("-", "_"), name)
  module = re.search(r"^HloModule ([\w.\-]+)", hlo_text, re.M)
  schedule = _entry_schedule(hlo_text)
  library_calls = {}
  for name in schedule:
    target = _TARGET.search(instructions[name].text)
    if instructions[name].opcode == "custom-call" and target:
      for component, pattern in _LIBRARY_CALLS:
        if re.search(pattern, target.group(1), re.I):
          library_calls[name] = component
          break
  return _Program(instructions, sanitised, module and module.group(1),
                  schedule, library_calls)


class _Order:
  """Ties a line's library kernels that name no instruction to the library
  calls of the schedule, by order (see the module docstring)."""

  def __init__(self, program: _Program, named: set[str],
               anchors: set[str]):
    self.program = program
    # Instructions whose kernel runs once a step: where it ran is known.
    self.index = {n: i for i, n in enumerate(program.schedule)
                  if n in anchors}
    # Calls that launch kernels named after themselves are not candidates.
    self.calls = [(i, n, program.library_calls[n])
                  for i, n in enumerate(program.schedule)
                  if n in program.library_calls and n not in named]
    self.position = 0  # schedule index after the last instruction tied
    self.last: tuple[str, str] | None = None  # (component, call) just tied

  def named(self, name: str) -> None:
    """An event tied to `name` by its name or `hlo_op`."""
    self.last = None
    if name in self.index:
      self.position = self.index[name] + 1

  def library(self, symbol: str) -> str | None:
    """The call a library kernel `symbol` belongs to, or None."""
    component = library_component(symbol)
    if component == "memcpy/memset":
      return None  # inside a call (a workspace's zeroing): the chain holds
    if self.last is not None and self.last[0] == component and (
        component == "attention (library kernel)"):
      return self.last[1]  # the next kernel of the same cuDNN call
    after = [c for c in self.calls if c[0] >= self.position]
    for i, name, kind in after + self.calls:  # wrapping into the next step
      if kind == component:
        self.position, self.last = i + 1, (component, name)
        return name
    self.last = None
    return None


def hlo_op_names(hlo_text: str) -> dict[str, str]:
  """HLO instruction name → its op_name metadata ("" when it has none)."""
  return {k: v.op_name for k, v in _instructions(hlo_text).items()}


def classify(instruction: str, op_name: str) -> tuple[str, str]:
  """(phase, component) of one HLO instruction."""
  if not op_name:
    # Fills and copies XLA adds itself, mostly the zero-initialised stacked
    # outputs of the layer scan and copies of them.
    kind = "copies" if instruction.startswith("copy") else "fills, other"
    return "other", f"XLA-inserted {kind} (no op metadata)"
  if "transpose(jvp(" in op_name:
    phase = "backward"
  elif "jvp(" in op_name:
    phase = "forward"
  else:
    for component, pattern in OTHER_COMPONENTS:
      if re.search(pattern, op_name):
        return "other", component
    return "other", OTHER
  for component, pattern in COMPONENTS:
    if re.search(pattern, op_name):
      return phase, component
  return phase, "losses (cross-entropy) and the rest"


def library_component(symbol: str) -> str:
  """The component of a kernel tied to no instruction, by its symbol."""
  for component, pattern in LIBRARY_KERNELS:
    if re.search(pattern, symbol, re.I):
      return component
  return OTHER_KERNELS


def newest_trace(trace: str) -> str:
  """`trace` if it is a file, else the newest `*.xplane.pb` under it."""
  if not os.path.isdir(trace):
    return trace
  files = sorted(glob.glob(os.path.join(trace, "**", "*.xplane.pb"),
                           recursive=True), key=os.path.getmtime)
  if not files:
    raise FileNotFoundError(f"No *.xplane.pb trace under {trace}.")
  return files[-1]


def load(trace: str) -> jax.profiler.ProfileData:
  """A trace file, or the newest `*.xplane.pb` under a directory."""
  return jax.profiler.ProfileData.from_file(newest_trace(trace))


def _lines(data) -> tuple[str, list]:
  """The platform and the (plane name, line) pairs to read."""
  planes = list(data.planes)
  gpus = [p for p in planes if p.name.startswith("/device:GPU:")]
  if gpus:
    return "gpu", [(p.name, l) for p in gpus for l in p.lines
                   if l.name.startswith("Stream #")]
  tpus = [p for p in planes if p.name.startswith("/device:TPU:")]
  if tpus:
    return "tpu", [(p.name, l) for p in tpus for l in p.lines
                   if l.name == "XLA Ops"]
  hosts = [p for p in planes if p.name == "/host:CPU"] or planes
  return "cpu", [(p.name, l) for p in hosts for l in p.lines]


def _self_times(spans: list[tuple[float, float]]) -> list[float]:
  """Each (start, end) span's length less that of the spans nested directly
  in it, for the events of one line (a `while` op and its body's ops)."""
  own = [end - start for start, end in spans]
  stack = []
  for i in sorted(range(len(spans)), key=lambda i: (spans[i][0], -own[i])):
    start, end = spans[i]
    while stack and spans[stack[-1]][1] <= start:
      stack.pop()
    if stack and end <= spans[stack[-1]][1]:
      own[stack[-1]] -= end - start
    stack.append(i)
  return own


def _union(spans: list[tuple[float, float]]) -> float:
  """Length of the union of (start, end) spans."""
  total, reach = 0.0, -math.inf
  for start, end in sorted(spans):
    if end > reach:
      total += end - max(start, reach)
      reach = end
  return total


def _shares(spans: list[tuple[float, float, str]]) -> dict[str, float]:
  """Each key's share of the time covered by (start, end, key) spans: every
  instant is split equally among the spans covering it."""
  edges = sorted({t for start, end, _ in spans for t in (start, end)})
  if len(edges) < 2:
    return {}
  index = {t: i for i, t in enumerate(edges)}
  # Per elementary interval: how many spans, and of each key, cover it.
  delta = [0] * len(edges)
  by_key = collections.defaultdict(lambda: [0] * len(edges))
  for start, end, key in spans:
    if end > start:
      delta[index[start]] += 1
      delta[index[end]] -= 1
      by_key[key][index[start]] += 1
      by_key[key][index[end]] -= 1
  active, counts = 0, []
  for d in delta[:-1]:
    active += d
    counts.append(active)
  out = {}
  for key, deltas in by_key.items():
    mine, total = 0, 0.0
    for i, d in enumerate(deltas[:-1]):
      mine += d
      if mine:
        total += (edges[i + 1] - edges[i]) * mine / counts[i]
    out[key] = total
  return out


def _named(event, program: _Program) -> str | None:
  """The instruction an event names by its `hlo_op` or its own name."""
  stats = dict(event.stats)
  inst = program.instructions
  # Another program's instruction may share a name ("copy.1").
  if program.module not in (None, stats.get("hlo_module", program.module)):
    return None
  return next((n for n in (stats.get("hlo_op"), event.name,
                           program.sanitised.get(event.name)) if n in inst),
              None)


def _label(event, platform: str, program: _Program,
           order: _Order | None = None):
  """(name, phase, component, HLO line) an event counts under; None for one
  not counted (on CPU: host work, a loop whose body's thunks count)."""
  inst = program.instructions
  name = _named(event, program)
  if order is not None:
    if name is not None:
      order.named(name)
    else:
      name = order.library(event.name)
  if name is not None:
    if platform == "cpu" and inst[name].opcode in _CONTAINERS:
      return None
    return name, *classify(name, inst[name].op_name), inst[name].text
  if platform == "cpu" and (
      dict(event.stats).get("hlo_op") is None
      or event.name.split(".")[0] in _CONTAINERS):
    return None
  return event.name, "unknown", library_component(event.name), ""


def breakdown(trace: str, hlo_text: str, steps: int, top: int = 10,
              wall_ms: float | None = None) -> StepBreakdown:
  """Milliseconds per step by component and phase, from a trace.

  Args:
    trace: an `*.xplane.pb` file, or a directory holding one (the newest
      under it is read).
    hlo_text: the traced program's `compiled.as_text()`.
    steps: how many steps the trace holds.
    top: how many of the slowest instructions or kernels to list.
    wall_ms: the measured wall time per step; default: the span of the
      events read, over `steps`.

  Returns:
    The breakdown (see `StepBreakdown` and the module docstring).

  Raises:
    ValueError: if the trace holds no event to count.
  """
  data, program = load(trace), _program(hlo_text)
  platform, lines = _lines(data)
  totals = collections.defaultdict(collections.Counter)
  per_name, calls, labels = collections.Counter(), collections.Counter(), {}
  streams = collections.Counter()
  spans_of = collections.defaultdict(list)
  keyed_of = collections.defaultdict(list)  # device → (start, end, component)
  named, runs = set(), {}
  if platform == "gpu":
    for device, line in lines:
      runs[device, line.name] = collections.Counter(
          n for e in line.events if (n := _named(e, program)) is not None)
      named.update(runs[device, line.name])
  for device, line in lines:
    events = sorted(line.events, key=lambda e: e.start_ns)
    order = None
    if platform == "gpu":
      order = _Order(program, named, {
          n for n, k in runs[device, line.name].items() if k == steps})
    spans = [(e.start_ns, e.start_ns + e.duration_ns) for e in events]
    # Host threads run a loop's body thunks on other threads than its
    # `while` thunk: nesting on one line says nothing there.
    own = (_self_times(spans) if platform != "cpu"
           else [e.duration_ns for e in events])
    for event, span, ns in zip(events, spans, own):
      label = _label(event, platform, program, order)
      if label is None:
        continue
      name, phase, component, _ = label
      labels[name] = label
      totals[component][phase] += ns
      per_name[name] += ns
      calls[name] += 1
      streams[line.name] += ns
      spans_of[device].append(span)
      keyed_of[device].append((*span, component))
  if not per_name:
    raise ValueError(f"No {platform} XLA events in {trace}; planes: "
                     f"{[p.name for p in data.planes]}.")
  devices = len(spans_of) if platform != "cpu" else 1
  scale = 1e-6 / steps / devices  # ns in all → ms per step and device
  rows = [(c, {p: phases[p] * scale for p in PHASES if p in phases})
          for c, phases in totals.items()]
  rows.sort(key=lambda kv: (-sum(kv[1].values()), kv[0]))
  span_ms = sum(max(e for _, e in s) - min(b for b, _ in s)
                for s in spans_of.values()) * 1e-6 / steps / len(spans_of)
  if wall_ms is None:
    wall_ms = span_ms
  shares = collections.Counter()
  for keyed in keyed_of.values():
    shares.update(_shares(keyed))
  wall_scale = 1e-6 / steps / len(keyed_of)
  wall_share = sorted(((c, ns * wall_scale) for c, ns in shares.items()),
                      key=lambda kv: (-kv[1], kv[0]))
  busy_ms = idle_ms = None
  if platform != "cpu":
    busy_ms = sum(_union(s) for s in spans_of.values()) * scale
    idle_ms = wall_ms - busy_ms
  return StepBreakdown(
      platform=platform, steps=steps, devices=devices, rows=rows,
      total_ms=sum(per_name.values()) * scale,
      top=[Entry(*labels[n][:3], ns * scale, calls[n] / steps / devices,
                 labels[n][3]) for n, ns in per_name.most_common(top)],
      wall_ms=wall_ms, busy_ms=busy_ms, idle_ms=idle_ms,
      streams=({k: v * scale for k, v in sorted(streams.items())}
               if platform == "gpu" else {}),
      wall_share=wall_share, span_ms=span_ms)


def _count(n: int, what: str) -> str:
  return f"{n} {what}{'s' * (n != 1)}"


def _header(result: StepBreakdown, title: str) -> str:
  """What the numbers mean, for the platform the trace came from."""
  head = f"Profile: {title}." if title else "Profile."
  traced = [_count(result.steps, "step")] if result.steps else []
  if result.platform == "cpu":
    what = "XLA:CPU thunk time in ms per step"
    how = ", summed over threads (can exceed the wall time)"
  else:
    traced.append(_count(result.devices, "device"))
    what = "GPU kernel time" if result.platform == "gpu" else (
        'TPU op time (the "XLA Ops" line)')
    what += " in ms per step and device"
    how = (", summed over streams (can exceed the wall time)"
           if result.platform == "gpu" else "")
  traced = f" ({', '.join(traced)} traced)" if traced else ""
  text = f"{head} {what}{traced}{how}."
  if result.wall_ms is not None:
    text += f" Wall {result.wall_ms:,.3f} ms per step"
    if result.busy_ms is not None:
      text += (f": device busy {result.busy_ms:,.3f}, idle / launch gaps "
               f"{result.idle_ms:,.3f}")
    text += "."
  return text


def to_markdown(result: StepBreakdown, title: str = "") -> str:
  """The breakdown, streams (GPU) and slowest entries as markdown tables."""
  phases = [p for p in PHASES
            if p != "unknown" or any(p in ph for _, ph in result.rows)]
  out = [_header(result, title),
         f"| component | {' | '.join(phases)} | total | share |",
         f"|---|{'---:|' * (len(phases) + 2)}"]
  for component, by_phase in result.rows:
    total = sum(by_phase.values())
    cells = [f"{by_phase[p]:,.3f}" if p in by_phase else "" for p in phases]
    out.append(f"| {component} | {' | '.join(cells)} | {total:,.3f} | "
               f"{100 * total / max(result.total_ms, 1e-12):.1f}% |")
  out.append(f"| total |{' |' * len(phases)} {result.total_ms:,.3f} | "
             "100% |")
  if result.streams:
    out += ["", "| stream | ms per step |", "|---|---:|"]
    out += [f"| {s} | {ms:,.3f} |" for s, ms in result.streams.items()]
  if result.wall_share and result.wall_ms:
    out += ["", f"Wall time per step, {result.wall_ms:,.3f} ms: each "
            "instant shared among the events running then.", "",
            "| component | ms per step | share of the wall time |",
            "|---|---:|---:|"]
    rest = result.unattributed_ms
    for component, ms in result.wall_share + [
        ("no XLA op running (Python, dispatch, data wait, launch gaps)",
         rest)]:
      out.append(f"| {component} | {ms:,.3f} | "
                 f"{100 * ms / result.wall_ms:.1f}% |")
    out.append(f"| wall time | {result.wall_ms:,.3f} | 100% |")
  out += ["", "| slowest HLO instructions and kernels | phase | component "
          "| ms | calls | shape and op |", "|---|---|---|---:|---:|---|"]
  for e in result.top:
    op = e.hlo.split(" = ", 1)[-1].split(", metadata=")[0][:110]
    name = e.name if len(e.name) <= 60 else e.name[:59] + "…"
    out.append(f"| {name} | {e.phase} | {e.component} | {e.ms:,.3f} | "
               f"{e.calls:g} | {f'`{op}`' if op else ''} |")
  return "\n".join(out) + "\n"


def write_summary(result: StepBreakdown, directory: str,
                  title: str = "", name: str = "summary.md") -> str:
  """Writes `to_markdown` to `directory`/`name` (local or gs://); returns
  its path."""
  root = storage.path(directory)
  root.mkdir(parents=True, exist_ok=True)
  storage.write_atomic(root / name, to_markdown(result, title))
  return os.fspath(root / name)
