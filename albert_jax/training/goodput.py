"""Where a run's wall time went: goodput, badput by cause, slow steps and
data stalls.

`Account` books every second of a training session to exactly one cause,
so the causes add up to the session's wall time:

  startup        from `run()` to the first step: restoring or creating the
                 state, the tokenizer and data checks, building the loaders.
  compile        the session's first step (tracing and compiling it; it
                 counts among the lost steps if it is one, not its time).
  productive     the steps that moved the run past any step reached before.
  data_wait      waiting on the loader for the next batch.
  checkpoint     saving, for as long as the save held up training (an
                 asynchronous save only blocks while it copies the state).
  evaluation     periodic and final evaluation.
  lost_progress  steps run again after a restart: from the checkpoint the
                 run resumed from up to the step an earlier session had
                 reached before it was killed or preempted.
  profiling      draining the device around profiled steps, writing the
                 trace and its breakdown (`config.profile`).
  idle           the rest: logging, the stop and lease checks, shutdown.

Goodput is the productive share. With asynchronous dispatch the host waits
on the device inside a step's time, so step time is the device's pace;
a data wait shorter than a step partly overlaps the device's work on the
step before, and so overstates the stall a little.

Each session is one entry of WORKDIR/goodput.json, rewritten after every
step in a local workdir (an atomic rename, well under a millisecond) and at
each logging step on Cloud Storage, so a killed session's entry is as
recent as that; the sessions of one workdir add up. A session that runs no
step (a rerun of a finished run) is left out: it trained nothing, and a
finished run's record stays as it was. A step whose time is
`slow_step_factor` times the median of the steps before it is counted as
slow and listed by number; a data wait above `data_stall_share` of the
steps' time is logged once, with the fix.
"""

from __future__ import annotations

import collections
import dataclasses
import datetime
import json
import logging
import os
import statistics
import time
from typing import Any, Callable, Mapping

from albert_jax import storage

log = logging.getLogger(__name__)

GOODPUT_FILE = "goodput.json"
CAUSES = ("startup", "compile", "productive", "data_wait", "checkpoint",
          "evaluation", "lost_progress", "profiling", "idle")
BADPUT = tuple(c for c in CAUSES if c != "productive")
MAX_LISTED_SLOW_STEPS = 20
# Steps the median needs before a step can be called slow.
_MIN_STEPS_FOR_MEDIAN = 5
_MEDIAN_WINDOW = 200


@dataclasses.dataclass(frozen=True)
class GoodputOptions:
  """`config.goodput`.

  Attributes:
    data_stall_share: warn (once) when the data wait exceeds this share of
      the time of the steps since the last log line.
    slow_step_factor: a step this many times slower than the median of the
      steps before it is counted as slow.
  """
  data_stall_share: float = 0.1
  slow_step_factor: float = 3.0

  @classmethod
  def from_config(cls, section: Mapping[str, Any] | None) -> GoodputOptions:
    """The options of a `config.goodput` section (None: the defaults)."""
    if section is None:
      return cls()
    names = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: v for k, v in dict(section).items() if k in names})


def _now_iso() -> str:
  return datetime.datetime.now(datetime.timezone.utc).isoformat(
      timespec="seconds")


