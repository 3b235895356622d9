"""One owner per workdir: a lease file with a heartbeat.

Two runs started on one workdir would both train, and each one's checkpoint
retention would delete the other's checkpoints. The first run takes
WORKDIR/lease.json (created only if it does not exist: `O_EXCL` locally,
the precondition `ifGenerationMatch=0` on gs://) and refreshes its
heartbeat every `HEARTBEAT_SECONDS` from a background thread; a second run
refuses, naming the owner. A lease whose heartbeat is older than
`STALE_SECONDS`, or whose process on this host has ended (its run was
killed), is taken over, and
`--config.take_over_workdir=True` takes over a live one at once; the log
says which happened.

A heartbeat's age is the lease file's own age by the storage's clock
(`storage.age`: the filesystem's or Cloud Storage's modification times),
never the owner's recorded wall-clock time against the reader's: two
hosts whose clocks disagree by minutes would otherwise take over a live
run, or never take over a dead one. The recorded times are for people.

A takeover is itself exclusive: the taker first creates PATH.takeover
(created only if absent, as the lease), judges the lease again under it,
replaces it and deletes PATH.takeover. Of several runs that find one lease
stale at the same moment (hosts polling a dead host's lease), one takes it
over; the others find it live when they judge again.

`take` is the same lease for a process that must not start JAX (a sweep's
claim on a trial, albert_jax/tools/sweep.py, whose trials need the host's
chips): this module imports JAX only inside `acquire`.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import socket
import threading
import time
from typing import Callable
import uuid

from albert_jax import retry
from albert_jax import storage

log = logging.getLogger(__name__)

LEASE = "lease.json"
HEARTBEAT_SECONDS = 30.0
STALE_SECONDS = 120.0
# Beside a lease while a run takes it over (see the module docstring).
TAKEOVER = ".takeover"
# What the heartbeat of a taken-over workdir lease logs: `loop.fit` stops.
_TRAINER_TAKEN = "this run stops before its next step."


class WorkdirBusyError(RuntimeError):
  """Another run holds the workdir, or the lease file `take` was given.

  Attributes:
    held: the holder's record ({} where it is being written or unreadable).
    age: seconds since the holder's last heartbeat, by the storage's clock.
  """

  def __init__(self, message: str, held: dict | None = None,
               age: float | None = None):
    super().__init__(message)
    self.held = {} if held is None else held
    self.age = age


@dataclasses.dataclass
class Lease:
  """A held lease; `release` (or leaving the `with` block) gives it back.

  `taken` is set by the heartbeat when another run has taken the lease
  over; the training loop then stops without saving (`loop.fit`), so its
  checkpoint retention cannot delete the new owner's checkpoints. `record`
  is what the heartbeat writes (with its time), `lock` orders its writes
  with `note`'s.
  """
  path: str
  owner: str
  stop: threading.Event
  thread: threading.Thread | None
  taken: threading.Event = dataclasses.field(default_factory=threading.Event)
  record: dict = dataclasses.field(default_factory=dict)
  lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)
  clock: Callable[[], float] = time.time

  def __enter__(self) -> "Lease":
    return self

  def __exit__(self, *exc) -> None:
    self.release()

  @property
  def lost(self) -> bool:
    """Whether another run has taken the lease over since."""
    if self.thread is None:  # not process 0: process 0 holds the lease
      return self.taken.is_set()
    held = _read(self.path)
    return held is not None and held.get("owner") != self.owner

  def note(self, **fields) -> None:
    """Adds `fields` to the lease's record, written now and by every
    heartbeat after (a sweep's claim records its trial's failure so);
    nothing once another run has taken the lease over."""
    with self.lock:
      if self.thread is None or self.lost:
        return
      self.record.update(fields)
      _replace(self.path, {**self.record, "heartbeat": self.clock()})

  def release(self, keep: bool = False) -> None:
    """Stops the heartbeat and deletes the lease, or with `keep` leaves it
    as last written (a sweep's record of a failed trial), to be judged as
    any lease whose heartbeat has stopped."""
    self.stop.set()
    if self.thread is not None:
      self.thread.join()
    if self.thread is not None and not keep and not self.lost:
      storage.path(self.path).unlink(missing_ok=True)


def _read(path: str) -> dict | None:
  """The lease's record; {} while it is being written (created, not yet
  filled) or if it is damaged: held either way, until its file's own age
  makes it stale."""
  try:
    held = json.loads(storage.path(path).read_text(encoding="utf-8"))
  except FileNotFoundError:
    return None
  except retry.StorageUnavailableError:
    raise  # unreachable storage says nothing about who holds the lease
  except (OSError, ValueError):
    return {}
  return held if isinstance(held, dict) else {}


def _age(path: str) -> float | None:
  """Seconds since the lease was last written, by the storage's clock; None
  if it is gone."""
  try:
    return storage.age(path)
  except FileNotFoundError:
    return None


def _workdir(path: str) -> str:
  return os.fspath(storage.path(path).parent)


def _pid_namespace() -> str:
  """This process's pid namespace ("" where /proc does not say): hosts with
  one name can run containers whose pids mean different processes."""
  try:
    return os.readlink("/proc/self/ns/pid")
  except OSError:
    return ""


def _record(owner: str, clock) -> dict:
  now = clock()
  return {"owner": owner, "host": socket.gethostname(), "pid": os.getpid(),
          "pid_namespace": _pid_namespace(), "started": now, "heartbeat": now}


def _create(path: str, record: dict) -> bool:
  """Writes `record` to `path` only if no file is there; whether it did."""
  return storage.create_if_absent(path, json.dumps(record).encode("utf-8"))


def _replace(path: str, record: dict) -> None:
  storage.write_atomic(path, json.dumps(record))


def describe(held: dict, age: float | None) -> str:
  """"pid 12 on host-1 (heartbeat 3 s ago)": a lease's holder for people."""
  when = "" if age is None else f" (heartbeat {age:.0f} s ago)"
  if "pid" not in held:
    return f"a lease being written or unreadable{when}"
  return f"pid {held.get('pid')} on {held.get('host')}{when}"


