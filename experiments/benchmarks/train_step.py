"""Steady-state train-step time: albert_jax against transformers' ALBERT.

For each ALBERT shape (`--sizes`: tiny = `config_lib.tiny_model`, base and
large = `config_lib.albert_model`) and sequence length (`--seqs`), one
process builds every implementation (`--impls`) on the same synthetic batch
and times them side by side:

  jax_adamw   albert_jax's train step built the way the trainer builds it:
              its `RunSpec`, `training.state.create_state`,
              `make_train_step` and `jit_train_step` on a mesh from
              `sharding.make_mesh`, with the state donated. The optimizer is
              albert_jax's AdamW
              (`config.optimizer.name="adamw"`: the official AdamW, no bias
              correction, no decay on LayerNorm and biases, gradients clipped
              at global norm 1), for parity with the torch rows. The step
              also computes what the trainer logs every step (MLM/SOP
              accuracy, gradient and parameter norms, the non-finite guard).
  jax_lamb    the same with albert_jax's LAMB (the ALBERT recipe); no torch
              counterpart, its ratios are against torch AdamW.
  hf_eager    transformers' `AlbertForPreTraining` (PyTorch) with an
              `AlbertConfig` built from the same `ModelConfig` fields,
              `attn_implementation="sdpa"`, trained with forward + loss +
              backward + `clip_grad_norm_(1.0)` + `torch.optim.AdamW(fused=
              True)` (HF Trainer's default optimizer for torch >= 2.8) with
              the same weight-decay exclusions, + a `LambdaLR` with the same
              warmup/decay schedule.
  hf_compile  the same with `torch.compile(model)` (what HF Trainer's
              `torch_compile=True` compiles: the model and its loss; the
              optimizer step stays eager).

The batch: full-length [CLS] A [SEP] B [SEP] rows (no padding), `--predictions`
masked positions per row (20, the ALBERT recipe) replaced by [MASK], and
random sentence-order labels. albert_jax gets `masked_positions` / `masked_ids`
/ `masked_weights`; HF gets the same ids with `labels` equal to the original
token at those positions and -100 elsewhere, and `sentence_order_label`.

Precision: on CPU everything is float32 and torch uses as many threads as
JAX (every CPU this process may run on). On GPU albert_jax runs
`model.dtype=bfloat16` (float32 parameters, LayerNorm and softmax in float32)
and torch runs under `torch.autocast(dtype=bfloat16)`.

Timing: compile is excluded. Each implementation first runs `--warmup`
steps; then the implementations take turns, one step each per round, for
`--steps` rounds (a noisy neighbour slows them alike), and the table gives
the median step. Every step ends in `jax.block_until_ready` /
`torch.cuda.synchronize` ("step ms": the host's launch latency is in it).
"pipelined ms" then runs `--steps` steps of one implementation back to back
and waits once (3 rounds, the median): host work overlaps the device's, as
in a training loop that does not wait on every step (albert_jax's trainer
queues step n + 1 before it reads step n's flags). The "first s" column is albert_jax's lower +
compile time (its state initialisation is in the JSON), and for torch the
first step (torch.compile compiles there). "CPU s/step" is the process's
CPU time per step, all threads together: on a busy machine it is steadier
than wall time. There, `--threads 1` is the fairer comparison: with more
threads than free cores torch's OpenMP threads wait for each other at every
operator, and XLA's thread hand-offs lose time slices, so wall-time ratios
then measure the scheduler more than the implementations.

FLOPs (`albert_jax.model.flops`, matmuls only, backward = 2 x forward):
  job TFLOP/s   the FLOPs of the job both do: the ALBERT recipe, MLM logits
                at the `--predictions` masked positions only. The same count
                for every row, so these TFLOP/s compare the same work and
                their ratios equal the sequences/s ratios. MFU is taken from
                these, against `metrics.peak_tflops` of the JAX device (none
                is defined for CPUs, so no MFU there).
  exec TFLOP/s  the FLOPs each implementation actually executes: albert_jax
                decodes only the masked positions, HF's head decodes all T
                positions (`num_predictions=None`), i.e. more work for the
                same loss.

`--unfix NAME` adds a row: albert_jax AdamW with one of the library's own
speed-ups switched back off at trace time (`step_fixes.UNFIXES`: the
CPU weight-gradient matmul of `layers.Dense`, the one-array GELU
derivative; `a+b` reverts both), i.e. the before of a before/after in the
same run. `--fix NAME` adds a row with a candidate change not in the
library (`step_fixes.FIXES`). `--profile DIR` traces a few steps of every
albert_jax row with `jax.profiler` and prints where the step's time goes,
by model component and by forward, backward and the rest (optimizer,
non-finite guard, metrics), and the slowest HLO instructions
(`step_profile`).

Usage:
  python experiments/benchmarks/train_step.py --sizes base --seqs 128
  python experiments/benchmarks/train_step.py --sizes tiny --seqs 64 \\
      --batch 2 --steps 2 --warmup 1 --impls jax_adamw,hf_eager
"""

