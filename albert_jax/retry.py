"""Retries of Cloud Storage requests: exponential backoff, jitter, a deadline.

A storage outage (a restarted endpoint, a network partition, a burst of 503s
or 429s) should cost a run the outage and not the run. The requests the
project sends to `gs://` through Python go through `call` (or `acall`, its
coroutine twin): those of gcsfs, under `etils.epath` and so under every
`storage.path(...)` read, write, listing and rename of the project and of
orbax's own metadata files (`storage` registers a gcsfs subclass whose
single request method is wrapped: `gcsfs_retrying`); `storage.write_atomic`
's whole upload; and `storage.create_if_absent`'s google-cloud-storage
request. Tensorstore (orbax's arrays) retries by itself;
`tensorstore_retries` gives it settings that cover the same deadline.
ArrayRecord's reader (prepared shards) retries inside its google-cloud-cpp
client, which takes no settings from Python.

A failure is retried only when it is transient: a refused, reset or timed-out
connection, HTTP 408, 429 or 5xx, a lost resumable-upload session. A missing
object (404), a refused permission (401/403), a failed precondition (412)
or a bad request is raised at once.

The n-th retry waits `min(maximum, initial * multiplier**(n-1))`, less a
random share of up to `jitter` of it (so many clients do not retry in step),
and never past the deadline: the last try is made when the deadline comes.
The deadline counts from the first failure. Each retry logs a warning
naming the path and the error; when the deadline passes, one error line
names the path, how long it retried and the fix, and the
`StorageUnavailableError` raised carries the same text.

Settings, read at each call (so a process and its children agree), in
seconds: `ALBERT_JAX_STORAGE_RETRY_DEADLINE` (180: a 60 s outage with room
to spare; 0 turns retries off), `ALBERT_JAX_STORAGE_RETRY_INITIAL` (1),
`ALBERT_JAX_STORAGE_RETRY_MAX` (32).
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import os
import random
import threading
import time
from typing import Any, Awaitable, Callable, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")

ENV_DEADLINE = "ALBERT_JAX_STORAGE_RETRY_DEADLINE"
ENV_INITIAL = "ALBERT_JAX_STORAGE_RETRY_INITIAL"
ENV_MAXIMUM = "ALBERT_JAX_STORAGE_RETRY_MAX"

# HTTP statuses worth another try: request timeout, too many requests and
# server errors.
TRANSIENT_STATUS = frozenset([408, 429, *range(500, 600)])


class StorageUnavailableError(OSError):
  """Cloud Storage kept failing with transient errors until the retry
  deadline passed. The message names the path, how long it was retried,
  the last error and the fix."""


class UploadSessionLostError(ConnectionError):
  """A resumable upload's session was gone (404/410 on its upload URL) after
  part of the object had been sent: the whole object must be sent again,
  which only the caller holding all of it can do (`storage.write_atomic`
  does). Transient: retried by `call`."""


@dataclasses.dataclass(frozen=True)
class Policy:
  """How long and how often to retry.

  Attributes:
    deadline: seconds after the first failure past which no try is made;
      0 makes no retries.
    initial: seconds before the first retry.
    maximum: the longest wait between two tries.
    multiplier: each wait is this many times the one before (up to
      `maximum`).
    jitter: up to this share of each wait is taken off at random.
  """
  deadline: float = 180.0
  initial: float = 1.0
  maximum: float = 32.0
  multiplier: float = 2.0
  jitter: float = 0.5

  def __post_init__(self):
    if not (self.deadline >= 0 and self.initial > 0
            and self.maximum >= self.initial and self.multiplier >= 1
            and 0 <= self.jitter <= 1):
      raise ValueError(
          f"Bad storage retry settings {self}: the deadline must be >= 0, "
          "0 < initial <= maximum, multiplier >= 1 and 0 <= jitter <= 1. "
          f"Fix {ENV_DEADLINE}, {ENV_INITIAL} or {ENV_MAXIMUM}.")

  @classmethod
  def from_env(cls) -> Policy:
    """The policy `$ALBERT_JAX_STORAGE_RETRY_*` set, defaults elsewhere."""
    values = {}
    for name, field in ((ENV_DEADLINE, "deadline"), (ENV_INITIAL, "initial"),
                        (ENV_MAXIMUM, "maximum")):
      text = os.environ.get(name, "").strip()
      if not text:
        continue
      try:
        values[field] = float(text)
      except ValueError:
        raise ValueError(f"{name}={text!r} is not a number of seconds; set "
                         "it to one, or unset it for the default.") from None
    if "maximum" not in values and "initial" in values:
      values["maximum"] = max(cls.maximum, values["initial"])
    return cls(**values)

  def wait(self, retry: int) -> float:
    """The nominal wait before retry number `retry` (1, 2, …), before
    jitter."""
    return min(self.maximum, self.initial * self.multiplier ** (retry - 1))


def current() -> Policy:
  """The policy in force: `Policy.from_env()`."""
  return Policy.from_env()


def tensorstore_retries(policy: Policy | None = None) -> dict[str, Any]:
  """Tensorstore's `gcs_request_retries` context resource for `policy`.

  Tensorstore retries a failed request `max_retries` times with waits that
  double from `initial_delay` up to `max_delay` (its defaults: 32 tries,
  1 s, 32 s, about 15 minutes). The count here covers the deadline with
  this policy's waits, and is never below tensorstore's default: the
  project only raises a library's own retries.
  """
  policy = policy or current()
  total, count = 0.0, 0
  while total < policy.deadline:
    count += 1
    total += policy.wait(count)
  return {"max_retries": max(32, count),
          "initial_delay": f"{policy.initial}s",
          "max_delay": f"{policy.maximum}s"}


@functools.lru_cache(maxsize=None)
def _library_errors() -> dict[str, tuple[type, ...]]:
  """Error classes of the storage clients, by kind (those installed)."""
  kinds: dict[str, list[type]] = {"connection": [], "status": [],
                                  "never": []}
  try:
    import aiohttp  # pylint: disable=g-import-not-at-top
    kinds["connection"].append(aiohttp.ClientError)
    kinds["status"].append(aiohttp.ClientResponseError)
  except ImportError:
    pass
  try:
    import requests  # pylint: disable=g-import-not-at-top
    kinds["connection"] += [requests.exceptions.ConnectionError,
                            requests.exceptions.Timeout,
                            requests.exceptions.ChunkedEncodingError]
    kinds["status"].append(requests.exceptions.HTTPError)
  except ImportError:
    pass
  try:
    from google.auth import exceptions as auth  # pylint: disable=g-import-not-at-top
    kinds["connection"].append(auth.TransportError)
  except ImportError:
    pass
  try:
    from google.api_core import exceptions as api  # pylint: disable=g-import-not-at-top
    kinds["status"].append(api.GoogleAPICallError)
  except ImportError:
    pass
  try:
    from gcsfs import retry as gcsfs_retry  # pylint: disable=g-import-not-at-top
    kinds["status"].append(gcsfs_retry.HttpError)
    kinds["connection"].append(gcsfs_retry.ChecksumError)
  except ImportError:
    pass
  return {k: tuple(v) for k, v in kinds.items()}


def _status(error: BaseException) -> int | None:
  """The HTTP status an error reports, if any."""
  for attribute in ("status", "code", "status_code"):
    value = getattr(error, attribute, None)
    if isinstance(value, int):
      return value
  response = getattr(error, "response", None)
  value = getattr(response, "status_code", None)
  return value if isinstance(value, int) else None


def is_transient(error: BaseException) -> bool:
  """Whether `error` is worth another try: a refused, reset or timed-out
  connection, HTTP 408/429/5xx or a lost upload session; never a missing
  object, a refused permission, a failed precondition or a bad request,
  nor a request already retried to its deadline."""
  if isinstance(error, StorageUnavailableError):
    return False
  if isinstance(error, UploadSessionLostError):
    return True
  if isinstance(error, (FileNotFoundError, FileExistsError, PermissionError,
                        IsADirectoryError, NotADirectoryError, ValueError)):
    return False
  errors = _library_errors()
  if isinstance(error, errors["status"]):
    status = _status(error)
    if status is None:
      return False
    if status == 401:  # an expired token: gcsfs refreshes it and retries
      return "Invalid Credentials" in str(error)
    return status in TRANSIENT_STATUS
  if isinstance(error, (ConnectionError, TimeoutError)):
    return True
  if isinstance(error, errors["connection"]):
    return True
  # google-auth marks the refresh errors worth retrying (a metadata server
  # not answering), and not those of bad credentials.
  return bool(getattr(error, "retryable", False))


def brief(error: BaseException, limit: int = 300) -> str:
  """`error` in one line: its class and its text, cut short."""
  try:
    text = str(error)
  except Exception:  # pylint: disable=broad-except
    text = repr(error)  # aiohttp's, built without a request, cannot say
  text = " ".join(text.split()) or "(no message)"
  if len(text) > limit:
    text = text[:limit] + " …"
  return f"{type(error).__name__}: {text}"


class _Tries:
  """The retry schedule of one operation: `failed` says how long to wait
  before the next try, or raises once the deadline has passed."""

  def __init__(self, what: str, policy: Policy | None,
               clock: Callable[[], float], rand: Callable[[], float]):
    self.what, self.policy = what, policy or current()
    self.clock, self.rand = clock, rand
    self.first: float | None = None
    self.retries = 0

  def failed(self, error: BaseException) -> float | None:
    """The wait before the next try after `error`; None when it is not
    transient (the caller raises it as it is).

    Raises:
      StorageUnavailableError: the deadline has passed.
    """
    if not is_transient(error) or self.policy.deadline == 0:
      return None
    now = self.clock()
    if self.first is None:
      self.first = now
    elapsed = now - self.first
    remaining = self.policy.deadline - elapsed
    if remaining <= 0:
      message = (
          f"{self.what}: Cloud Storage kept failing for {elapsed:.0f} s "
          f"({self.retries + 1} tries; last error {brief(error)}). Check the "
          "network and that the bucket answers (gcloud storage ls "
          f"{_bucket(self.what)}), then run again (a training run resumes "
          f"from its last checkpoint); to ride out longer outages, set "
          f"{ENV_DEADLINE} to more seconds (now {self.policy.deadline:g}).")
      if _first_to_give_up(self.what):
        log.error("%s", message)
      raise StorageUnavailableError(message) from error
    self.retries += 1
    wait = self.policy.wait(self.retries)
    wait = min(wait * (1.0 - self.policy.jitter * self.rand()), remaining)
    log.warning("%s: %s; retry %d in %.1f s (retrying for %.0f s more at "
                "most).", self.what, brief(error), self.retries, wait,
                remaining)
    return wait


_GIVEN_UP: dict[str, float] = {}
_GIVEN_UP_LOCK = threading.Lock()
_GIVEN_UP_WINDOW = 5.0  # seconds


def _first_to_give_up(what: str) -> bool:
  """Whether no other request for `what` gave up in the last few seconds:
  one operation often sends several at once (gcsfs asks for an object and
  for a listing under its name together), and one error line says it."""
  now = time.monotonic()
  with _GIVEN_UP_LOCK:
    last = _GIVEN_UP.get(what)
    _GIVEN_UP[what] = now
    for key in [k for k, t in _GIVEN_UP.items()
                if now - t > _GIVEN_UP_WINDOW]:
      del _GIVEN_UP[key]
  return last is None or now - last > _GIVEN_UP_WINDOW


def _bucket(what: str) -> str:
  """gs://BUCKET of a description starting with a gs:// path, else a
  placeholder."""
  if what.startswith("gs://"):
    return "gs://" + what[len("gs://"):].split("/", 1)[0].split()[0]
  return "gs://BUCKET"


def call(fn: Callable[[], T], *, what: str, policy: Policy | None = None,
         clock: Callable[[], float] = time.monotonic,
         sleep: Callable[[float], Any] = time.sleep,
         rand: Callable[[], float] = random.random) -> T:
  """`fn()`, tried again after transient errors until `policy`'s deadline.

  Args:
    fn: the operation; it must be safe to repeat (a whole upload, a read).
    what: the path (or request) it touches, for the log lines.
    policy: the schedule; `current()` when None.
    clock, sleep, rand: time, waiting and jitter (for tests).

  Raises:
    StorageUnavailableError: transient errors until the deadline.
    Whatever `fn` raises that is not transient, at once.
  """
  tries = _Tries(what, policy, clock, rand)
  while True:
    try:
      return fn()
    except Exception as e:  # pylint: disable=broad-except
      wait = tries.failed(e)
      if wait is None:
        raise
      sleep(wait)


async def acall(fn: Callable[[], Awaitable[T]], *, what: str,
                policy: Policy | None = None,
                clock: Callable[[], float] = time.monotonic,
                sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
                rand: Callable[[], float] = random.random) -> T:
  """`call` for a coroutine: `await fn()`, retried the same way."""
  tries = _Tries(what, policy, clock, rand)
  while True:
    try:
      return await fn()
    except Exception as e:  # pylint: disable=broad-except
      wait = tries.failed(e)
      if wait is None:
        raise
      await sleep(wait)
