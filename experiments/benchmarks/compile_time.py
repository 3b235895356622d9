"""Compile time against depth: the layer scan keeps it flat.

For each depth in `--depths` (12, 24, 48 layers) and each sharing mode in
`--shares` ("all": ALBERT, one set of layer parameters; "none": one set per
layer, BERT-style) at the width of an ALBERT size (`--width`, default base:
hidden 768, 12 heads, FFN 3072, E 128, vocab 30000), it measures:

  init          lower + compile of the state initialiser, jitted with the
                state's shardings exactly as `training.state.create_state` jits
                it (abstract: nothing is allocated or run).
  step lower    tracing and lowering of the train step built as the trainer
                builds it (`make_train_step` + `jit_train_step` on a
                `sharding.make_mesh` mesh), from the abstract sharded state
                and batch: `albert_jax.tools.compile_only.compile_train_step`.
  step compile  XLA's compile of that lowered step, at the default
                optimisation level (what a training run pays).

albert_jax walks the layers with one `nn.scan`, so the program does not grow
with depth; the "vs fewest layers" column divides each step total by the
shallowest depth's of the same sharing mode. Two unrolled peers, each behind
a flag because they are slow at 48 layers:

  --unrolled    albert_jax with the scan unrolled (`nn.scan(unroll=True)`,
                the `unroll` fix of train_step.py): the same model with
                depth in the graph.
  --hf_compile  transformers' AlbertForPreTraining under `torch.compile`
                (inductor) on CPU: TorchDynamo traces the Python loop over
                layers, so its graph is unrolled too. Reported: the first
                forward + backward (trace, compile, run) minus a second one
                (run), at batch `--hf_batch`. share="none" is HF's one group
                per layer. The inductor caches are pointed at a fresh
                temporary directory so that nothing is reused between depths
                or runs.

`--peer_depths` limits both peers to some of the depths (the others show
"—"), since theirs is the time that grows.

Each time is the best of `--repeats`, in wall seconds, with the process's
CPU seconds beside it in the JSON. A small model is compiled first so that
one-off start-up costs land outside the table (`--no_warmup` skips it).

Usage:
  python experiments/benchmarks/compile_time.py                # base width
  python experiments/benchmarks/compile_time.py --unrolled --hf_compile
  python experiments/benchmarks/compile_time.py --width tiny --depths 2,4
"""

import argparse
import contextlib
import datetime
import json
import os
import sys
import tempfile
import time

import flax.linen as nn
import jax
import numpy as np

from albert_jax import config_lib
from albert_jax import sharding as sharding_lib
from albert_jax.model.config import ModelConfig
from albert_jax.tools import compile_only
from albert_jax.training import optimizer as optim
from albert_jax.training import run_setup
from albert_jax.training import run_spec
from albert_jax.training import state as state_lib

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# pylint: disable=g-import-not-at-top,wrong-import-position
import step_fixes  # noqa: E402
import step_impls  # noqa: E402


def make_config(width: str, layers: int, share: str, seq: int, batch: int,
                predictions: int):
  """A pre-training config of `width`'s shape with `layers` layers."""
  section = step_impls.model_section(width, seq)
  section.num_hidden_layers = layers
  section.share = share
  section.num_hidden_groups = 1
  return config_lib.base_config(section, optimizer="lamb",
                                batch_size=batch, max_seq_length=seq,
                                max_predictions=predictions)


def timed(fn):
  """(result, wall seconds, process CPU seconds) of fn()."""
  wall, cpu = time.perf_counter(), time.process_time()
  out = fn()
  return out, time.perf_counter() - wall, time.process_time() - cpu


def init_compile(config, fast: bool = False) -> None:
  """Lowers and compiles the sharded state initialiser (as create_state)."""
  spec = run_spec.run_spec(config)
  tx, _ = optim.make(config.optimizer, config.num_train_steps)
  mesh, rules = sharding_lib.mesh_and_rules(config.mesh,
                                            config.sharding_rules)
  init = state_lib.state_init_fn(spec.init_params, tx)
  rng = jax.random.key(0)
  _, shardings = state_lib.abstract_state(init, tx, mesh, rules, rng)

  def unboxed_init(r):
    s = init(r)
    return {**s, "params": nn.meta.unbox(s["params"])}

  with sharding_lib.in_mesh(mesh, rules):
    jax.jit(unboxed_init, out_shardings=shardings).lower(rng).compile(
        compiler_options=fast_options(fast))


