"""The project's own gs:// reads and writes ride out a real outage: the
emulator (objects on disk, `restartable_gcs`) is stopped, and started again
on the same port a second later, while each call waits. Retry settings are
scaled down (waits of 0.1 to 0.5 s) so a test takes seconds; the schedule
itself is `test_retry.py`'s."""

import contextlib
import json
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time

from gcsfs import core as gcsfs_core
import pytest
from restartable_gcs import Emulator

from albert_jax import retry
from albert_jax import storage

OUTAGE = 1.0


@pytest.fixture(scope="module")
def emulator(tmp_path_factory):
  folder = tmp_path_factory.mktemp("restartable_gcs")
  server = Emulator(folder / "root", folder / "server.log")
  server.start()
  yield server
  server.stop()


@pytest.fixture(name="gcs")
def fixture_gcs(emulator, monkeypatch):
  """The emulator, answering, with every layer pointed at it and retries
  scaled down."""
  if emulator.process is None:
    emulator.start()
  monkeypatch.setenv(storage.EMULATOR, emulator.url)
  monkeypatch.setenv(retry.ENV_DEADLINE, "30")
  monkeypatch.setenv(retry.ENV_INITIAL, "0.1")
  monkeypatch.setenv(retry.ENV_MAXIMUM, "0.5")
  return emulator


def _during_outage(gcs, fn, seconds=OUTAGE):
  """fn(), called while the emulator is down; it comes back after
  `seconds`. fn's result, and how long it took."""
  gcs.stop()
  timer = threading.Timer(seconds, gcs.start)
  start = time.monotonic()
  timer.start()
  try:
    out = fn()
  finally:
    timer.join()
  return out, time.monotonic() - start


def _retries(caplog, what):
  return [r.getMessage() for r in caplog.records
          if r.levelno == logging.WARNING and r.name == "albert_jax.retry"
          and r.getMessage().startswith(what)]


def test_reads_writes_listings_and_creates_ride_out_an_outage(gcs, caplog):
  bucket = gcs.bucket()
  storage.write_atomic(f"{bucket}/a.json", '{"x": 1}')
  calls = [
      ("read", f"{bucket}/a.json",
       lambda: storage.read_json_object(f"{bucket}/a.json", fix="-"),
       {"x": 1}),
      ("write", f"{bucket}/b.json",
       lambda: storage.write_atomic(f"{bucket}/b.json", '{"y": 2}'), None),
      ("exists", f"{bucket}/b.json",
       lambda: storage.path(f"{bucket}/b.json").exists(), True),
      ("glob", bucket,
       lambda: [p.name for p in storage.glob(f"{bucket}/*.json")],
       ["a.json", "b.json"]),
      ("create", f"{bucket}/lease.json",
       lambda: storage.create_if_absent(f"{bucket}/lease.json", b"{}"), True),
      ("create again", f"{bucket}/lease.json",
       lambda: storage.create_if_absent(f"{bucket}/lease.json", b"{}"), False),
      ("age", f"{bucket}/a.json",
       lambda: storage.age(f"{bucket}/a.json") >= 0, True),
  ]
  with caplog.at_level(logging.WARNING):
    for name, what, fn, want in calls:
      caplog.clear()
      got, took = _during_outage(gcs, fn)
      assert got == want, name
      assert took >= OUTAGE, name
      assert _retries(caplog, what), (name, caplog.text)
      assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
  assert storage.read_json_object(f"{bucket}/b.json", fix="-") == {"y": 2}
  assert storage.path(f"{bucket}/lease.json").read_bytes() == b"{}"


def test_a_missing_object_is_not_retried(gcs, caplog):
  bucket = gcs.bucket()
  start = time.monotonic()
  with caplog.at_level(logging.WARNING):
    with pytest.raises(FileNotFoundError):
      storage.path(f"{bucket}/missing.json").read_text()
    assert not storage.path(f"{bucket}/missing.json").exists()
  assert time.monotonic() - start < 2
  assert not _retries(caplog, "")


def test_an_upload_whose_session_is_lost_is_started_again(gcs, monkeypatch,
                                                          caplog):
  """The emulator restarts between the start of a resumable upload and its
  data (as it did under a checkpoint's metadata file): the data's POST
  answers 404 for the session, and a new session is started."""
  bucket = gcs.bucket()
  initiate = retry.RetryingGCSFile._initiate_upload  # pylint: disable=protected-access
  restarts = []

  def initiate_then_restart(self):
    initiate(self)
    if not restarts:
      restarts.append(self.location)
      gcs.restart()

  monkeypatch.setattr(retry.RetryingGCSFile, "_initiate_upload",
                      initiate_then_restart)
  with caplog.at_level(logging.WARNING):
    storage.path(f"{bucket}/run/_CHECKPOINT_METADATA").write_text("{}")
  assert restarts
  assert storage.path(f"{bucket}/run/_CHECKPOINT_METADATA").read_text() == "{}"
  assert (f"{bucket}/run/_CHECKPOINT_METADATA: the upload session was lost"
          in caplog.text)


