r"""Will it fit? Per-chip memory of ALBERT pre-training, by the TPU compiler.

  nohup python experiments/benchmarks/tpu_memory_table.py \
      --markdown experiments/memory_table.md > /tmp/tpu_memory.log 2>&1 &
  python experiments/benchmarks/tpu_memory_table.py --topologies v5e:16x16 \
      --models base --remat none --accumulation 1

For ALBERT base, large and xxlarge at the paper's recipe (batch 4096, seq
512, 20 predictions, LAMB, SOP), bfloat16 compute and float32 parameters,
it compiles the sharded train step for each TPU slice (`--topologies`, as
`python -m albert_jax.main --compile_only --topology=NAME` does; needs
libtpu) with the attention the config really uses there (`auto`: the
Pallas TPU kernels), for every mesh, remat policy and accumulation count,
and records the TPU compiler's per-chip memory analysis. Each compile runs
in its own subprocess, killed after `--timeout` seconds; each result is
appended to `--out` as one JSON line as it comes, so an interrupted run
resumes where it stopped (failed compiles are tried again). Accumulation
only shrinks the micro-batch, so once a row (model, slice, mesh, remat)
fits, its larger accumulation counts are not compiled (`--skip_after_fit`,
on by default: their cells stay empty).

The markdown (`--markdown`) has one table per slice: per model / mesh /
remat, one column per accumulation count, each cell the per-chip total in
GiB, ✓ if it fits the chip's HBM less 10% headroom (✗ temps > X: the
compiler refused it, its temporaries alone needing X GiB), and the old XLA:CPU
estimate of the same program (`experiments/memory_table.jsonl`, fake CPU
devices, `--cpu_records`) beside it where one was made. Below the tables,
for each slice, the recommended settings: for each model the cheapest
setting that fits, preferring less recomputation (remat none, then
dots_no_batch, dots, full: each recomputes more of the forward pass) and
then fewer accumulation steps (which cost no FLOPs, only smaller
micro-batches). Anything below `NOTES_MARKER` in an existing `--markdown`
file (the hand-written reading) is kept.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import platform
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]
GIB = 1024 ** 3
HEADROOM = 0.10
MODELS = ("base", "large", "xxlarge")
# Slice → (label, chips, HBM GiB per chip). v4-64 is 32 chips (v4 names
# count TensorCores, two per chip); v5e's 16 GB are decimal.
TOPOLOGIES = {
    "v4:2x4x4": ("v4-64: 32 × TPU v4, 32 GiB each", 32, 32.0),
    "v5e:16x16": ("v5e-256: 256 × TPU v5e, 16 GB each", 256, 16e9 / GIB),
    "v5p:4x4x4": ("v5p-128: 64 × TPU v5p, 95 GiB each", 64, 95.0),
    "v6e:16x16": ("v6e-256: 256 × TPU v6e, 32 GiB each", 256, 32.0),
}
MESHES = {
    "data": [("data", -1), ("fsdp", 1), ("tensor", 1)],
    "fsdp": [("data", 1), ("fsdp", -1), ("tensor", 1)],
}
# Least recomputation first: the order recommendations prefer.
REMATS = ("none", "dots_no_batch", "dots", "full")
ACCUMULATIONS = (1, 2, 4, 8)
NOTES_MARKER = "<!-- notes: kept when the tables are regenerated -->"
CPU_RECORDS = ROOT / "experiments" / "memory_table.jsonl"


def case_key(case: dict) -> str:
  return (f"{case['model']}/{case['topology']}/{case['mesh']}/"
          f"{case['remat']}/{case['accumulation']}")


def config_for(case: dict):
  """The paper's recipe for `case`, bfloat16 compute, float32 parameters."""
  from albert_jax import config_lib  # pylint: disable=g-import-not-at-top
  config = config_lib.base_config(config_lib.albert_model(case["model"]))
  config.model.dtype = "bfloat16"
  config.model.param_dtype = "float32"
  config.model.remat = case["remat"]
  config.accumulation_steps = case["accumulation"]
  config.mesh = MESHES[case["mesh"]]
  return config


def worker(case: dict) -> None:
  """Compiles one case; prints its record as one JSON line."""
  from albert_jax.tools import compile_only  # pylint: disable=g-import-not-at-top
  start_cpu, start = time.process_time(), time.perf_counter()
  try:
    result = compile_only.analyse(config_for(case),
                                  topology=case["topology"])
    record = {k: v for k, v in result.items() if k != "model"}
    record["status"] = "ok"
  except compile_only.DoesNotFit as e:  # the compiler's own verdict
    record = {"status": "oom", "error": str(e),
              "required_bytes": e.required_bytes,
              "available_bytes": e.available_bytes}
  record.update(case, wall_seconds=round(time.perf_counter() - start, 1),
                cpu_seconds=round(time.process_time() - start_cpu, 1))
  print(json.dumps(record), flush=True)