def fast_options(fast: bool):
  """XLA:CPU's cheapest code generation (smoke runs), or the defaults."""
  if fast and jax.default_backend() == "cpu":
    return dict(run_setup.FAST_COMPILE_OPTIONS)
  return None


def num_params(compiled: compile_only.Compiled) -> int:
  return sum(int(np.prod(x.shape))
             for x in jax.tree.leaves(compiled.state["params"]))


def measure_jax(config, repeats: int, unrolled: bool = False,
                fast: bool = False) -> dict:
  """Best-of-`repeats` init and step compile times of one config."""
  patch = step_fixes.unroll_scan if unrolled else contextlib.nullcontext
  best = {}
  for _ in range(repeats):
    sample = {}
    if not unrolled:
      _, sample["init_s"], sample["init_cpu_s"] = timed(
          lambda: init_compile(config, fast))
    with patch():
      result, _, cpu = timed(
          lambda: compile_only.compile_train_step(config, fast=fast))
    sample.update(step_lower_s=result.lower_seconds,
                  step_compile_s=result.compile_seconds,
                  step_total_s=result.lower_seconds + result.compile_seconds,
                  step_cpu_s=cpu, params=num_params(result))
    for key, value in sample.items():
      best[key] = value if key == "params" else min(
          best.get(key, float("inf")), value)
  return best


def measure_hf(config, batch: int, repeats: int) -> dict:
  """torch.compile: first forward + backward minus a steady one."""
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  cfg = ModelConfig.from_dict(config.model)
  seq = config.data.max_seq_length
  batch_np = step_impls.make_batch(cfg, batch, seq,
                                   config.masking.max_predictions)
  inputs = step_impls.hf_inputs(batch_np, "cpu")
  best = {}
  for _ in range(repeats):
    torch._dynamo.reset()  # pylint: disable=protected-access
    torch.manual_seed(0)
    model = transformers.AlbertForPreTraining(
        step_impls.hf_albert_config(cfg)).train()
    compiled = torch.compile(model)

    def fwd_bwd():
      compiled(**inputs).loss.backward()

    _, first, first_cpu = timed(fwd_bwd)
    _, steady, steady_cpu = timed(fwd_bwd)
    sample = {"hf_compile_s": first - steady,
              "hf_compile_cpu_s": first_cpu - steady_cpu,
              "hf_step_s": steady}
    for key, value in sample.items():
      best[key] = min(best.get(key, float("inf")), value)
  return best


def print_table(rows: list[dict], file=sys.stdout) -> None:
  columns = [("width", "{}"), ("share", "{}"), ("layers", "{}"),
             ("params (M)", "{:.1f}"), ("init s", "{:.1f}"),
             ("step lower s", "{:.1f}"), ("step compile s", "{:.1f}"),
             ("step total s", "{:.1f}"), ("vs fewest layers", "{:.2f}x")]
  keys = ["width", "share", "layers", "params_m", "init_s", "step_lower_s",
          "step_compile_s", "step_total_s", "vs_fewest"]
  if any("unrolled_step_total_s" in r for r in rows):
    columns.append(("unrolled step total s", "{:.1f}"))
    keys.append("unrolled_step_total_s")
  if any("hf_compile_s" in r for r in rows):
    columns.append(("HF torch.compile s", "{:.1f}"))
    keys.append("hf_compile_s")
  print("| " + " | ".join(c for c, _ in columns) + " |", file=file)
  print("|" + "|".join("---" if i < 2 else "---:"
                       for i in range(len(columns))) + "|", file=file)
  for r in rows:
    cells = [fmt.format(r[k]) if r.get(k) is not None else "—"
             for (_, fmt), k in zip(columns, keys)]
    print("| " + " | ".join(cells) + " |", file=file)


