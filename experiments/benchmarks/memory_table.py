r"""Will it fit? Per-chip memory of ALBERT pre-training on TPU slices.

  nohup python experiments/benchmarks/memory_table.py --compiler tpu \
      --markdown experiments/memory_table.md > /tmp/tpu_memory.log 2>&1 &
  python experiments/benchmarks/memory_table.py --compiler tpu \
      --topologies v5e:16x16 --models base --remat none --accumulation 1
  python experiments/benchmarks/memory_table.py --compiler cpu --devices 64 \
      --models base --remat full --markdown /tmp/cpu_memory_table.md

For ALBERT base, large and xxlarge at the paper's recipe (batch 4096, seq
512, 20 predictions, LAMB, SOP), bfloat16 compute and float32 parameters,
it compiles the sharded train step ahead of time for every combination of
mesh (pure data parallel, or FSDP), remat policy and accumulation count,
and records the compiler's per-chip memory analysis. Two compilers:

- `--compiler tpu` (needs libtpu): the TPU compiler itself, for each TPU
  slice in `--topologies` (as `python -m albert_jax.main --compile_only
  --topology=NAME` does), with the attention the config really uses there
  (`auto`: the Pallas TPU kernels). A step that needs more HBM than a chip
  has is refused by the compiler, and recorded as such. Records:
  `experiments/benchmarks/tpu_memory_table.jsonl`; the first command above
  remakes `experiments/memory_table.md` from them.
- `--compiler cpu`: XLA:CPU for `--devices` fake CPU devices (as
  `--compile_only --num_fake_devices=N` does), an estimate of the same
  program that runs 2-4x too high without remat (its attention keeps what
  the Pallas kernels recompute). Records: `experiments/memory_table.jsonl`,
  which the TPU table quotes beside its cells (`--cpu_records`).

Compiles run in worker subprocesses, one per TPU compile and one per fake
device count for XLA:CPU (the count is fixed when JAX starts). Each result
is appended to `--out` as one JSON line as it comes, so an interrupted run
resumes where it stopped (failed compiles are tried again). A compile with
no result after `--timeout` seconds (60 s more for a worker's first, which
also starts Python and JAX) is killed and recorded as a timeout. With
`--skip_after_fit` (the TPU default) a row (model, slice, mesh, remat) is
not compiled further once it fits: more accumulation only shrinks the
micro-batch, so its larger accumulation counts' cells stay empty.

The markdown (`--markdown`, else printed) has one table per slice: per
model / mesh / remat, one column per accumulation count, each cell the
per-chip total in GiB, ✓ if it fits the chip's memory less 10% headroom
(✗ temps > X: the TPU compiler refused it, its temporaries alone needing
X GiB), and in a TPU table the XLA:CPU estimate of the same program beside
it where one was made. Below each table, the recommended settings: for
each model the cheapest setting that fits, preferring less recomputation
(remat none, then dots_no_batch, dots, full: each recomputes more of the
forward pass) and then fewer accumulation steps (which cost no FLOPs, only
smaller micro-batches). Anything below `NOTES_MARKER` in an existing
`--markdown` file (the hand-written reading) is kept, and a file holding
the other compiler's table is not overwritten. `--render_only` only renders
the records; `--command`, `--machine` and `--date` then say what made them
(tests/test_benchmarks.py remakes experiments/memory_table.md so).
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import datetime
import json
import os
import pathlib
import platform
import queue
import shlex
import subprocess
import sys
import threading
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]
GIB = 1024 ** 3
HEADROOM = 0.10
MODELS = ("base", "large", "xxlarge")
MESHES = {
    "data": [("data", -1), ("fsdp", 1), ("tensor", 1)],
    "fsdp": [("data", 1), ("fsdp", -1), ("tensor", 1)],
}
# Least recomputation first: the order recommendations prefer.
REMATS = ("none", "dots_no_batch", "dots", "full")
ACCUMULATIONS = (1, 2, 4, 8)
# In --markdown, everything from this line on is kept when the tables are
# written again: the hand-written reading of them.
NOTES_MARKER = "<!-- notes: kept when the tables are regenerated -->"
# Seconds a worker's first compile gets on top of --timeout: it also starts
# Python and JAX.
STARTUP_SECONDS = 60


@dataclasses.dataclass(frozen=True)
class Compiler:
  """What one compiler's cases are compiled for, and its table's words."""
  name: str
  target: str  # the case field saying what to compile for
  flag: str  # the --compile_only flag that compiles for a target
  # Target → (label, chips, memory per chip in GiB).
  targets: dict[int | str, tuple[str, int, float]]
  records: pathlib.Path  # the default --out
  remat: str  # the default --remat
  timeout: float  # the default --timeout
  skip_after_fit: bool  # the default --skip_after_fit
  one_compile_per_worker: bool
  state_column: bool  # a column with the state (parameters + moments)
  title: str
  intro: str


TPU = Compiler(
    name="tpu", target="topology", flag="topology",
    # v4-64 is 32 chips (v4 names count TensorCores, two per chip); v5e's
    # 16 GB are decimal.
    targets={
        "v4:2x4x4": ("v4-64: 32 × TPU v4, 32 GiB each", 32, 32.0),
        "v5e:16x16": ("v5e-256: 256 × TPU v5e, 16 GB each", 256, 16e9 / GIB),
        "v5p:4x4x4": ("v5p-128: 64 × TPU v5p, 95 GiB each", 64, 95.0),
        "v6e:16x16": ("v6e-256: 256 × TPU v6e, 32 GiB each", 256, 32.0),
    },
    records=ROOT / "experiments" / "benchmarks" / "tpu_memory_table.jsonl",
    # dots costs as much recomputation as dots_no_batch and more memory.
    remat="none,dots_no_batch,full", timeout=1200.0, skip_after_fit=True,
    # A fresh libtpu for each compile: what one compile leaves behind
    # cannot sway the next.
    one_compile_per_worker=True, state_column=False,
    title="## Will it fit? Per-chip memory of the train step, by the TPU "
    "compiler",
    intro="ALBERT pre-training at the paper's recipe (batch 4096, seq 512, "
    "20 predictions, LAMB, SOP), bfloat16 compute, float32 parameters and "
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
    "optimizer state over every chip.")

CPU = Compiler(
    name="cpu", target="devices", flag="num_fake_devices",
    # One JAX device per chip: a v4 chip (32 GiB HBM) is one device with
    # megacore, and a v4-N slice has N/2 chips, so a v4-64 is 32 devices
    # and 64 v4 devices a v4-128. v5e: 16 GB per chip, taken as decimal
    # (14.9 GiB) to stay on the safe side.
    targets={
        32: ("v4-64: 32 × TPU v4, 32 GiB each", 32, 32.0),
        64: ("v4-128: 64 × TPU v4, 32 GiB each", 64, 32.0),
        256: ("v5e-256: 256 × TPU v5e, 16 GB each", 256, 16e9 / GIB),
    },
    records=ROOT / "experiments" / "memory_table.jsonl",
    remat=",".join(REMATS), timeout=300.0, skip_after_fit=False,
    one_compile_per_worker=False, state_column=True,
    title="## Will it fit? Per-device memory of the train step, estimated "
    "by XLA:CPU",
    intro="ALBERT pre-training at the paper's recipe (batch 4096, seq 512, "
    "20 predictions, LAMB, SOP) with bfloat16 compute and float32 "
    "parameters and optimizer state. Each cell is the per-device total "
    "(GiB) of the compiled train step: state (parameters + LAMB moments) "
    "+ batch + temporaries (activations kept for the backward pass, "
    "gradients, collective buffers), from XLA's `memory_analysis()` of the "
    "sharded program compiled ahead of time for fake CPU devices "
    "(`--compile_only --num_fake_devices`). An estimate: without remat it "
    "is 2-4x what the TPU compiler says (`experiments/memory_table.md`), "
    "its attention keeping what the Pallas kernels recompute. ✓: fits the "
    "device's memory less 10% headroom; ✗: does not. Columns: "
    "gradient-accumulation steps (micro-batches per step). Meshes: `data` "
    "is pure data parallelism (state replicated), `fsdp` shards "
    "parameters, gradients and optimizer state over all devices "
    "(`[('data', 1), ('fsdp', -1)]`). Remat: `none` keeps every "
    "activation, `dots` the outputs of every matmul (the attention scores "
    "included), `dots_no_batch` those of the weight matmuls only, `full` "
    "only each layer's input.")

COMPILERS = {c.name: c for c in (TPU, CPU)}


def case_key(compiler: Compiler, case: dict) -> str:
  return (f"{case['model']}/{case[compiler.target]}/{case['mesh']}/"
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


def worker() -> None:
  """Compiles the cases on stdin, a JSON line each; prints their records."""
  from albert_jax.tools import compile_only  # pylint: disable=g-import-not-at-top
  for line in iter(sys.stdin.readline, ""):
    case = json.loads(line)
    start_cpu, start = time.process_time(), time.perf_counter()
    try:
      result = compile_only.analyse(config_for(case),
                                    topology=case.get("topology"))
      # The case names the model; the model's config would be noise here.
      record = {k: v for k, v in result.items() if k != "model"}
      record["mesh_shape"] = record.pop("mesh")  # "mesh" is the case's
      record["status"] = "ok"
    except compile_only.DoesNotFit as e:  # the TPU compiler's own verdict
      record = {"status": "oom", "error": str(e),
                "required_bytes": e.required_bytes,
                "available_bytes": e.available_bytes}
    except Exception as e:  # pylint: disable=broad-except
      record = {"status": "error",
                "error": f"{type(e).__name__}: {str(e)[:500]}"}
    record.update(case, wall_seconds=round(time.perf_counter() - start, 1),
                  cpu_seconds=round(time.process_time() - start_cpu, 1))
    print(json.dumps(record, default=_as_json), flush=True)


def _as_json(value):
  """A dataclass as a dict, for `json.dumps`.

  analyse() prices a TPU step's kernels in a `roofline.Summary` ("traffic").
  """
  if dataclasses.is_dataclass(value) and not isinstance(value, type):
    return dataclasses.asdict(value)
  raise TypeError(f"{type(value).__name__} is not JSON serializable")


class Worker:
  """A `worker()` subprocess compiling cases of one target, one at a time.

  Cases are sent one by one, not all at once, so that `--skip_after_fit`
  can decide on each from the results before it.
  """

  def __init__(self, compiler: Compiler, target: int | str):
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=os.pathsep.join(
        p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))
    if compiler is CPU:
      flags = [f for f in env.get("XLA_FLAGS", "").split()
               if not f.startswith("--xla_force_host_platform_device_count")]
      env["XLA_FLAGS"] = " ".join(
          flags + [f"--xla_force_host_platform_device_count={target}"])
    else:
      # libtpu's lock file would keep it from loading in a second process
      # (another run, or a worker not yet gone).
      env["ALLOW_MULTIPLE_LIBTPU_LOAD"] = "1"
    self.compiler, self.target, self.compiles = compiler, target, 0
    self.proc = subprocess.Popen(
        [sys.executable, __file__, "--worker"], env=env, cwd=ROOT,
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True)
    self.lines: queue.Queue = queue.Queue()
    self.stderr: collections.deque = collections.deque(maxlen=100)
    threading.Thread(target=lambda: [self.lines.put(l)
                                     for l in self.proc.stdout]
                     + [self.lines.put(None)], daemon=True).start()
    self.stderr_reader = threading.Thread(
        target=lambda: self.stderr.extend(self.proc.stderr), daemon=True)
    self.stderr_reader.start()

  def usable_for(self, case: dict) -> bool:
    return (self.proc.poll() is None
            and case[self.compiler.target] == self.target
            and not (self.compiler.one_compile_per_worker and self.compiles))

  def compile(self, case: dict, timeout: float) -> dict:
    """The case's record; a timeout or a crash ends the worker."""
    limit = timeout + (0 if self.compiles else STARTUP_SECONDS)
    self.compiles += 1
    deadline = time.monotonic() + limit
    try:
      self.proc.stdin.write(json.dumps(case) + "\n")
      self.proc.stdin.flush()
    except BrokenPipeError:
      pass  # it died: its stdout ends, below
    while True:
      try:
        line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
      except queue.Empty:
        self.proc.kill()
        self.proc.wait()
        return {**case, "status": "timeout",
                "error": f"no result within {limit:.0f} s"}
      if line is None:
        self.proc.wait()
        self.stderr_reader.join(timeout=10)  # for its last words
        return {**case, "status": "error",
                "error": f"worker exited {self.proc.returncode}: "
                         + "".join(self.stderr)[-500:]}
      if line.startswith("{"):  # not something a library printed
        record = json.loads(line)
        assert case_key(self.compiler, record) == case_key(self.compiler,
                                                           case)
        return record

  def close(self) -> None:
    if self.proc.returncode is None:
      self.proc.stdin.close()  # it exits at the end of its input
      self.proc.wait()