def run_case(case: dict, timeout: float) -> dict:
  """`worker(case)` in a subprocess; a record also for a failure."""
  env = dict(os.environ, JAX_PLATFORMS="cpu", ALLOW_MULTIPLE_LIBTPU_LOAD="1",
             PYTHONPATH=os.pathsep.join(
                 p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))
  start = time.perf_counter()
  try:
    proc = subprocess.run([sys.executable, __file__, "--worker",
                           json.dumps(case)], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout,
                          check=False)
  except subprocess.TimeoutExpired:
    return {**case, "status": "timeout",
            "error": f"no result within {timeout:.0f} s"}
  lines = [l for l in proc.stdout.splitlines() if l.startswith("{")]
  if proc.returncode == 0 and lines:
    return json.loads(lines[-1])
  error = proc.stderr.strip().splitlines()[-1:] or ["(no output)"]
  return {**case, "status": "error", "error": error[0][:500],
          "wall_seconds": round(time.perf_counter() - start, 1)}


def _fits_with_less(records: dict[str, dict], case: dict) -> bool:
  """Whether the same model, slice, mesh and remat already fit with fewer
  accumulation steps (more steps only shrink the micro-batch)."""
  _, _, hbm = TOPOLOGIES[case["topology"]]
  return any(_fits(r, hbm) for r in records.values()
             if r["accumulation"] < case["accumulation"] and all(
                 r[k] == case[k] for k in ("model", "topology", "mesh",
                                           "remat")))


def cpu_estimates(path: pathlib.Path) -> dict[str, dict]:
  """The old fake-CPU records, by (model, devices, mesh, remat, accum)."""
  out = {}
  if path.exists():
    for line in path.read_text().splitlines():
      r = json.loads(line) if line.strip() else None
      if r and r.get("status") == "ok":
        out[(r["model"], r["devices"], r["mesh"], r["remat"],
             r["accumulation"])] = r
  return out


def _fits(record: dict | None, hbm: float) -> bool:
  return bool(record and record.get("status") == "ok"
              and record["total"] <= hbm * GIB * (1 - HEADROOM))


def _cell(record: dict | None, cpu: dict | None, hbm: float) -> str:
  if record is None:
    return "–"
  if record["status"] == "oom":  # the compiler refused: no total
    needed = record.get("required_bytes")
    text = "✗" + (f" temps > {needed / GIB:.1f}" if needed else "")
  elif record["status"] != "ok":
    return {"timeout": "compile timed out"}.get(record["status"], "error")
  else:
    mark = "✓" if _fits(record, hbm) else "✗"
    text = f"{record['total'] / GIB:.2f} {mark}"
  if cpu is not None:
    text += f" (CPU {cpu['total'] / GIB:.1f})"
  return text


def recommendations(records: dict[str, dict], topology: str,
                    meshes, accumulations) -> list[str]:
  """Per model, the cheapest fitting setting (see the module docstring)."""
  _, _, hbm = TOPOLOGIES[topology]
  lines = []
  for model in MODELS:
    choice = None
    for remat in REMATS:
      for acc in accumulations:
        for mesh in meshes:
          r = records.get(case_key(dict(model=model, topology=topology,
                                        mesh=mesh, remat=remat,
                                        accumulation=acc)))
          if _fits(r, hbm) and choice is None:
            choice = r
    if choice is not None:
      lines.append(
          f"- {model}: mesh {choice['mesh']}, remat {choice['remat']}, "
          f"accumulation_steps={choice['accumulation']} "
          f"({choice['total'] / GIB:.2f} GiB per chip)")
    elif any(r.get("model") == model and r.get("topology") == topology
             for r in records.values()):
      lines.append(f"- {model}: nothing compiled here fits")
  return lines


def render(records: dict[str, dict], cases: list[dict], cpu: dict,
           command: str, machine: str, date: str) -> str:
  """Markdown: one table per slice, then the recommendations."""
  meshes = [m for m in MESHES if any(c["mesh"] == m for c in cases)]
  accs = sorted({c["accumulation"] for c in cases})
  lines = [
      "## Will it fit? Per-chip memory of the train step, by the TPU "
      "compiler",
      "",
      "ALBERT pre-training at the paper's recipe (batch 4096, seq 512, 20 "
      "predictions, LAMB, SOP), bfloat16 compute, float32 parameters and "
      "optimizer state, attention on the Pallas TPU kernels (what "
      "`attention_impl=auto` runs on TPU). Each cell is the per-chip total "
      "(GiB) from the TPU compiler's `memory_analysis()` of the sharded "
      "train step compiled for the slice (`--compile_only --topology`): "
      "arguments + outputs - donated + temporaries. ✓: fits the chip's HBM "
      "less 10% headroom; \"✗ temps > X\": the compiler refused the step "
      "(`CompileTimeHbmOom`), its temporaries alone needing X GiB, more "
      "than the chip has. In brackets, the old XLA:CPU estimate of the same "
      "program on as many fake CPU devices (`--num_fake_devices`), where "
      "one was made. Columns: gradient-accumulation steps; a row stops at "
      "its first ✓ (more accumulation only lowers memory). Meshes: `data` "
      "replicates the state, `fsdp` shards parameters, gradients and "
      "optimizer state over every chip.",
      ""]
  for topology in TOPOLOGIES:
    rows = [c for c in cases if c["topology"] == topology]
    if not rows:
      continue
    label, chips, hbm = TOPOLOGIES[topology]
    lines += [f"### {label} (`--topology={topology}`, "
              f"{hbm * (1 - HEADROOM):.1f} GiB usable)", "",
              "| model | mesh | remat | "
              + " | ".join(f"accum {a}" for a in accs) + " |",
              "|---|---|---|" + "---:|" * len(accs)]
    for model in MODELS:
      for mesh in meshes:
        for remat in REMATS:
          keys = [dict(model=model, topology=topology, mesh=mesh,
                       remat=remat, accumulation=a) for a in accs]
          cells = [records.get(case_key(k)) for k in keys]
          if not any(cells):
            continue
          lines.append(f"| {model} | {mesh} | {remat} | " + " | ".join(
              _cell(c, cpu.get((model, chips, mesh, remat, k["accumulation"])),
                    hbm) for c, k in zip(cells, keys)) + " |")
    lines += ["", "Recommended for the paper's recipe:", ""]
    lines += recommendations(records, topology, meshes, accs) + [""]
  ok = [r for r in records.values() if r.get("status") == "ok"]
  wall = [r["wall_seconds"] for r in ok]
  lines += ["Produced by", "", "```", command, "```", "",
            f"on {machine}, {date}"
            + (f": {len(ok)} compiles, {min(wall):.0f}–{max(wall):.0f} s "
               f"each ({sum(wall) / 60:.0f} min in all)." if ok else "."),
            ""]
  return "\n".join(lines)


