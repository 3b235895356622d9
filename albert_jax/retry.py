"""Retries of Cloud Storage requests: exponential backoff, jitter, a deadline.

A storage outage (a restarted endpoint, a network partition, a burst of 503s
or 429s) should cost a run the outage and not the run. The requests the
project sends to `gs://` through Python go through `call` (or `acall`, its
coroutine twin): those of gcsfs, under `etils.epath` and so under every
`storage.path(...)` read, write, listing and rename of the project and of
orbax's own metadata files (`RetryingGCSFileSystem` below, which `storage`
registers for gs:// in fsspec); `storage.write_atomic`'s whole upload; and
`storage.create_if_absent`'s google-cloud-storage request. Tensorstore (orbax's arrays) retries by itself;
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
import re
import threading
import time
from typing import Any, Awaitable, Callable, TypeVar
import urllib.parse

log = logging.getLogger(__name__)

T = TypeVar("T")

ENV_DEADLINE = "ALBERT_JAX_STORAGE_RETRY_DEADLINE"
ENV_INITIAL = "ALBERT_JAX_STORAGE_RETRY_INITIAL"
ENV_MAXIMUM = "ALBERT_JAX_STORAGE_RETRY_MAX"
ENV_TRY_TIMEOUT = "ALBERT_JAX_STORAGE_TRY_TIMEOUT"

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
    try_timeout: seconds one gcsfs request may take before it counts as
      failed (and is retried): a server that accepts a connection and never
      answers would otherwise hold each try for aiohttp's own 5 minutes,
      past the deadline. Generous, as one request can carry a 50 MB
      chunk of an upload. Set in the environment, it also bounds
      tensorstore's requests (`storage.bound_tensorstore_tries`).
  """
  deadline: float = 180.0
  initial: float = 1.0
  maximum: float = 32.0
  multiplier: float = 2.0
  jitter: float = 0.5
  try_timeout: float = 120.0

  def __post_init__(self):
    if not (self.deadline >= 0 and self.initial > 0
            and self.maximum >= self.initial and self.multiplier >= 1
            and 0 <= self.jitter <= 1 and self.try_timeout > 0):
      raise ValueError(
          f"Bad storage retry settings {self}: the deadline must be >= 0, "
          "0 < initial <= maximum, multiplier >= 1, 0 <= jitter <= 1 and "
          f"try_timeout > 0. Fix {ENV_DEADLINE}, {ENV_INITIAL}, "
          f"{ENV_MAXIMUM} or {ENV_TRY_TIMEOUT}.")

  @classmethod
  def from_env(cls) -> Policy:
    """The policy `$ALBERT_JAX_STORAGE_RETRY_*` set, defaults elsewhere."""
    values = {}
    for name, field in ((ENV_DEADLINE, "deadline"), (ENV_INITIAL, "initial"),
                        (ENV_MAXIMUM, "maximum"),
                        (ENV_TRY_TIMEOUT, "try_timeout")):
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


################################################################################
# gcsfs with these retries: what `etils.epath` reaches gs:// by.
################################################################################

# gcsfs retries a failed request 6 times (about 31 s of waits), a count bound
# when its class is defined, so a longer outage ended whatever was reading
# or writing: a checkpoint's metadata file in orbax's background thread, a
# metrics flush, the lease's heartbeat. `RetryingGCSFileSystem` is gcsfs's
# file system with its one request method (`_request`, under every read,
# write, listing, copy and delete) retried by `acall` instead.
#
# Two repeats need care:
# - A DELETE whose answer was lost may have deleted the object: its retry's
#   404 means the object is gone, as asked.
# - A resumable upload's session can be lost (an emulator restarted; a
#   session that expired): the chunk's POST then answers 404. While no byte
#   has been committed (the whole object is still in the file's buffer) a
#   new session is started and the upload made again; past that the file
#   raises `UploadSessionLostError`, which `storage.write_atomic` retries by
#   writing the whole object again.
#
# gcsfs takes a second to import, so the classes are made when fsspec first
# asks for them (`__getattr__`), after `storage` has set gcsfs's
# environment.

_GCSFS_CLASSES = ("RetryingGCSFileSystem", "RetryingGCSFile")
_SESSION_RESTARTS = 3


