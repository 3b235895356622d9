"""`python -m albert_jax.main` with a SIGKILL planned at a chosen moment.

tests/training/test_crash_survival.py runs this in place of the CLI (same arguments)
to kill a training run at a reproducible kind of moment, chosen by the
environment variable CRASH_PLAN:

  time:U      SIGKILL U seconds after the interpreter starts: during
              imports, restore, tracing or training, wherever it is (a
              launch that gets to its last step first waits there).
  step:K:V    SIGKILL V·20 ms after the loader hands out step K (0-based:
              the step that turns state K into state K+1).
  write:C:V   SIGKILL while checkpoint C is being written asynchronously:
              once 1 + ⌊V·12⌋ of its files exist in its temporary directory
              (a complete one has 18), or at once if it was already renamed
              into place.
  (unset)     no kill: run to the end.

Nothing in the trainer changes. The kill comes from a daemon thread, so, as
an external SIGKILL would, it lands wherever the main thread (or orbax's
writer threads) happen to be. Lines starting "CRASH:" report what happened,
for the test's checks and its failure messages: the step restored at
start-up, the first step trained, and where the kill landed.
"""

import glob
import os
import signal
import sys
import threading
import time

_START = time.monotonic()

WRITE_FILES = 12
STEP_WINDOW = 0.02  # seconds


def report(message):
  print(f"CRASH: {message} at {time.monotonic() - _START:.3f}s", flush=True)


def kill(where):
  report(f"SIGKILL {where}")
  os.kill(os.getpid(), signal.SIGKILL)


def later(seconds, where):
  timer = threading.Timer(seconds, kill, args=(where,))
  timer.daemon = True
  timer.start()


def kill_during_write(directory, step, wanted):
  """Polls the save's temporary directory; kills once it holds `wanted`
  files, or right away if the write has already been renamed into place."""
  pattern = os.path.join(directory, f"{step}.orbax-checkpoint-tmp*")
  while True:
    tmp = glob.glob(pattern)
    if tmp:
      written = sum(len(files) for _, _, files in os.walk(tmp[0]))
      if written >= wanted:
        kill(f"during the write of checkpoint {step} ({written} files "
             "written)")
    elif os.path.isdir(os.path.join(directory, str(step))):
      kill(f"after the write of checkpoint {step} (complete)")
    time.sleep(0.0005)


def install(kind, target, fraction):
  """Wraps the restore, the loader and the save to report and to kill."""
  from albert_jax.data import loader  # pylint: disable=import-outside-toplevel
  from albert_jax.training import checkpoints  # pylint: disable=import-outside-toplevel

  restore_latest = checkpoints.restore_latest

  def restore_hook(mngr, *args, **kwargs):
    out = restore_latest(mngr, *args, **kwargs)
    report(f"restored {'none' if out is None else int(out[1]['step'])}")
    return out

  iterate = loader.Loader.iterate

  def iterate_hook(self, start_step=0, num_steps=None):
    last = start_step + (num_steps or 0) - 1
    for step, batch in iterate(self, start_step, num_steps):
      if step == start_step:
        report(f"first step {step}")
      if kind == "step" and step == target:
        later(fraction * STEP_WINDOW, f"in step {step}")
      if kind == "time" and step == last:
        report(f"holding at step {step} for the timed kill")
        time.sleep(3600)
      yield step, batch

  save = checkpoints.save

  def save_hook(mngr, state, *args, **kwargs):
    started = save(mngr, state, *args, **kwargs)
    step = int(state["step"])
    if kind == "write" and started and step == target:
      threading.Thread(
          target=kill_during_write, daemon=True,
          args=(str(mngr.directory), step,
                1 + int(fraction * WRITE_FILES))).start()
    return started

  checkpoints.restore_latest = restore_hook
  loader.Loader.iterate = iterate_hook
  checkpoints.save = save_hook


def main():
  plan = os.environ.get("CRASH_PLAN", "")
  kind, *values = plan.split(":") if plan else ("",)
  if kind == "time":
    later(float(values[0]), f"{float(values[0]):.3f}s into the launch")
    install(kind, -1, 0.0)
  elif kind in ("step", "write"):
    install(kind, int(values[0]), float(values[1]))
  elif not kind:
    install(kind, -1, 0.0)  # only reports the restored and first steps
  else:
    raise ValueError(f"Unknown CRASH_PLAN {plan!r}.")
  from albert_jax import main as cli  # pylint: disable=import-outside-toplevel
  sys.argv = ["albert_jax.main"] + sys.argv[1:]
  cli.run()


if __name__ == "__main__":
  main()
