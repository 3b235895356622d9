"""`albert_jax.retry`: backoff, jitter and the deadline on a scripted clock;
which errors are retried; the settings; tensorstore's share."""

import asyncio
import logging

import aiohttp
from gcsfs.retry import HttpError
from google.api_core import exceptions as api_exceptions
from google.auth import exceptions as auth_exceptions
import pytest
import requests

from albert_jax import retry


class Script:
  """A clock that only `sleep` moves, and an operation that fails a set
  number of times (each try taking `cost` seconds) before it succeeds."""

  def __init__(self, failures, error=ConnectionRefusedError, cost=0.0):
    self.now, self.cost = 100.0, cost
    self.failures, self.error = failures, error
    self.sleeps, self.tries = [], []

  def clock(self):
    return self.now

  def sleep(self, seconds):
    self.sleeps.append(seconds)
    self.now += seconds

  async def async_sleep(self, seconds):
    self.sleep(seconds)

  def fn(self):
    self.tries.append(self.now)
    self.now += self.cost
    if len(self.tries) <= self.failures:
      raise self.error("connection refused")
    return "done"

  async def async_fn(self):
    return self.fn()

  def call(self, policy, rand=lambda: 0.0, what="gs://bkt/run/config.json"):
    return retry.call(self.fn, what=what, policy=policy, clock=self.clock,
                      sleep=self.sleep, rand=rand)


def test_waits_double_up_to_the_maximum_less_their_jitter():
  policy = retry.Policy(deadline=1000, initial=1, maximum=8, jitter=0.5)
  script = Script(failures=6)
  assert script.call(policy) == "done"
  assert script.sleeps == [1, 2, 4, 8, 8, 8]
  script = Script(failures=6)  # the most jitter takes off half
  assert script.call(policy, rand=lambda: 1.0) == "done"
  assert script.sleeps == [0.5, 1, 2, 4, 4, 4]
  draws = iter([0.2, 0.6, 0.0])
  script = Script(failures=3)
  script.call(policy, rand=lambda: next(draws))
  assert script.sleeps == pytest.approx([0.9, 2 * 0.7, 4])
  script = Script(failures=3)
  script.call(retry.Policy(initial=0.5, maximum=10, multiplier=3, jitter=0))
  assert script.sleeps == [0.5, 1.5, 4.5]


def test_the_deadline_counts_from_the_first_failure_and_is_kept(caplog):
  policy = retry.Policy(deadline=10, initial=1, maximum=4, jitter=0)
  script = Script(failures=100)
  with caplog.at_level(logging.WARNING, logger="albert_jax.retry"):
    with pytest.raises(retry.StorageUnavailableError) as raised:
      script.call(policy)
  # 1 + 2 + 4 s, then only the 3 s left: the last try is at the deadline.
  assert script.sleeps == [1, 2, 4, 3]
  assert script.tries == [100, 101, 103, 107, 110]
  message = str(raised.value)
  assert message == (
      "gs://bkt/run/config.json: Cloud Storage kept failing for 10 s (5 "
      "tries; last error ConnectionRefusedError: connection refused). Check "
      "the network and that the bucket answers (gcloud storage ls gs://bkt), "
      "then run again (a training run resumes from its last checkpoint); to "
      "ride out longer outages, set ALBERT_JAX_STORAGE_RETRY_DEADLINE to "
      "more seconds (now 10).")
  assert isinstance(raised.value.__cause__, ConnectionRefusedError)
  warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
  errors = [r for r in caplog.records if r.levelno == logging.ERROR]
  assert [r.getMessage() for r in warnings][:2] == [
      "gs://bkt/run/config.json: ConnectionRefusedError: connection refused; "
      "retry 1 in 1.0 s (retrying for 10 s more at most).",
      "gs://bkt/run/config.json: ConnectionRefusedError: connection refused; "
      "retry 2 in 2.0 s (retrying for 9 s more at most)."]
  assert len(warnings) == 4
  assert [r.getMessage() for r in errors] == [message]

  # Tries that take time spend the deadline too: the first failure is at
  # 101, the fourth at 111, past 101 + 10.
  script = Script(failures=100, cost=1)
  with pytest.raises(retry.StorageUnavailableError, match="for 10 s"):
    script.call(policy)
  assert script.sleeps == [1, 2, 4]
  assert script.tries == [100, 102, 105, 110]


def test_an_outage_shorter_than_the_deadline_is_ridden_out():
  policy = retry.Policy(deadline=60, initial=1, maximum=32, jitter=0)
  script = Script(failures=6)
  assert script.call(policy) == "done"
  assert script.sleeps == [1, 2, 4, 8, 16, 29]  # the last cut to 60 s
  assert script.now - 100 == 60


