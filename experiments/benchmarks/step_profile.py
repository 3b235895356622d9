"""Where albert_jax's train step spends its time, from a `jax.profiler` trace.

XLA records one trace event per executed HLO thunk (CPU) or kernel (GPU,
TPU), tagged with its HLO instruction. The compiled module's text maps each
instruction to its `op_name` metadata (the JAX name stack: Flax module
paths, `jvp(...)` for the forward pass, `transpose(jvp(...))` for the
backward pass), which `classify` turns into a model component and a phase.
The breakdown was written against XLA:CPU's traces; on an accelerator it
reads the same tags from the device planes, untested here.
"""

import collections
import glob
import os
import re
import sys
import time

import jax

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
# Thunks that only run others; their time is their children's.
_CONTAINERS = ("while", "conditional", "call")


def hlo_op_names(hlo_text: str) -> dict[str, str]:
  """HLO instruction name → its op_name metadata ("" when it has none)."""
  names = {}
  pattern = re.compile(r"^\s*(?:ROOT )?%?([\w.\-]+) = [^\n]*", re.M)
  op_name = re.compile(r'metadata=\{[^}]*op_name="([^"]*)"')
  for m in pattern.finditer(hlo_text):
    found = op_name.search(m.group(0))
    names.setdefault(m.group(1), found.group(1) if found else "")
  return names


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
    return "other", "optimizer, clipping, non-finite guard, metrics"
  for component, pattern in COMPONENTS:
    if re.search(pattern, op_name):
      return phase, component
  return phase, "losses (cross-entropy) and the rest"


def profile_breakdown(trace_dir: str, hlo_text: str, steps: int,
                      top: int = 10):
  """Per-component milliseconds per step from a `jax.profiler` trace.

  XLA records one event per executed HLO thunk (on CPU) or kernel (on an
  accelerator, whose device planes are read instead of the host's), tagged
  with its instruction (`hlo_op`); events of control-flow thunks (while,
  call) are left out, since their children are counted. Times are summed
  over threads, so on CPU the shares are of busy thread time.

  Returns:
    (rows, total, instructions): rows is a list of (component, {phase: ms
    per step}) sorted by total; total the ms per step of all of them;
    instructions the `top` slowest HLO instructions as (name, phase,
    component, ms per step, calls per step, the instruction's HLO line).
  """
  files = sorted(glob.glob(os.path.join(trace_dir, "**", "*.xplane.pb"),
                           recursive=True), key=os.path.getmtime)
  if not files:
    raise FileNotFoundError(f"No *.xplane.pb trace under {trace_dir}.")
  data = jax.profiler.ProfileData.from_file(files[-1])
  names = hlo_op_names(hlo_text)
  totals = collections.defaultdict(collections.Counter)
  per_instruction = collections.Counter()
  calls = collections.Counter()
  # On an accelerator its own planes hold the kernels; the host's hold the
  # launches, which would count twice.
  planes = [p for p in data.planes if p.name.startswith("/device:")]
  for plane in planes or data.planes:
    for line in plane.lines:
      for event in line.events:
        name = dict(event.stats).get("hlo_op", event.name)
        if name not in names or name.split(".")[0] in _CONTAINERS:
          continue
        phase, component = classify(name, names[name])
        ms = event.duration_ns / 1e6 / steps
        totals[component][phase] += ms
        per_instruction[name] += ms
        calls[name] += 1
  rows = sorted(totals.items(), key=lambda kv: -sum(kv[1].values()))
  lines = {m.group(1): m.group(0).strip() for m in re.finditer(
      r"^\s*(?:ROOT )?%?([\w.\-]+) = [^\n]*", hlo_text, re.M)}
  instructions = [(name, *classify(name, names[name]), ms,
                   calls[name] / steps, lines.get(name, ""))
                  for name, ms in per_instruction.most_common(top)]
  return rows, sum(per_instruction.values()), instructions


def run_profile(runner, trace_dir: str, steps: int, top: int = 10):
  """Traces `steps` calls of `runner.step()` into `trace_dir`.

  The compiled step's HLO is written beside the trace (`step.hlo.txt`).

  Returns:
    `profile_breakdown`'s rows, total and top instructions for the runner's
    compiled step (`runner.compiled`), and the wall ms per traced step.
  """
  os.makedirs(trace_dir, exist_ok=True)
  hlo_text = runner.compiled.as_text()
  with open(os.path.join(trace_dir, "step.hlo.txt"), "w",
            encoding="utf-8") as f:
    f.write(hlo_text)
  jax.profiler.start_trace(trace_dir)
  start = time.perf_counter()
  try:
    for _ in range(steps):
      runner.step()
  finally:
    wall_ms = (time.perf_counter() - start) * 1e3 / steps
    jax.profiler.stop_trace()
  return (*profile_breakdown(trace_dir, hlo_text, steps, top), wall_ms)


def print_profile(title: str, rows, total_ms: float, instructions,
                  wall_ms: float, file=sys.stdout):
  """The breakdown and the slowest instructions as markdown tables."""
  print(f"\nProfile: {title}. ms per step, summed over threads; the traced "
        f"steps took {wall_ms:,.1f} ms each.", file=file)
  print("| component | forward | backward | other | total | share |",
        file=file)
  print("|---|---:|---:|---:|---:|---:|", file=file)
  for component, phases in rows:
    total = sum(phases.values())
    cells = [f"{phases.get(p, 0.0):,.1f}"
             for p in ("forward", "backward", "other")]
    print(f"| {component} | {' | '.join(cells)} | {total:,.1f} | "
          f"{100 * total / max(total_ms, 1e-9):.1f}% |", file=file)
  print(f"| total | | | | {total_ms:,.1f} | 100% |", file=file)
  print("\n| slowest HLO instructions | phase | component | ms | calls | "
        "shape and op |", file=file)
  print("|---|---|---|---:|---:|---|", file=file)
  for name, phase, component, ms, count, line in instructions:
    op = line.split(" = ", 1)[-1].split(", metadata=")[0][:110]
    print(f"| {name} | {phase} | {component} | {ms:,.1f} | {count:g} | "
          f"`{op}` |", file=file)
