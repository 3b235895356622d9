"""One owner per workdir (training/lease.py)."""

import concurrent.futures
import json
import logging
import os
import re
import socket
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from albert_jax import storage
from albert_jax.training import lease as lease_lib
from albert_jax.training import pretrain
from locations import REPO  # pylint: disable=g-bad-import-order
from training.test_resume import Run  # pylint: disable=g-bad-import-order
from training.test_resume import fixture_dataset  # noqa: F401  pylint: disable=unused-import


def _held(workdir):
  # gcsfs reads an object in ranges sized by a first request, so a read
  # racing the heartbeat's rewrite can mix two versions: read again.
  for _ in range(4):
    try:
      return json.loads(
          storage.path(f"{workdir}/{lease_lib.LEASE}").read_text())
    except ValueError:
      time.sleep(0.01)
  return json.loads(storage.path(f"{workdir}/{lease_lib.LEASE}").read_text())


def _gone(workdir):
  return not storage.path(f"{workdir}/{lease_lib.LEASE}").exists()


@pytest.fixture(params=["local", "gs"])
def workdir(request, tmp_path) -> str:
  """An empty workdir, local or on the Cloud Storage emulator."""
  if request.param == "local":
    return str(tmp_path)
  return request.getfixturevalue("gcs_bucket") + "/run"


def test_a_second_run_is_refused_until_the_first_releases(workdir):
  first = lease_lib.acquire(workdir)
  with pytest.raises(lease_lib.WorkdirBusyError) as error:
    lease_lib.acquire(workdir)
  message = str(error.value)
  assert f"pid {os.getpid()} on {socket.gethostname()}" in message
  assert re.search(r"\(heartbeat [0-2] s ago\)", message), message
  assert "--config.take_over_workdir=True" in message
  first.release()
  assert _gone(workdir)
  with lease_lib.acquire(workdir):
    assert _held(workdir)["pid"] == os.getpid()
  assert _gone(workdir)


def test_the_heartbeat_advances(workdir):
  with lease_lib.acquire(workdir, heartbeat_seconds=0.05):
    first = _held(workdir)["heartbeat"]
    deadline = time.time() + 10
    while _held(workdir)["heartbeat"] == first and time.time() < deadline:
      time.sleep(0.05)
    assert _held(workdir)["heartbeat"] > first


def _leave_lease(workdir, **fields):
  record = {"owner": "other", "host": "another-host", "pid": 1,
            "started": time.time(), "heartbeat": time.time(), **fields}
  storage.write_atomic(f"{workdir}/{lease_lib.LEASE}", json.dumps(record))


def _age_lease(workdir, seconds):
  """Makes the lease's last write `seconds` old by the storage's clock:
  locally its file time is set back; Cloud Storage sets an object's time
  itself, so there the test waits."""
  if storage.is_remote(workdir):
    time.sleep(seconds)
  else:
    then = time.time() - seconds
    os.utime(f"{workdir}/{lease_lib.LEASE}", (then, then))


def test_a_stale_lease_is_taken_over_and_said_so(workdir, caplog):
  _leave_lease(workdir)
  # Cloud Storage's object times may be whole seconds: wait past two.
  wait = 2.5 if storage.is_remote(workdir) else 500
  _age_lease(workdir, wait)
  with caplog.at_level(logging.WARNING):
    with lease_lib.acquire(workdir, stale_seconds=wait - 1):
      assert _held(workdir)["pid"] == os.getpid()
  assert re.search(r"pid 1 on another-host \(heartbeat (2|3|500) s ago\)",
                   caplog.text), caplog.text
  assert "its heartbeat is stale" in caplog.text


def test_staleness_never_compares_two_hosts_clocks(workdir):
  """A live owner whose clock is an hour behind (its recorded heartbeat an
  hour old) keeps its lease; so does one an hour ahead, against a reader
  whose clock is right."""
  for skew in (-3600, 3600):
    with lease_lib.acquire(workdir, clock=lambda s=skew: time.time() + s):
      assert abs(_held(workdir)["heartbeat"] - time.time() - skew) < 60
      with pytest.raises(lease_lib.WorkdirBusyError,
                         match=r"\(heartbeat [0-2] s ago\)"):
        lease_lib.acquire(workdir, stale_seconds=120)
    assert _gone(workdir)


def test_a_dead_owner_whose_clock_ran_ahead_goes_stale(tmp_path, caplog):
  """A lease whose recorded heartbeat lies in the future (its host's clock
  ran ahead) still goes stale when its file stops being written."""
  _leave_lease(tmp_path, heartbeat=time.time() + 3600)
  _age_lease(tmp_path, 500)
  with caplog.at_level(logging.WARNING):
    with lease_lib.acquire(str(tmp_path), stale_seconds=120):
      pass
  assert "(heartbeat 500 s ago): its heartbeat is stale" in caplog.text


@pytest.mark.parametrize("text", ["[1, 2]", '{"heartbeat": "soon"}', "\x00{",
                                  '"owner"'])