def _name(error) -> str:
  status = getattr(error, "status", None) or getattr(error, "code", "")
  return f"{type(error).__name__}-{status}"


@pytest.mark.parametrize("error", [
    FileNotFoundError("gs://bkt/missing"),
    PermissionError("Forbidden"),
    FileExistsError("gs://bkt/lease.json"),
    ValueError("Bad Request: invalid"),
    HttpError({"code": 404, "message": "No such object"}),
    HttpError({"code": 403, "message": "Forbidden"}),
    HttpError({"code": 412, "message": "Precondition Failed"}),
    HttpError({"code": 401, "message": "Anonymous caller"}),
    api_exceptions.NotFound("no such object"),
    api_exceptions.Forbidden("forbidden"),
    api_exceptions.PreconditionFailed("generation mismatch"),
    api_exceptions.BadRequest("bad"),
    aiohttp.ClientResponseError(None, (), status=404),
    retry.StorageUnavailableError("already retried to its deadline"),
    RuntimeError("a bug"),
], ids=_name)
def test_errors_that_are_not_transient_are_raised_at_once(error, caplog):
  script = Script(failures=0)

  def fn():
    script.tries.append(script.now)
    raise error

  with caplog.at_level(logging.WARNING, logger="albert_jax.retry"):
    with pytest.raises(type(error)) as raised:
      retry.call(fn, what="gs://bkt/x", policy=retry.Policy(),
                 clock=script.clock, sleep=script.sleep)
  assert raised.value is error
  assert not retry.is_transient(error)
  assert len(script.tries) == 1 and script.sleeps == []
  assert not caplog.records


@pytest.mark.parametrize("error", [
    ConnectionRefusedError(111, "Connection refused"),
    ConnectionResetError(104, "Connection reset by peer"),
    TimeoutError("timed out"),
    HttpError({"code": 503, "message": "Service Unavailable"}),
    HttpError({"code": 500, "message": "Internal"}),
    HttpError({"code": 429, "message": "Too Many Requests"}),
    HttpError({"code": 408, "message": "Request Timeout"}),
    HttpError({"code": 401, "message": "Invalid Credentials"}),
    api_exceptions.ServiceUnavailable("unavailable"),
    api_exceptions.InternalServerError("internal"),
    api_exceptions.TooManyRequests("slow down"),
    api_exceptions.GatewayTimeout("gateway"),
    requests.exceptions.ConnectionError("refused"),
    requests.exceptions.ProxyError("gcsfs's 502"),
    requests.exceptions.ReadTimeout("read timeout"),
    aiohttp.ServerDisconnectedError(),
    aiohttp.ClientPayloadError("cut short"),
    aiohttp.ClientResponseError(None, (), status=503),
    auth_exceptions.TransportError("metadata server"),
    auth_exceptions.RefreshError("metadata server busy", retryable=True),
    retry.UploadSessionLostError("session gone"),
], ids=_name)
def test_transient_errors_are_retried(error):
  assert retry.is_transient(error)
  script = Script(failures=2, error=lambda _: error)
  assert script.call(retry.Policy(jitter=0)) == "done"
  assert script.sleeps == [1, 2]


def test_an_inner_deadline_is_not_retried_again_outside():
  """write_atomic retries around gcsfs's retried requests: an inner
  deadline ends both, so deadlines never multiply."""
  policy = retry.Policy(deadline=5, initial=1, maximum=1, jitter=0)
  script = Script(failures=100)
  outer = []

  def upload():
    outer.append(script.now)
    return script.call(policy)

  with pytest.raises(retry.StorageUnavailableError):
    retry.call(upload, what="gs://bkt/x", policy=policy, clock=script.clock,
               sleep=script.sleep)
  assert len(outer) == 1 and script.now - 100 == 5


def test_no_retries_with_a_zero_deadline():
  script = Script(failures=1)
  with pytest.raises(ConnectionRefusedError):
    script.call(retry.Policy(deadline=0))
  assert script.sleeps == []


def test_acall_retries_a_coroutine_the_same_way():
  policy = retry.Policy(deadline=10, initial=1, maximum=4, jitter=0)
  script = Script(failures=3)
  assert asyncio.run(retry.acall(
      script.async_fn, what="gs://bkt/x", policy=policy, clock=script.clock,
      sleep=script.async_sleep)) == "done"
  assert script.sleeps == [1, 2, 4]
  script = Script(failures=100)
  with pytest.raises(retry.StorageUnavailableError, match="for 10 s"):
    asyncio.run(retry.acall(
        script.async_fn, what="gs://bkt/x", policy=policy,
        clock=script.clock, sleep=script.async_sleep))
  assert script.sleeps == [1, 2, 4, 3]