def compile_cases(compiler: Compiler, todo: list[dict],
                  records: dict[str, dict], out, timeout: float,
                  skip_after_fit: bool, log) -> None:
  """Compiles `todo`, appending each record to `out` and `records`."""
  current = None
  try:
    for case in todo:
      if skip_after_fit and _fits_with_less(compiler, records, case):
        continue
      if current is not None and not current.usable_for(case):
        current.close()
        current = None
      if current is None:
        current = Worker(compiler, case[compiler.target])
      record = current.compile(case, timeout)
      out.write(json.dumps(record) + "\n")
      out.flush()
      records[case_key(compiler, case)] = record
      total = record.get("total")
      log(f"{record['status']}: {case_key(compiler, case)} "
          + (f"{total / GIB:.2f} GiB" if total else record.get("error", ""))
          + f" ({record.get('wall_seconds', '?')} s wall, "
          f"{record.get('cpu_seconds', '?')} s CPU)")
  finally:
    if current is not None:
      current.close()


# ------------------------------------------------------------- markdown


def _fits(record: dict | None, memory_gib: float) -> bool:
  return bool(record and record.get("status") == "ok"
              and record["total"] <= memory_gib * GIB * (1 - HEADROOM))


def _fits_with_less(compiler: Compiler, records: dict[str, dict],
                    case: dict) -> bool:
  """Whether the case's row already fits with fewer accumulation steps.

  The row: the same model, target, mesh and remat. More steps only shrink
  the micro-batch, so they would fit too.
  """
  _, _, memory_gib = compiler.targets[case[compiler.target]]
  row = ("model", compiler.target, "mesh", "remat")
  return any(_fits(r, memory_gib) for r in records.values()
             if r["accumulation"] < case["accumulation"]
             and all(r.get(k) == case[k] for k in row))