def describe_request(method: str, path: str, args=(), kwargs=None) -> str:
  """A gcsfs request as `gs://BUCKET/KEY (METHOD)` where its URL says which
  object (a listing by its folder), else `METHOD URL` without its query."""
  kwargs = kwargs or {}
  try:
    if args and "{}" in path:  # "b/{}/o/{}" with (bucket, key)
      target = "/".join(str(a) for a in args[:2])
      prefix = kwargs.get("prefix")
      if len(args) == 1 and prefix:
        target += "/" + str(prefix).rstrip("/")
      return f"gs://{target} ({method})"
    parts = urllib.parse.urlsplit(path)
    found = re.search(r"/b/([^/]+)(?:/o/([^/?]+))?", parts.path)
    if found:
      name = (urllib.parse.parse_qs(parts.query).get("name", [None])[0]
              or (urllib.parse.unquote(found.group(2)) if found.group(2)
                  else None))
      bucket = urllib.parse.unquote(found.group(1))
      return f"gs://{bucket}/{name} ({method})" if name else (
          f"gs://{bucket} ({method})")
    return f"{method} {parts.scheme}://{parts.netloc}{parts.path}"
  except Exception:  # pylint: disable=broad-except
    return f"{method} {path}"


@functools.lru_cache(maxsize=None)
def _gcsfs_classes() -> dict[str, type]:
  """The two classes, made once (named as this module's, so a pickled file
  system finds its class again)."""
  import gcsfs  # pylint: disable=g-import-not-at-top
  from gcsfs import core as gcsfs_core  # pylint: disable=g-import-not-at-top
  from gcsfs.retry import HttpError  # pylint: disable=g-import-not-at-top
  # gcsfs's request method without its 6-try decorator (the `decorator`
  # package keeps the function it wrapped as `__wrapped__`).
  raw_request = gcsfs_core.GCSFileSystem._request.__wrapped__  # pylint: disable=protected-access

  class RetryingGCSFile(gcsfs_core.GCSFile):
    """A gcsfs file whose upload survives a lost upload session."""

    def _upload_chunk(self, final=False):
      restarts = 0
      while True:
        try:
          return super()._upload_chunk(final=final)
        except (FileNotFoundError, HttpError) as e:
          lost = self.location and (isinstance(e, FileNotFoundError)
                                    or getattr(e, "code", None) == 410)
          if not lost:
            raise
          if self.offset or restarts >= _SESSION_RESTARTS:
            raise UploadSessionLostError(
                f"gs://{self.path}: the resumable upload's session was lost "
                f"after {self.offset} bytes had been sent ({brief(e)}); the "
                "object must be written again from its start.") from e
          restarts += 1
          log.warning("gs://%s: the upload session was lost (%s); starting "
                      "the upload again.", self.path, brief(e))
          self.location = None
          self._initiate_upload()

  class RetryingGCSFileSystem(gcsfs.GCSFileSystem):
    """gcsfs's file system (`gcsfs.GCSFileSystem`: the extended one on real
    Cloud Storage, the core one on an emulator) with every request retried
    by `acall`."""

    async def _request(self, method, path, *args, **kwargs):  # pylint: disable=invalid-overridden-method
      failed = False
      policy = current()

      async def once():
        nonlocal failed
        try:
          try:
            return await asyncio.wait_for(
                raw_request(self, method, path, *args, **kwargs),
                policy.try_timeout)
          except TimeoutError:
            raise TimeoutError(f"no answer within {policy.try_timeout:g} s "
                               f"({ENV_TRY_TIMEOUT})") from None
        except FileNotFoundError:
          if failed and str(method).upper() == "DELETE":
            # An earlier try deleted it; its answer was lost.
            return 204, {}, None, b""
          raise
        except Exception:
          failed = True
          raise

      return await acall(once, policy=policy,
                         what=describe_request(method, path, args, kwargs))

    def _open(self, path, mode="rb", *args, **kwargs):
      f = super()._open(path, mode, *args, **kwargs)
      if type(f) is gcsfs_core.GCSFile:  # pylint: disable=unidiomatic-typecheck
        f.__class__ = RetryingGCSFile  # adds a method, no state
      return f

  out = {"RetryingGCSFile": RetryingGCSFile,
         "RetryingGCSFileSystem": RetryingGCSFileSystem}
  for name, cls in out.items():
    cls.__module__, cls.__qualname__ = __name__, name
  return out


def __getattr__(name: str):
  if name in _GCSFS_CLASSES:
    return _gcsfs_classes()[name]
  raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
