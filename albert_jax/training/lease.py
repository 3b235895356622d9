"""One owner per workdir: a lease file with a heartbeat.

Two runs started on one workdir would both train, and each one's checkpoint
retention would delete the other's checkpoints. The first run takes
WORKDIR/lease.json (created only if it does not exist) and refreshes its
heartbeat every `HEARTBEAT_SECONDS` from a background thread; a second run
refuses, naming the owner. A lease whose heartbeat is older than
`STALE_SECONDS`, or whose process on this host has ended (its run was
killed), is taken over, and
`--config.take_over_workdir=True` takes over a live one at once; the log
says which happened.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import socket
import threading
import time
import uuid

import jax

log = logging.getLogger(__name__)

LEASE = "lease.json"
HEARTBEAT_SECONDS = 30.0
STALE_SECONDS = 120.0


class WorkdirBusyError(RuntimeError):
  """Another run holds the workdir."""


@dataclasses.dataclass
class Lease:
  """A held lease; `release` (or leaving the `with` block) gives it back."""
  path: str
  owner: str
  stop: threading.Event
  thread: threading.Thread | None

  def __enter__(self) -> "Lease":
    return self

  def __exit__(self, *exc) -> None:
    self.release()

  @property
  def lost(self) -> bool:
    """Whether another run has taken the lease over since."""
    held = _read(self.path)
    return held is not None and held.get("owner") != self.owner

  def release(self) -> None:
    self.stop.set()
    if self.thread is not None:
      self.thread.join()
    if not self.lost:
      try:
        os.remove(self.path)
      except FileNotFoundError:
        pass


def _read(path: str) -> dict | None:
  try:
    with open(path, encoding="utf-8") as f:
      return json.load(f)
  except FileNotFoundError:
    return None
  except (OSError, ValueError):
    return {}  # being written, or damaged: treated as held, with no heartbeat


def _record(owner: str) -> dict:
  now = time.time()
  return {"owner": owner, "host": socket.gethostname(), "pid": os.getpid(),
          "started": now, "heartbeat": now}


def _create(path: str, record: dict) -> bool:
  """Writes `record` to `path` only if no file is there; whether it did."""
  try:
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
  except FileExistsError:
    return False
  with os.fdopen(fd, "w", encoding="utf-8") as f:
    json.dump(record, f)
  return True


def _replace(path: str, record: dict) -> None:
  tmp = f"{path}.{record['owner']}.tmp"
  with open(tmp, "w", encoding="utf-8") as f:
    json.dump(record, f)
  os.replace(tmp, path)


def _describe(held: dict, now: float) -> str:
  if not held:
    return "an unreadable lease"
  age = now - float(held.get("heartbeat", 0))
  return (f"pid {held.get('pid')} on {held.get('host')} (heartbeat "
          f"{age:.0f} s ago)")


def _process_gone(held: dict) -> bool:
  """Whether the lease's run was on this host and its process has ended
  (killed: a lease it could not release)."""
  if held.get("host") != socket.gethostname() or not held.get("pid"):
    return False
  try:
    os.kill(int(held["pid"]), 0)
  except ProcessLookupError:
    return True
  except (OSError, ValueError):
    return False
  return False


def _beat(path: str, record: dict, stop: threading.Event,
          interval: float) -> None:
  while not stop.wait(interval):
    held = _read(path)
    if held is not None and held.get("owner") != record["owner"]:
      log.error("The lease on %s was taken over by %s; this run no longer "
                "owns its workdir.", os.path.dirname(path),
                _describe(held, time.time()))
      return
    _replace(path, {**record, "heartbeat": time.time()})


def acquire(workdir: str, take_over: bool = False, *,
            heartbeat_seconds: float = HEARTBEAT_SECONDS,
            stale_seconds: float = STALE_SECONDS) -> Lease:
  """Takes `workdir`'s lease (process 0 only; other processes get a lease
  that holds nothing, their run's process 0 owns the workdir).

  Raises:
    WorkdirBusyError: another run's lease is live, naming it and the fixes.
  """
  path = os.path.join(workdir, LEASE)
  owner = uuid.uuid4().hex
  stop = threading.Event()
  if jax.process_index() != 0:
    return Lease(path, owner, stop, None)
  record = _record(owner)
  if not _create(path, record):
    held = _read(path) or {}
    now = time.time()
    stale = now - float(held.get("heartbeat", 0)) > stale_seconds
    gone = _process_gone(held)
    if not (stale or gone or take_over):
      raise WorkdirBusyError(
          f"{workdir} is in use by another run: {_describe(held, now)}. Wait "
          "for it to end; if it was killed, its lease goes stale "
          f"{stale_seconds:.0f} s after its last heartbeat and is then taken "
          "over; to take it over now, rerun with "
          "--config.take_over_workdir=True.")
    log.warning("Taking over the lease on %s from %s: %s.", workdir,
                _describe(held, now),
                "its heartbeat is stale" if stale else
                "its process is gone" if gone else
                "--config.take_over_workdir=True")
    _replace(path, record)
  thread = threading.Thread(target=_beat, args=(path, record, stop,
                                                heartbeat_seconds),
                            name="workdir-lease", daemon=True)
  thread.start()
  return Lease(path, owner, stop, thread)
