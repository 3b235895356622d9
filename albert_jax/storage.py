"""User paths, local or `gs://`: one place that turns a string into a path.

Every path a user gives (workdir, corpus, data dir, tokenizer, init,
fine-tuning files, sweep roots, report inputs) goes through `path` and is
then used only through `etils.epath` (which reaches Cloud Storage through
gcsfs) or through orbax/tensorstore, which take `gs://` themselves. No
module calls `os.path`, `open` or `glob` on a user path.

`STORAGE_EMULATOR_HOST=http://127.0.0.1:PORT` sends every layer to a Cloud
Storage emulator: gcsfs and google-cloud-storage read that variable
themselves, and `use_emulator_from_env` maps it onto the settings of the two
that do not: tensorstore's `TENSORSTORE_GCS_HTTP_URL` (orbax's arrays), read
once per process, and `CLOUD_STORAGE_EMULATOR_ENDPOINT`, that of the
google-cloud-cpp client inside array_record (prepared shards). So this runs
when the package is imported.

gcsfs's listings cache is off: several processes share a workdir (the
lease, process 0's files, data workers), and a cached listing would hide
what another process wrote.

Outages: every request to Cloud Storage is retried with exponential backoff
and jitter until a deadline (`albert_jax.retry`, 180 s unless
`ALBERT_JAX_STORAGE_RETRY_DEADLINE` says otherwise), so a run rides out a
storage outage shorter than that: epath's requests through gcsfs
(`retry.RetryingGCSFileSystem`, registered for gs:// here), `write_atomic`'s whole
upload, `create_if_absent`'s request, and tensorstore's (orbax's arrays),
whose own retries `training.checkpoints` raises to cover the deadline
(`raise_tensorstore_retries`). A server that accepts a request and never
answers costs a try: gcsfs's requests time out after
`ALBERT_JAX_STORAGE_TRY_TIMEOUT`, tensorstore's after its own 60 s of
silence, or that setting where the user gave it (`bound_tensorstore_tries`).
ArrayRecord's reader (prepared shards) retries in its own client
(google-cloud-cpp), which rode out a 60 s outage on the emulator; its
settings (a 120 s stall timeout, 15 minutes of retries) are not reachable
from Python.
"""

from __future__ import annotations

import contextlib
import glob as glob_lib
import json
import math
import os
import re
from typing import BinaryIO, Iterator
import uuid

from etils import epath

from albert_jax import retry

EMULATOR = "STORAGE_EMULATOR_HOST"
_SCHEME = re.compile(r"^([a-zA-Z][a-zA-Z0-9+.-]*)://")
SCHEMES = ("gs",)  # besides local paths


def use_emulator_from_env() -> None:
  """Points every storage layer at `$STORAGE_EMULATOR_HOST`, where it is set.

  Also makes `etils.epath` reach `gs://` through gcsfs rather than
  TensorFlow's gfile (which does not read the variable) unless the user
  chose with `EPATH_USE_TF`, and through gcsfs with the project's retries
  (`retry.RetryingGCSFileSystem`). Settings the user made are kept.
  """
  os.environ.setdefault("EPATH_USE_TF", "false")
  bound_tensorstore_tries()
  import fsspec  # pylint: disable=g-import-not-at-top
  fsspec.config.conf.setdefault("gs", {}).setdefault("use_listings_cache",
                                                     False)
  # gcsfs with the project's retries, imported (after the settings below)
  # when a gs:// path is first used.
  for protocol in ("gs", "gcs"):
    fsspec.register_implementation(
        protocol, "albert_jax.retry.RetryingGCSFileSystem",
        clobber=True)
  host = os.environ.get(EMULATOR)
  if not host:
    return
  url = host if "://" in host else f"http://{host}"
  os.environ.setdefault("TENSORSTORE_GCS_HTTP_URL", url)
  os.environ.setdefault("CLOUD_STORAGE_EMULATOR_ENDPOINT", url)
  # An emulator takes any token; without one tensorstore looks for Google
  # credentials, which a test machine has none of.
  os.environ.setdefault("GOOGLE_AUTH_TOKEN_FOR_TESTING", "emulator")
  # gcsfs asks the bucket's layout from the storage control API, which no
  # emulator serves; it would warn on every call and then fall back anyway.
  os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")


# Tensorstore's HTTP client (libcurl) abandons a request that moves fewer
# than TENSORSTORE_CURL_LOW_SPEED_LIMIT_BYTES (256) bytes a second for
# TENSORSTORE_CURL_LOW_SPEED_TIME_SECONDS (60), and retries it like any
# transient failure: a server that accepts a connection and never answers
# costs a try, not the save. Both are read once per process, when the first
# request is made.
TENSORSTORE_TRY_TIMEOUT = "TENSORSTORE_CURL_LOW_SPEED_TIME_SECONDS"