def machine_name() -> str:
  try:
    out = subprocess.run(["lscpu"], capture_output=True, text=True,
                         check=True).stdout
    model = next(l.split(":", 1)[1].strip() for l in out.splitlines()
                 if l.startswith("Model name"))
  except (OSError, subprocess.CalledProcessError, StopIteration):
    model = platform.processor() or "unknown CPU"
  return f"{model}, {os.cpu_count()} cores"


def _read(path: str) -> dict[str, dict]:
  if not os.path.exists(path):
    return {}
  with open(path) as f:
    return {case_key(r): r for r in map(json.loads, filter(str.strip, f))}


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--topologies", default=",".join(TOPOLOGIES))
  parser.add_argument("--models", default=",".join(MODELS))
  parser.add_argument("--meshes", default="fsdp")
  parser.add_argument("--remat", default="none,dots_no_batch,full")
  parser.add_argument("--accumulation", default="1,2,4")
  parser.add_argument("--out", default=str(
      ROOT / "experiments" / "benchmarks" / "tpu_memory_table.jsonl"))
  parser.add_argument("--cpu_records", default=str(CPU_RECORDS))
  parser.add_argument("--markdown", default=None,
                      help="Write the tables here (default: print them).")
  parser.add_argument("--timeout", type=float, default=1200.0,
                      help="Seconds one compile may take.")
  parser.add_argument("--date", default=datetime.date.today().isoformat())
  parser.add_argument("--render_only", action="store_true")
  parser.add_argument(
      "--skip_after_fit", action=argparse.BooleanOptionalAction,
      default=True, help="Skip a case when the same row fits with fewer "
      "accumulation steps (its cell stays empty).")
  parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
  args = parser.parse_args()
  if args.worker:
    worker(json.loads(args.worker))
    return

  def log(msg):
    print(f"[{datetime.datetime.now():%H:%M:%S}] {msg}", flush=True)

  cases = [dict(model=m, topology=t, mesh=mesh, remat=r, accumulation=int(a))
           for t in args.topologies.split(",")
           for m in args.models.split(",")
           for mesh in args.meshes.split(",")
           for r in args.remat.split(",")
           for a in args.accumulation.split(",")]
  records = _read(args.out)
  todo = [c for c in cases
          if records.get(case_key(c), {}).get("status") in (None, "error")]
  if not args.render_only and todo:
    log(f"{len(todo)} compiles at most, results appended to {args.out}")
    with open(args.out, "a") as out:
      for case in todo:
        if args.skip_after_fit and _fits_with_less(records, case):
          continue
        record = run_case(case, args.timeout)
        out.write(json.dumps(record) + "\n")
        out.flush()
        records[case_key(case)] = record
        total = record.get("total")
        log(f"{record['status']}: {case_key(case)} "
            + (f"{total / GIB:.2f} GiB " if total else record.get("error", ""))
            + f" ({record.get('wall_seconds', '?')} s)")
  command = "python experiments/benchmarks/tpu_memory_table.py " + " ".join(
      a for a in sys.argv[1:] if a != "--render_only")
  text = render(records, cases, cpu_estimates(pathlib.Path(args.cpu_records)),
                command.strip(), machine_name(), args.date)
  if args.markdown:
    notes = ""
    if os.path.exists(args.markdown):
      with open(args.markdown) as f:
        old = f.read()
      if NOTES_MARKER in old:
        notes = "\n" + old[old.index(NOTES_MARKER):]
    with open(args.markdown, "w") as f:
      f.write(text + notes)
    log(f"wrote {args.markdown}")
  else:
    print(text)


if __name__ == "__main__":
  main()