def parse_args(argv=None):
  p = argparse.ArgumentParser(
      description=__doc__.split("\n\n")[0],
      formatter_class=argparse.RawDescriptionHelpFormatter)
  csv = lambda kind: lambda s: [kind(x) for x in s.split(",") if x]  # noqa
  p.add_argument("--width", default="base",
                 help="tiny, or an ALBERT size whose width to use.")
  p.add_argument("--depths", type=csv(int), default=[12, 24, 48])
  p.add_argument("--shares", type=csv(str), default=["all", "none"])
  p.add_argument("--seq", type=int, default=128)
  p.add_argument("--batch", type=int, default=8)
  p.add_argument("--predictions", type=int, default=20)
  p.add_argument("--repeats", type=int, default=1)
  p.add_argument("--unrolled", action="store_true",
                 help="Also compile albert_jax with the scan unrolled.")
  p.add_argument("--hf_compile", action="store_true",
                 help="Also time torch.compile of transformers' model.")
  p.add_argument("--hf_batch", type=int, default=2)
  p.add_argument("--peer_depths", type=csv(int), default=None,
                 help="Depths at which to run the --unrolled and "
                      "--hf_compile peers (default: every --depths; the "
                      "peers' time grows with depth, the scan's does not).")
  p.add_argument("--no_warmup", action="store_true",
                 help="Skip the first, untimed compile (quick looks only: "
                      "the first row then carries one-off costs).")
  p.add_argument("--fast_compile", action="store_true",
                 help="XLA:CPU's cheapest code generation for albert_jax "
                      "(smoke runs; not the compile a training run pays).")
  p.add_argument("--json", default="", help="Also write results here.")
  args = p.parse_args(argv)
  if args.width != "tiny" and args.width not in config_lib.ALBERT_SIZES:
    p.error(f"--width {args.width!r}: use tiny or one of "
            f"{', '.join(config_lib.ALBERT_SIZES)}.")
  bad = [s for s in args.shares if s not in ("all", "none")]
  if bad:
    p.error(f"--shares {bad}: use all and/or none.")
  if min(args.depths + [args.repeats, args.batch, args.hf_batch]) < 1:
    p.error("--depths, --repeats, --batch and --hf_batch must be >= 1.")
  if args.peer_depths is None:
    args.peer_depths = list(args.depths)
  elif not set(args.peer_depths) <= set(args.depths):
    p.error(f"--peer_depths {args.peer_depths} must be among --depths "
            f"{args.depths}.")
  return args


def main(argv=None):
  args = parse_args(argv)
  # Every JAX compile a cold one too: JAX_COMPILATION_CACHE_DIR in the
  # environment would otherwise turn repeats into cache reads.
  jax.config.update("jax_enable_compilation_cache", False)
  with tempfile.TemporaryDirectory(prefix="albert_jax_inductor_") as cache:
    if args.hf_compile:
      # Inductor and AOTAutograd cache compiled graphs on disk; a fresh
      # directory makes every compile a cold one.
      os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache
    return run(args)


def run(args):
  """Measures every configuration `args` asks for and prints the table."""
  info = step_impls.machine_info(len(os.sched_getaffinity(0)))
  print(f"# {info['date']} | {info['cpu']} | JAX device {info['jax_device']}"
        f" | load {info['load_average']}", flush=True)
  if not args.no_warmup:
    # One-off costs (XLA and LLVM start-up) go here, not into the first row.
    measure_jax(make_config("tiny", 2, "all", 16, 2, 2), 1,
                fast=args.fast_compile)
  rows = []
  for share in args.shares:
    for layers in args.depths:
      config = make_config(args.width, layers, share, args.seq, args.batch,
                           args.predictions)
      row = {"width": args.width, "share": share, "layers": layers,
             **measure_jax(config, args.repeats, fast=args.fast_compile)}
      row["params_m"] = row["params"] / 1e6
      peers = layers in args.peer_depths
      if args.unrolled and peers:
        unrolled = measure_jax(config, args.repeats, unrolled=True,
                               fast=args.fast_compile)
        row["unrolled_step_total_s"] = unrolled["step_total_s"]
        row["unrolled_step_cpu_s"] = unrolled["step_cpu_s"]
      if args.hf_compile and peers:
        row.update(measure_hf(config, args.hf_batch, args.repeats))
      rows.append(row)
      print(f"# done {share}/{layers}", flush=True)
  for row in rows:
    fewest = min((r for r in rows if r["share"] == row["share"]),
                 key=lambda r: r["layers"])
    row["vs_fewest"] = row["step_total_s"] / fewest["step_total_s"]
  print()
  print_table(rows)
  if args.json:
    with open(args.json, "w", encoding="utf-8") as f:
      json.dump({"machine": info, "args": vars(args),
                 "date": datetime.date.today().isoformat(), "rows": rows},
                f, indent=1)
  return rows


if __name__ == "__main__":
  main()