def cpu_estimates(path: pathlib.Path) -> dict[tuple, dict]:
  """XLA:CPU's records, by (model, devices, mesh, remat, accumulation)."""
  return {(r["model"], r["devices"], r["mesh"], r["remat"],
           r["accumulation"]): r
          for r in read_records(CPU, path).values()
          if r.get("status") == "ok"}


def _cell(record: dict | None, cpu: dict | None, memory_gib: float) -> str:
  if record is None:
    return "–"
  if record["status"] == "oom":  # the compiler refused: no total
    needed = record.get("required_bytes")
    text = "✗" + (f" temps > {needed / GIB:.1f}" if needed else "")
  elif record["status"] != "ok":
    return {"timeout": "compile timed out"}.get(record["status"], "error")
  else:
    mark = "✓" if _fits(record, memory_gib) else "✗"
    text = f"{record['total'] / GIB:.2f} {mark}"
  if cpu is not None:
    text += f" (CPU {cpu['total'] / GIB:.1f})"
  return text


def recommendations(compiler: Compiler, records: dict[str, dict], target,
                    meshes, accumulations) -> list[str]:
  """Per model, the cheapest fitting setting (see the module docstring)."""
  _, _, memory_gib = compiler.targets[target]
  lines = []
  for model in MODELS:
    choice = None
    for remat in REMATS:
      for acc in accumulations:
        for mesh in meshes:
          r = records.get(case_key(compiler, {
              "model": model, compiler.target: target, "mesh": mesh,
              "remat": remat, "accumulation": acc}))
          if _fits(r, memory_gib) and choice is None:
            choice = r
    if choice is not None:
      lines.append(
          f"- {model}: mesh {choice['mesh']}, remat {choice['remat']}, "
          f"accumulation_steps={choice['accumulation']} "
          f"({choice['total'] / GIB:.2f} GiB per chip)")
    elif any(r.get("model") == model and r.get(compiler.target) == target
             for r in records.values()):
      lines.append(f"- {model}: nothing compiled here fits")
  return lines