def test_a_damaged_lease_is_held_then_stale_in_one_line(tmp_path, text,
                                                         caplog):
  path = tmp_path / lease_lib.LEASE
  path.write_text(text, encoding="utf-8")
  with pytest.raises(lease_lib.WorkdirBusyError) as error:
    lease_lib.acquire(str(tmp_path))
  assert str(error.value) == (
      f"{tmp_path} is in use by another run: a lease being written or "
      "unreadable (heartbeat 0 s ago). Wait for it to end; if it was "
      "killed, its lease goes stale 120 s after its last heartbeat and is "
      "then taken over; to take it over now, rerun with "
      f"--config.take_over_workdir=True. If no run is using it and {path} "
      "stays unreadable, delete that file.")
  _age_lease(tmp_path, 500)
  with caplog.at_level(logging.WARNING):
    with lease_lib.acquire(str(tmp_path)):
      assert _held(tmp_path)["pid"] == os.getpid()
  assert "its heartbeat is stale" in caplog.text


def test_a_killed_runs_lease_on_this_host_is_taken_over_at_once(tmp_path,
                                                                caplog):
  ended = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                         capture_output=True, text=True, check=True)
  _leave_lease(tmp_path, host=socket.gethostname(), pid=int(ended.stdout),
               pid_namespace=lease_lib._pid_namespace())  # pylint: disable=protected-access
  with caplog.at_level(logging.WARNING):
    with lease_lib.acquire(str(tmp_path)):
      pass
  assert "its process is gone" in caplog.text


def test_a_live_lease_on_another_host_is_refused(workdir):
  _leave_lease(workdir)  # pid 1 exists here, but on "another-host"
  with pytest.raises(lease_lib.WorkdirBusyError,
                     match="pid 1 on another-host"):
    lease_lib.acquire(workdir)


def test_take_over_flag_and_the_old_owner_lets_go(workdir, caplog):
  old = lease_lib.acquire(workdir)
  with caplog.at_level(logging.WARNING):
    new = lease_lib.acquire(workdir, take_over=True)
  assert "--config.take_over_workdir=True" in caplog.text
  assert old.lost and not new.lost
  old.release()  # must not delete the new owner's lease
  assert _held(workdir)["owner"] == new.owner
  new.release()
  assert _gone(workdir)


@pytest.mark.long  # a CLI run; the refusal itself: the tests above
def test_a_second_training_run_on_a_busy_workdir_is_refused(dataset,
                                                            tmp_path):
  """The journey: a run (held at step 8 by a hook) owns its workdir; the
  same run started again refuses, naming the first, and changes nothing."""
  first = Run("first", tmp_path / "w", dataset, tmp_path, hang_at=8)
  try:
    deadline = time.time() + 300
    while "HOOK: holding at step 8" not in first.output:
      assert first.proc.poll() is None, first.describe()
      assert time.time() < deadline, first.describe()
      time.sleep(0.2)
    before = {p.name: p.read_bytes() for p in (tmp_path / "w").iterdir()
              if p.is_file() and p.name != lease_lib.LEASE}
    with pytest.raises(lease_lib.WorkdirBusyError,
                       match=f"pid {first.proc.pid} on "):
      pretrain.run(_config_of(first), first.workdir)
    assert before == {p.name: p.read_bytes() for p in (tmp_path / "w").iterdir()
                      if p.is_file() and p.name != lease_lib.LEASE}
    assert _held(first.workdir)["pid"] == first.proc.pid
  finally:
    first.proc.kill()
    first.wait()


def _config_of(run):
  """The config the CLI run recorded, as a ConfigDict."""
  import ml_collections  # pylint: disable=g-import-not-at-top
  with open(os.path.join(run.workdir, "config.json"), encoding="utf-8") as f:
    return ml_collections.ConfigDict(json.load(f))


def test_a_lease_being_written_is_held_not_stale(tmp_path):
  """A lease file created but not yet filled (or unreadable) counts as
  held, its file time standing for the heartbeat."""
  (tmp_path / lease_lib.LEASE).write_text("", encoding="utf-8")
  with pytest.raises(lease_lib.WorkdirBusyError,
                     match="a lease being written or unreadable"):
    lease_lib.acquire(str(tmp_path), stale_seconds=120)
  assert os.listdir(tmp_path) == [lease_lib.LEASE]  # no probe left


def test_a_pid_in_another_pid_namespace_is_not_judged_gone(tmp_path):
  ended = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                         capture_output=True, text=True, check=True)
  _leave_lease(tmp_path, host=socket.gethostname(), pid=int(ended.stdout),
               pid_namespace="pid:[another container]")
  with pytest.raises(lease_lib.WorkdirBusyError):
    lease_lib.acquire(str(tmp_path))


