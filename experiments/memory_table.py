r"""Which ALBERT pre-training settings fit a TPU pod: the README's table.

  python experiments/memory_table.py --markdown experiments/memory_table.md
  python experiments/memory_table.py --models base --devices 64 --remat full

For ALBERT base, large and xxlarge at the paper's recipe (batch 4096, seq
512, 20 predictions, LAMB, SOP), with bfloat16 compute and float32
parameters, it compiles the sharded train step ahead of time for
`--devices` fake CPU devices (`albert_jax.tools.compile_only`, as
`python -m albert_jax.main --compile_only --num_fake_devices=N` does) for
every combination of mesh (pure data parallel, or FSDP), remat policy and
accumulation steps, and records XLA's per-device memory analysis.

Each device count runs in its own worker subprocess (the fake device
count is fixed when JAX starts) and prints one JSON line per compile; the
lines are appended to `--out` as they come, so an interrupted run resumes
where it stopped. A compile that prints nothing for `--timeout` seconds is
killed and recorded as a timeout, and the group goes on without it.
Finally the JSON lines are rendered as markdown tables (`--markdown`): per
device kind, one row per model / mesh / remat, one column per accumulation
count, each cell the per-device total in GiB and whether it fits the
device's memory less 10% headroom. Anything below `NOTES_MARKER` in an
existing `--markdown` file (the hand-written reading) is kept.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import platform
import queue
import subprocess
import sys
import threading
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
GIB = 1024 ** 3
HEADROOM = 0.10
MODELS = ("base", "large", "xxlarge")
# Devices → (label, memory per device in GiB). One JAX device per chip: a v4
# chip (32 GiB HBM) is one device with megacore, and a v4-N slice has N/2
# chips, so a v4-64 is 32 devices and 64 v4 devices a v4-128. v5e: 16 GB
# per chip, taken as decimal (14.9 GiB) to stay on the safe side.
DEVICE_KINDS = {
    32: ("32 × TPU v4 (v4-64 slice), 32 GiB each", 32.0),
    64: ("64 × TPU v4 (v4-128 slice), 32 GiB each", 32.0),
    256: ("256 × TPU v5e (v5litepod-256), 16 GB each", 16e9 / GIB),
}
MESHES = {
    "data": [("data", -1), ("fsdp", 1), ("tensor", 1)],
    "fsdp": [("data", 1), ("fsdp", -1), ("tensor", 1)],
}
REMATS = ("none", "dots", "dots_no_batch", "full")
# In --markdown, everything from this line on is kept when the tables are
# written again: the hand-written reading of them.
NOTES_MARKER = "<!-- notes: kept when the tables are regenerated -->"
ACCUMULATIONS = (1, 2, 4, 8)


def case_key(case: dict) -> str:
  return (f"{case['model']}/{case['devices']}/{case['mesh']}/"
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


# --------------------------------------------------------------- worker


def worker(cases: list[dict]) -> None:
  """Compiles each case in this process; one JSON line each on stdout."""
  import jax  # pylint: disable=g-import-not-at-top

  from albert_jax.tools import compile_only  # pylint: disable=g-import-not-at-top
  count = jax.device_count()
  for case in cases:
    assert case["devices"] == count, (case, count)
    start_cpu, start = time.process_time(), time.perf_counter()
    try:
      result = compile_only.analyse(config_for(case))
      result["mesh_shape"] = result.pop("mesh")
      record = {**result, **case, "status": "ok"}
    except Exception as e:  # pylint: disable=broad-except
      record = {**case, "status": "error",
                "error": f"{type(e).__name__}: {str(e)[:500]}"}
    record["wall_seconds"] = round(time.perf_counter() - start, 1)
    record["cpu_seconds"] = round(time.process_time() - start_cpu, 1)
    print(json.dumps(record), flush=True)


def worker_env(devices: int) -> dict[str, str]:
  env = dict(os.environ)
  flags = [f for f in env.get("XLA_FLAGS", "").split()
           if not f.startswith("--xla_force_host_platform_device_count")]
  env["XLA_FLAGS"] = " ".join(
      flags + [f"--xla_force_host_platform_device_count={devices}"])
  env["JAX_PLATFORMS"] = "cpu"
  env["PYTHONPATH"] = os.pathsep.join(
      p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
  return env


def run_group(cases: list[dict], out, timeout: float, log) -> None:
  """Runs one device count's cases in worker subprocesses, with timeouts."""
  pending = list(cases)
  while pending:
    proc = subprocess.Popen(
        [sys.executable, __file__, "--worker"], env=worker_env(
            pending[0]["devices"]), stdin=subprocess.PIPE,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    proc.stdin.write(json.dumps(pending))
    proc.stdin.close()
    lines: queue.Queue = queue.Queue()
    stderr: list[str] = []
    threading.Thread(target=lambda: [lines.put(l) for l in proc.stdout]
                     + [lines.put(None)], daemon=True).start()
    threading.Thread(target=lambda: stderr.extend(proc.stderr),
                     daemon=True).start()
    # The first compile also pays for starting Python and JAX.
    limit = timeout + 60
    while pending:
      try:
        line = lines.get(timeout=limit)
      except queue.Empty:
        proc.kill()
        record = {**pending[0], "status": "timeout",
                  "error": f"no result within {limit:.0f} s"}
        log(f"timeout: {case_key(pending[0])}")
        out.write(json.dumps(record) + "\n")
        out.flush()
        pending.pop(0)
        break
      if line is None:  # the worker died
        proc.wait()
        record = {**pending[0], "status": "error",
                  "error": f"worker exited {proc.returncode}: "
                           + "".join(stderr)[-500:]}
        log(f"crash: {case_key(pending[0])}: {record['error']}")
        out.write(json.dumps(record) + "\n")
        out.flush()
        pending.pop(0)
        break
      if not line.startswith("{"):
        continue
      record = json.loads(line)
      out.write(json.dumps(record) + "\n")
      out.flush()
      assert case_key(record) == case_key(pending[0])
      pending.pop(0)
      total = record.get("total")
      log(f"{record['status']}: {case_key(record)} "
          + (f"{total / GIB:.2f} GiB " if total else "")
          + f"({record['wall_seconds']} s wall, "
          f"{record['cpu_seconds']} s CPU)")
      limit = timeout
    proc.wait()


# ------------------------------------------------------------- markdown


def _cell(record: dict | None, memory_gib: float) -> str:
  if record is None:
    return "–"
  if record["status"] == "timeout":
    return "compile timed out"
  if record["status"] != "ok":
    return "error"
  total = record["total"] / GIB
  fits = total <= memory_gib * (1 - HEADROOM)
  return f"{total:.1f} {'✓' if fits else '✗'}"


def render(records: list[dict], command: str, machine: str, date: str,
           timings: str) -> str:
  """Markdown tables of the records, one per device kind."""
  by_key = {case_key(r): r for r in records}
  models = [m for m in MODELS if any(r["model"] == m for r in records)]
  accumulations = sorted({r["accumulation"] for r in records})
  lines = [
      "## Will it fit? Per-device memory of the train step",
      "",
      "ALBERT pre-training at the paper's recipe (batch 4096, seq 512, 20 "
      "predictions, LAMB, SOP) with bfloat16 compute and float32 parameters "
      "and optimizer state. Each cell is the per-device total (GiB) of the "
      "compiled train step: state (parameters + LAMB moments) + batch + "
      "temporaries (activations kept for the backward pass, gradients, "
      "collective buffers), from XLA's `memory_analysis()` of the sharded "
      "program compiled ahead of time for fake CPU devices "
      "(`--compile_only`). ✓: fits the device's memory less 10% headroom; "
      "✗: does not. Columns: gradient-accumulation steps (micro-batches "
      "per step). Meshes: `data` is pure data parallelism (state "
      "replicated), `fsdp` shards parameters, gradients and optimizer state "
      "over all devices (`[('data', 1), ('fsdp', -1)]`). Remat: `none` "
      "keeps every activation, `dots` the outputs of every matmul (the "
      "attention scores included), `dots_no_batch` those of the weight "
      "matmuls only, `full` only each layer's input.",
      "",
  ]
  for devices, (label, memory_gib) in DEVICE_KINDS.items():
    rows = [r for r in records if r["devices"] == devices]
    if not rows:
      continue
    usable = memory_gib * (1 - HEADROOM)
    lines += [f"### {label} ({usable:.1f} GiB usable)", "",
              "| model | mesh | remat | state/device (GiB) | "
              + " | ".join(f"accum {a}" for a in accumulations) + " |",
              "|---|---|---|---:|" + "---:|" * len(accumulations)]
    for model in models:
      for mesh in MESHES:
        for remat in REMATS:
          cells = [by_key.get(case_key(dict(
              model=model, devices=devices, mesh=mesh, remat=remat,
              accumulation=a))) for a in accumulations]
          if not any(cells):
            continue
          state = next((c["state"] / GIB for c in cells
                        if c and c.get("status") == "ok"), None)
          lines.append(
              f"| {model} | {mesh} | {remat} | "
              + (f"{state:.2f}" if state is not None else "–") + " | "
              + " | ".join(_cell(c, memory_gib) for c in cells) + " |")
    lines.append("")
  lines += ["Produced by", "", "```", command, "```", "",
            f"on {machine}, {date}. {timings}", ""]
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


def timing_summary(records: list[dict]) -> str:
  ok = [r for r in records if r["status"] == "ok"]
  if not ok:
    return ""
  parts = []
  for devices in DEVICE_KINDS:
    rs = [r for r in ok if r["devices"] == devices]
    if rs:
      cpu = [r["cpu_seconds"] for r in rs]
      parts.append(f"{devices} devices: {len(rs)} compiles, "
                   f"{min(cpu):.0f}–{max(cpu):.0f} s CPU each "
                   f"({sum(cpu) / 60:.0f} min in all)")
  wall = [r["wall_seconds"] for r in ok]
  failed = len(records) - len(ok)
  return ("Time per compile (trace, lower and compile, in the worker "
          "process; Python and JAX start-up excluded): " + "; ".join(parts)
          + f". Wall clock {min(wall):.0f}–{max(wall):.0f} s per compile, "
          f"{sum(wall) / 60:.0f} min in all."
          + (f" {failed} did not compile." if failed else ""))


# ----------------------------------------------------------------- main


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--models", default=",".join(MODELS))
  parser.add_argument("--devices", default=",".join(map(str, DEVICE_KINDS)))
  parser.add_argument("--meshes", default=",".join(MESHES))
  parser.add_argument("--remat", default=",".join(REMATS))
  parser.add_argument("--accumulation",
                      default=",".join(map(str, ACCUMULATIONS)))
  parser.add_argument("--out", default=str(ROOT / "experiments" /
                                           "memory_table.jsonl"))
  parser.add_argument("--markdown", default=None,
                      help="Write the tables here (default: print them).")
  parser.add_argument("--timeout", type=float, default=300.0,
                      help="Seconds one compile may take.")
  parser.add_argument("--date", default=datetime.date.today().isoformat())
  parser.add_argument("--render_only", action="store_true",
                      help="Only render --out's records as markdown.")
  parser.add_argument("--worker", action="store_true",
                      help=argparse.SUPPRESS)
  args = parser.parse_args()
  if args.worker:
    worker(json.loads(sys.stdin.read()))
    return

  def log(msg):
    print(f"[{datetime.datetime.now():%H:%M:%S}] {msg}", flush=True)

  cases = [dict(model=m, devices=int(d), mesh=mesh, remat=r,
                accumulation=int(a))
           for d in args.devices.split(",")
           for m in args.models.split(",")
           for mesh in args.meshes.split(",")
           for r in args.remat.split(",")
           for a in args.accumulation.split(",")]
  done = {}
  if os.path.exists(args.out):
    with open(args.out) as f:
      for line in f:
        if line.strip():
          record = json.loads(line)
          done[case_key(record)] = record
  todo = [c for c in cases if case_key(c) not in done]
  if not args.render_only and todo:
    log(f"{len(todo)} compiles to run ({len(cases) - len(todo)} done), "
        f"results appended to {args.out}")
    with open(args.out, "a") as out:
      for devices in sorted({c["devices"] for c in todo}):
        run_group([c for c in todo if c["devices"] == devices], out,
                  args.timeout, log)
    with open(args.out) as f:
      done = {case_key(r): r for r in map(json.loads, filter(str.strip, f))}
  records = [done[case_key(c)] for c in cases if case_key(c) in done]
  command = "python experiments/memory_table.py " + " ".join(
      a for a in sys.argv[1:] if not a.startswith("--render_only"))
  text = render(records, command.strip(), machine_name(), args.date,
                timing_summary(records))
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