class Account:
  """One session's wall time, booked cause by cause (see the module
  docstring), and the workdir's earlier sessions read from goodput.json.

  Time is booked in consecutive slices: `book(cause)` gives the time since
  the previous call (or `started_at`) to `cause`, so nothing is counted
  twice or left out.
  """

  def __init__(self, workdir: str, options: GoodputOptions, *,
               start_step: int, started_at: float | None = None,
               enabled: bool = True, clock: Callable[[], float] = time.time):
    self.options, self.clock, self.enabled = options, clock, enabled
    self.path = storage.path(workdir) / GOODPUT_FILE
    self.remote = storage.is_remote(workdir)
    now = clock()
    self.mark = now if started_at is None else min(started_at, now)
    self.seconds = collections.Counter({c: 0.0 for c in CAUSES})
    self.earlier = self._read() if enabled else []
    # The furthest step any earlier session reached: steps up to it are
    # being run again.
    self.reached_before = max((s.get("reached", 0) for s in self.earlier),
                              default=0)
    self.session = {"started": _now_iso(), "pid": os.getpid(),
                    "start_step": start_step, "reached": start_step}
    self.step_times: collections.deque[float] = collections.deque(
        maxlen=_MEDIAN_WINDOW)
    self.slow_steps: list[int] = []
    self.slow_count = 0
    self.lost_steps = 0
    self.first_step_done = False
    self.ran_a_step = False
    self.window = collections.Counter()  # data wait and step time since the
    self.stall_warned = False            # last `check_data_stall`

  def _read(self) -> list[dict[str, Any]]:
    """The earlier sessions' entries; a damaged file is set aside (renamed
    with a note), never silently overwritten."""
    if not self.path.exists():
      return []
    text = self.path.read_text(encoding="utf-8")
    try:
      sessions = json.loads(text)["sessions"]
      if not isinstance(sessions, list) or not all(
          isinstance(s, dict) and isinstance(s.get("seconds"), dict)
          for s in sessions):
        raise TypeError("sessions is not a list of session entries")
    except (ValueError, KeyError, TypeError) as e:
      aside = self.path.parent / f"{GOODPUT_FILE}.damaged"
      storage.write_atomic(aside, text)
      log.warning("%s is damaged (%s); kept as %s, and goodput counts this "
                  "run's sessions from here on.", self.path, e, aside.name)
      return []
    return sessions

  def book(self, cause: str) -> float:
    """Books the time since the last call to `cause`; returns it."""
    now = self.clock()
    seconds = max(now - self.mark, 0.0)
    self.seconds[cause] += seconds
    self.mark = now
    return seconds

  def data_waited(self) -> None:
    """The loader has just handed out a batch."""
    seconds = self.book("data_wait")
    if self.first_step_done:  # the first batch also waits for the loader
      self.window["data_wait"] += seconds  # to start: no stall

  def step_done(self, done: int) -> None:
    """Step `done` (1-based) has been run and checked: books it as compile
    (the session's first), lost progress (a step an earlier session had
    reached) or productive, and counts it slow if it was."""
    self.ran_a_step = True
    redone = done <= self.reached_before
    self.lost_steps += redone
    if not self.first_step_done:  # compiled whether redone or not
      self.first_step_done = True
      self.book("compile")
    elif redone:
      self._timed(done, self.book("lost_progress"))
    else:
      self._timed(done, self.book("productive"))
    self.session["reached"] = max(self.session["reached"], done)
    if not self.remote:
      self.save()

  def _timed(self, done: int, seconds: float) -> None:
    self.window["steps"] += seconds
    if len(self.step_times) >= _MIN_STEPS_FOR_MEDIAN:
      median = statistics.median(self.step_times)
      if seconds > self.options.slow_step_factor * median:
        self.slow_count += 1
        if len(self.slow_steps) < MAX_LISTED_SLOW_STEPS:
          self.slow_steps.append(done)
        log.info("Step %d took %.3f s, %.1f× the median step (%.3f s).",
                 done, seconds, seconds / max(median, 1e-12), median)
    self.step_times.append(seconds)

  def check_data_stall(self, data_hint: str) -> None:
    """Warns once if the data wait since the last call exceeded the set
    share of the steps' time; `data_hint` names the run's loader settings."""
    wait, steps = self.window["data_wait"], self.window["steps"]
    self.window.clear()
    if self.stall_warned or wait + steps <= 0:
      return
    share = wait / (wait + steps)
    if share > self.options.data_stall_share:
      self.stall_warned = True
      log.warning(
          "Data stall: the steps waited on the loader for %.0f%% of their "
          "time (over %.0f%%, config.goodput.data_stall_share). The device "
          "is starved: %sprepare the data offline (python -m "
          "albert_jax.data.prepare) instead of on the fly, or read it from a "
          "faster disk or a bucket in the accelerators' region.",
          100 * share, 100 * self.options.data_stall_share, data_hint)

  def entry(self) -> dict[str, Any]:
    """This session's goodput.json entry."""
    return {**self.session, "updated": _now_iso(),
            "seconds": {c: round(self.seconds[c], 6) for c in CAUSES},
            "lost_steps": self.lost_steps, "slow_steps": list(self.slow_steps),
            "slow_step_count": self.slow_count}

  def save(self) -> None:
    """Rewrites goodput.json with the earlier sessions and this one."""
    if self.enabled and self.ran_a_step:
      storage.write_atomic(self.path, json.dumps(
          {"sessions": self._sessions()}, indent=1))

  def _sessions(self) -> list[dict[str, Any]]:
    return self.earlier + ([self.entry()] if self.ran_a_step else [])

  def summary(self) -> dict[str, Any]:
    """All sessions of the workdir so far, this one included: total wall
    seconds, seconds and % by cause, goodput %, slow and lost steps."""
    sessions = self._sessions()
    seconds = {c: sum(float(s["seconds"].get(c, 0.0)) for s in sessions)
               for c in CAUSES}
    wall = sum(seconds.values())
    percent = {c: 100 * v / wall if wall > 0 else 0.0
               for c, v in seconds.items()}
    slow = [n for s in sessions for n in s.get("slow_steps", [])]
    return {"goodput_percent": percent["productive"], "wall_seconds": wall,
            "sessions": len(sessions), "seconds": seconds, "percent": percent,
            "lost_steps": sum(int(s.get("lost_steps", 0)) for s in sessions),
            "slow_step_count": sum(int(s.get("slow_step_count", 0))
                                   for s in sessions),
            "slow_steps": slow[:MAX_LISTED_SLOW_STEPS]}

  def scalars(self) -> dict[str, float]:
    """`summary` as TensorBoard / metrics.jsonl scalars."""
    s = self.summary()
    out = {"goodput/percent": s["goodput_percent"],
           "goodput/wall_seconds": s["wall_seconds"],
           "goodput/slow_steps": float(s["slow_step_count"]),
           "goodput/lost_steps": float(s["lost_steps"])}
    out.update({f"badput/{c}_percent": s["percent"][c] for c in BADPUT})
    return out
