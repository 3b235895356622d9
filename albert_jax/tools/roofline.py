"""A compiled step's kernels priced on a card: bytes, time and MFU by category.

`tools.hlo_stats.kernels` lists every kernel launch of a compiled program
with the HBM bytes it moves and the matmul FLOPs it does. Here each is
priced on a card (`Card`) by a roofline:

  GEMM       max(FLOPs / sustained GEMM rate, bytes / sustained HBM rate)
  attention  max(FLOPs / the rate measured for its implementation, mask,
             pass and sequence length (`ops.hopper_rates`), bytes / HBM)
  the rest   bytes / sustained HBM rate
  + a fixed launch cost per kernel,

and the step time is their sum (one stream, no overlap between kernels).
MFU is the model's analytic FLOPs (`model.flops`, 3 × forward matmuls) over
that time at the card's peak.

How far to trust it, on an H100 (calibration, 2026-11-27, one H100 SXM
80GB, jax 0.11.2): the card ran ALBERT-large at seq 512 and batch 32 (bf16,
AdamW, `experiments/benchmarks/train_step.py`) and a trace of one step gave
each kernel's time; the step's compiled HLO from the card is
tests/testdata/h100_step_large_seq512_b32.hlo.gz and the trace
tests/testdata/traces/h100_large_step.xplane.pb.gz. Its GEMMs ran 29.7
TFLOP in 37.4 ms (790 TFLOP/s sustained, the GEMM rate here) and its
memory-bound kernels moved 55.6 GB in 24.2 ms over 1,111 launches (2.4 TB/s
at 1 µs a launch, the HBM rate here). Attention is priced at the measured
back-to-back rates of `ops.hopper_rates` (12 heads, rows 75-100% valid):
14.3 ms against the step's 11.2 (16 heads, full rows). So the model gives
that step 76.8 ms of kernels against 72.8 measured (+5%, the rates fitted
on it), and ALBERT-base at seq 128 and batch 128, compiled here for an
H100 (tests/testdata/h100_step_base_seq128_b128.hlo.gz, the same code),
25.3 ms against the 26.6 ms of kernels its trace on the card showed (-5%,
out of sample). The model is of kernel time; the measured step is longer
by the gaps between kernels and between steps (large: 72.8 ms of kernels,
77.4 ms a step back to back, 79.3 ms waited for alone, when the host's
update and launch of the step's CUDA graph, 5.7 ms in the trace, is not
hidden behind the step before). The GEMM rate cannot be seen without the card
(autotuning picks the kernels), so GEMMs are priced at one sustained rate
whatever their shape. A TPU step gets the kernel table without times: no
TPU step has been measured to calibrate against, and the TPU compiler's
matmuls are convolutions whose FLOPs are not read here.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Iterable

from albert_jax.ops import hopper_rates
from albert_jax.tools import hlo_stats


@dataclasses.dataclass(frozen=True)
class Card:
  """What pricing a kernel on a device needs.

  Attributes:
    peak_flops: datasheet dense bfloat16 FLOP/s (what MFU is measured
      against).
    gemm_flops: sustained GEMM FLOP/s a step's matmuls are priced at.
    hbm_bytes_per_second: sustained HBM bandwidth.
    launch_seconds: fixed cost per kernel (launch and the gap between).
    measured_attention: price attention kernels at `ops.hopper_rates`
      (else at `gemm_flops`).
    calibration: one line on where the constants come from.
  """
  peak_flops: float
  gemm_flops: float
  hbm_bytes_per_second: float
  launch_seconds: float
  measured_attention: bool
  calibration: str


# The calibration steps (see the module docstring): modelled ms of kernels,
# and the ms of kernels measured in their traces on the card. Checked by
# tests/tools/test_roofline.py on the recorded HLO and trace.
CALIBRATION = {"large": 76.8, "base": 25.3}
MEASURED = {"large": 72.8, "base": 26.6}
_H100_NOTE = (
    "calibration: modelled kernel time against an H100's trace, "
    f"{CALIBRATION['large']} vs {MEASURED['large']} ms (ALBERT-large, seq "
    f"512, batch 32; GEMM and HBM rates fitted there) and "
    f"{CALIBRATION['base']} vs {MEASURED['base']} ms (base, seq 128, batch "
    "128, out of sample): within 5%; measured steps add the gaps between "
    "kernels and steps (large: 77.4 ms a step back to back)")
CARDS = {
    "NVIDIA H100 80GB HBM3": Card(989e12, 790e12, 2.4e12, 1e-6, True,
                                  _H100_NOTE),
    # The H100's die with 4.8 TB/s HBM3e: the same GEMM and attention rates,
    # the bandwidth scaled by the H100's sustained / datasheet ratio.
    "NVIDIA H200": Card(989e12, 790e12, 4.8e12 * 2.4 / 3.35, 1e-6, True,
                        "the H100's calibration with the H200's bandwidth "
                        "(not measured on an H200)"),
}
_MASKS = {"none": "none", "padding": "lengths", "causal": "none",
          "bias": "padded", "segments": "padded"}


def card(device_kind: str) -> Card | None:
  """The `Card` of a device kind, or None for one not priced here."""
  return CARDS.get(device_kind)


def seconds(kernel: hlo_stats.Kernel, on: Card) -> float:
  """Modelled seconds of one execution of `kernel` on `on`."""
  memory = kernel.bytes / on.hbm_bytes_per_second
  compute = 0.0
  if kernel.attention is not None and on.measured_attention:
    a = kernel.attention
    flops = kernel.flops / 2 if a.mask == "causal" else kernel.flops
    compute = flops / (1e12 * hopper_rates.rate(a.impl, _MASKS[a.mask],
                                                a.direction, a.seq))
  elif kernel.flops:
    compute = kernel.flops / on.gemm_flops
  return max(compute, memory) + on.launch_seconds


@dataclasses.dataclass(frozen=True)
class Summary:
  """A step's kernels priced on a card.

  Attributes:
    categories: category → {"kernels": launches per step, "bytes": HBM
      bytes per step, "ms": modelled ms per step}, in `CATEGORIES` order.
    kernels: launches per step.
    bytes: HBM bytes per step.
    ms: modelled step time.
    mfu: analytic FLOPs / (ms × peak), or None without FLOPs.
    top: the costliest kernels as (what, category, ms per step, launches
      per step), kernels of one JAX op (an unrolled layer's copies, a
      loop's iterations) together: "what" is the op's name stack's last
      parts, or a kernel's name where it has none.
    calibration: the card's calibration line.
    priced: whether times were modelled (a device with a `Card`).
  """
  categories: dict[str, dict[str, float]]
  kernels: int
  bytes: float
  ms: float
  mfu: float | None
  top: list[tuple[str, str, float, int]]
  calibration: str
  priced: bool = True


def summarize(kernels: Iterable[hlo_stats.Kernel], on: Card | None,
              analytic_flops: float | None = None, top: int = 8) -> Summary:
  """Per-category launches, bytes and modelled ms of `kernels` on `on`
  (None: a device with no `Card`, whose times are not modelled: 0 ms)."""
  rows = collections.OrderedDict(
      (c, {"kernels": 0, "bytes": 0.0, "ms": 0.0})
      for c in hlo_stats.CATEGORIES)
  costly = collections.defaultdict(lambda: [0.0, 0])
  for k in kernels:
    ms = 1e3 * k.runs * seconds(k, on) if on else 0.0
    row = rows[k.category]
    row["kernels"] += k.runs
    row["bytes"] += k.runs * k.bytes
    row["ms"] += ms
    what = "/".join(k.op_name.split("/")[-3:]) if k.op_name else k.name
    costly[(what, k.category)][0] += ms
    costly[(what, k.category)][1] += k.runs
  rows = collections.OrderedDict((c, r) for c, r in rows.items()
                                 if r["kernels"])
  total_ms = sum(r["ms"] for r in rows.values())
  mfu = (analytic_flops / (total_ms / 1e3 * on.peak_flops)
         if on and analytic_flops and total_ms else None)
  costly = sorted(((what, category, ms, runs)
                   for (what, category), (ms, runs) in costly.items()),
                  key=lambda row: (-row[2], -row[3]))
  return Summary(dict(rows), sum(r["kernels"] for r in rows.values()),
                 sum(r["bytes"] for r in rows.values()), total_ms, mfu,
                 costly[:top],
                 on.calibration if on else "no rates for this device: "
                 "bytes and launches only", on is not None)


def format_summary(summary: Summary, where: str) -> list[str]:
  """The report's lines: a table by category, totals, the costliest
  kernels (by modelled time, or by bytes where times are not modelled)."""
  timed = summary.priced
  lines = [f"Kernels, HBM traffic{' and modelled time' if timed else ''} "
           f"per step ({where}; {summary.calibration}):",
           f"  {'category':34s} {'kernels':>8s} {'GB':>9s}"
           + (f" {'ms':>8s}" if timed else "")]
  for name, row in summary.categories.items():
    lines.append(f"  {name:34s} {int(row['kernels']):8d} "
                 f"{row['bytes'] / 1e9:9.2f}"
                 + (f" {row['ms']:8.2f}" if timed else ""))
  total = (f"  {'total':34s} {summary.kernels:8d} "
           f"{summary.bytes / 1e9:9.2f}")
  if timed:
    mfu = f", MFU {summary.mfu:.1%}" if summary.mfu is not None else ""
    total += f" {summary.ms:8.2f}   modelled step {summary.ms:.1f} ms{mfu}"
  lines.append(total)
  if timed:
    lines.append("  costliest ops (ms per step, launches): " + "; ".join(
        f"{name} [{category}] {ms:.2f} ({runs})"
        for name, category, ms, runs in summary.top))
  return lines