def _process_gone(held: dict) -> bool:
  """Whether the lease's run was on this host and its process has ended
  (killed: a lease it could not release)."""
  if (held.get("host") != socket.gethostname() or not held.get("pid")
      or held.get("pid_namespace") != _pid_namespace()):
    return False
  try:
    os.kill(int(held["pid"]), 0)
  except ProcessLookupError:
    return True
  except (OSError, ValueError):
    return False
  return False


def _beat(lease: Lease, interval: float, taken_says: str) -> None:
  while not lease.stop.wait(interval):
    try:
      with lease.lock:
        held = _read(lease.path)
        if held is not None and held.get("owner") != lease.owner:
          log.error("The lease %s was taken over by %s; %s", lease.path,
                    describe(held, None), taken_says)
          lease.taken.set()
          return
        _replace(lease.path, {**lease.record, "heartbeat": lease.clock()})
    except retry.StorageUnavailableError:
      # Retried to its deadline and logged; the next beat tries again.
      log.warning("The heartbeat of the lease %s was not written; "
                  "trying again in %.0f s.", lease.path, interval)


def acquire(workdir: str, take_over: bool = False, *,
            heartbeat_seconds: float = HEARTBEAT_SECONDS,
            stale_seconds: float = STALE_SECONDS,
            clock=time.time) -> Lease:
  """Takes `workdir`'s lease. Process 0 holds it for the run; the others
  learn whether it did, so every process of a refused run raises (none is
  left waiting in a collective). `clock` gives the wall-clock times the
  lease records for people to read; staleness never depends on it.

  Raises:
    WorkdirBusyError: another run's lease is live, naming it and the fixes.
  """
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  path = os.fspath(storage.path(workdir) / LEASE)
  owner = uuid.uuid4().hex
  stop, error, lease = threading.Event(), None, None
  if jax.process_index() == 0:
    try:
      lease = _take(path, owner, stop, take_over, heartbeat_seconds,
                    stale_seconds, clock)
    except WorkdirBusyError as e:
      error = e
  if jax.process_count() > 1:
    from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
    busy = multihost_utils.broadcast_one_to_all(np.int32(error is not None))
    if int(busy) and error is None:
      error = WorkdirBusyError(
          f"{workdir} is in use by another run (process 0 could not take "
          "its lease; its log names the owner).")
  if error is not None:
    raise error
  return lease or Lease(path, owner, stop, None)