import argparse
import json
import os
import re
import statistics
import sys
import time

import jax

from albert_jax import config_lib
from albert_jax.model.config import ModelConfig
from albert_jax.training import metrics as metrics_lib
from albert_jax.training.run_setup import FAST_COMPILE_OPTIONS

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# pylint: disable=g-import-not-at-top,wrong-import-position
import step_fixes  # noqa: E402
from step_impls import HFRunner  # noqa: E402
from step_impls import IMPLS  # noqa: E402
from step_impls import JaxRunner  # noqa: E402
from step_impls import LABELS  # noqa: E402
import step_impls  # noqa: E402
import step_profile  # noqa: E402


def time_runners(runners: dict, warmup: int, steps: int,
                 rounds: int = 3) -> dict:
  """Per-step seconds of each runner, taking turns.

  "wall" and "cpu": each step waited for before the next starts, one step
  of each runner per round. "pipelined": `steps` steps of one runner
  issued back to back and waited for once, per step, once per round for
  `rounds` rounds: the host's work for a step (Python, dispatch, a CUDA
  graph's update and launch) then overlaps the device's work for the step
  before, as in the trainer, which queues step n + 1 before it reads step
  n's guard flags.
  """
  for runner in runners.values():
    for _ in range(warmup):
      runner.step()
  times = {name: {"wall": [], "cpu": [], "pipelined": []} for name in runners}
  for _ in range(steps):
    for name, runner in runners.items():
      wall, cpu = time.perf_counter(), time.process_time()
      runner.step()
      times[name]["wall"].append(time.perf_counter() - wall)
      times[name]["cpu"].append(time.process_time() - cpu)
  for _ in range(rounds):
    for name, runner in runners.items():
      wall = time.perf_counter()
      for _ in range(steps):
        runner.launch()
      runner.sync()
      times[name]["pipelined"].append((time.perf_counter() - wall) / steps)
  return times


def build_runners(args, size, seq, batch_np, dtype, device, notes):
  """name → runner for one (size, seq); failures go to `notes`."""
  runners = {}
  jax_rows = [(impl, impl.split("_")[1], "") for impl in args.impls
              if impl.startswith("jax_")]
  jax_rows += [(f"jax_adamw{spec}", "adamw", spec) for spec in args.variants]
  base = (FAST_COMPILE_OPTIONS if args.fast_compile and device == "cpu"
          else {})
  rows = [(name, optimizer, spec, base) for name, optimizer, spec in jax_rows]
  rows += [(f"jax_adamw {text}", "adamw", "", {**base, **options})
           for text, options in args.xla]
  for name, optimizer, spec, options in rows:
    runners[name] = JaxRunner(size, seq, batch_np, optimizer, dtype, spec,
                              options)
  hf_impls = [i for i in args.impls if i.startswith("hf_")]
  if not hf_impls:
    return runners
  try:
    import torch  # pylint: disable=g-import-not-at-top
  except ImportError:
    notes.append("torch is not installed: HF rows skipped.")
    return runners
  if device == "cuda" and not torch.cuda.is_available():
    notes.append("JAX runs on GPU but this torch has no CUDA: HF rows "
                 "skipped.")
    return runners
  train_config = config_lib.base_config(
      step_impls.model_section(size, seq), optimizer="adamw",
      batch_size=batch_np["masked_ids"].shape[0], max_seq_length=seq,
      max_predictions=batch_np["masked_ids"].shape[1])
  cfg = ModelConfig.from_dict(train_config.model)
  for impl in hf_impls:
    try:
      runners[impl] = HFRunner(cfg, train_config, batch_np, device,
                               autocast=dtype == "bfloat16",
                               compile_model=impl == "hf_compile",
                               attn=args.hf_attn)
    except Exception as e:  # pylint: disable=broad-except
      # torch.compile needs a working C++ toolchain on CPU; report, go on.
      notes.append(f"{LABELS[impl]} at {size}/{seq} failed: "
                   f"{type(e).__name__}: {str(e).splitlines()[0][:200]}")
  return runners


