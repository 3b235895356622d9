r"""Hyperparameter sweeps as files: expand, validate, run trial after trial.

A sweep file (experiments/*.py, e.g. demo_lr.py) sets `CONFIG`, its base
config, and `get_sweep(arg=None)`, returning the trials: dicts of dotted config
overrides, built with `axis`, `product`, `zip_`, `chain` and `fixed`. A
`get_sweep` with a `base` keyword also receives the base config (CONFIG, or
the one `--config` names) as a ConfigDict, for trials that depend on the
model (experiments/ablate_embedding.py's widths follow its hidden size).
The ablations share `ablation`: the demo's pre-training as CONFIG and a
`quick` argument for 30-step smoke runs.

  python -m albert_jax.tools.sweep experiments/demo_lr.py[:arg] --workdir_root=DIR
  python -m albert_jax.tools.sweep experiments/demo_lr.py --workdir_root=gs://b/lr \
      --print_commands --launcher=tpu > lr.sh && bash lr.sh   # a trial a slice

Keys are checked against the base config first. Each trial runs `python -m
albert_jax.main --config=CONFIG --workdir=DIR/NAME --config.k=v ...`, logging
to DIR/NAME/sweep.log; NAME is `k=v,k2=v2` (hashed when long or unsafe). Done
trials (final_metrics.json) are skipped; failures are reported, the rest run
(exit 1). The metrics table is printed and written to DIR/results.md.
Arguments after `--` go to every trial. Each trial's arguments are recorded
in DIR/NAME/sweep_args.json: a rerun whose arguments for a done trial
differ (other `--` overrides, another base config) is refused, naming the
difference, as its table would mix trials of two setups.

`--parallel=N` runs N trials at once, each a process seeing every device
of the host (with 1/N of an accelerator's memory); `--devices_per_trial=K`
gives each running trial K devices of its own instead, the host's GPUs or
TPU chips split into groups (albert_jax/tools/device_groups.py), with
`--parallel` defaulting to the number of groups. Each trial's log then
starts with the devices it ran on.

Several processes may run the same command on one DIR at once, and share
its trials out: each claims a trial before it runs it, DIR/NAME/claim.json
(the lease of albert_jax/training/lease.py: created only if absent, a
heartbeat every 30 s; beside the trial's own lease.json, which its trainer
takes), skips the trials others hold, and when only those are left waits
for them, saying which and who holds them, looking again every 15 s. A
claim whose process died is taken over 180 s after its last heartbeat (at
once where its process was on this host) and its trial resumes from its
checkpoints. A trial that fails leaves its claim marked failed: a process
that started before the failure reports it failed without running it
again, one started after it (a later run of the command) retries it; the
claim's age is by the storage's clock, the process's running time by its
own, and no two hosts' clocks are compared. Each process ends when every
trial is done or failed, whichever process ran it, and then writes
results.md, whole (the downstream suite's report likewise; the last
written stands).

On a multi-host TPU slice that is how its hosts run trials at once: the
same command on every worker, DIR in gs://, each host's chips split with
`--devices_per_trial` (required there: a trial not pinned to one host's
chips would wait for the whole slice, and is refused), e.g. with each
worker's output in logs/lr.HOST.log:

  bash tpu_setup.sh ssh --name=$TPU_NAME --zone=$ZONE -- 'cd albert_jax && \
      . .venv/bin/activate && mkdir -p logs && nohup python -m \
      albert_jax.tools.sweep experiments/demo_lr.py --workdir_root=gs://b/lr \
      --devices_per_trial=1 > logs/lr.$(hostname).log 2>&1 < /dev/null &'

A model too big for one host runs each trial on the whole slice instead,
one after another: `--print_commands --launcher=tpu` above. The trials'
one-host TPU environment has not been run on a multi-host slice here.

DIR is local (`~` expanded) or gs://BUCKET/PATH. Under gs:// a trial logs
into ./sweep_logs/NAME.log while it runs (followed live on a terminal) and
the log is copied to DIR/NAME/sweep.log when it ends. Sweep and config files
are Python modules, read from the local disk.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import copy
import dataclasses
import hashlib
import importlib.util
import inspect
import itertools
import json
import os
import queue
import re
import shlex
import subprocess
import sys
import time
from typing import Any, Iterable, Mapping

from etils import epath

from albert_jax import hints
from albert_jax import storage
from albert_jax.tools import device_groups
from albert_jax.training import lease as lease_lib

Trial = dict[str, Any]

# The ablations' base: the demo's pre-training at 400 steps, without its
# fine-tuning stage; `--config=configs/albert_base.py` (say) runs one at
# paper scale.
ABLATION_CONFIG = "configs/demo.py:steps=400,finetune_steps=0"
# An ablation's `quick` argument: 30 steps a trial, evaluated every 10.
QUICK = {"config.num_train_steps": 30, "config.optimizer.warmup_steps": 3,
         "config.eval_every_steps": 10}


class SweepError(ValueError):
  """A sweep that cannot run: bad file, unknown key, clashing trials."""


def axis(key: str, values: Iterable[Any]) -> list[Trial]:
  """One trial per value of `key`."""
  return [{key: v} for v in values]


def fixed(mapping: Mapping[str, Any] | None = None, **kv: Any) -> list[Trial]:
  """A single trial setting every given key; in a product, a constant."""
  return [{**(mapping or {}), **kv}]


def _parts(parts, axes) -> list[list[Trial]]:
  """Each part is a list of trials or a mapping key → values (one axis each)."""
  return [p for part in (*parts, axes) for p in (
      [axis(k, v) for k, v in part.items()] if isinstance(part, Mapping)
      else [list(part)])]


def _merge(trials: Iterable[Trial]) -> Trial:
  merged = {}
  for key, value in (item for trial in trials for item in trial.items()):
    if key in merged:
      raise SweepError(f"{key} is set twice in one trial.")
    merged[key] = value
  return merged


def product(*parts, **axes) -> list[Trial]:
  """Cartesian product: `product({"a.b": [1, 2]}, c=[3, 4])` is 4 trials."""
  return [_merge(c) for c in itertools.product(*_parts(parts, axes))]


def zip_(*parts, **axes) -> list[Trial]:
  """Trials side by side: the i-th trial merges the i-th of every part."""
  lists = _parts(parts, axes)
  if len({len(p) for p in lists}) > 1:
    raise SweepError(f"zip_ of unequal lengths {[len(p) for p in lists]}.")
  return [_merge(c) for c in zip(*lists)]


def chain(*parts) -> list[Trial]:
  """The trials of every part, one list after another."""
  return [t for part in _parts(parts, {}) for t in part]


def ablation(arg: str | None, *parts) -> list[Trial]:
  """An ablation's trials: `product(*parts)`, each with QUICK's schedule
  added when `arg` is "quick" (the only argument an ablation takes)."""
  from albert_jax import config_lib  # pylint: disable=g-import-not-at-top
  args = config_lib.parse_arg(arg, quick=False)
  return product(*parts, fixed(QUICK if args.quick else {}))


def format_value(value: Any) -> str:
  """A value as `--config.k=` reads it back (ml_collections config flags)."""
  if isinstance(value, (bool, str)):
    return str(value).lower() if isinstance(value, bool) else value
  return repr(value)


def trial_name(trial: Trial) -> str:
  """Stable, filesystem-safe and unique: `k=v,k2=v2`, hashed when needed."""
  raw = ",".join(f"{k}={format_value(v)}" for k, v in trial.items()) or "base"
  safe = re.sub(r"[^A-Za-z0-9._,=+-]", "_", raw)
  if safe == raw and len(raw) <= 100:
    return raw
  return f"{safe[:89]}-{hashlib.sha1(raw.encode()).hexdigest()[:10]}"


def _load(spec: str):
  """(path, module, arg) of `path.py[:arg]`, the module freshly executed."""
  path, sep, arg = spec.partition(".py:")
  path, arg = (path + ".py", arg) if sep else (spec, None)
  if storage.is_remote(path):
    raise SweepError(f"{path}: sweep and config files are Python modules, "
                     "imported from the local disk; copy it here (gsutil cp) "
                     "and give the local path.")
  if not storage.path(path).is_file():
    raise SweepError(f"No such file: {path}")
  path = os.fspath(storage.path(path))
  module = importlib.util.module_from_spec(
      importlib.util.spec_from_file_location("_loaded_by_sweep", path))
  module.__spec__.loader.exec_module(module)
  return path, module, arg


def _base_config(config_spec: str):
  """The ConfigDict of `configs/x.py[:arg]`."""
  _, module, arg = _load(config_spec)
  return module.get_config(arg)


def load_sweep(spec: str, config: str | None = None):
  """(base config spec, {name: trial}) from `experiments/x.py[:arg]`."""
  path, module, arg = _load(spec)
  config = config or getattr(module, "CONFIG", None)
  if not config:
    raise SweepError(f"{path} sets no CONFIG and no --config was given.")
  kwargs = {}
  if "base" in inspect.signature(module.get_sweep).parameters:
    kwargs["base"] = _base_config(config)
  trials = {}
  for trial in module.get_sweep(*([] if arg is None else [arg]), **kwargs):
    trial = _merge({k.removeprefix("config."): v} for k, v in trial.items())
    if (name := trial_name(trial)) in trials:
      raise SweepError(f"{path}: trial {name} appears twice.")
    trials[name] = trial
  if not trials:
    raise SweepError(f"{path}: get_sweep returned no trials.")
  return config, trials


def _paths(node, prefix=""):
  for k, v in node.items():
    yield prefix + k
    yield from _paths(v, f"{prefix}{k}.") if hasattr(v, "items") else ()


def _unknown(key: str, paths: list[str]) -> str:
  """Names the closest valid keys, and the fields where `key` points."""
  parent, _, leaf = key.rpartition(".")
  split = [(p, *p.rpartition(".")[::2]) for p in paths]  # path, parent, leaf
  # The whole path misspelt, or the right field under the wrong parent.
  close = hints.closest(key, paths, n=3) + [
      p for p, _, l in split if hints.closest(leaf, [l], cutoff=0.8)]
  fields = ", ".join(l for _, d, l in split if d == parent)
  return (f"Unknown config key {key!r}"
          + hints.suggestion(list(dict.fromkeys(close))[:5])
          + "." + (f" Fields of {parent or 'config'}: {fields}."
                   if fields else ""))


def validate(config_spec: str, trials: Mapping[str, Trial],
             extra_keys: Iterable[str] = ()) -> None:
  """Every key exists in the base config and takes its trial's value."""
  base = _base_config(config_spec)
  paths = list(_paths(base))
  keys = dict.fromkeys([*extra_keys, *(k for t in trials.values() for k in t)])
  errors = [_unknown(k, paths) for k in keys if k not in paths]
  for name, trial in trials.items():
    for key, value in ((k, v) for k, v in trial.items() if k in paths):
      *parents, leaf = key.split(".")
      node = copy.deepcopy(base)
      for part in parents:
        node = node[part]
      try:
        node[leaf] = value
      except (TypeError, ValueError) as e:
        errors.append(f"Bad value {value!r} for {key} (trial {name}): {e}")
  if errors:
    raise SweepError("\n".join(errors))