def look(path: str) -> tuple[dict, float] | None:
  """The lease at `path` without taking it: (its record, seconds since it
  was last written by the storage's clock), or None where there is none."""
  held, age = _read(path), _age(path)
  return None if held is None or age is None else (held, age)


def take(path: str, *, over: str | None = None,
         heartbeat_seconds: float = HEARTBEAT_SECONDS,
         stale_seconds: float = STALE_SECONDS, clock=time.time,
         taken_says: str = "this process no longer holds it.") -> Lease:
  """The lease file `path` for this process alone, heartbeat and all:
  `acquire`'s taking without JAX (which `acquire` asks which process of a
  run holds the lease), for a process that must not start it. A lease
  whose owner is `over` is taken over however live it looks (a sweep's
  record of an earlier run's failure); another owner's, as `acquire` does.
  `taken_says` ends the error the heartbeat logs if another run takes the
  lease over.

  Raises:
    WorkdirBusyError: another's lease is live; `held` and `age` name it.
  """
  return _take(os.fspath(path), uuid.uuid4().hex, threading.Event(), False,
               heartbeat_seconds, stale_seconds, clock, taken_says, over)


def _take(path: str, owner: str, stop: threading.Event, take_over: bool,
          heartbeat_seconds: float, stale_seconds: float, clock,
          taken_says: str = _TRAINER_TAKEN, over: str | None = None) -> Lease:
  """Process 0's side of `acquire`; `take`'s whole."""
  workdir = _workdir(path)
  record = _record(owner, clock)
  while not _create(path, record):
    held, age = _read(path), _age(path)
    if held is None or age is None:
      continue  # released meanwhile: try to create it again
    if held.get("owner") == owner:
      break  # ours: a retried create whose first answer was lost
    stale = age > stale_seconds
    gone = _process_gone(held)
    named = over is not None and held.get("owner") == over
    if not (stale or gone or take_over or named):
      damaged = ("" if "pid" in held else
                 f" If no run is using it and {path} stays unreadable, "
                 "delete that file.")
      raise WorkdirBusyError(
          f"{workdir} is in use by another run: {describe(held, age)}. Wait "
          "for it to end; if it was killed, its lease goes stale "
          f"{stale_seconds:.0f} s after its last heartbeat and is then taken "
          "over; to take it over now, rerun with "
          f"--config.take_over_workdir=True.{damaged}", held, age)
    if not _lock_takeover(path, owner, stale_seconds):
      raise WorkdirBusyError(
          f"{workdir} is being taken over by another run this moment (it "
          f"holds {path}{TAKEOVER}) from {describe(held, age)}; wait for "
          "that run.", held, age)
    try:
      now = _read(path)
      if now is None or now.get("owner") != held.get("owner"):
        continue  # released or taken over while judged: judge again
      log.warning("Taking over %s from %s: %s.", path, describe(held, age),
                  "its heartbeat is stale" if stale else
                  "its process is gone" if gone else
                  "its owner was named to be taken over" if named else
                  "--config.take_over_workdir=True")
      _replace(path, record)
    finally:
      storage.path(path + TAKEOVER).unlink(missing_ok=True)
    break
  lease = Lease(path, owner, stop, None, record=record, clock=clock)
  lease.thread = threading.Thread(
      target=_beat, args=(lease, heartbeat_seconds, taken_says),
      name="workdir-lease", daemon=True)
  lease.thread.start()
  return lease


def _lock_takeover(path: str, owner: str, stale_seconds: float) -> bool:
  """Creates PATH.takeover for `owner`; whether it holds it. One left by a
  run that died taking the lease over (older than `stale_seconds`) is
  removed first."""
  lock = path + TAKEOVER
  if _create(lock, {"owner": owner}):
    return True
  held, age = _read(lock), _age(lock)
  if held is not None and held.get("owner") == owner:
    return True  # ours: a retried create whose first answer was lost
  if age is not None and age <= stale_seconds:
    return False
  if age is not None:
    log.warning("Removing %s, left %.0f s ago by a run that died taking "
                "the lease over.", lock, age)
    storage.path(lock).unlink(missing_ok=True)
  return _create(lock, {"owner": owner})