def row_label(name: str, attn: str) -> str:
  """"jax_adamw-gelu_jvp" → "albert_jax AdamW -gelu_jvp"; "jax_adamw
  xla_x=1" → "albert_jax AdamW xla_x=1"."""
  if " " in name:
    impl, options = name.split(" ", 1)
    return f"{LABELS[impl]} {options}"
  impl, spec = re.match(r"([^+-]+)(.*)", name).groups()
  if spec:
    return f"{LABELS[impl]} {spec}"
  return LABELS[name] + (f" ({attn})" if name.startswith("hf_") else "")


def summarise(rows: list[dict], predictions: int, peak: float | None,
              cfg_of) -> list[dict]:
  """Adds throughput, TFLOP/s, MFU and ratios to the timed rows."""
  for row in rows:
    cfg = cfg_of(row["size"], row["seq"])
    step = statistics.median(row["wall"])
    pipelined = statistics.median(row["pipelined"])
    job = step_impls.step_flops(cfg, row["batch"], row["seq"], predictions)
    executed = job if row["impl"].startswith("jax") else step_impls.step_flops(
        cfg, row["batch"], row["seq"], None)
    row.update(
        step_seconds=step, cpu_seconds=statistics.median(row["cpu"]),
        pipelined_seconds=pipelined,
        sequences_per_second=row["batch"] / step,
        tokens_per_second=row["batch"] * row["seq"] / step,
        job_tflops=job / step / 1e12, executed_tflops=executed / step / 1e12,
        job_flops_per_step=job, executed_flops_per_step=executed,
        mfu=job / step / (peak * 1e12) if peak else None)
  for row in rows:
    for ref in ("hf_eager", "hf_compile"):
      match = [r for r in rows if r["impl"] == ref and
               (r["size"], r["seq"]) == (row["size"], row["seq"])]
      row[f"vs_{ref}"] = (row["sequences_per_second"]
                          / match[0]["sequences_per_second"]
                          if match else None)
      row[f"pipelined_vs_{ref}"] = (match[0]["pipelined_seconds"]
                                    / row["pipelined_seconds"]
                                    if match else None)
  return rows


def print_table(rows: list[dict], file=sys.stdout):
  print("| size | seq | batch | implementation | step ms | seq/s | tokens/s "
        "| job TFLOP/s | exec TFLOP/s | MFU | first s | CPU s/step "
        "| vs HF eager | vs HF compile | pipelined ms | pipelined vs HF "
        "compile |", file=file)
  print("|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:"
        "|---:|---:|", file=file)
  ratio = lambda x: "—" if x is None else f"{x:.2f}x"  # noqa: E731
  for r in rows:
    mfu = "—" if r["mfu"] is None else f"{100 * r['mfu']:.1f}%"
    print(f"| {r['size']} | {r['seq']} | {r['batch']} | {r['label']} | "
          f"{1e3 * r['step_seconds']:,.1f} | {r['sequences_per_second']:,.2f} "
          f"| {r['tokens_per_second']:,.0f} | {r['job_tflops']:.4f} | "
          f"{r['executed_tflops']:.4f} | {mfu} | {r['first_seconds']:.1f} | "
          f"{r['cpu_seconds']:.2f} | {ratio(r['vs_hf_eager'])} | "
          f"{ratio(r['vs_hf_compile'])} | "
          f"{1e3 * r['pipelined_seconds']:,.1f} | "
          f"{ratio(r['pipelined_vs_hf_compile'])} |", file=file)