def _main_args(config: str, workdir: str, trial: Trial, extra=()) -> list[str]:
  return [f"--config={config}", f"--workdir={workdir}",
          *(f"--config.{k}={format_value(v)}" for k, v in trial.items()),
          *extra]


ARGS_FILE = "sweep_args.json"


def _recorded_args(cmd: list[str]) -> list[str]:
  """A trial's command as recorded and compared: without --workdir, which
  names the same directory however the root is spelt."""
  return [a for a in cmd if not a.startswith("--workdir=")]


def other_arguments(workdir: str, cmd: list[str]) -> str | None:
  """How a done trial's recorded arguments differ from `cmd`'s ("then
  --config.batch_size=8; now none"), or None where they agree or none were
  recorded (a trial run before they were)."""
  path = storage.path(workdir) / ARGS_FILE
  if not path.exists():
    return None
  try:
    then = json.loads(path.read_text())
  except ValueError:
    then = None
  if not isinstance(then, list):
    return f"{path} is damaged (delete it to skip the check)"
  now = _recorded_args(cmd)
  gone = [a for a in then if a not in now]
  new = [a for a in now if a not in then]
  if then == now or not (gone or new):  # the same, or only reordered
    return None
  return f"then {' '.join(gone) or 'none'}; now {' '.join(new) or 'none'}"