def test_a_session_lost_after_its_first_chunk_rewrites_the_whole_object(
    gcs, monkeypatch, caplog):
  """Past the first chunk only the writer holding the whole object can send
  it again: `write_atomic` does."""
  bucket = gcs.bucket()
  data = os.urandom(6 * 2**20 + 3)  # over gcsfs's 5 MiB block: two POSTs
  upload = gcsfs_core.GCSFile._upload_chunk  # pylint: disable=protected-access
  restarts = []

  def restart_before_the_last_chunk(self, final=False):
    if self.offset and not restarts:
      restarts.append(self.offset)
      gcs.restart()
    return upload(self, final=final)

  monkeypatch.setattr(gcsfs_core.GCSFile, "_upload_chunk",
                      restart_before_the_last_chunk)
  with caplog.at_level(logging.WARNING):
    storage.write_atomic(f"{bucket}/shard.arrayrecord", data)
  assert restarts
  assert storage.path(f"{bucket}/shard.arrayrecord").read_bytes() == data
  assert "UploadSessionLostError" in caplog.text


def test_past_the_deadline_one_clear_error(gcs, monkeypatch, caplog):
  bucket = gcs.bucket()
  storage.write_atomic(f"{bucket}/a.json", "{}")
  monkeypatch.setenv(retry.ENV_DEADLINE, "1")
  gcs.stop()
  try:
    with caplog.at_level(logging.WARNING):
      start = time.monotonic()
      with pytest.raises(retry.StorageUnavailableError) as raised:
        storage.read_json_object(f"{bucket}/a.json", fix="-")
      took = time.monotonic() - start
  finally:
    gcs.start()
  assert 1 <= took < 5
  message = str(raised.value)
  assert message.startswith(
      f"{bucket}/a.json (GET): Cloud Storage kept failing for 1 s (")
  assert "ClientConnectorError" in message
  assert f"gcloud storage ls {bucket})" in message
  assert "ALBERT_JAX_STORAGE_RETRY_DEADLINE to more seconds (now 1)" in message
  errors = [r.getMessage() for r in caplog.records
            if r.levelno >= logging.ERROR]
  # One error line, the raised message. gcsfs's retries and the read's own
  # both give up at the deadline, and whichever does first logs (the other
  # is silenced, `retry._first_to_give_up`): their try counts may differ.
  tries = re.compile(r"\(\d+ tries; ")
  assert [tries.sub("(N tries; ", e) for e in errors] == [
      tries.sub("(N tries; ", message)]


def _hung(gcs, seconds):
  """The emulator stopped (SIGSTOP) for `seconds`, then continued: the
  kernel still accepts its connections, and nothing answers them."""
  os.kill(gcs.process.pid, signal.SIGSTOP)
  timer = threading.Timer(seconds,
                          lambda: os.kill(gcs.process.pid, signal.SIGCONT))
  timer.start()
  return timer


def test_a_server_that_never_answers_costs_a_try_not_the_run(
    gcs, monkeypatch, caplog):
  """Each request may take `try_timeout` (scaled down to 0.3 s): a hung
  server's try times out and is retried like a refused one, so a read
  outlives a 1.5 s hang, and a hang past the deadline ends in the one
  clear error within it, not after aiohttp's 5 minutes."""
  bucket = gcs.bucket()
  storage.write_atomic(f"{bucket}/a.json", '{"x": 1}')
  monkeypatch.setenv(retry.ENV_TRY_TIMEOUT, "0.3")
  with caplog.at_level(logging.WARNING):
    timer = _hung(gcs, 1.5)
    start = time.monotonic()
    try:
      got = storage.read_json_object(f"{bucket}/a.json", fix="-")
    finally:
      timer.join()
    took = time.monotonic() - start
  assert got == {"x": 1} and took >= 1.5
  retried = _retries(caplog, f"{bucket}/a.json (GET)")
  assert retried and all("TimeoutError: no answer within 0.3 s "
                         "(ALBERT_JAX_STORAGE_TRY_TIMEOUT); retry" in r
                         for r in retried), retried

  monkeypatch.setenv(retry.ENV_DEADLINE, "1")
  timer = _hung(gcs, 5)
  start = time.monotonic()
  try:
    with pytest.raises(retry.StorageUnavailableError) as raised:
      storage.read_json_object(f"{bucket}/a.json", fix="-")
    took = time.monotonic() - start
  finally:
    timer.cancel()
    os.kill(gcs.process.pid, signal.SIGCONT)
  assert 1 <= took < 3, took
  assert str(raised.value).startswith(
      f"{bucket}/a.json (GET): Cloud Storage kept failing for 1 s ("), (
          str(raised.value))
  assert "no answer within 0.3 s" in str(raised.value)


