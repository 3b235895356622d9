"""The sweep and the report with gs:// workdirs (the Cloud Storage
emulator).

The sweep launches a fake trainer that writes its final_metrics.json through
`albert_jax.storage`, as the real one does; the report reads runs uploaded
from the fake workdirs test_report builds.
"""

import concurrent.futures
import os
import socket
import textwrap
import threading
import time

from locations import CONFIGS
import pytest
# test_report's fake runs, as the fixture `runs` here too.
from test_report import fixture_runs  # noqa: F401  pylint: disable=unused-import

from albert_jax import storage
from albert_jax.tools import report
from albert_jax.tools import sweep

FAKE_MAIN = textwrap.dedent("""\
    import json, sys
    from albert_jax import storage
    args = dict(a.split("=", 1) for a in sys.argv[1:])
    workdir = args["--workdir"]
    print("fake main starting in", workdir)
    lr = float(args["--config.optimizer.learning_rate"])
    storage.write_atomic(f"{workdir}/final_metrics.json", json.dumps(
        {"step": 30, "eval_mlm_accuracy": lr * 100}))
    print("fake main done")
    """)


def test_sweep_runs_into_a_gcs_workdir_root(gcs_bucket, tmp_path,
                                            monkeypatch, capsys):
  monkeypatch.chdir(tmp_path)  # where the live logs go
  fake = tmp_path / "fake_main.py"
  fake.write_text(FAKE_MAIN)
  spec = tmp_path / "sw.py"
  spec.write_text(textwrap.dedent(f"""\
      from albert_jax.tools import sweep
      CONFIG = {str(CONFIGS / "tiny.py")!r}
      def get_sweep(arg=None):
        return sweep.axis("config.optimizer.learning_rate", [0.001, 0.002])
      """))
  root = f"{gcs_bucket}/lr"
  argv = [str(spec), f"--workdir_root={root}/", f"--main_module={fake}"]
  assert sweep.main(argv) == 0
  out = capsys.readouterr().out
  names = ["optimizer.learning_rate=0.001", "optimizer.learning_rate=0.002"]
  assert f"[1/2] {names[0]}: running, log in sweep_logs/{names[0]}.log" in out
  for name, accuracy in zip(names, (0.1, 0.2)):
    assert sweep.read_metrics(f"{root}/{name}") == {
        "step": 30, "eval_mlm_accuracy": accuracy}
    # The log is kept with the run, not only on this machine's disk.
    assert storage.path(f"{root}/{name}/sweep.log").read_text() == (
        f"fake main starting in {root}/{name}\nfake main done\n")
  table = (
      "| trial | status | optimizer.learning_rate | step | eval_mlm_accuracy "
      "|\n|---|---|---|---|---|\n"
      f"| {names[0]} | ok | 0.001 | 30 | 0.1 |\n"
      f"| {names[1]} | ok | 0.002 | 30 | 0.2 |")
  assert storage.path(f"{root}/results.md").read_text() == (
      f"# Sweep `{spec}`\n\nBase config `{CONFIGS / 'tiny.py'}`, workdirs "
      f"under `{root}/`.\n\n{table}\n")
  # Again: both trials are found done in the bucket and skipped.
  assert sweep.main(argv) == 0
  out = capsys.readouterr().out
  assert f"[1/2] {names[0]}: done, skipped" in out
  assert f"[2/2] {names[1]}: done, skipped" in out


def test_two_processes_claim_one_gcs_trial_once(gcs_bucket):
  """Two hosts claim one trial at the same moment: of the two creates (the
  precondition ifGenerationMatch=0), one succeeds; the other is told who
  holds the trial. Its release deletes the claim."""
  workdir = f"{gcs_bucket}/lr/seed=1"
  start = threading.Barrier(2)

  def attempt(_):
    start.wait()
    return sweep.claim(workdir, sweep.Timing(), time.monotonic())

  with concurrent.futures.ThreadPoolExecutor(2) as pool:
    got = dict(pool.map(attempt, range(2)))
  assert sorted(got) == ["held", "run"]
  assert got["held"] == f"pid {os.getpid()} on {socket.gethostname()}"
  got["run"].release()
  assert not storage.path(f"{workdir}/{sweep.CLAIM}").exists()


def test_sweep_files_must_be_local(gcs_bucket):
  with pytest.raises(sweep.SweepError) as error:
    sweep.load_sweep(f"{gcs_bucket}/sw.py")
  assert str(error.value) == (
      f"{gcs_bucket}/sw.py: sweep and config files are Python modules, "
      "imported from the local disk; copy it here (gsutil cp) and give the "
      "local path.")


def _upload(local, remote: str) -> None:
  """Copies the tree under `local` (a pathlib.Path) to `remote`."""
  for path in local.rglob("*"):
    if path.is_file():
      storage.path(f"{remote}/{path.relative_to(local).as_posix()}"
                   ).write_bytes(path.read_bytes())


def test_report_reads_gcs_runs_and_writes_into_gcs(runs, gcs_bucket,
                                                  tmp_path, capsys):
  local_runs = sorted(runs)  # the order the pattern expands to
  _upload(tmp_path / "sweep", f"{gcs_bucket}/sweep")
  assert report.main([*local_runs, f"--out={tmp_path}/out"]) == 0
  capsys.readouterr()
  # A quoted pattern: the report expands it, as no shell expands gs://.
  assert report.main([f"{gcs_bucket}/sweep/*/",
                      f"--out={gcs_bucket}/out/"]) == 0
  printed = capsys.readouterr().out
  assert printed.endswith(f"\nWrote {gcs_bucket}/out/report.md and "
                          f"{gcs_bucket}/out/curves.png.\n")
  for name in (report.TABLE_FILE, report.CURVES_FILE):
    assert storage.path(f"{gcs_bucket}/out/{name}").read_bytes() == (
        tmp_path / "out" / name).read_bytes(), name
  run = report.load_run(f"{gcs_bucket}/sweep/share=all/")
  assert (run.name, run.path) == ("share=all", f"{gcs_bucket}/sweep/share=all")
  assert run.scalars == report.load_run(local_runs[1]).scalars
  with pytest.raises(report.ReportError) as error:
    report.expand_run_dirs([f"{gcs_bucket}/other/*/"])
  assert str(error.value) == (
      f"{gcs_bucket}/other/*/ matches no directory; give the workdirs of "
      "pre-training runs (e.g. a sweep's WORKDIR_ROOT/*/).")
  storage.path(f"{gcs_bucket}/unfinished/config.json").write_text(
      storage.path(f"{local_runs[0]}/config.json").read_text())
  with pytest.raises(report.ReportError) as error:
    report.load_run(f"{gcs_bucket}/unfinished")
  assert str(error.value) == (
      f"{gcs_bucket}/unfinished is not a finished pre-training run (a "
      "workdir of python -m albert_jax.main): it has no final_metrics.json, "
      "which the trainer writes when training ends; rerun the same command "
      "to finish it.")