def read_metrics(workdir: str) -> dict | None:
  """The contents of WORKDIR/final_metrics.json (local or gs://), None if
  there is none."""
  path = storage.path(workdir) / "final_metrics.json"
  if not path.exists():
    return None
  try:
    return storage.read_json_object(
        path, "delete it, and the sweep runs that trial again (it resumes "
        "from the trial's checkpoints).")
  except storage.DamagedFileError as e:
    raise SweepError(str(e)) from None


def run_trial(cmd: list[str], workdir: str, log: epath.Path, prefix: str,
              env: Mapping[str, str] | None = None, live: bool | None = None,
              devices: str | None = None):
  """Runs `cmd` into `log` (a live line on a terminal unless `live` is
  False); (status, metrics). `env` adds to the environment. `devices`
  ("GPUs 2,3"), where `env` pins the trial to them: the log's first line
  names them and the variables set, so the record says where it ran."""
  log.parent.mkdir(parents=True, exist_ok=True)
  on = f" on {devices}" if devices else ""
  print(f"{prefix}: running{on}, log in {log}", flush=True)
  start = time.time()
  live = sys.stdout.isatty() if live is None else live
  added = dict(env or {})
  env = {**os.environ, "PYTHONUNBUFFERED": "1", **added}
  with log.open("wb") as f, log.open("rb") as r:
    if devices:
      f.write(f"devices: {devices}; ".encode() + " ".join(
          f"{k}={v}" for k, v in added.items()).encode() + b"\n")
      f.flush()
    proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env)
    while (proc.poll() if live else proc.wait()) is None:
      time.sleep(0.2)
      r.seek(max(0, r.seek(0, os.SEEK_END) - 2000))
      last = (r.read().decode(errors="replace").strip().splitlines()
              or [""])[-1][:60]
      print(f"\r\033[K{prefix}: {time.time() - start:.0f} s  {last}",
            end="", flush=True)
  print("\r\033[K" if live else "", end="")
  rc, took = proc.returncode, time.time() - start
  if storage.is_remote(workdir):  # the run's record stays with the run
    storage.write_atomic(storage.path(workdir) / "sweep.log",
                         log.read_bytes())
  metrics = read_metrics(workdir)
  if rc == 0 and metrics is not None:
    print(f"{prefix}: ok in {took:.1f} s")
    return "ok", metrics
  why = f"exit code {rc}" if rc else "no final_metrics.json"
  tail = log.read_bytes().decode(errors="replace").splitlines()[-10:]
  print(f"{prefix}: FAILED ({why}) after {took:.1f} s; end of {log}:\n"
        + "\n".join("  " + line for line in tail))
  return "failed", metrics