def test_a_run_whose_lease_is_taken_over_stops_without_saving(tmp_path):
  """After a takeover the old run raises before its next save, so its
  retention cannot delete the new owner's checkpoints."""
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from albert_jax.training import checkpoints  # pylint: disable=g-import-not-at-top
  from albert_jax.training import loop  # pylint: disable=g-import-not-at-top
  from training.test_loop import _config, _fake_step  # pylint: disable=g-import-not-at-top

  held = lease_lib.acquire(str(tmp_path))
  config = _config(checkpoint_every_steps=2)
  mngr = checkpoints.manager(str(tmp_path), async_save=False)

  def batches():
    for i in range(config.num_train_steps):
      if i == 5:  # what the heartbeat thread does when it finds another owner
        held.taken.set()
      yield i, None

  with pytest.raises(lease_lib.WorkdirBusyError,
                     match="taken over by another run at step 6"):
    loop.fit(loop.LoopOptions.from_config(config), loop.FitPlan(
        state={"step": jnp.zeros([], jnp.int32),
               "params": {"w": jnp.zeros(2)}},
        train_step=_fake_step(first_bad=100), batches=batches(),
        start_step=0, resumed=False, mngr=mngr, workdir=str(tmp_path),
        evaluate=None, flops_per_step=1.0,
        rows_per_step=config.batch_size, tokens_per_sequence=4,
        param_paths=["w"], lease=held))
  assert mngr.all_steps() == [2, 4]
  held.stop.set()


def test_one_of_many_takes_a_stale_lease_over(tmp_path):
  """Hosts polling a dead host's lease find it stale at one moment: the
  takeover is made under PATH.takeover, so one of them takes it over and
  the others find it live; the takeover file is gone after."""
  _leave_lease(tmp_path)
  _age_lease(tmp_path, 500)
  path = str(tmp_path / lease_lib.LEASE)
  start = threading.Barrier(8)

  def attempt(_):
    start.wait()
    try:
      return lease_lib.take(path)
    except lease_lib.WorkdirBusyError as e:
      return e

  with concurrent.futures.ThreadPoolExecutor(8) as pool:
    got = list(pool.map(attempt, range(8)))
  won = [g for g in got if isinstance(g, lease_lib.Lease)]
  assert len(won) == 1, got
  assert _held(tmp_path)["owner"] == won[0].owner
  # The others name the stale owner (they judged it while it was taken
  # over) or the new one.
  assert {e.held.get("owner") for e in got if e not in won} <= {
      "other", won[0].owner}
  won[0].release()
  assert not os.listdir(tmp_path)


def test_a_takeover_left_by_a_dead_taker_goes_stale(tmp_path, caplog):
  _leave_lease(tmp_path)
  _age_lease(tmp_path, 500)
  lock = tmp_path / (lease_lib.LEASE + lease_lib.TAKEOVER)
  lock.write_text('{"owner": "a taker that died"}', encoding="utf-8")
  with pytest.raises(lease_lib.WorkdirBusyError,
                     match="is being taken over by another run this moment"):
    lease_lib.acquire(str(tmp_path))
  then = time.time() - 500
  os.utime(lock, (then, then))
  with caplog.at_level(logging.WARNING):
    with lease_lib.acquire(str(tmp_path)):
      assert _held(tmp_path)["pid"] == os.getpid()
  assert f"Removing {lock}, left 500 s ago" in caplog.text
  assert not lock.exists()


def test_a_noted_record_kept_and_taken_over_by_name(tmp_path):
  """A sweep's claim on a trial that failed: the failure noted, the file
  kept when released, judged as any lease whose heartbeat stopped (live
  until stale, its process alive); `over=` its owner takes it at once."""
  path = str(tmp_path / "claim.json")
  held = lease_lib.take(path)
  held.note(failed=True)
  held.release(keep=True)
  record, age = lease_lib.look(path)
  assert (record["failed"], record["owner"], record["pid"]) == (
      True, held.owner, os.getpid())
  assert 0 <= age < 60
  with pytest.raises(lease_lib.WorkdirBusyError) as error:
    lease_lib.take(path)
  assert error.value.held["failed"] and error.value.age < 60
  again = lease_lib.take(path, over=held.owner)
  assert "failed" not in lease_lib.look(path)[0]
  again.release()
  assert lease_lib.look(path) is None and not os.listdir(tmp_path)


def test_take_and_look_need_no_jax(tmp_path):
  """The sweep takes its claims in a process that must not start JAX (its
  trials need the host's chips): `take` and `look` import none of it."""
  code = textwrap.dedent(f"""\
      import sys
      from albert_jax.training import lease
      held = lease.take({str(tmp_path / "claim.json")!r})
      print(lease.look(held.path)[0]["owner"] == held.owner)
      held.release()
      print([m for m in ("jax", "jaxlib") if m in sys.modules])
      """)
  result = subprocess.run([sys.executable, "-c", code], capture_output=True,
                          text=True, check=True, cwd=REPO)
  assert result.stdout == "True\n[]\n"
  assert not os.listdir(tmp_path)