def render(compiler: Compiler, records: dict[str, dict], cases: list[dict],
           estimates: dict[tuple, dict], command: str, machine: str,
           date: str) -> str:
  """Markdown: per target, a table of `cases`, then the recommendations.

  `estimates` (`cpu_estimates`) go in brackets beside the cells.
  """
  meshes = [m for m in MESHES if any(c["mesh"] == m for c in cases)]
  accs = sorted({c["accumulation"] for c in cases})
  lines = [compiler.title, "", compiler.intro, ""]
  for target, (label, chips, memory_gib) in compiler.targets.items():
    if not any(c[compiler.target] == target for c in cases):
      continue
    state = " state/device (GiB) |" if compiler.state_column else ""
    lines += [f"### {label} (`--{compiler.flag}={target}`, "
              f"{memory_gib * (1 - HEADROOM):.1f} GiB usable)", "",
              f"| model | mesh | remat |{state} "
              + " | ".join(f"accum {a}" for a in accs) + " |",
              "|---|---|---|" + "---:|" * (len(accs) + bool(state))]
    for model in MODELS:
      for mesh in meshes:
        for remat in REMATS:
          keys = [{"model": model, compiler.target: target, "mesh": mesh,
                   "remat": remat, "accumulation": a} for a in accs]
          cells = [records.get(case_key(compiler, k)) for k in keys]
          if not any(cells):
            continue
          row = f"| {model} | {mesh} | {remat} | "
          if state:
            ok = [c for c in cells if c and c["status"] == "ok"]
            row += f"{ok[0]['state'] / GIB:.2f} | " if ok else "– | "
          lines.append(row + " | ".join(
              _cell(c, estimates.get((model, chips, mesh, remat,
                                      k["accumulation"])), memory_gib)
              for c, k in zip(cells, keys)) + " |")
    lines += ["", "Recommended for the paper's recipe:", ""]
    lines += recommendations(compiler, records, target, meshes, accs) + [""]
  shown = {case_key(compiler, c) for c in cases}
  ok = [r for k, r in records.items()
        if k in shown and r.get("status") == "ok"]
  wall = [r["wall_seconds"] for r in ok]
  lines += ["Produced by", "", "```", command, "```", "",
            f"on {machine}, {date}"
            + (f": {len(ok)} compiles, {min(wall):.0f}–{max(wall):.0f} s "
               f"each ({sum(wall) / 60:.0f} min in all)." if ok else "."),
            ""]
  return "\n".join(lines)