################################################################################
# Claims: which process of the command runs which trial.
################################################################################

CLAIM = "claim.json"
# How often a process with nothing to run looks again at the trials others
# hold (seconds).
POLL_SECONDS = 15.0
# A claim goes stale later than its trial's own lease.json: its trainer
# beats up to a heartbeat after the claim's last beat, so a process taking
# a dead host's claim over finds that host's trainer lease stale too, and
# its trainer is not refused.
CLAIM_STALE_SECONDS = lease_lib.STALE_SECONDS + 2 * lease_lib.HEARTBEAT_SECONDS


@dataclasses.dataclass(frozen=True)
class Timing:
  """The claims' clocks (tests shorten them): `poll` seconds between looks
  at trials held elsewhere; a claim `stale` after that long without a
  heartbeat, written every `heartbeat` seconds."""
  poll: float = POLL_SECONDS
  stale: float = CLAIM_STALE_SECONDS
  heartbeat: float = lease_lib.HEARTBEAT_SECONDS


def _holder(path: str, held: dict) -> str:
  """Who holds the claim `path` (its record `held`), for people: "pid 12 on
  w-1"."""
  if "pid" in held:
    return lease_lib.describe(held, None)
  return (f"an unreadable claim, {path}: if no process of the command runs "
          "that trial and the file stays unreadable, delete it")


