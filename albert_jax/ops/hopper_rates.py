"""Attention throughput measured on Hopper, and what it implies.

One table of TFLOP/s by implementation, mask, pass and sequence length,
measured on one NVIDIA H100 SXM 80GB with this package's attention benchmark
(`experiments/benchmarks/attention.py`: bfloat16, 12 heads, head_dim 64,
16,384 tokens a call, median of timed calls; jax 0.11.2, CUDA 13;
2026-11-27; BENCHMARKS.md "Attention on an H100"). FLOPs follow the usual
convention, 4·B·N·T²·D forward and 2.5x that backward, so 3.5x for
forward + backward; masking and softmax are not counted.

Two readers: `attention.dot_product_attention`'s impl="auto" on a GPU picks
the faster of the Pallas (Mosaic GPU) kernel and cuDNN for the call's
sequence length, mask and pass (`faster`), and `tools.roofline` prices a
compiled step's attention kernels at these rates (`rate`).

Masks: "none" (no segment ids), "padded" (segment ids, each row valid on a
75-100% prefix: the Pallas kernel compares ids, cuDNN reads a dense
[B, 1, T, T] bias made from the mask). cuDNN given sequence lengths instead
of a mask (its PADDING mask type, `attention.dot_product_attention(...,
right_padded=True)`) was not in the run: it is priced at its no-mask rate,
which is what it computes when no row is padded; on padded rows it skips
the key tiles past each row's length and runs faster than that.
"""

from __future__ import annotations

import math

SOURCE = ("measured on one H100 SXM 80GB, experiments/benchmarks/"
          "attention.py, jax 0.11.2, 2026-11-27")
# (implementation, mask, pass) → {sequence length: TFLOP/s}.
MEASURED: dict[tuple[str, str, str], dict[int, float]] = {
    ("pallas", "none", "fwd"): {128: 40.0, 512: 83.6, 2048: 207.4,
                                8192: 346.1},
    ("cudnn", "none", "fwd"): {128: 40.1, 512: 74.9, 2048: 212.8,
                               8192: 380.5},
    ("xla", "none", "fwd"): {128: 16.1, 512: 36.9, 2048: 50.4, 8192: 59.4},
    ("pallas", "none", "fwd+bwd"): {128: 54.0, 512: 140.7, 2048: 221.5,
                                    8192: 224.4},
    ("cudnn", "none", "fwd+bwd"): {128: 30.8, 512: 138.7, 2048: 283.7,
                                   8192: 418.2},
    ("xla", "none", "fwd+bwd"): {128: 25.3, 512: 48.3, 2048: 66.9,
                                 8192: 70.1},
    ("pallas", "padded", "fwd+bwd"): {128: 41.3, 512: 111.4, 2048: 179.5},
    ("cudnn", "padded", "fwd+bwd"): {128: 26.2, 512: 104.5, 2048: 189.5},
    ("xla", "padded", "fwd+bwd"): {128: 29.0, 512: 49.2, 2048: 59.0},
}
IMPLS = ("pallas", "cudnn", "xla")
MASKS = ("none", "padded")
PASSES = ("fwd", "bwd", "fwd+bwd")
# Forward + backward FLOPs in units of the forward's.
_FWD_BWD = 3.5
_BWD = 2.5


def _interpolate(points: dict[int, float], seq: int) -> float:
  """TFLOP/s at `seq`, linear in log(seq) between measured lengths and
  held at the nearest one outside them."""
  lengths = sorted(points)
  if seq <= lengths[0]:
    return points[lengths[0]]
  if seq >= lengths[-1]:
    return points[lengths[-1]]
  for lo, hi in zip(lengths, lengths[1:]):
    if lo <= seq <= hi:
      w = (math.log(seq) - math.log(lo)) / (math.log(hi) - math.log(lo))
      return points[lo] + w * (points[hi] - points[lo])
  raise AssertionError("unreachable")


def rate(impl: str, mask: str, direction: str, seq: int) -> float:
  """TFLOP/s of `impl` ("pallas", "cudnn", "xla") with `mask` ("none",
  "padded") for one pass ("fwd", "bwd", "fwd+bwd") at sequence length `seq`.

  A backward rate comes from the forward and forward + backward
  measurements (its time is their difference, its FLOPs 2.5x the
  forward's); a masked pass without its own measurement is the unmasked
  one scaled by the masked / unmasked forward + backward ratio at that
  length.
  """
  if impl not in IMPLS or mask not in MASKS or direction not in PASSES:
    raise ValueError(f"No measured rate for {impl}/{mask}/{direction}; "
                     f"impls {IMPLS}, masks {MASKS}, passes {PASSES}.")
  key = (impl, mask, direction)
  if key in MEASURED:
    return _interpolate(MEASURED[key], seq)
  if mask != "none":
    scale = rate(impl, mask, "fwd+bwd", seq) / rate(impl, "none", "fwd+bwd",
                                                    seq)
    return scale * rate(impl, "none", direction, seq)
  fwd = rate(impl, "none", "fwd", seq)
  both = rate(impl, "none", "fwd+bwd", seq)
  seconds_per_fwd_flop = _FWD_BWD / both - 1.0 / fwd
  return _BWD / seconds_per_fwd_flop


def faster(seq: int, pallas_mask: str, cudnn_mask: str,
           training: bool) -> str:
  """"pallas" or "cudnn", whichever ran faster at `seq` with the masks
  each would take ("none" or "padded"), forward + backward when
  `training`, else forward only."""
  direction = "fwd+bwd" if training else "fwd"
  pallas = rate("pallas", pallas_mask, direction, seq)
  cudnn = rate("cudnn", cudnn_mask, direction, seq)
  return "pallas" if pallas > cudnn else "cudnn"
