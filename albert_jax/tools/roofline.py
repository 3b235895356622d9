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

How far to trust it, on an H100 (calibration): the constants below are the
ones that, over this accounting of the step as it was compiled on
2026-11-27 (commit 75b02e5), model ALBERT-large at seq 512 and batch 32 at
`CALIBRATION["large"]` = 111.8 ms against 106.5 ms measured, and
ALBERT-base at seq 128 and batch 128 at 40.1 against 38.9 ms (both bf16,
AdamW, one H100 SXM 80GB, `experiments/benchmarks/train_step.py`; the
deviceless compile's temporaries were within 2% of the card's): it errs
3-5% slow on that step. The GEMM rate is not seen in a deviceless compile
(autotuning needs the card), so GEMMs are priced at one sustained rate
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


# Modelled ms of the 2026-11-27 step (see the module docstring) against the
# measured 106.5 (large) and 38.9 (base): checked by tests/tools/
# test_roofline.py on that step's recorded kernel table.
CALIBRATION = {"large": 111.8, "base": 40.1}
MEASURED = {"large": 106.5, "base": 38.9}
_H100_NOTE = (
    "calibration: the 2026-11-27 step modelled at "
    f"{CALIBRATION['large']} ms against {MEASURED['large']} measured "
    f"(ALBERT-large, seq 512, batch 32) and {CALIBRATION['base']} against "
    f"{MEASURED['base']} (base, seq 128, batch 128) on one H100 SXM 80GB: "
    "the model errs 3-5% slow")
CARDS = {
    "NVIDIA H100 80GB HBM3": Card(989e12, 720e12, 3.1e12, 1e-6, True,
                                  _H100_NOTE),
    # The H100's die with 4.8 TB/s HBM3e: the same GEMM and attention rates,
    # the bandwidth scaled by the H100's sustained / datasheet ratio.
    "NVIDIA H200": Card(989e12, 720e12, 4.8e12 * 3.1 / 3.35, 1e-6, True,
                        "the H100's calibration with the H200's bandwidth "
                        "(not measured on an H200)"),
}
_MASKS = {"none": "none", "padding": "none", "causal": "none",
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