def test_the_lease_reads_an_outage_as_an_outage(tmp_path, monkeypatch,
                                                caplog):
  """A lease read that failed past the deadline says nothing of its owner,
  and a create whose answer was lost made the lease ours."""
  from albert_jax.training import lease  # pylint: disable=g-import-not-at-top

  def answer_lost(path, record):  # created, but the caller never heard
    storage.write_atomic(path, json.dumps(record))
    return False

  monkeypatch.setattr(lease, "_create", answer_lost)
  held = lease.acquire(str(tmp_path), heartbeat_seconds=3600)
  assert not held.lost
  held.release()
  monkeypatch.undo()

  outage = retry.StorageUnavailableError("gs://bkt/run/lease.json (GET): "
                                         "Cloud Storage kept failing …")

  class Unreachable:
    def read_text(self, **_):
      raise outage

  monkeypatch.setattr(lease.storage, "path", lambda _: Unreachable())
  with pytest.raises(retry.StorageUnavailableError):
    lease._read("gs://bkt/run/lease.json")  # pylint: disable=protected-access
  monkeypatch.undo()

  # The heartbeat: two beats meet the outage, the third finds the lease.
  path = os.path.join(tmp_path, lease.LEASE)
  record = {"owner": "me"}
  storage.write_atomic(path, json.dumps(record))
  reads = []

  def read(p):
    reads.append(p)
    if len(reads) <= 2:
      raise outage
    return record

  monkeypatch.setattr(lease, "_read", read)
  held = lease.Lease(path, "me", threading.Event(), None, record=record)
  beat = threading.Thread(target=lease._beat,  # pylint: disable=protected-access
                          args=(held, 0.01, "this run stops."))
  with caplog.at_level(logging.WARNING):
    beat.start()
    deadline = time.monotonic() + 30
    while len(reads) < 4 and beat.is_alive():
      assert time.monotonic() < deadline, reads
      time.sleep(0.01)
    held.stop.set()
    beat.join()
  assert len(reads) >= 4, reads  # the heartbeat went on beating
  assert not held.taken.is_set()
  assert caplog.text.count(f"The heartbeat of the lease {path} was "
                           "not written") == 2


def test_bound_tensorstore_tries_follows_the_try_timeout_the_user_set(
    monkeypatch):
  monkeypatch.delenv(storage.TENSORSTORE_TRY_TIMEOUT, raising=False)
  monkeypatch.delenv(retry.ENV_TRY_TIMEOUT, raising=False)
  storage.bound_tensorstore_tries()
  assert storage.TENSORSTORE_TRY_TIMEOUT not in os.environ  # its own 60 s
  for text in ("soon", "0", "-3", "inf"):
    monkeypatch.setenv(retry.ENV_TRY_TIMEOUT, text)
    storage.bound_tensorstore_tries()
    assert storage.TENSORSTORE_TRY_TIMEOUT not in os.environ, text
  monkeypatch.setenv(retry.ENV_TRY_TIMEOUT, "0.3")
  storage.bound_tensorstore_tries()
  assert os.environ[storage.TENSORSTORE_TRY_TIMEOUT] == "1"
  monkeypatch.setenv(retry.ENV_TRY_TIMEOUT, "90")
  storage.bound_tensorstore_tries()  # the value there is kept
  assert os.environ[storage.TENSORSTORE_TRY_TIMEOUT] == "1"