def parse_xla_options(text: str) -> dict:
  """"a=false,b=,c=3" → {"a": False, "b": "", "c": 3}."""
  options = {}
  for item in text.split(","):
    name, eq, value = item.partition("=")
    if not eq or not name.startswith("xla_"):
      raise ValueError(f"--xla {text!r}: each item is xla_NAME=VALUE.")
    lowered = value.lower()
    options[name] = ({"true": True, "false": False}.get(lowered)
                     if lowered in ("true", "false")
                     else int(value) if re.fullmatch(r"-?\d+", value)
                     else value)
  return options


def parse_args(argv=None):
  p = argparse.ArgumentParser(
      description=__doc__.split("\n\n")[0],
      formatter_class=argparse.RawDescriptionHelpFormatter)
  csv = lambda kind: lambda s: [kind(x) for x in s.split(",") if x]  # noqa
  p.add_argument("--sizes", type=csv(str), default=["tiny", "base", "large"],
                 help="ALBERT shapes: tiny, base, large, xlarge, xxlarge.")
  p.add_argument("--seqs", type=csv(int), default=[128, 512])
  p.add_argument("--batch", type=int, default=8, help="Global batch size.")
  p.add_argument("--predictions", type=int, default=20,
                 help="Masked positions per sequence.")
  p.add_argument("--steps", type=int, default=10, help="Timed steps.")
  p.add_argument("--warmup", type=int, default=2)
  p.add_argument("--impls", type=csv(str), default=list(IMPLS),
                 help=f"Any of {','.join(IMPLS)}.")
  p.add_argument("--unfix", type=csv(str), default=[],
                 help="Extra albert_jax AdamW rows with library speed-ups "
                      f"reverted: each one of {','.join(step_fixes.UNFIXES)} "
                      "or several joined by '+'.")
  p.add_argument("--fix", type=csv(str), default=[],
                 help="Extra albert_jax AdamW rows with candidate changes: "
                      f"each one of {','.join(step_fixes.FIXES)} or several "
                      "joined by '+'.")
  p.add_argument("--xla", action="append", default=[], metavar="OPT=V,...",
                 help="An extra albert_jax AdamW row compiled with these XLA "
                      "options on top of the library's (e.g. "
                      "xla_gpu_enable_triton_gemm=false; an empty value "
                      "clears a list option); repeat for more rows.")
  p.add_argument("--device", choices=("auto", "cpu", "gpu"), default="auto")
  p.add_argument("--threads", type=int, default=0,
                 help="CPU threads for JAX and torch alike (the process is "
                      "pinned to that many CPUs); default: all.")
  p.add_argument("--fast_compile", action="store_true",
                 help="Compile albert_jax with XLA:CPU's cheapest code "
                      "generation (smoke runs: quicker start, slower steps).")
  p.add_argument("--dtype", choices=("float32", "bfloat16"), default=None,
                 help="Default: float32 on CPU, bfloat16 on GPU.")
  p.add_argument("--hf_attn", default="sdpa", choices=("sdpa", "eager"))
  p.add_argument("--peak_tflops", type=float, default=0.0,
                 help="Peak TFLOP/s of the device, for MFU (default: "
                      "metrics.peak_tflops of the device kind).")
  p.add_argument("--profile", default="",
                 help="Trace albert_jax rows into this directory and print "
                      "a breakdown.")
  p.add_argument("--profile_steps", type=int, default=2)
  p.add_argument("--json", default="", help="Also write results here.")
  args = p.parse_args(argv)
  bad = [i for i in args.impls if i not in IMPLS]
  bad += [f for fix in args.fix for f in fix.split("+")
          if f not in step_fixes.FIXES]
  bad += [f for unfix in args.unfix for f in unfix.split("+")
          if f not in step_fixes.UNFIXES]
  bad += [s for s in args.sizes
          if s != "tiny" and s not in config_lib.ALBERT_SIZES]
  if bad:
    p.error(f"unknown {bad}; --impls from {IMPLS}, --unfix from "
            f"{tuple(step_fixes.UNFIXES)}, --fix from "
            f"{tuple(step_fixes.FIXES)}, --sizes from tiny, "
            f"{', '.join(config_lib.ALBERT_SIZES)}.")
  try:
    args.xla = [(text, parse_xla_options(text)) for text in args.xla]
  except ValueError as e:
    p.error(str(e))
  # Row suffixes in step_fixes.variant's form: "-a-b" reverts, "+a+b" adds.
  args.variants = (["-" + u.replace("+", "-") for u in args.unfix]
                   + ["+" + f for f in args.fix])
  if min(args.steps, args.batch, args.profile_steps) < 1 or min(
      args.warmup, args.threads) < 0:
    p.error("--steps, --batch and --profile_steps must be >= 1, --warmup "
            "and --threads >= 0.")
  return args