def bound_tensorstore_tries() -> None:
  """Makes `ALBERT_JAX_STORAGE_TRY_TIMEOUT`, where the user set it, also the
  time a tensorstore request (orbax's arrays) may go unanswered before it is
  retried, so one setting bounds a hung request in gcsfs and tensorstore
  alike. Unset, tensorstore keeps its own 60 s (under gcsfs's 120 s); a
  `TENSORSTORE_CURL_LOW_SPEED_TIME_SECONDS` the user set is kept.
  Tensorstore counts whole seconds, so a fraction is rounded up.
  """
  text = os.environ.get(retry.ENV_TRY_TIMEOUT, "").strip()
  if not text:
    return
  try:
    seconds = float(text)
  except ValueError:
    return  # `retry.Policy.from_env` names it at the first request
  if seconds > 0 and math.isfinite(seconds):
    os.environ.setdefault(TENSORSTORE_TRY_TIMEOUT, str(math.ceil(seconds)))


def raise_tensorstore_retries() -> None:
  """Gives tensorstore, in the contexts orbax opens its arrays with, retries
  that cover the deadline (`retry.tensorstore_retries`; never fewer than
  tensorstore's own 32).

  orbax 0.12 takes no tensorstore context from its handlers' options: each
  save and restore builds one from `tensorstore_utils`' module-level
  defaults, which this extends. Where a later orbax moves them, nothing
  changes and tensorstore keeps its own retries (32 tries, waits of 1 to
  32 s: about 15 minutes).
  """
  try:
    from orbax.checkpoint._src.serialization import tensorstore_utils  # pylint: disable=g-import-not-at-top
  except ImportError:
    return
  for name in ("_BASE_TS_CONTEXT", "_DEFAULT_OCDBT_TS_CONTEXT"):
    context = getattr(tensorstore_utils, name, None)
    if isinstance(context, dict):
      context["gcs_request_retries"] = retry.tensorstore_retries()


def path(p: str | os.PathLike) -> epath.Path:
  """`p` as a path: `gs://bucket/key` or a local path with `~` expanded.

  Raises:
    ValueError: `p` is empty or names a scheme other than `gs://`.
  """
  text = os.fspath(p)
  if isinstance(text, bytes):
    text = text.decode()
  if not text:
    raise ValueError("empty path: give a local path or gs://BUCKET/PATH")
  match = _SCHEME.match(text)
  if match:
    if match.group(1) not in SCHEMES:
      raise ValueError(
          f"{text}: {match.group(1)}:// paths are not supported; use a local "
          "path or gs://BUCKET/PATH")
    if not text[match.end():].strip("/"):
      raise ValueError(f"{text}: no bucket; use gs://BUCKET/PATH")
    return epath.Path(text)
  return epath.Path(os.path.expanduser(text))


def is_remote(p: str | os.PathLike) -> bool:
  """Whether `p` is in Cloud Storage (`gs://`)."""
  return bool(_SCHEME.match(os.fspath(p)))


def as_str(p: str | os.PathLike) -> str:
  """`path(p)` as the string orbax, tensorstore and logs take: `gs://…`, or
  an absolute local path."""
  resolved = path(p)
  return os.fspath(resolved) if is_remote(resolved) else os.path.abspath(
      resolved)


def glob(pattern: str | os.PathLike) -> list[epath.Path]:
  """The paths matching `pattern` (`*`, `?`, `[…]`, `**`), sorted.

  A pattern without wildcards matches itself if it exists.
  """
  text = os.fspath(pattern)
  if not is_remote(text):
    text = os.path.expanduser(text)
    return [epath.Path(m) for m in sorted(glob_lib.glob(text, recursive=True))]
  import fsspec  # pylint: disable=g-import-not-at-top
  matches = fsspec.filesystem("gs").glob(text)
  return sorted((path(f"gs://{m}") for m in matches), key=os.fspath)


class DamagedFileError(ValueError):
  """A file the project wrote that no longer holds what it should (torn,
  edited, or replaced)."""


def read_json_object(p: str | os.PathLike, fix: str) -> dict:
  """The JSON object in `p`, a file the project wrote.

  Args:
    p: the file, local or gs://.
    fix: what to do about a damaged one, a sentence starting lower-case
      ("delete it and rerun").

  Raises:
    FileNotFoundError: there is no such file.
    DamagedFileError: it is not UTF-8 JSON, or holds no object; one line
      naming the file, what is wrong and `fix`.
  """
  target = path(p)
  try:
    value = json.loads(target.read_bytes())
  except (json.JSONDecodeError, UnicodeDecodeError) as e:
    raise DamagedFileError(f"{target} is damaged (not valid JSON: {e}); "
                           f"{fix}") from None
  if not isinstance(value, dict):
    raise DamagedFileError(f"{target} is damaged (it holds a JSON "
                           f"{type(value).__name__}, not an object); {fix}")
  return value


def write_atomic(p: str | os.PathLike, data: str | bytes) -> None:
  """Writes `data` to `p` so that a reader sees the old file or the new one,
  never part of it: a local file is written beside and renamed; a Cloud
  Storage object is replaced in one upload, which is atomic already."""
  target = path(p)
  blob = data.encode("utf-8") if isinstance(data, str) else data
  if is_remote(target):
    # Each request is retried by gcsfs; this retries the whole upload when
    # its session was lost part-way.
    retry.call(lambda: target.write_bytes(blob), what=os.fspath(target))
    return
  with open_atomic(target) as f:
    f.write(blob)