def claim(workdir: str, timing: Timing, since: float):
  """Claims the trial in `workdir` for this process, unless it is done.

  A claim marked failed was left by a process whose trial failed: since
  `since` (this process's start, by `time.monotonic`), a failure of this
  run, reported and not run again; before it, an earlier run's, retried.
  Its age is by the storage's clock and compared with a duration here: no
  two hosts' clocks are compared.

  Returns:
    ("run", lease) where this process is to run it; ("done", metrics);
    ("failed", holder) where another process of this run failed it;
    ("held", holder) where another process runs it.
  """
  if (metrics := read_metrics(workdir)) is not None:
    return "done", metrics
  storage.path(workdir).mkdir(parents=True, exist_ok=True)
  path = f"{workdir}/{CLAIM}"
  def this_run(held, age):
    return held.get("failed") and age < time.monotonic() - since
  over = None
  if (seen := lease_lib.look(path)) is not None and seen[0].get("failed"):
    if this_run(*seen):
      return "failed", _holder(path, seen[0])
    over = seen[0].get("owner")
  try:
    held = lease_lib.take(
        path, over=over, heartbeat_seconds=timing.heartbeat,
        stale_seconds=timing.stale, taken_says="the trial it runs goes on "
        "(the trial's own lease.json lets one trainer train).")
  except lease_lib.WorkdirBusyError as e:
    failed = this_run(e.held, e.age or 0.0)
    return ("failed" if failed else "held"), _holder(path, e.held)
  # Finished and released in the moment between the look and the claim.
  if (metrics := read_metrics(workdir)) is not None:
    held.release()
    return "done", metrics
  return "run", held


def _runner(parallel: int, devices: device_groups.DeviceGroups | None):
  """The function that runs one trial's `run_trial` arguments: pinned to a
  free device group, or with 1/parallel of an accelerator's memory."""
  if devices is None:
    if parallel == 1:
      return lambda trial_args: run_trial(*trial_args)
    env = ({} if "XLA_PYTHON_CLIENT_MEM_FRACTION" in os.environ else
           {"XLA_PYTHON_CLIENT_MEM_FRACTION": f"{0.9 / parallel:.3f}"})
    return lambda trial_args: run_trial(*trial_args, env=env, live=False)
  free = queue.SimpleQueue()
  for group in range(len(devices.groups)):
    free.put(group)
  def run(trial_args):
    group = free.get()
    try:
      return run_trial(*trial_args, env=devices.env(group),
                       live=None if parallel == 1 else False,
                       devices=devices.label(group))
    finally:
      free.put(group)
  return run


