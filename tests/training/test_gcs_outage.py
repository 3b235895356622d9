"""A training run in Cloud Storage rides out storage outages, a 60 s one
during a checkpoint upload included, and its checkpoints resume bitwise.

`python -m albert_jax.main` trains 12 steps (a checkpoint every 3) with its
workdir and prepared data in a bucket of a restartable emulator
(`restartable_gcs`: objects on disk, so they outlive a restart). The
emulator is stopped (SIGKILL: connections refused) twice and started again
on the same port (`OUTAGES`):

  1. for 8 s, just before the save of step 6, once the commit of step 3 is
     done, so that the save starts into the outage, while the loader reads
     the next batches from the bucket;
  2. for 60 s, just after the final save (step 12) has started, while its
     upload runs in the background (a 25 s outage during an upload ended a
     run with exit 1: orbax's metadata write through gcsfs lost its upload
     session, and gcsfs gives up after 6 tries, about 31 s, anyway), and
     the run's last writes (the final commit, goodput, the lease). The
     upload is in flight when the emulator stops if the hook says so ("a
     save in flight: True", always so on the 2-core test host); then its
     retries must be logged.

Retry waits are scaled down (0.2 s to 1 s); the deadline is the default,
180 s, which a 60 s outage must fit in with room. The 60 s outage comes
after the last step because ArrayRecord's reader (the prepared shards)
retries in its own client, whose waits grow past such an outage's end (a
minute more of stalled loader, which RELIABILITY.md records from a run by
hand); the 8 s one meets the loader. The run must finish with exit 0, every
checkpoint committed; then the checkpoints after step 6 are deleted and a
rerun resumes from the one written into the first outage and ends bitwise
where the first run did. The outages are slept through: the test's CPU
time is its two short runs.
"""

import os
import subprocess
import sys
import time

import numpy as np
import pytest
from restartable_gcs import Emulator

from albert_jax import retry
from albert_jax import storage
from locations import REPO
from training.test_resume import _HOOK  # pylint: disable=g-bad-import-order

# The save of a step → (when the storage goes down: just before the save,
# or just after it has started; for how many seconds).
OUTAGES = {6: ("before", 8.0), 12: ("after", 60.0)}
STEPS, EVERY, SEQ = 12, 3, 32
TIMEOUT = 300

# Before test_resume's hook (which dumps the final parameters and runs the
# CLI): at the steps in $OUTAGE_AT ("6:before,12:after"), the save asks the
# test for an outage and goes on once the emulator is down.
_OUTAGE_HOOK = r"""
import os, time
import jax
from albert_jax.training import checkpoints

_at = dict(x.split(":") for x in os.environ.get("OUTAGE_AT", "").split(",")
           if x)
_real_save = checkpoints.save

def _outage(mngr, step):
  folder = os.environ["OUTAGE_DIR"]
  open(os.path.join(folder, f"stop-{step}"), "w").close()
  deadline = time.time() + 60
  while (not os.path.exists(os.path.join(folder, f"stopped-{step}"))
         and time.time() < deadline):
    time.sleep(0.01)
  print(f"HOOK: outage at the save of step {step}; a save in flight: "
        f"{mngr.is_saving_in_progress()}", flush=True)

def _save(mngr, state, meta, **kwargs):
  step = int(jax.device_get(state["step"]))
  if _at.get(str(step)) == "before":
    # The previous commit first: else the save would wait through the
    # outage for it and start its own writes only after it.
    mngr.wait_until_finished()
    _outage(mngr, step)
  started = _real_save(mngr, state, meta, **kwargs)
  if _at.get(str(step)) == "after":
    _outage(mngr, step)
  return started

checkpoints.save = _save
"""


@pytest.fixture(name="gcs")
def fixture_gcs(tmp_path, monkeypatch):
  server = Emulator(tmp_path / "gcs_root", tmp_path / "gcs.log")
  server.start()
  # This process's own gcsfs and google-cloud-storage calls (copying the
  # data in, deleting checkpoints) go to it too.
  monkeypatch.setenv(storage.EMULATOR, server.url)
  yield server
  server.stop()


def _env(gcs, tmp_path, **extra) -> dict:
  env = {**os.environ, "JAX_PLATFORMS": "cpu",
         # The session's compilation cache (conftest's
         # JAX_COMPILATION_CACHE_DIR): test_resume's runs compile the same
         # programs (same flags, same config).
         "XLA_FLAGS": "--xla_backend_optimization_level=0",
         # Every layer to this emulator (this process may hold another's).
         storage.EMULATOR: gcs.url, "TENSORSTORE_GCS_HTTP_URL": gcs.url,
         "CLOUD_STORAGE_EMULATOR_ENDPOINT": gcs.url,
         retry.ENV_INITIAL: "0.2", retry.ENV_MAXIMUM: "1"}
  env.pop(retry.ENV_DEADLINE, None)  # the default's 180 s
  env.update(extra)
  return env


