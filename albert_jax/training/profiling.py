"""`config.profile`: a `jax.profiler` trace of chosen training steps, and
their step breakdown.

The trace goes to WORKDIR/profile/plugins/profile/<time>/<host>.xplane.pb,
where TensorBoard's profile plugin (`tensorboard --logdir WORKDIR/profile`)
and Perfetto (via the plugin's trace viewer, or `xprof`) read it. A gs://
workdir's trace is recorded locally and then copied up. Once the profiled
steps have run, `albert_jax.training.step_breakdown` reads the trace with the
train step's HLO and writes profile/summary.md (on other hosts
summary.host<N>.md), also printed: milliseconds per step by component and
phase, the wall time shared among them, and the slowest ops or kernels.

Steps are numbered as the logs number them (the state's step once a step has
run: the first step of a fresh run is step 1). The device queue is drained
before and after the profiled steps, so their measured wall time is theirs
alone.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import pathlib
import shutil
import sys
import tempfile
import time
from typing import Any, Callable, Mapping

import jax

from albert_jax import storage
from albert_jax.training import step_breakdown

log = logging.getLogger(__name__)

PROFILE_DIR = "profile"
# Steps a session runs before the default first profiled step: the first
# compiles the step, the second may still wait on the first's buffers.
SKIP_STEPS = 2


@dataclasses.dataclass(frozen=True)
class ProfileOptions:
  """`config.profile`.

  Attributes:
    num_steps: steps per profile; 0: no profiling.
    start_step: the first profiled step; -1: the session's third step, past
      the compilation of the first.
    period: > 0: profile `num_steps` steps again every `period` steps.
    hosts: the process indices that trace; (): every host.
  """
  num_steps: int = 0
  start_step: int = -1
  period: int = 0
  hosts: tuple[int, ...] = (0,)

  @classmethod
  def from_config(cls, section: Mapping[str, Any] | None) -> ProfileOptions:
    """The options of a `config.profile` section (None: no profiling)."""
    if section is None:
      return cls()
    names = {f.name for f in dataclasses.fields(cls)}
    values = {k: v for k, v in dict(section).items() if k in names}
    if "hosts" in values:
      values["hosts"] = tuple(values["hosts"])
    return cls(**values)


def problems(section: Mapping[str, Any]) -> list[str]:
  """One line per `config.profile` value that cannot run (for
  `config_check`)."""
  out = []
  values = {**dataclasses.asdict(ProfileOptions()), **dict(section)}
  num, start = values["num_steps"], values["start_step"]
  period, hosts = values["period"], values["hosts"]
  whole = lambda v: isinstance(v, int) and not isinstance(v, bool)
  if not whole(num) or num < 0:
    out.append(f"config.profile.num_steps={num!r} must be a whole number "
               ">= 0 (0: no profiling), e.g. --config.profile.num_steps=5")
  if not whole(start) or (start < 1 and start != -1):
    out.append(f"config.profile.start_step={start!r} must be a step >= 1, "
               "or -1 for the third step after the run (re)starts, e.g. "
               "--config.profile.start_step=100")
  if not whole(period) or period < 0:
    out.append(f"config.profile.period={period!r} must be a whole number "
               ">= 0 (0: profile once), e.g. --config.profile.period=1000")
  elif whole(num) and 0 < period <= num:
    out.append(f"config.profile.period={period} must exceed "
               f"config.profile.num_steps={num} (the profiles would "
               "overlap), e.g. --config.profile.period=1000")
  if not isinstance(hosts, (tuple, list)) or not all(
      whole(h) and h >= 0 for h in hosts):
    out.append(f"config.profile.hosts={hosts!r} must be a tuple of process "
               "indices, () for every host, e.g. "
               "--config.profile.hosts='(0,)'")
  return out


def tracer_problem() -> str | None:
  """Why starting a trace here would end the process, or None.

  Where libtpu's PJRT plugin is loaded but the backend is not a TPU, the
  profiler calls the plugin's tracer, whose API does not match this
  jaxlib's (libtpu 0.0.52 with jax 0.10.2: "Unexpected PLUGIN_Profiler_Api
  size", then a segmentation fault). jax loads the plugin on a host with
  libtpu installed and no TPU unless JAX_PLATFORMS leaves TPUs out, and a
  compile for a TPU topology (`--compile_only --topology=v5e:...`) loads it
  in its own process whatever JAX_PLATFORMS says.
  """
  from jax._src.lib import xla_client  # pylint: disable=g-import-not-at-top
  backend = jax.default_backend()
  if backend == "tpu" or not xla_client.pjrt_plugin_loaded("tpu"):
    return None
  platforms = jax.config.jax_platforms or ""
  if not platforms or "tpu" in platforms.split(","):
    return (f"config.profile needs JAX_PLATFORMS={backend} on this {backend} "
            "host: libtpu is installed, and jax.profiler crashes the process "
            "calling its TPU plugin where there is no TPU; rerun as "
            f"JAX_PLATFORMS={backend} python -m albert_jax.main ...")
  return ("config.profile: this process loaded libtpu's plugin (a compile "
          "for a TPU topology) and runs on " + backend + ", where "
          "jax.profiler would crash in the plugin's tracer; profile in a "
          "process of its own.")


def check_can_trace(options: ProfileOptions) -> None:
  """Raises ValueError (one line, with the fix) if this host is to trace
  and `tracer_problem` says it cannot; called at a run's start."""
  if options.num_steps > 0 and (not options.hosts
                                or jax.process_index() in options.hosts):
    problem = tracer_problem()
    if problem:
      raise ValueError(problem)