@contextlib.contextmanager
def open_atomic(p: str | os.PathLike) -> Iterator[BinaryIO]:
  """A binary file to stream a user's output into, which appears under `p`
  only once the `with` block ends without an error.

  It is written under a temporary name beside `p` (`NAME.HEX.tmp`) and
  renamed into place at the end, so an error or a kill part-way leaves the
  earlier file at `p` as it was and nothing that looks finished under `p`.
  On Cloud Storage the temporary object is copied into place; a failed
  write deletes it.
  """
  target = path(p)
  tmp = target.with_name(f"{target.name}.{uuid.uuid4().hex}.tmp")
  try:
    with tmp.open("wb") as f:
      yield f
    if is_remote(target):
      tmp.replace(target)
    else:
      os.replace(tmp, target)
  except BaseException:
    with contextlib.suppress(OSError):
      tmp.unlink(missing_ok=True)
    raise


def same_file(a: str | os.PathLike, b: str | os.PathLike) -> bool:
  """Whether `a` and `b` name one file: the same object on Cloud Storage, or
  locally the same file after links (`samefile`) or the same resolved
  path, whether or not it exists yet."""
  if is_remote(a) or is_remote(b):
    return os.fspath(path(a)).rstrip("/") == os.fspath(path(b)).rstrip("/")
  a, b = os.path.expanduser(os.fspath(a)), os.path.expanduser(os.fspath(b))
  if os.path.realpath(a) == os.path.realpath(b):
    return True
  try:
    return os.path.samefile(a, b)
  except OSError:
    return False


def age(p: str | os.PathLike) -> float:
  """Seconds since `p` was last written, by the clock of the storage that
  holds it: a probe file is written beside `p` and the two modification
  times (both set by the filesystem or by Cloud Storage) are compared. No
  host's own clock enters, so hosts whose clocks disagree judge alike.

  Raises:
    FileNotFoundError: `p` does not exist.
  """
  target = path(p)
  probe = target.with_name(f"{target.name}.{uuid.uuid4().hex}.clock")
  probe.write_bytes(b"")
  try:
    # `p` is read after the probe is written: a `p` rewritten in between
    # reads as new (age 0), never as older than it is.
    return max(0.0, _mtime(probe) - _mtime(target))
  finally:
    with contextlib.suppress(OSError):
      probe.unlink(missing_ok=True)


def _mtime(p: epath.Path) -> float:
  if is_remote(p):
    return float(p.stat().mtime)
  return os.stat(p).st_mtime


def refuse_links_out(workdir: str | os.PathLike) -> None:
  """Refuses a local workdir holding a symbolic link that leads outside it.

  albert_jax makes no links; one planted in a workdir (metrics.jsonl → a
  file elsewhere) would have every later write land outside it. Cloud
  Storage has no links.

  Raises:
    PermissionError: naming the link, where it leads and the fix.
  """
  root = os.fspath(path(workdir))
  if is_remote(root) or not os.path.isdir(root):
    return
  real = os.path.realpath(root).rstrip(os.sep) + os.sep
  for directory, dirs, files in os.walk(root):
    for name in dirs + files:
      entry = os.path.join(directory, name)
      if not os.path.islink(entry):
        continue
      target = os.path.realpath(entry)
      if not target.startswith(real):
        raise PermissionError(
            f"{entry} is a symbolic link to {target}, outside the workdir; "
            "albert_jax writes only inside its workdir and follows no link "
            "it did not make. Replace the link with the file or directory "
            "itself, or use another workdir.")


def create_if_absent(p: str | os.PathLike, data: bytes) -> bool:
  """Writes `data` to `p` only if nothing is there; whether it did.

  One request decides: `O_EXCL` for a local file, the precondition
  `ifGenerationMatch=0` for a Cloud Storage object, so of two runs that
  race, exactly one creates it.
  """
  target = path(p)
  if not is_remote(target):
    try:
      fd = os.open(target, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
      return False
    with os.fdopen(fd, "wb") as f:
      f.write(data)
    return True
  from google.api_core import exceptions  # pylint: disable=g-import-not-at-top
  bucket, _, key = os.fspath(target)[len("gs://"):].partition("/")
  blob = _gcs_client().bucket(bucket).blob(key)
  try:
    # The project's retries, not the client's (retry=None): one deadline
    # and one log line per retry for every layer. A retried create whose
    # first answer was lost finds its own object and returns False; the
    # caller reads the object to tell (the lease compares its owner).
    retry.call(lambda: blob.upload_from_string(data, if_generation_match=0,
                                               retry=None),
               what=os.fspath(target))
  except exceptions.PreconditionFailed:
    return False
  return True


def _gcs_client():
  """A google-cloud-storage client: `$STORAGE_EMULATOR_HOST`'s without
  credentials, else the environment's default credentials."""
  from google.cloud import storage as gcs  # pylint: disable=g-import-not-at-top
  if os.environ.get(EMULATOR):
    from google.auth import credentials  # pylint: disable=g-import-not-at-top
    return gcs.Client(project="emulator",
                      credentials=credentials.AnonymousCredentials())
  return gcs.Client()