def test_settings_come_from_the_environment(monkeypatch):
  for name in (retry.ENV_DEADLINE, retry.ENV_INITIAL, retry.ENV_MAXIMUM):
    monkeypatch.delenv(name, raising=False)
  assert retry.current() == retry.Policy(deadline=180, initial=1, maximum=32)
  monkeypatch.setenv(retry.ENV_DEADLINE, "20")
  monkeypatch.setenv(retry.ENV_INITIAL, "0.2")
  assert retry.current() == retry.Policy(deadline=20, initial=0.2,
                                         maximum=32)
  monkeypatch.setenv(retry.ENV_MAXIMUM, "2")
  assert retry.current().maximum == 2
  monkeypatch.setenv(retry.ENV_DEADLINE, "three minutes")
  with pytest.raises(ValueError, match="ALBERT_JAX_STORAGE_RETRY_DEADLINE="
                     "'three minutes' is not a number of seconds"):
    retry.current()
  monkeypatch.setenv(retry.ENV_DEADLINE, "-1")
  with pytest.raises(ValueError, match="deadline must be >= 0"):
    retry.current()


def test_tensorstore_retries_cover_the_deadline_and_never_lower_its_own():
  assert retry.tensorstore_retries(retry.Policy()) == {
      "max_retries": 32, "initial_delay": "1.0s", "max_delay": "32.0s"}
  long = retry.Policy(deadline=3600)
  spec = retry.tensorstore_retries(long)
  n = spec["max_retries"]
  assert sum(long.wait(k) for k in range(1, n + 1)) >= 3600
  assert sum(long.wait(k) for k in range(1, n)) < 3600
  assert n == 117


def test_orbax_opens_its_arrays_with_those_retries(monkeypatch):
  from albert_jax import storage  # pylint: disable=g-import-not-at-top
  from albert_jax.training import checkpoints  # pylint: disable=g-import-not-at-top,unused-import
  from orbax.checkpoint._src.serialization import tensorstore_utils  # pylint: disable=g-import-not-at-top
  for name in (retry.ENV_DEADLINE, retry.ENV_INITIAL, retry.ENV_MAXIMUM):
    monkeypatch.delenv(name, raising=False)
  storage.raise_tensorstore_retries()
  for ocdbt in (True, False):
    context = tensorstore_utils.get_ts_context(use_ocdbt=ocdbt)
    assert context["gcs_request_retries"].to_json(
        include_defaults=True) == {
        "max_retries": 32, "initial_delay": "1s", "max_delay": "32s"}
  monkeypatch.setenv(retry.ENV_DEADLINE, "3600")
  monkeypatch.setenv(retry.ENV_INITIAL, "0.5")
  monkeypatch.setenv(retry.ENV_MAXIMUM, "4")
  storage.raise_tensorstore_retries()
  try:
    context = tensorstore_utils.get_ts_context(use_ocdbt=True)
    assert context["gcs_request_retries"].to_json(
        include_defaults=True) == {
        "max_retries": 903, "initial_delay": "500ms", "max_delay": "4s"}
  finally:
    monkeypatch.undo()
    storage.raise_tensorstore_retries()


def test_a_checkpoint_write_cut_by_an_outage_says_so():
  """A save that failed because Cloud Storage stayed away past the deadline
  (orbax may wrap the error) names the outage's line, not a full disk."""
  from albert_jax.training import checkpoints  # pylint: disable=g-import-not-at-top

  class Manager:
    directory = "gs://bkt/run/checkpoints"

    def reload(self):
      pass

    def all_steps(self):
      return [3]

  outage = retry.StorageUnavailableError(
      "gs://bkt/run/checkpoints/6/meta (POST): Cloud Storage kept failing "
      "for 180 s (…). Check the network …")
  try:
    try:
      raise outage
    except retry.StorageUnavailableError as e:
      raise RuntimeError("Save Finalize thread failed") from e
  except RuntimeError as wrapped:
    error = checkpoints._write_error(Manager(), 6, wrapped)  # pylint: disable=protected-access
  assert str(error) == (
      "Writing checkpoint step 6 to gs://bkt/run/checkpoints failed "
      f"({outage}). The complete checkpoints (steps [3]) are intact and the "
      "incomplete one is never restored: a rerun resumes from step 3.")
  assert "Free space" not in str(error)
  disk = checkpoints._write_error(Manager(), 6, OSError(28, "No space left"))  # pylint: disable=protected-access
  assert str(disk).endswith("Free space on that disk (or lower "
                            "config.keep_checkpoints, or choose another "
                            "--workdir) and run again.")