class _Proxy:
  """An HTTP/1.1 relay on 127.0.0.1 to the emulator that takes tensorstore's
  first read (GET) and first upload (POST) and never answers them, nor
  passes them on: a server that hangs, for those two requests. Every other
  request is relayed both ways. Tensorstore's connections are relayed
  request by request (its requests carry a Content-Length), so a request
  on a reused connection can be held too; other clients' are relayed as
  bytes."""

  def __init__(self, upstream_port: int):
    self.upstream_port = upstream_port
    self.server = socket.create_server(("127.0.0.1", 0))
    self.server.settimeout(0.1)
    self.port = self.server.getsockname()[1]
    self.hung: list[tuple[bytes, tuple]] = []
    self.relayed = 0
    self.lock = threading.Lock()
    self.stop = threading.Event()
    self.thread = threading.Thread(target=self._accept, daemon=True)
    self.thread.start()

  def _accept(self):
    while not self.stop.is_set():
      try:
        client, _ = self.server.accept()
      except OSError:
        continue
      threading.Thread(target=self._serve, args=(client,), daemon=True).start()

  def _serve(self, client):
    upstream, data = None, b""
    try:
      while True:
        while b"\r\n\r\n" not in data:  # a request's head
          chunk = client.recv(65536)
          if not chunk:
            return
          data += chunk
        head, data = data.split(b"\r\n\r\n", 1)
        method = head.split(b" ", 1)[0]
        tensorstore = re.search(rb"(?im)^user-agent:.*tensorstore", head)
        with self.lock:
          hold = tensorstore and method not in [m for m, _ in self.hung]
          if hold:
            # Held open, never answered; the connection to the emulator
            # (where one was made) stays open too, so nothing closes it.
            self.hung.append((method, (client, upstream)))
        if hold:
          client = upstream = None
          return
        if upstream is None:
          upstream = socket.create_connection(
              ("127.0.0.1", self.upstream_port))
          threading.Thread(target=self._pipe, args=(upstream, client),
                           daemon=True).start()
        self.relayed += 1
        upstream.sendall(head + b"\r\n\r\n")
        if not tensorstore:
          upstream.sendall(data)
          self._pipe(client, upstream)
          return
        length = re.search(rb"(?im)^content-length:\s*(\d+)", head)
        left = int(length.group(1)) if length else 0
        while len(data) < left:
          chunk = client.recv(65536)
          if not chunk:
            return
          data += chunk
        upstream.sendall(data[:left])
        data = data[left:]
    except OSError:
      pass
    finally:
      for s in (client, upstream):
        if s is not None:
          with contextlib.suppress(OSError):
            s.shutdown(socket.SHUT_RDWR)

  @staticmethod
  def _pipe(source, sink):
    try:
      while chunk := source.recv(65536):
        sink.sendall(chunk)
    except OSError:
      pass
    finally:
      for s in (source, sink):
        with contextlib.suppress(OSError):
          s.shutdown(socket.SHUT_RDWR)

  def close(self):
    self.stop.set()
    self.thread.join()
    self.server.close()
    for _, held in self.hung:
      for s in held:
        if s is not None:
          s.close()


# Saves step 1 of a small state into the bucket through the project's
# checkpoint manager (orbax: metadata through gcsfs, arrays through
# tensorstore), then restores it; prints the save's seconds.
_SAVE = """
import json, sys, time
import jax
import jax.numpy as jnp
from albert_jax.training import checkpoints
state = {"step": jnp.int32(1), "params": {"w": jnp.arange(6.0).reshape(2, 3)}}
mngr = checkpoints.manager(sys.argv[1])
start = time.monotonic()
checkpoints.save(mngr, state, {"step": 1})
mngr.wait_until_finished()
took = time.monotonic() - start
one = jax.sharding.SingleDeviceSharding(jax.devices()[0])
back = checkpoints.restore_latest(
    checkpoints.manager(sys.argv[1]), state, jax.tree.map(lambda _: one, state))
print(json.dumps({"took": took, "w": back[0]["params"]["w"].tolist()}))
"""


def test_a_checkpoint_save_rides_out_a_tensorstore_request_never_answered(
    gcs, tmp_path):
  """The server accepts tensorstore's first read and first upload and
  never answers them. With ALBERT_JAX_STORAGE_TRY_TIMEOUT=1, tensorstore
  (orbax's arrays) abandons each after a second of silence and retries
  it, so the save finishes in seconds and restores; before the setting
  reached tensorstore, each waited tensorstore's own 60 s (measured: the
  save took 60.6 s). A fresh process: tensorstore reads the setting once
  per process."""
  bucket = gcs.bucket()
  proxy = _Proxy(gcs.port)
  env = {k: v for k, v in os.environ.items()
         if not k.startswith(("TENSORSTORE_", "CLOUD_STORAGE_"))}
  env.update({storage.EMULATOR: f"http://127.0.0.1:{proxy.port}",
              retry.ENV_TRY_TIMEOUT: "1", retry.ENV_DEADLINE: "30",
              retry.ENV_INITIAL: "0.1", retry.ENV_MAXIMUM: "0.5",
              "JAX_PLATFORMS": "cpu"})
  try:
    done = subprocess.run([sys.executable, "-c", _SAVE, f"{bucket}/run"],
                          env=env, capture_output=True, text=True,
                          timeout=300, check=False)
  finally:
    proxy.close()
  assert done.returncode == 0, done.stderr[-3000:]
  out = json.loads(done.stdout.strip().splitlines()[-1])
  assert sorted(m for m, _ in proxy.hung) == [b"GET", b"POST"]
  assert proxy.relayed > 0
  assert out["w"] == [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]
  assert 1 <= out["took"] < 30, out