class StepProfiler:
  """Traces the steps `ProfileOptions` chooses and summarises them.

  The loop calls `before(step)` before running step `step` and
  `after(step, state, batch)` once it has; `lower(state, batch)` gives the
  train step's `jax.stages.Lowered` (its compiled HLO names the trace's
  events; None: the trace is written without a breakdown).
  """

  def __init__(self, options: ProfileOptions, workdir: str, *,
               session_start: int, lower: Callable | None,
               out=sys.stdout):
    self.options, self.lower, self.out = options, lower, out
    self.root = storage.path(workdir) / PROFILE_DIR
    self.remote = storage.is_remote(workdir)
    host = jax.process_index()
    self.enabled = options.num_steps > 0 and (
        not options.hosts or host in options.hosts)
    if self.enabled:
      check_can_trace(options)
    self.summary_name = ("summary.md" if host == 0
                         else f"summary.host{host}.md")
    self.first = (options.start_step if options.start_step > 0
                  else session_start + SKIP_STEPS + 1)
    self.active: tuple[int, float, str] | None = None  # (last, t0, dir)
    self.summaries: list[str] = []

  def starts_at(self, step: int) -> bool:
    """Whether a profile starts at step `step`."""
    if not self.enabled or step < self.first:
      return False
    offset = step - self.first
    return offset == 0 or (self.options.period > 0
                           and offset % self.options.period == 0)

  def before(self, step: int, state) -> None:
    """Starts the trace if a profile starts at step `step`."""
    if self.active is not None or not self.starts_at(step):
      return
    jax.block_until_ready(state)  # earlier steps stay out of the trace
    trace_dir = (tempfile.mkdtemp(prefix="albert_profile_") if self.remote
                 else os.fspath(self.root))
    os.makedirs(trace_dir, exist_ok=True)
    jax.profiler.start_trace(trace_dir)
    last = step + self.options.num_steps - 1
    log.info("Profiling steps %d-%d into %s.", step, last, self.root)
    self.active = (last, time.perf_counter(), trace_dir)

  def after(self, step: int, state, batch, final: bool = False) -> bool:
    """Stops and summarises the trace once its last step (or the run's,
    `final`) has run; whether it did."""
    if self.active is None or (step < self.active[0] and not final):
      return False
    last, t0, trace_dir = self.active
    self.active = None
    jax.block_until_ready(state)
    wall_ms = (time.perf_counter() - t0) * 1e3
    jax.profiler.stop_trace()
    first = last - self.options.num_steps + 1
    steps = step - first + 1
    try:
      self._summarise(trace_dir, first, steps, wall_ms / steps, state, batch)
    finally:
      if self.remote:
        shutil.rmtree(trace_dir, ignore_errors=True)
    return True

  def abandon(self) -> None:
    """On an error: stops a trace in progress, keeping what it recorded."""
    if self.active is not None:
      self.active = None
      try:
        jax.profiler.stop_trace()
      except RuntimeError as e:
        log.warning("The profile in progress could not be stopped: %s", e)

  def _summarise(self, trace_dir: str, first: int, steps: int,
                 wall_ms: float, state, batch) -> None:
    """The breakdown of the trace just written; copies a gs:// workdir's
    trace up."""
    newest = step_breakdown.newest_trace(trace_dir)
    if self.remote:
      relative = os.path.relpath(newest, trace_dir)
      storage.write_atomic(self.root / relative,
                           pathlib.Path(newest).read_bytes())
    title = f"training steps {first}-{first + steps - 1}"
    if self.lower is None:
      log.warning("Profiled %s: the trace is in %s; no breakdown (the train "
                  "step's HLO is not available).", title, self.root)
      return
    hlo_text = self.lower(state, batch).compile().as_text()
    storage.write_atomic(self.root / "step.hlo.txt", hlo_text)
    try:
      result = step_breakdown.breakdown(newest, hlo_text, steps,
                                        wall_ms=wall_ms)
    except ValueError as e:  # no XLA events in it
      log.warning("Profiled %s into %s, but no breakdown: %s", title,
                  self.root, e)
      return
    path = step_breakdown.write_summary(result, os.fspath(self.root), title,
                                        name=self.summary_name)
    self.summaries.append(path)
    print("\n" + step_breakdown.to_markdown(result, title), file=self.out,
          flush=True)
    log.info("Profile of %s: trace and %s in %s.", title, self.summary_name,
             self.root)