def _run_all(todo, parallel: int, status: dict, metrics: dict,
             devices: device_groups.DeviceGroups | None = None,
             timing: Timing = Timing(), starting=lambda name: None) -> None:
  """Runs the trials of `todo` [(name, run_trial args)] that no other
  process of the command has claimed, `parallel` at once, filling `status`
  and `metrics` for every one; returns when each is done or failed.

  Without `devices` every trial sees every device, with 1/parallel of an
  accelerator's memory. With them a trial takes a free group from a queue,
  is pinned to it, and puts it back when it ends: one trial per group at any
  time, whatever `parallel` is (more than the groups would only wait).

  Each trial is claimed (`claim`) before it runs; the claim is released
  when it ends ok, and when it fails it is left in place, marked failed,
  so that the other processes of this run report the failure rather than
  run the trial again (a later run retries it). A trial held elsewhere is
  looked at again every `timing.poll` seconds, while this process has
  nothing else to run, until it is done, failed or its claim goes stale
  (then it is taken over here). `starting(name)` is called as this process
  starts a trial.
  """
  run = _runner(parallel, devices)
  def start(name, trial_args):
    starting(name)
    return run(trial_args)
  since = time.monotonic()
  by_name, pending = dict(todo), dict(todo)
  running, said = {}, None
  prefix = {name: trial_args[3] for name, trial_args in todo}
  try:
    with concurrent.futures.ThreadPoolExecutor(parallel) as pool:
      while pending or running:
        held = {}
        for name in list(pending):
          if len(running) == parallel:
            break
          workdir = pending[name][1]
          kind, got = claim(workdir, timing, since)
          if kind == "held":
            held[name] = got
            continue
          trial_args = pending.pop(name)
          if kind == "run":
            running[pool.submit(start, name, trial_args)] = (name, got)
          elif kind == "done":
            status[name], metrics[name] = "done", got
            print(f"{prefix[name]}: done by another process of the command")
          else:
            status[name], metrics[name] = "failed", None
            print(f"{prefix[name]}: FAILED in {got}; not run again here (a "
                  f"rerun of the command retries it; its log: "
                  f"{workdir}/sweep.log)")
        if not running:
          if held:
            line = (f"waiting for {len(held)} trial(s) other processes of "
                    "the command run: " + ", ".join(
                        f"{n} ({h})" for n, h in held.items())
                    + f"; looking again every {timing.poll:g} s")
            if line != said:
              print(line, flush=True)
              said = line
            time.sleep(timing.poll)
          continue
        ended, _ = concurrent.futures.wait(
            running, timeout=timing.poll if pending else None,
            return_when=concurrent.futures.FIRST_COMPLETED)
        for future in ended:
          name, held_claim = running[future]
          outcome = future.result()
          del running[future]
          if outcome[0] == "failed" and held_claim.lost:
            # Another process took the trial over (this one's claim went
            # stale while it stalled): the trial is theirs to settle.
            held_claim.release()
            pending[name] = by_name[name]
            print(f"{prefix[name]}: its claim was taken over by another "
                  "process of the command, which runs it now")
            continue
          status[name], metrics[name] = outcome
          if status[name] == "failed":
            held_claim.note(failed=True)
          held_claim.release(keep=status[name] == "failed")
  finally:
    # Left here by an error or an interrupt, once the pool has waited for
    # the trials: theirs are given back, to be run or found done again.
    for _, held_claim in running.values():
      held_claim.release()


def results_table(trials: Mapping[str, Trial], status: Mapping[str, str],
                  metrics: Mapping[str, dict | None]) -> str:
  """Markdown: trial, status, the overrides that vary, every metric."""
  keys = list(dict.fromkeys(k for t in trials.values() for k in t))
  varied = [k for k in keys
            if len({repr(t.get(k)) for t in trials.values()}) > 1] or keys
  names = list(dict.fromkeys(k for m in metrics.values() for k in m or {}))
  def cell(v):
    text = f"{v:.4g}" if isinstance(v, float) else format_value(v)
    return "" if v is None else text.replace("|", r"\|")
  rows = [["trial", "status", *varied, *names]]
  rows += [[name, status[name], *(cell(t.get(k)) for k in varied),
            *(cell((metrics[name] or {}).get(k)) for k in names)]
           for name, t in trials.items()]
  lines = ["| " + " | ".join(r) + " |" for r in rows]
  lines.insert(1, "|" + "---|" * len(rows[0]))
  return "\n".join(lines)


