"""Where albert_jax's train step spends its time, from a `jax.profiler` trace.

A thin caller of `albert_jax.training.step_breakdown`, which reads the trace
(XLA:CPU thunks, GPU kernels per stream, TPU ops), ties each event to its
HLO instruction and classifies it by model component and phase. Here:
`run_profile` traces a runner's steps, and `profile_breakdown` and
`print_profile` keep the tuple form `train_step.py` stores and prints.
"""

import os
import sys
import time

import jax

from albert_jax.training import step_breakdown
# Re-exported: the benchmarks' tests and callers use them from here.
from albert_jax.training.step_breakdown import classify  # noqa: F401  pylint: disable=unused-import
from albert_jax.training.step_breakdown import COMPONENTS  # noqa: F401  pylint: disable=unused-import
from albert_jax.training.step_breakdown import hlo_op_names  # noqa: F401  pylint: disable=unused-import


def profile_breakdown(trace_dir: str, hlo_text: str, steps: int,
                      top: int = 10):
  """`step_breakdown.breakdown` as a tuple.

  Returns:
    (rows, total, instructions): rows is a list of (component, {phase: ms
    per step}) sorted by total; total the ms per step of all of them;
    instructions the `top` slowest HLO instructions (or kernels) as
    `step_breakdown.Entry` (name, phase, component, ms per step, calls per
    step, the instruction's HLO line).
  """
  result = step_breakdown.breakdown(trace_dir, hlo_text, steps, top)
  return result.rows, result.total_ms, result.top


def run_profile(runner, trace_dir: str, steps: int, top: int = 10):
  """Traces `steps` calls of `runner.step()` into `trace_dir`.

  The compiled step's HLO is written beside the trace (`step.hlo.txt`), and
  the whole breakdown (on a device with its busy and idle time, which the
  tuple leaves out) as `summary.md`.

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
  result = step_breakdown.breakdown(trace_dir, hlo_text, steps, top,
                                    wall_ms=wall_ms)
  step_breakdown.write_summary(result, trace_dir)
  return result.rows, result.total_ms, result.top, wall_ms


def print_profile(title: str, rows, total_ms: float, instructions,
                  wall_ms: float, file=sys.stdout):
  """The breakdown and the slowest instructions as markdown tables.

  The tuple does not say which platform it came from: the default
  backend's, where it was traced, is assumed.
  """
  platform = jax.default_backend()
  result = step_breakdown.StepBreakdown(
      platform=platform if platform in ("gpu", "tpu") else "cpu",
      steps=0, devices=1, rows=rows, total_ms=total_ms,
      top=[step_breakdown.Entry(*e) for e in instructions],
      wall_ms=wall_ms)
  print("\n" + step_breakdown.to_markdown(result, title), end="", file=file)
