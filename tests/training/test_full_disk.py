"""A full disk at the command line: one `error:` line naming what failed,
what is intact and the fix; nothing partial left; the rerun goes on.

The disk fills for real: the kernel refuses writes past a file-size limit
(RLIMIT_FSIZE, with SIGXFSZ ignored as Python does, so `write` fails with
EFBIG as it fails with ENOSPC on a full disk). The limit needs no
privileges, applies to the run's own files only, and leaves its output,
read through pipes, whole.

  1. Pre-training: the limit drops while the run trains, after the save of
     step 2 is done, so the save of step 4 fails in orbax's background
     writes. The command prints one line and no traceback (orbax's threads,
     asyncio and tensorstore report the failure 30 times, 500 lines
     without `checkpoints.hide_failed_write_reports`); a rerun with room
     resumes from step 2.
  2. Training the run's tokenizer: SentencePiece does not check its model's
     write; the truncated model is caught and removed.
"""

import os
import resource
import subprocess
import sys


from locations import REPO
from plugin_noise import without_plugin_noise

SEQ = 32

# At step $FULL_AT the save first waits for the previous one, then the
# process's files may no longer grow past $FULL_LIMIT bytes.
_HOOK = r"""
import os, resource, sys
import jax
from albert_jax.training import checkpoints
_real_save = checkpoints.save

def _save(mngr, state, meta, **kwargs):
  if int(jax.device_get(state["step"])) == int(os.environ["FULL_AT"]):
    mngr.wait_until_finished()
    limit = int(os.environ["FULL_LIMIT"])
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    print("HOOK: the disk is full", flush=True)
  return _real_save(mngr, state, meta, **kwargs)

checkpoints.save = _save
from albert_jax import main
sys.argv = ["albert_jax.main"] + sys.argv[1:]
main.run()
"""


def _run(args, tmp_path, preexec_fn=None, **env):
  return subprocess.run(
      [sys.executable, "-c", _HOOK, *args], cwd=REPO, capture_output=True,
      text=True, timeout=300, check=False, preexec_fn=preexec_fn,
      # No .pyc writes: under the file-size limit Python's raw write of a
      # module's bytecode stops short without an error, and the truncated
      # file would break every later import of that module.
      env={**os.environ, "JAX_PLATFORMS": "cpu",
           "PYTHONDONTWRITEBYTECODE": "1",
           # As test_resume's runs (same flags, same config): the session's
           # compilation cache (conftest) then holds this run's programs.
           "XLA_FLAGS": "--xla_backend_optimization_level=0",
           "FULL_AT": "-1", "FULL_LIMIT": "0", **env})


def _errors(out) -> list[str]:
  """The lines of the run's output that are not progress or logging."""
  return [line for line in without_plugin_noise(out.stderr).splitlines()
          if line.strip() and line[:1] not in "IW" and "it/s" not in line]


def test_a_checkpoint_save_on_a_full_disk_is_one_line_and_resumes(
    tiny_sop_dataset, tmp_path):
  tokenizer, data = tiny_sop_dataset
  workdir = tmp_path / "run"
  # test_resume's run (its programs are compiled once per session), with a
  # checkpoint every 2 steps, all kept.
  args = ["--config=configs/tiny.py:dropout=0.1", f"--workdir={workdir}",
          f"--config.data.tokenizer={tokenizer}",
          f"--config.data.data_dir={data}", "--config.model.vocab_size=300",
          f"--config.model.max_position_embeddings={SEQ}",
          f"--config.data.max_seq_length={SEQ}",
          "--config.masking.max_predictions=5", "--config.batch_size=8",
          "--config.num_train_steps=6", "--config.optimizer.warmup_steps=2",
          "--config.checkpoint_every_steps=2", "--config.keep_checkpoints=10",
          "--config.eval_batches=0", "--config.fast_compile=true"]
  # Under the checkpoint's smallest file (its shardings, 33 KB here).
  out = _run(args, tmp_path, FULL_AT="4", FULL_LIMIT="16000")
  assert out.returncode == 1, out.stderr[-4000:]
  assert "HOOK: the disk is full" in out.stdout
  text = out.stdout + out.stderr
  assert "Traceback" not in text and "Event loop is closed" not in text, (
      text[-4000:])
  errors = _errors(out)
  assert len(errors) == 1, "\n".join(e[:300] for e in errors[:8])
  line = errors[0]
  assert line.startswith(
      f"error: Writing checkpoint step 4 to {workdir}/checkpoints failed "
      f"(File too large, writing {workdir}/checkpoints/4.orbax-checkpoint-"
      "tmp/"), line
  assert line.endswith(
      "). The complete checkpoints (steps [2]) are intact and the "
      "incomplete one is never restored: a rerun resumes from step 2. Free "
      "space on that disk (or lower config.keep_checkpoints, or choose "
      "another --workdir) and run again."), line

  rerun = _run(args, tmp_path)
  assert rerun.returncode == 0, rerun.stderr[-4000:]
  assert f"Resumed from step 2 in {workdir}." in rerun.stderr
  assert sorted(os.listdir(workdir / "checkpoints"), key=int) == [
      "2", "4", "6"]


def test_training_the_tokenizer_on_a_full_disk_is_one_line(tiny_spm,
                                                          tmp_path):
  corpus = os.path.join(os.path.dirname(tiny_spm), "corpus.txt")
  workdir = tmp_path / "run"

  def full_disk():  # the model (about 240 KB) cannot be written whole
    resource.setrlimit(resource.RLIMIT_FSIZE, (65536, 65536))

  out = _run(["--config=configs/tiny.py", f"--workdir={workdir}",
              f"--config.data.corpus={corpus}",
              "--config.model.vocab_size=300"], tmp_path,
             preexec_fn=full_disk)
  assert out.returncode == 1, out.stderr[-4000:]
  assert "Traceback" not in out.stderr, out.stderr[-4000:]
  assert _errors(out) == [
      f"error: Writing the SentencePiece model into {workdir}/spm failed "
      "(65536 bytes written, which do not parse): the disk is full, or the "
      "folder is not writable. Free space there (or choose another folder) "
      "and run again; no partial model is left."]
  assert os.listdir(workdir / "spm") == []
