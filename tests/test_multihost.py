"""Two processes, one 8-device system: sharded training and checkpoints.

Two local processes (tests/multihost_worker.py) join through
`jax.distributed.initialize(coordinator_address="127.0.0.1:<port>", ...)`,
each with 4 fake CPU devices; cross-process collectives go through gloo.
Each builds a mesh over all 8 devices (data 2 × fsdp 2 × tensor 2, so the
data axis spans the processes and parameters are split across them), creates
the sharded state, trains on global batches to which it contributes its own
rows, saves an asynchronous orbax checkpoint to a shared directory, restores
it and takes one more step. A single process with 8 devices runs the same
steps as the reference.

All three run at once as subprocesses, with a deadline: a hang (a collective
or barrier waiting for a peer that died) fails the test instead of blocking
CI, and every worker's stderr is shown.
"""

import json
import socket
import subprocess
import sys
import time

import multihost_worker
import pytest
import sharding_worker

DEADLINE_S = 420
TOLERANCE = 1e-5
PROCESSES = 2


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _launch(directory, name, *args):
  # Closed by _run_all once the process has exited.
  log = open(directory / f"{name}.log", "w")  # pylint: disable=R1732
  proc = subprocess.Popen(
      [sys.executable, multihost_worker.__file__,
       f"--out={directory / (name + '.json')}", *args],
      env=sharding_worker.subprocess_env(sharding_worker.NUM_DEVICES),
      stdout=log, stderr=subprocess.STDOUT, text=True)
  proc.log = log
  return proc


def _tail(directory, name, chars=6000) -> str:
  text = (directory / f"{name}.log").read_text(errors="replace")
  lines = [l for l in text.splitlines() if not l.startswith("[Gloo]")]
  return "\n".join(lines)[-chars:]


def _run_all(directory):
  """Starts the two processes and the reference; waits for all of them."""
  port = _free_port()
  procs = {
      f"process{i}": _launch(directory, f"process{i}",
                             f"--num_processes={PROCESSES}",
                             f"--process_id={i}", f"--port={port}",
                             f"--workdir={directory / 'multi'}")
      for i in range(PROCESSES)}
  procs["reference"] = _launch(directory, "reference", "--num_processes=1",
                               f"--workdir={directory / 'single'}")
  deadline = time.monotonic() + DEADLINE_S
  failed = None
  try:
    while any(p.poll() is None for p in procs.values()):
      failed = [n for n, p in procs.items() if p.poll() not in (None, 0)]
      if failed:
        break  # its peer would wait for it until the deadline
      if time.monotonic() > deadline:
        failed = [n for n, p in procs.items() if p.poll() is None]
        break
      time.sleep(0.2)
    failed = failed or [n for n, p in procs.items() if p.returncode != 0]
  finally:
    for p in procs.values():
      if p.poll() is None:
        p.kill()
      p.wait()
      p.log.close()
  if failed:
    report = "\n".join(
        f"===== {name} (exit {procs[name].returncode}) =====\n"
        f"{_tail(directory, name)}" for name in procs)
    print(report)
    raise RuntimeError(f"{failed} failed or hung past {DEADLINE_S}s:\n"
                       + report)
  return {name: json.loads((directory / f"{name}.json").read_text())
          for name in procs}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
  return sharding_worker.run_once("multihost", tmp_path_factory, _run_all)


def test_processes_form_one_8_device_system(runs):
  rows = []
  for i in range(PROCESSES):
    r = runs[f"process{i}"]
    assert r["process_index"] == i
    assert r["process_count"] == PROCESSES
    assert r["device_count"] == 8 and r["local_device_count"] == 4
    assert r["mesh"] == dict(multihost_worker.MESH)
    # Really multi-host: no process holds a whole batch or parameter set.
    assert not r["batch_fully_addressable"]
    assert not r["params_fully_addressable"]
    rows.append(r["local_rows"])
  # Process p contributed rows [p·B/2, (p+1)·B/2) of every global batch:
  # the slice the data loader reads for it.
  half = sharding_worker.BATCH_SIZE // PROCESSES
  assert rows == [[i * half, (i + 1) * half] for i in range(PROCESSES)]
  ref = runs["reference"]
  assert ref["process_count"] == 1 and ref["local_device_count"] == 8
  assert ref["batch_fully_addressable"] and ref["params_fully_addressable"]


def test_losses_match_single_process(runs):
  want = runs["reference"]["losses"]
  assert len(want) == multihost_worker.NUM_STEPS + 1
  assert all(0 < x < 20 for x in want), want
  assert len(set(want)) == len(want), want  # steps differ: not one value
  for i in range(PROCESSES):
    got = runs[f"process{i}"]["losses"]
    assert got == runs["process0"]["losses"]  # replicated metrics agree
    assert len(got) == len(want)
    assert max(abs(a - b) for a, b in zip(got, want)) <= TOLERANCE, (got,
                                                                     want)


@pytest.mark.parametrize("name", [f"process{i}" for i in range(PROCESSES)]
                         + ["reference"])
def test_checkpoint_restores_the_live_state(runs, name):
  r = runs[name]
  assert r["saved"]
  assert r["steps_on_disk"] == [multihost_worker.NUM_STEPS]
  assert r["meta"] == {"step": multihost_worker.NUM_STEPS}
  assert r["restored_step"] == multihost_worker.NUM_STEPS
  compare = r["compare"]
  assert not compare["problems"], "\n".join(compare["problems"])
  assert compare["leaves"] > 50
  # Every local device's shard of every leaf was compared.
  assert compare["shards"] == compare["leaves"] * r["local_device_count"]
  # The step taken from the restored state is the one the live state takes.
  assert r["losses"][-1] == r["uninterrupted_loss"]