def _parse(argv):
  p = argparse.ArgumentParser(prog="python -m albert_jax.tools.sweep",
                              description=__doc__.split("\n")[0])
  add = p.add_argument
  add("sweep", help="experiments/file.py[:arg]")
  add("--workdir_root", required=True, help="Trials run in WORKDIR_ROOT/NAME.")
  add("--config", help="Base config; replaces the sweep file's CONFIG.")
  add("--print_commands", action="store_true", help="Print one command per "
      "trial (done ones, under a local root, commented out); run nothing.")
  add("--launcher", choices=("local", "tpu"), default="local", help="With "
      "--print_commands: tpu runs each on all workers via tpu_setup.sh.")
  add("--results_only", action="store_true", help="Only write results.md.")
  add("--main_module", default="albert_jax.main", help="Module run per trial, "
      "or a script path ending in .py.")
  add("--parallel", type=int, help="Trials run at once (one process each; "
      "default 1, or with --devices_per_trial one per device group; without "
      "it each gets 1/N of an accelerator's memory, through "
      "XLA_PYTHON_CLIENT_MEM_FRACTION unless that is set).")
  device_groups.add_flags(p)
  split = argv.index("--") if "--" in argv else len(argv)
  return p.parse_args(argv[:split]), argv[split + 1:]


def launch_command(main_module: str, python: str = sys.executable
                   ) -> list[str]:
  """The command that runs one trial, before its arguments: `python -m
  MODULE`, or `python SCRIPT.py`."""
  return [python, *([] if main_module.endswith(".py") else ["-m"]),
          main_module]


def run_trials(trials: Mapping[str, tuple[str, Trial]], root: str, *,
               extra: Iterable[str] = (), parallel: int = 1,
               main_module: str = "albert_jax.main",
               print_commands: bool = False, launcher: str = "local",
               results_only: bool = False,
               devices: device_groups.DeviceGroups | None = None,
               timing: Timing | None = None
               ) -> tuple[dict[str, str], dict[str, dict | None]]:
  """Runs every trial that is not done, `parallel` at a time, each claimed
  first (`claim`), so that the same command run by several processes on
  one root (the workers of a TPU slice) runs each trial once; returns when
  every trial is done or failed, whichever process ran it.

  Args:
    trials: name → (base config spec, overrides); each runs in ROOT/NAME
      with `extra` arguments after its own.
    root: the trials' parent directory (local or gs://).
    devices: the host's device groups (`device_groups.plan`): each running
      trial pinned to one of its own; None: every trial sees every device.
    print_commands, launcher: print one command per trial (done ones
      commented out) and run nothing.
    results_only: run nothing; read what is done.
    timing: the claims' clocks (`Timing`'s defaults where None).

  Returns:
    (status, metrics): per trial "done" (skipped, or run by another
    process), "ok", "failed" (here, or by another process of this run) or
    "missing" (not run), and its final_metrics.json (None where none).

  Raises:
    SweepError: a damaged final_metrics.json, done trials whose recorded
      arguments differ from these (`other_arguments`), or trials to run
      unpinned on a worker of a multi-host TPU slice
      (`device_groups.refuse_a_slice`).
  """
  python = "python" if print_commands else sys.executable
  launch = launch_command(main_module, python)
  extra = list(extra)
  status, metrics, todo, differ, said = {}, {}, [], [], []
  for i, (name, (config, trial)) in enumerate(trials.items(), 1):
    workdir, prefix = f"{root}/{name}", f"[{i}/{len(trials)}] {name}"
    # Printing commands need not reach gs://.
    remote = print_commands and storage.is_remote(root)
    metrics[name] = None if remote else read_metrics(workdir)
    status[name] = "missing" if metrics[name] is None else "done"
    cmd = _main_args(config, workdir, trial, extra)
    if status[name] == "done" and (why := other_arguments(workdir, cmd)):
      differ.append(f"{workdir} ({why})")
    if print_commands:
      line = shlex.join(launch + cmd) if launcher == "local" else (
          "bash tpu_setup.sh run --name=$TPU_NAME --zone=$ZONE -- "
          + shlex.join(cmd))
      said.append(f"# {name}: done" if status[name] == "done" else line)
    elif results_only:
      continue
    elif status[name] == "done":
      said.append(f"{prefix}: done, skipped")
    else:
      log = (epath.Path("sweep_logs", name + ".log")
             if storage.is_remote(root) else epath.Path(workdir, "sweep.log"))
      todo.append((name, (launch + cmd, workdir, log, prefix)))
  if differ:
    raise SweepError(
        f"{len(differ)} done trial(s) ran with other arguments than this "
        f"sweep gives them: {differ[0]}"
        + (f" and {len(differ) - 1} more" if len(differ) > 1 else "")
        + ". Rerun with the arguments they ran with, or give another "
        "--workdir_root, so that one table does not mix two setups.")
  for line in said:
    print(line)
  if print_commands:
    return status, metrics
  if todo and devices is None:
    try:
      device_groups.refuse_a_slice()
    except device_groups.DeviceGroupError as e:
      raise SweepError(str(e)) from None
  recorded = {name: (workdir, _recorded_args(cmd[len(launch):]))
              for name, (cmd, workdir, _, _) in todo}
  def starting(name):
    workdir, args = recorded[name]
    storage.write_atomic(storage.path(workdir) / ARGS_FILE, json.dumps(args))
  _run_all(todo, parallel, status, metrics, devices, timing or Timing(),
           starting)
  return status, metrics


