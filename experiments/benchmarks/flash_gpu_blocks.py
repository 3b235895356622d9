"""Tile sizes of the Mosaic GPU flash-attention kernels, timed on a Hopper GPU.

`albert_jax.ops.flash_gpu.BlockSizes` holds the kernels' tiles; this times
the forward, and forward + backward, of `flash_gpu.flash_attention` for
each candidate at each sequence length, beside cuDNN at the same length,
and checks every candidate's output and gradients against the XLA path on
the same inputs. The forward's tiles are swept with the default backward
and the backward's with the default forward, so a row changes one kernel.

  python3 experiments/benchmarks/flash_gpu_blocks.py --seqs 2048 \\
      --kinds bwd --seconds 90 --json /tmp/blocks.json

Inputs, FLOPs and timing are `attention.py`'s (12 heads, head_dim 64,
bfloat16, 16,384 tokens a call; 20 calls back to back, the median of 5
rounds). `--mask padded` gives rows valid on a random 75-100% prefix (the
kernels compare segment ids; cuDNN is then given each row's length). The
sweep stops starting new candidates after `--seconds` (each compiles its
kernels, several seconds on the card) and prints what it has; candidates
run most promising first. Without a Hopper GPU `--lower_only` lowers every
candidate for CUDA (Pallas to Mosaic GPU), which catches tiles the kernels
cannot lay out, not ones that overflow shared memory.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

import attention as attention_bench  # experiments/benchmarks/attention.py
from albert_jax.ops import flash_gpu

DEFAULT = flash_gpu.BlockSizes()


def candidates():
  """(pass it changes, BlockSizes), the defaults first, then larger tiles."""
  yield "default", DEFAULT
  # Backward: the dk/dv kernel does 4 of the backward's 5 matmuls; larger
  # key tiles per thread block reuse each streamed query tile more.
  for kv_dkv, q_dkv, q_dq, kv_dq in itertools.product(
      (128, 64), (64, 128), (128, 64), (64, 128)):
    sizes = dataclasses.replace(DEFAULT, block_kv_dkv=kv_dkv,
                                block_q_dkv=q_dkv, block_q_dq=q_dq,
                                block_kv_dq=kv_dq)
    if sizes != DEFAULT:
      yield "bwd", sizes
  for steps in (3, 2):
    for q, kv in ((64, 64), (128, 64), (64, 128), (128, 128)):
      sizes = dataclasses.replace(DEFAULT, block_q=q, block_kv=kv,
                                  max_concurrent_steps=steps)
      if sizes != DEFAULT:
        yield "fwd", sizes


def label(sizes):
  return (f"fwd q{sizes.block_q} kv{sizes.block_kv} "
          f"s{sizes.max_concurrent_steps} | dq q{sizes.block_q_dq} "
          f"kv{sizes.block_kv_dq} | dkv q{sizes.block_q_dkv} "
          f"kv{sizes.block_kv_dkv}")


def build(sizes, mode):
  return attention_bench.jitted(
      lambda q, k, v, ids: flash_gpu.flash_attention(q, k, v, ids,
                                                     block_sizes=sizes),
      mode)


def max_error(got, want, ids):
  """Largest |difference| over output and gradients, valid rows only."""
  keep = 1.0 if ids is None else np.asarray(ids != 0)[:, :, None, None]
  flat = lambda t: [np.asarray(x, np.float32) * keep  # noqa: E731
                    for x in jax.tree.leaves(t)]
  return max(float(np.abs(a - b).max()) for a, b in zip(flat(got), flat(want)))


def sweep(seq, args, deadline):
  batch = max(1, args.tokens // seq)
  inputs = attention_bench.make_inputs(seq, batch, seq, args.heads,
                                       args.head_dim, jnp.bfloat16, args.mask)
  ids = inputs[-1]
  fl = {m: attention_bench.flops(m, batch, args.heads, seq, args.head_dim)
        for m in attention_bench.MODES}
  rows = []
  want = attention_bench.build("xla", "fwd+bwd")(*inputs)
  # cuDNN beside them (given row lengths under --mask padded).
  fn = attention_bench.build("cudnn", "fwd+bwd",
                             right_padded=ids is not None)
  seconds = attention_bench.time_call(fn, inputs, args.warmup, args.iters)
  rows.append(dict(seq=seq, kind="cudnn", sizes=None,
                   fwd_bwd_tflops=fl["fwd+bwd"] / seconds / 1e12,
                   max_error=max_error(fn(*inputs), want, ids)))
  print(f"seq {seq}: cudnn fwd+bwd {rows[-1]['fwd_bwd_tflops']:.1f} TFLOP/s",
        flush=True)
  for i, (kind, sizes) in enumerate(candidates()):
    if kind not in ("default", *args.kinds) or 0 < i <= args.skip:
      continue
    if time.monotonic() > deadline:
      print(f"seq {seq}: out of time, {kind} {label(sizes)} and later not "
            "run", flush=True)
      break
    row = dict(seq=seq, kind=kind, sizes=dataclasses.asdict(sizes))
    # A forward candidate leaves the backward kernels as they are, and a
    # backward one the forward: time (and check) what the row changes.
    modes = {"default": attention_bench.MODES, "fwd": ("fwd",),
             "bwd": ("fwd+bwd",)}[kind]
    try:
      for mode in modes:
        fn = build(sizes, mode)
        seconds = attention_bench.time_call(fn, inputs, args.warmup,
                                            args.iters)
        row[f"{mode}_tflops".replace("+", "_")] = fl[mode] / seconds / 1e12
        got = fn(*inputs)
        row["max_error"] = max(row.get("max_error", 0.0), max_error(
            got, want if mode == "fwd+bwd" else want[0], ids))
    except Exception as e:  # pylint: disable=broad-except
      row["failed"] = f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"
    rows.append(row)
    print(f"seq {seq}: {kind:7s} {label(sizes)}: " + (
        row["failed"] if "failed" in row else
        ", ".join(f"{m} {row[f'{m}_tflops'.replace('+', '_')]:.1f}"
                  for m in modes)
        + f" TFLOP/s, max |err| {row['max_error']:.3g}"), flush=True)
  return rows


def lower_only(args):
  """Lower forward + backward of every candidate for CUDA; count failures."""
  failed = 0
  for seq in args.seqs:
    batch = max(1, args.tokens // seq)
    q = jax.ShapeDtypeStruct((batch, seq, args.heads, args.head_dim),
                             jnp.bfloat16)
    ids = (None if args.mask == "none" else
           jax.ShapeDtypeStruct((batch, seq), jnp.int32))
    for kind, sizes in candidates():
      if kind not in ("default", *args.kinds):
        continue
      try:
        build(sizes, "fwd+bwd").trace(q, q, q, q, ids).lower(
            lowering_platforms=("cuda",))
        status = "lowers"
      except Exception as e:  # pylint: disable=broad-except
        failed += 1
        status = f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"
      print(f"seq {seq}: {kind:7s} {label(sizes)}: {status}", flush=True)
  return 1 if failed else 0


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--seqs", type=int, nargs="+", default=[2048, 512])
  p.add_argument("--tokens", type=int, default=16384)
  p.add_argument("--heads", type=int, default=12)
  p.add_argument("--head_dim", type=int, default=64)
  p.add_argument("--mask", default="none", choices=["none", "padded"])
  p.add_argument("--kinds", nargs="+", default=["bwd", "fwd"],
                 choices=["bwd", "fwd"],
                 help="which kernels' tiles to sweep (the defaults always run)")
  p.add_argument("--skip", type=int, default=0,
                 help="leave out the first N candidates after the defaults "
                      "(those an earlier call timed)")
  p.add_argument("--iters", type=int, default=20)
  p.add_argument("--warmup", type=int, default=2)
  p.add_argument("--seconds", type=float, default=150.0,
                 help="start no candidate after this many seconds in all")
  p.add_argument("--lower_only", action="store_true")
  p.add_argument("--json", default=None)
  args = p.parse_args(argv)
  if args.lower_only:
    return lower_only(args)
  if jax.default_backend() != "gpu":
    p.error("needs a Hopper GPU (or --lower_only)")
  print(f"jax {jax.__version__}: {jax.devices()[0].device_kind}", flush=True)
  start = time.monotonic()
  rows = []
  for i, seq in enumerate(args.seqs):
    # Each length gets its share of the time left.
    share = (args.seconds - (time.monotonic() - start)) / (len(args.seqs) - i)
    rows += sweep(seq, args, time.monotonic() + share)
    if args.json:
      with open(args.json, "w", encoding="utf-8") as f:
        json.dump(dict(rows=rows, device=jax.devices()[0].device_kind,
                       jax=jax.__version__, mask=args.mask), f, indent=1)
  return 0


if __name__ == "__main__":
  sys.exit(main())
