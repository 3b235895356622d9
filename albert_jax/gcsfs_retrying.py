"""gcsfs with the project's retries: what `etils.epath` reaches `gs://` by.

gcsfs retries a failed request 6 times (about 31 s of waits), a count bound
when its class is defined, so a longer outage ended whatever was reading or
writing: a checkpoint's metadata file in orbax's background thread, a
metrics flush, the lease's heartbeat. `RetryingGCSFileSystem` is gcsfs's
file system with its one request method (`_request`, under every read,
write, listing, copy and delete) retried by `albert_jax.retry.acall`
instead: backoff, jitter and the deadline of `ALBERT_JAX_STORAGE_RETRY_*`.
`albert_jax.storage` registers it for `gs://` and `gcs://` in fsspec, the
registry epath asks.

Two repeats need care:
- A DELETE whose answer was lost may have deleted the object: its retry's
  404 means the object is gone, as asked.
- A resumable upload's session can be lost (an emulator restarted; a
  session that expired): the chunk's POST then answers 404. While no byte
  has been committed (the whole object is still in the file's buffer) a new
  session is started and the upload made again; past that the file raises
  `retry.UploadSessionLostError`, which `storage.write_atomic` retries by
  writing the whole object again.
"""

from __future__ import annotations

import logging
import re
import urllib.parse

import gcsfs
from gcsfs import core as gcsfs_core
from gcsfs.retry import HttpError

from albert_jax import retry

log = logging.getLogger(__name__)

# gcsfs's request method without its 6-try decorator (the `decorator`
# package keeps the function it wrapped as `__wrapped__`).
_RAW_REQUEST = gcsfs_core.GCSFileSystem._request.__wrapped__  # pylint: disable=protected-access
_SESSION_RESTARTS = 3


def describe(method: str, path: str, args=(), kwargs=None) -> str:
  """A request as `gs://BUCKET/KEY (METHOD)` where its URL says which
  object, else `METHOD URL` without its query."""
  kwargs = kwargs or {}
  try:
    if args and "{}" in path:  # "b/{}/o/{}" with (bucket, key)
      target = "/".join(str(a) for a in args[:2])
      prefix = kwargs.get("prefix")
      if len(args) == 1 and prefix:  # a listing: named by its folder
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
          raise retry.UploadSessionLostError(
              f"gs://{self.path}: the resumable upload's session was lost "
              f"after {self.offset} bytes had been sent ({retry.brief(e)}); "
              "the object must be written again from its start.") from e
        restarts += 1
        log.warning("gs://%s: the upload session was lost (%s); starting the "
                    "upload again.", self.path, retry.brief(e))
        self.location = None
        self._initiate_upload()


class RetryingGCSFileSystem(gcsfs.GCSFileSystem):
  """gcsfs's file system (`gcsfs.GCSFileSystem`: the extended one on real
  Cloud Storage, the core one on an emulator) with every request retried by
  `albert_jax.retry`."""

  async def _request(self, method, path, *args, **kwargs):  # pylint: disable=invalid-overridden-method
    failed = False

    async def once():
      nonlocal failed
      try:
        return await _RAW_REQUEST(self, method, path, *args, **kwargs)
      except FileNotFoundError:
        if failed and str(method).upper() == "DELETE":
          # An earlier try deleted it; its answer was lost.
          return 204, {}, None, b""
        raise
      except Exception:
        failed = True
        raise

    return await retry.acall(once, what=describe(method, path, args, kwargs))

  def _open(self, path, mode="rb", *args, **kwargs):
    f = super()._open(path, mode, *args, **kwargs)
    if type(f) is gcsfs_core.GCSFile:  # pylint: disable=unidiomatic-typecheck
      f.__class__ = RetryingGCSFile  # adds a method, no state
    return f