def main(argv: list[str] | None = None) -> int:
  args, extra = _parse(sys.argv[1:] if argv is None else argv)
  if args.parallel is not None and args.parallel < 1:
    print(f"sweep: --parallel={args.parallel}; give 1 (one trial after "
          "another) or more.", file=sys.stderr)
    return 2
  parallel, devices = args.parallel or 1, None
  if not args.results_only:  # which runs nothing: no devices to split
    try:
      parallel, devices = device_groups.plan(
          args.devices_per_trial, args.parallel, args.platform,
          args.num_devices, print_commands=args.print_commands)
    except device_groups.DeviceGroupError as e:
      print(f"sweep: {e}", file=sys.stderr)
      return 2
  root = os.fspath(storage.path(args.workdir_root.rstrip("/") or "/"))
  try:
    config, trials = load_sweep(args.sweep, args.config)
    validate(config, trials, [a[len("--config."):].split("=", 1)[0]
                              for a in extra if a.startswith("--config.")])
    status, metrics = run_trials(
        {name: (config, trial) for name, trial in trials.items()}, root,
        extra=extra, parallel=parallel, main_module=args.main_module,
        print_commands=args.print_commands, launcher=args.launcher,
        results_only=args.results_only, devices=devices)
  except SweepError as e:
    print(f"sweep: {e}", file=sys.stderr)
    return 2
  if args.print_commands:
    return 0
  table = results_table(trials, status, metrics)
  print("\n" + table)
  storage.path(root).mkdir(parents=True, exist_ok=True)
  storage.write_atomic(
      storage.path(root) / "results.md",
      f"# Sweep `{args.sweep}`\n\nBase config `{config}`, workdirs under "
      f"`{root}/`.\n\n{table}\n")
  if failed := [n for n, s in status.items() if s == "failed"]:
    print(f"\n{len(failed)} of {len(trials)} trials failed:", ", ".join(failed))
  return 1 if failed else 0


if __name__ == "__main__":
  sys.exit(main())