def _start(args, env, log):
  with open(log, "w", encoding="utf-8") as f:
    return subprocess.Popen([sys.executable, "-c", _OUTAGE_HOOK + _HOOK,
                             *args], cwd=REPO, env=env, stdout=f,
                            stderr=subprocess.STDOUT)


def _finish(proc, log) -> str:
  try:
    proc.wait(timeout=TIMEOUT)
  finally:
    if proc.poll() is None:
      proc.kill()
      proc.wait()
  text = log.read_text(encoding="utf-8")
  assert proc.returncode == 0, text[-6000:]
  return text


def test_a_run_rides_out_outages_during_checkpoint_saves(gcs, tiny_sop_dataset,
                                                         tmp_path):
  tokenizer, local_data = tiny_sop_dataset
  bucket = gcs.bucket()
  data_dir, workdir = f"{bucket}/data", f"{bucket}/run"
  for f in storage.path(local_data).iterdir():
    if f.is_file():
      storage.write_atomic(f"{data_dir}/{f.name}", f.read_bytes())
  args = ["--config=configs/tiny.py:dropout=0.1", f"--workdir={workdir}",
          f"--config.data.tokenizer={tokenizer}",
          f"--config.data.data_dir={data_dir}",
          "--config.model.vocab_size=300",
          f"--config.model.max_position_embeddings={SEQ}",
          f"--config.data.max_seq_length={SEQ}",
          "--config.masking.max_predictions=5", "--config.batch_size=8",
          f"--config.num_train_steps={STEPS}",
          "--config.optimizer.warmup_steps=2",
          f"--config.checkpoint_every_steps={EVERY}",
          "--config.keep_checkpoints=10", f"--config.log_every_steps={EVERY}",
          "--config.eval_batches=0", "--config.fast_compile=True"]
  signals = tmp_path / "signals"
  signals.mkdir()
  log = tmp_path / "outages.log"
  proc = _start(args, _env(gcs, tmp_path, OUTAGE_AT=",".join(
                               f"{k}:{when}" for k, (when, _) in OUTAGES.items()),
                           OUTAGE_DIR=str(signals),
                           RESUME_TEST_DUMP=str(tmp_path / "first.npz")),
                log)
  deadline = time.monotonic() + TIMEOUT
  for step, (_, seconds) in OUTAGES.items():
    while not (signals / f"stop-{step}").exists():
      assert proc.poll() is None, log.read_text(encoding="utf-8")[-6000:]
      assert time.monotonic() < deadline, f"never reached the save of {step}"
      time.sleep(0.01)
    gcs.stop()
    (signals / f"stopped-{step}").touch()
    time.sleep(seconds)
    gcs.start()
  first = _finish(proc, log)
  assert f"Finished at step {STEPS}." in first
  assert "kept failing" not in first
  # Each outage met checkpoint writes, retried and logged by name: the save
  # of step 6 started into the first, and the upload of step 12 still in
  # flight when the second (60 s) began (the failure seen).
  windows = first.split("HOOK: outage at the save of step ")[1:]
  assert [w.split(";")[0] for w in windows] == ["6", "12"], first
  for window in windows:
    retried = [line for line in window.splitlines()[1:]
               if "; retry " in line and f"{workdir}/checkpoints/" in line]
    in_flight = window.splitlines()[0].endswith("in flight: True")
    if in_flight or window.startswith("6;"):
      assert retried, window
  steps = sorted(int(p.name) for p in
                 storage.path(f"{workdir}/checkpoints").iterdir()
                 if p.name.isdigit())
  assert steps == [3, 6, 9, 12]

  # The checkpoint written during the first outage is whole: resuming from
  # it ends bitwise where the first run ended.
  for step in (9, 12):
    storage.path(f"{workdir}/checkpoints/{step}").rmtree()
  second = _finish(_start(args, _env(
      gcs, tmp_path, RESUME_TEST_DUMP=str(tmp_path / "second.npz")),
                          tmp_path / "resumed.log"), tmp_path / "resumed.log")
  assert f"Resumed from step 6 in {workdir}." in second
  want, got = np.load(tmp_path / "first.npz"), np.load(tmp_path / "second.npz")
  assert sorted(want.files) == sorted(got.files) and want.files
  for key in want.files:
    np.testing.assert_array_equal(got[key], want[key], err_msg=key)
