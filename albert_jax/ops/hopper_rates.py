"""Attention throughput measured on Hopper, and what it implies.

One table of TFLOP/s by implementation, mask, pass and sequence length,
measured on one NVIDIA H100 SXM 80GB with this package's attention benchmark
(`experiments/benchmarks/attention.py`: bfloat16, 12 heads, head_dim 64,
16,384 tokens a call, 20 calls issued back to back and waited for once, the
median of 5 such rounds; jax 0.11.2, CUDA 13; 2026-11-27; BENCHMARKS.md "On
an H100, second run"). FLOPs follow the usual convention, 4·B·N·T²·D forward
and 2.5x that backward, so 3.5x for forward + backward; masking and softmax
are not counted.

Two readers: `attention.dot_product_attention`'s impl="auto" on a GPU picks
the faster of the Pallas (Mosaic GPU) kernel and cuDNN for the call's
sequence length, mask and pass (`faster`), and `tools.roofline` prices a
compiled step's attention kernels at these rates (`rate`).

Masks: "none" (no segment ids); "padded" (segment ids, each row valid on a
75-100% prefix: the Pallas kernel compares the ids, cuDNN reads a dense
[B, 1, T, T] bias made from them); "lengths" (the same rows promised
right-padded, `dot_product_attention(..., right_padded=True)`: cuDNN takes
each row's length, its PADDING mask; the Pallas kernel still compares ids,
so its "lengths" rate is its "padded" one).

cuDNN with a dense bias was measured only in the first run of that day,
which waited on every call (`PER_CALL`): at these sizes the wait cost about
as much as the kernels (cuDNN's s512 forward showed 75 TFLOP/s there, over
300 in the train step's own trace). Its rate here is that measurement
scaled by how much faster cuDNN without a mask ran back to back than per
call at the same length (`rate`).

The Pallas backward's tiles changed after this table (`flash_gpu.
BlockSizes`: on an H200 its forward + backward ran 13% faster at seq 512
with padded rows and at seq 2048, still below cuDNN at both): its Pallas
rates are those of the earlier tiles, so `auto` and the roofline understate
the kernel by up to that much until an H100 measures it again.
"""

from __future__ import annotations

import math

SOURCE = ("measured on one H100 SXM 80GB, experiments/benchmarks/"
          "attention.py (calls back to back), jax 0.11.2, 2026-11-27")
# (implementation, mask, pass) → {sequence length: TFLOP/s}, calls back to
# back.
MEASURED: dict[tuple[str, str, str], dict[int, float]] = {
    ("pallas", "none", "fwd"): {128: 101.2, 512: 105.1, 2048: 367.9},
    ("pallas", "none", "fwd+bwd"): {128: 84.1, 512: 191.0, 2048: 265.9},
    ("cudnn", "none", "fwd"): {128: 76.9, 512: 248.5, 2048: 409.0},
    ("cudnn", "none", "fwd+bwd"): {128: 71.3, 512: 214.7, 2048: 369.0},
    ("pallas", "padded", "fwd"): {128: 94.4, 512: 176.2, 2048: 231.2},
    ("pallas", "padded", "fwd+bwd"): {128: 79.0, 512: 165.3, 2048: 224.9},
    ("cudnn", "lengths", "fwd"): {128: 82.2, 512: 237.8, 2048: 386.0},
    ("cudnn", "lengths", "fwd+bwd"): {128: 74.3, 512: 202.2, 2048: 388.2},
}
# The first run's cuDNN rates, each call waited for (see the docstring):
# only their ratios are used, to place the dense-bias rate on the table's
# footing.
PER_CALL: dict[tuple[str, str, str], dict[int, float]] = {
    ("cudnn", "none", "fwd+bwd"): {128: 30.8, 512: 138.7, 2048: 283.7},
    ("cudnn", "padded", "fwd+bwd"): {128: 26.2, 512: 104.5, 2048: 189.5},
}
IMPLS = ("pallas", "cudnn")
MASKS = ("none", "padded", "lengths")
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
  """TFLOP/s of `impl` ("pallas", "cudnn") with `mask` ("none", "padded",
  "lengths") for one pass ("fwd", "bwd", "fwd+bwd") at sequence length
  `seq`.

  A backward rate comes from the forward and forward + backward
  measurements (its time is their difference, its FLOPs 2.5x the
  forward's). The Pallas kernel's "lengths" is its "padded". cuDNN's
  "padded" (a dense bias) is its per-call measurement times the ratio of
  its back-to-back and per-call rates without a mask at that length; a
  masked pass without its own measurement is the unmasked one scaled by
  the masked / unmasked forward + backward ratio.
  """
  if impl not in IMPLS or mask not in MASKS or direction not in PASSES:
    raise ValueError(f"No measured rate for {impl}/{mask}/{direction}; "
                     f"impls {IMPLS}, masks {MASKS}, passes {PASSES}.")
  if impl == "pallas" and mask == "lengths":
    mask = "padded"
  key = (impl, mask, direction)
  if key in MEASURED:
    return _interpolate(MEASURED[key], seq)
  if key == ("cudnn", "padded", "fwd+bwd"):
    none = (impl, "none", direction)
    return (_interpolate(PER_CALL[key], seq) * _interpolate(MEASURED[none], seq)
            / _interpolate(PER_CALL[none], seq))
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
  each would take ("none", "padded" or "lengths"), forward + backward when
  `training`, else forward only."""
  direction = "fwd+bwd" if training else "fwd"
  pallas = rate("pallas", pallas_mask, direction, seq)
  cudnn = rate("cudnn", cudnn_mask, direction, seq)
  return "pallas" if pallas > cudnn else "cudnn"