def write_markdown(compiler: Compiler, path: str, text: str) -> None:
  """Writes `text` to `path`, keeping the notes from NOTES_MARKER on."""
  notes = ""
  if os.path.exists(path):
    with open(path, encoding="utf-8") as f:
      old = f.read()
    first = old.split("\n", 1)[0]
    other = [c for c in COMPILERS.values() if c is not compiler
             and first == c.title]
    if other:  # the CPU estimate must not replace the TPU table
      raise SystemExit(
          f"{path} holds the {other[0].name} compiler's table: not "
          f"overwriting it with the {compiler.name} one (pick another "
          "--markdown).")
    if NOTES_MARKER in old:
      notes = "\n" + old[old.index(NOTES_MARKER):]
  with open(path, "w", encoding="utf-8") as f:
    f.write(text + notes)


# ----------------------------------------------------------------- main


def machine_name() -> str:
  try:
    out = subprocess.run(["lscpu"], capture_output=True, text=True,
                         check=True).stdout
    model = next(l.split(":", 1)[1].strip() for l in out.splitlines()
                 if l.startswith("Model name"))
  except (OSError, subprocess.CalledProcessError, StopIteration):
    model = platform.processor() or "unknown CPU"
  return f"{model}, {os.cpu_count()} cores"


def read_records(compiler: Compiler, path) -> dict[str, dict]:
  """The records in `path` by case key; a case's last record wins."""
  if not os.path.exists(path):
    return {}
  with open(path, encoding="utf-8") as f:
    return {case_key(compiler, r): r
            for r in map(json.loads, filter(str.strip, f))}


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--compiler", choices=COMPILERS,
                      help="tpu: the TPU compiler (libtpu); cpu: XLA:CPU "
                      "with fake devices, an estimate.")
  parser.add_argument("--topologies", default=None, help="TPU slices "
                      f"(--compiler tpu; default {','.join(TPU.targets)}).")
  parser.add_argument("--devices", default=None, help="Fake CPU device "
                      "counts (--compiler cpu; default "
                      f"{','.join(map(str, CPU.targets))}).")
  parser.add_argument("--models", default=",".join(MODELS))
  parser.add_argument("--meshes", default=",".join(MESHES))
  parser.add_argument("--remat", default=None, help="Default: "
                      f"{TPU.remat} (tpu), {CPU.remat} (cpu).")
  parser.add_argument("--accumulation",
                      default=",".join(map(str, ACCUMULATIONS)))
  parser.add_argument("--out", default=None, help="The records (default: "
                      f"{TPU.records.relative_to(ROOT)} or "
                      f"{CPU.records.relative_to(ROOT)}).")
  parser.add_argument("--cpu_records", default=str(CPU.records),
                      help="XLA:CPU's records, quoted in the TPU table.")
  parser.add_argument("--markdown", default=None,
                      help="Write the tables here (default: print them).")
  parser.add_argument("--timeout", type=float, default=None,
                      help="Seconds one compile may take (default: "
                      f"{TPU.timeout:.0f} tpu, {CPU.timeout:.0f} cpu).")
  parser.add_argument("--render_only", action="store_true",
                      help="Only render --out's records as markdown.")
  parser.add_argument("--date", default=datetime.date.today().isoformat())
  parser.add_argument("--machine", default=None,
                      help="What compiled the records (default: this one).")
  parser.add_argument("--command", default=None,
                      help="The command that made the records (default: "
                      "this one).")
  parser.add_argument(
      "--skip_after_fit", action=argparse.BooleanOptionalAction,
      default=None, help="Skip a case when the same row fits with fewer "
      "accumulation steps (its cell stays empty; default: on for tpu).")
  parser.add_argument("--worker", action="store_true",
                      help=argparse.SUPPRESS)
  args = parser.parse_args()
  if args.worker:
    worker()
    return
  if args.compiler is None:
    parser.error("--compiler tpu or cpu is needed")
  compiler = COMPILERS[args.compiler]
  wrong = "--devices" if compiler is TPU else "--topologies"
  if getattr(args, wrong[2:]) is not None:
    parser.error(f"{wrong} is not for --compiler {compiler.name}")
  targets = args.topologies if compiler is TPU else args.devices
  targets = [type(next(iter(compiler.targets)))(t) for t in
             (targets.split(",") if targets else compiler.targets)]
  unknown = [t for t in targets if t not in compiler.targets]
  if unknown:
    parser.error(f"no table for {unknown} (known: "
                 f"{', '.join(map(str, compiler.targets))})")
  out = args.out or str(compiler.records)
  timeout = compiler.timeout if args.timeout is None else args.timeout
  skip_after_fit = (compiler.skip_after_fit if args.skip_after_fit is None
                    else args.skip_after_fit)

  def log(msg):
    print(f"[{datetime.datetime.now():%H:%M:%S}] {msg}", flush=True)

  cases = [{"model": m, compiler.target: t, "mesh": mesh, "remat": r,
            "accumulation": int(a)}
           for t in targets
           for m in args.models.split(",")
           for mesh in args.meshes.split(",")
           for r in (args.remat or compiler.remat).split(",")
           for a in args.accumulation.split(",")]
  records = read_records(compiler, out)
  todo = [c for c in cases if records.get(case_key(compiler, c), {}).get(
      "status") in (None, "error")]
  if not args.render_only and todo:
    log(f"{len(todo)} compiles at most, results appended to {out}")
    with open(out, "a", encoding="utf-8") as f:
      compile_cases(compiler, todo, records, f, timeout, skip_after_fit, log)
  command = args.command or "python experiments/benchmarks/memory_table.py " \
      + shlex.join(a for a in sys.argv[1:] if a != "--render_only")
  estimates = (cpu_estimates(pathlib.Path(args.cpu_records))
               if compiler is TPU else {})
  text = render(compiler, records, cases, estimates, command.strip(),
                args.machine or machine_name(), args.date)
  if args.markdown:
    write_markdown(compiler, args.markdown, text)
    log(f"wrote {args.markdown}")
  else:
    print(text)


if __name__ == "__main__":
  main()