def main(argv=None):
  args = parse_args(argv)
  # JAX would otherwise take 75% of an accelerator's memory up front and
  # leave torch too little; read when JAX creates its client, below.
  os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
  if args.device == "cpu":
    jax.config.update("jax_platforms", "cpu")
  if args.threads:
    # Before JAX creates its CPU client: XLA sizes its thread pool by the
    # CPUs this process may run on.
    allowed = sorted(os.sched_getaffinity(0))
    if args.threads > len(allowed):
      raise SystemExit(f"--threads {args.threads}: only {len(allowed)} CPUs "
                       "are available.")
    os.sched_setaffinity(0, allowed[-args.threads:])
  backend = jax.default_backend()
  if args.device == "gpu" and backend != "gpu":
    print(f"No GPU: JAX's backend is {backend!r}. Nothing measured; run with "
          "--device cpu (or auto) here.")
    return []
  on_gpu = backend == "gpu"
  dtype = args.dtype or ("bfloat16" if on_gpu else "float32")
  device = "cuda" if on_gpu else "cpu"
  threads = len(os.sched_getaffinity(0))
  if any(i.startswith("hf_") for i in args.impls):
    import torch  # pylint: disable=g-import-not-at-top
    torch.set_num_threads(threads)
  info = step_impls.machine_info(threads)
  peak = metrics_lib.peak_tflops(info["jax_device"], args.peak_tflops)
  print(f"# {info['date']} | {info['cpu']} ({threads} threads) | JAX device "
        f"{info['jax_device']} | {dtype} | load {info['load_average']}",
        flush=True)
  rows, notes, losses, profiles = [], [], [], []
  configs = {}
  for size in args.sizes:
    for seq in args.seqs:
      cfg = ModelConfig.from_dict(step_impls.model_section(size, seq))
      configs[size, seq] = cfg
      batch_np = step_impls.make_batch(cfg, args.batch, seq, args.predictions)
      runners = build_runners(args, size, seq, batch_np, dtype, device, notes)
      times = time_runners(runners, args.warmup, args.steps)
      for name, runner in runners.items():
        losses.append(f"{size}/{seq} {row_label(name, args.hf_attn)}: "
                      f"{runner.loss():.3f}")
        rows.append({"size": size, "seq": seq, "batch": args.batch,
                     "impl": name, "label": row_label(name, args.hf_attn),
                     "first_seconds": runner.first_seconds,
                     "init_seconds": getattr(runner, "init_seconds", None),
                     "xla_options": getattr(runner, "compiler_options", None),
                     **times[name]})
      if args.profile:
        for name, runner in runners.items():
          if isinstance(runner, JaxRunner):
            trace_dir = os.path.join(args.profile, f"{size}_{seq}_{name}")
            profiles.append((f"{size} seq {seq} batch {args.batch} "
                             f"{row_label(name, args.hf_attn)}",
                             *step_profile.run_profile(
                                 runner, trace_dir, args.profile_steps)))
      print(f"# done {size}/{seq}", flush=True)
      del runners
  summarise(rows, args.predictions, peak, lambda s, t: configs[s, t])
  print()
  print_table(rows)
  print("\nLoss at the last step (same job, different random inits): "
        + "; ".join(losses))
  for note in notes:
    print(f"Note: {note}")
  for profile in profiles:
    step_profile.print_profile(*profile)
  if args.json:
    with open(args.json, "w", encoding="utf-8") as f:
      json.dump({"machine": info, "args": vars(args), "dtype": dtype,
                 "peak_tflops": peak, "notes": notes,
                 "profiles": [{"title": t, "total_ms": tot, "wall_ms": wall,
                               "components": {c: dict(p) for c, p in b},
                               "instructions": top}
                              for t, b, tot, top, wall in profiles],
                 "rows": rows}, f, indent=1)
  return rows


if __name__ == "__main__":
  main()
