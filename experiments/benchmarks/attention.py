"""Attention TFLOP/s: the Pallas kernels against cuDNN and XLA, side by side.

Times `albert_jax.ops.dot_product_attention` with impl = "pallas", "cudnn"
and "xla" on the same random inputs, forward only and forward + backward,
at each sequence length, and prints one table with the three next to each
other and the ratios pallas/cudnn and pallas/xla. Every path is the one the
model runs, padding and layout changes included.

Implementations (columns):

  pallas  the backend's Pallas kernel: Mosaic TPU on TPU, Mosaic GPU on
          Hopper, and on CPU the TPU kernel in TPU interpret mode, which
          simulates the TPU and is only a correctness smoke: its numbers say
          nothing about performance.
  cudnn   cuDNN's fused attention via `jax.nn.dot_product_attention`; GPU
          only, skipped with a note elsewhere.
  xla     einsum, softmax, einsum: the reference path.

Inputs: q, k, v [batch, seq, heads, head_dim] with normal entries (default
bfloat16, head_dim 64, 12 heads as ALBERT-base), batch = --tokens / seq
unless --batch is given, so each length processes the same number of
tokens. --mask none (default) passes no segment ids; --mask padded gives
each row segment id 1 on a random 75-100% prefix and 0 after it, the
padded-batch case of pre-training (cuDNN then takes a bias, the kernels
their segment-id masking; the FLOP count stays that of the full T x T).
--mask lengths gives the same rows with `right_padded=True`, the model's
promise for right-padded single-segment rows: cuDNN then takes each row's
length instead of a bias (the Pallas kernels and xla still read the ids).

FLOPs (the usual convention, e.g. FlashAttention's benchmarks): forward
4·B·H·T²·D (two T x T x D matmuls, 2 FLOPs a multiply-add); backward 2.5 x
the forward (five matmuls against two), so forward + backward is 3.5 x.
Softmax, masking and exponentials are not counted. TFLOP/s = FLOPs / the
wall time per call of --iters calls issued back to back and waited for once
(the median of 5 such rounds), after --warmup untimed calls that include
compilation: the kernels' rate as a train step runs them, without a
synchronisation after each call (which at seq 512 cost as much as the
kernels: 2026-11-27's first H100 table, taken that way, gave cuDNN's
forward 75 TFLOP/s where the train step's trace shows it at over 300).

Each implementation's forward output is compared with xla's on the same
inputs (max |difference|), as a check that the timed path computes the
same thing. A cell that fails (an implementation that refuses the shape,
out of memory) prints "failed" and the reason below the table.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from albert_jax.ops import attention

IMPLS = ("pallas", "cudnn", "xla")
MODES = ("fwd", "fwd+bwd")


def flops(mode, batch, heads, seq, head_dim):
  """Matmul FLOPs of one call: 4·B·H·T²·D forward, 3.5x for fwd + bwd."""
  forward = 4 * batch * heads * seq * seq * head_dim
  return forward if mode == "fwd" else 3.5 * forward


def available(impl, backend):
  """None if `impl` runs on `backend`, else why it is skipped."""
  if impl == "cudnn" and backend != "gpu":
    return f"cudnn: GPU only, skipped on {backend}"
  if impl == "pallas" and backend not in ("tpu", "gpu", "cpu"):
    return f"pallas: no kernel for {backend}"
  return None


def make_inputs(seed, batch, seq, heads, head_dim, dtype, mask):
  rng = np.random.default_rng(seed)
  shape = (batch, seq, heads, head_dim)
  q, k, v, cotangent = (jnp.asarray(rng.normal(size=shape), dtype)
                        for _ in range(4))
  ids = None
  if mask in ("padded", "lengths"):
    lengths = rng.integers(int(0.75 * seq), seq + 1, size=batch)
    ids = jnp.asarray(np.arange(seq)[None] < lengths[:, None], jnp.int32)
  return q, k, v, cotangent, ids


def build(impl, mode, right_padded=False):
  """A jitted call of one implementation: forward, or forward + backward."""
  def forward(q, k, v, ids):
    return attention.dot_product_attention(q, k, v, segment_ids=ids,
                                           impl=impl,
                                           right_padded=right_padded)

  return jitted(forward, mode)


def jitted(forward, mode):
  """`forward(q, k, v, ids)` as a jitted call of (q, k, v, cotangent, ids):
  its output ("fwd"), or its output and the gradients of q, k and v for
  the cotangent ("fwd+bwd")."""
  if mode == "fwd":
    return jax.jit(lambda q, k, v, cotangent, ids: forward(q, k, v, ids))

  def forward_backward(q, k, v, cotangent, ids):
    out, vjp = jax.vjp(lambda q, k, v: forward(q, k, v, ids), q, k, v)
    return out, vjp(cotangent)

  return jax.jit(forward_backward)


def time_call(fn, args, warmup, iters, rounds=5):
  """Seconds per call: the median over `rounds` of `iters` calls issued back
  to back and waited for once, after `warmup` calls.

  Waiting on every call would add the host's dispatch and synchronisation
  (tens of microseconds) to kernels that take about as long: the rates would
  be those of the call, not of the kernels a train step runs back to back.
  """
  for _ in range(warmup):
    jax.block_until_ready(fn(*args))
  times = []
  for _ in range(rounds):
    start = time.perf_counter()
    for _ in range(iters):
      out = fn(*args)
    jax.block_until_ready(out)
    times.append((time.perf_counter() - start) / iters)
  return statistics.median(times)


def bench_seq(seq, args, backend, notes):
  batch = args.batch or max(1, args.tokens // seq)
  dtype = jnp.dtype(args.dtype)
  inputs = make_inputs(seq, batch, seq, args.heads, args.head_dim, dtype,
                       args.mask)
  rows = []
  reference = None
  for mode in MODES:
    row = dict(seq=seq, batch=batch, heads=args.heads,
               head_dim=args.head_dim, mode=mode)
    for impl in args.impls:
      reason = available(impl, backend)
      if reason:
        notes.setdefault(reason, None)
        row[impl] = None
        continue
      fn = build(impl, mode, right_padded=args.mask == "lengths")
      try:
        seconds = time_call(fn, inputs, args.warmup, args.iters)
        out = fn(*inputs)
        out = out[0] if mode == "fwd+bwd" else out
      except Exception as e:  # pylint: disable=broad-except
        row[impl] = "failed"
        notes.setdefault(f"{impl} at seq {seq} {mode}: {type(e).__name__}: "
                         f"{str(e).splitlines()[0][:200]}", None)
        continue
      row[impl] = flops(mode, batch, args.heads, seq, args.head_dim) / (
          seconds * 1e12)
      row[f"{impl}_ms"] = seconds * 1e3
      if mode == "fwd":
        out = np.asarray(out, np.float32)
        if inputs[-1] is not None:  # padded queries' outputs are unused
          out = out * np.asarray(inputs[-1] != 0)[:, :, None, None]
        if impl == "xla":
          reference = out
        row[f"{impl}_out"] = out
    if mode == "fwd":
      for impl in args.impls:
        out = row.pop(f"{impl}_out", None)
        if out is not None and reference is not None:
          row[f"{impl}_max_diff"] = float(np.abs(out - reference).max())
    rows.append(row)
    print(f"seq {seq} batch {batch} {mode}: " + ", ".join(
        f"{impl} {_cell(row.get(impl))}" for impl in args.impls), flush=True)
  return rows


def _cell(value):
  if value is None:
    return "n/a"
  if isinstance(value, str):
    return value
  return f"{value:.3g}" if value < 1 else f"{value:.1f}"


def _ratio(row, a, b):
  x, y = row.get(a), row.get(b)
  if isinstance(x, float) and isinstance(y, float):
    return f"{x / y:.3g}x"
  return "n/a"


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--seqs", type=int, nargs="+",
                      default=[128, 512, 2048, 8192])
  parser.add_argument("--tokens", type=int, default=16384,
                      help="batch = tokens // seq unless --batch is given")
  parser.add_argument("--batch", type=int, default=None)
  parser.add_argument("--heads", type=int, default=12)
  parser.add_argument("--head_dim", type=int, default=64)
  parser.add_argument("--dtype", default="bfloat16",
                      choices=["bfloat16", "float16", "float32"])
  parser.add_argument("--mask", default="none", choices=["none", "padded", "lengths"])
  parser.add_argument("--impls", nargs="+", default=list(IMPLS),
                      choices=IMPLS)
  parser.add_argument("--iters", type=int, default=20,
                      help="calls per timed round (5 rounds, the median)")
  parser.add_argument("--warmup", type=int, default=3,
                      help="untimed calls first (the first compiles)")
  parser.add_argument("--json", default=None, help="also write results here")
  args = parser.parse_args(argv)
  if args.iters < 1 or args.warmup < 0:
    parser.error("--iters must be >= 1 and --warmup >= 0")

  backend = jax.default_backend()
  device = jax.devices()[0]
  print(f"jax {jax.__version__} on {backend}: {device.device_kind} "
        f"({len(jax.devices())} devices, 1 used); python "
        f"{platform.python_version()}", flush=True)
  notes = {}
  if backend == "cpu" and "pallas" in args.impls:
    notes["pallas on CPU runs the TPU kernel in TPU interpret mode: a "
          "correctness smoke, not a performance number"] = None
  results = []
  for seq in args.seqs:
    results += bench_seq(seq, args, backend, notes)

  print()
  print("| seq | batch | mode | pallas TFLOP/s | cudnn TFLOP/s | "
        "xla TFLOP/s | pallas/cudnn | pallas/xla |")
  print("|---:|---:|---|---:|---:|---:|---:|---:|")
  for r in results:
    print(f"| {r['seq']} | {r['batch']} | {r['mode']} | "
          f"{_cell(r.get('pallas'))} | {_cell(r.get('cudnn'))} | "
          f"{_cell(r.get('xla'))} | {_ratio(r, 'pallas', 'cudnn')} | "
          f"{_ratio(r, 'pallas', 'xla')} |")
  print()
  diffs = [f"{impl} seq {r['seq']} {r[f'{impl}_max_diff']:.2g}" for r in results
           for impl in args.impls
           if impl != "xla" and f"{impl}_max_diff" in r]
  print(f"heads {args.heads}, head_dim {args.head_dim}, {args.dtype}, mask "
        f"{args.mask}; FLOPs 4·B·H·T²·D forward, x3.5 forward+backward; "
        f"{args.iters} calls back to back a round, median of 5 rounds, "
        f"after {args.warmup} warm-up; "
        f"{device.device_kind}; {datetime.date.today().isoformat()}.")
  if diffs:
    print("forward max |difference| from xla: " + ", ".join(diffs))
  for note in notes:
    print(f"note: {note}")
  if args.json:
    with open(args.json, "w", encoding="utf-8") as f:
      json.dump(dict(results=results, device=device.device_kind,
                     backend=backend, notes=list(notes), jax=jax.__version__,
                     argv=sys.argv[1:] if argv is None else list(argv)),
                f, indent=1)
  return 0


if __name__ == "__main__":
  sys.exit(main())
