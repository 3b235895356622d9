"""albert_jax.tools.sweep: trial expansion, names, validation, commands, local runs.

The local runs launch a fake trainer (a short script written by the tests,
given with --main_module) that records its arguments and writes
final_metrics.json, so a whole sweep takes well under a second. It also
records when it ran and the device-pinning variables it was given, from
which the device-group tests check that no two trials held one group at
once (the groups of a fake host said with --platform and --num_devices).
The claims (several processes of one command sharing its trials out, as the
hosts of a TPU slice do) are checked with two processes of the command
started together through DRIVER, and with claims written by hand for
another host.
"""

import collections
import json
import os
import re
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from albert_jax.tools import device_groups
from albert_jax.tools import sweep
from locations import REPO


# The variables that pin a trial to devices (device_groups.py).
PINS = ("CUDA_VISIBLE_DEVICES", "TPU_VISIBLE_CHIPS",
        "TPU_CHIPS_PER_PROCESS_BOUNDS", "TPU_PROCESS_BOUNDS",
        "TPU_PROCESS_PORT", "TPU_PROCESS_ADDRESSES", "CLOUD_TPU_TASK_ID",
        "ALLOW_MULTIPLE_LIBTPU_LOAD", "TPU_HOST_BOUNDS",
        "TPU_CHIPS_PER_HOST_BOUNDS", "TPU_WORKER_ID", "TPU_WORKER_HOSTNAMES",
        "XLA_PYTHON_CLIENT_MEM_FRACTION")

FAKE_MAIN = f"PINS = {PINS!r}\n" + textwrap.dedent("""\
    import json, os, sys, time
    start = time.time()
    args = dict(a.split("=", 1) for a in sys.argv[1:])
    workdir = args["--workdir"]
    os.makedirs(workdir, exist_ok=True)
    with open(os.path.join(os.path.dirname(workdir), "calls.txt"), "a") as f:
      f.write(json.dumps(sys.argv[1:]) + "\\n")
    print("fake main starting in", workdir)
    with open(os.path.join(workdir, "times.json"), "w") as f:
      json.dump([time.time(), os.environ.get("XLA_PYTHON_CLIENT_MEM_FRACTION"),
                 os.environ.get("FAKE_SLEEP")], f)
    time.sleep(float(os.environ.get("FAKE_SLEEP", "0")))
    if args.get("--config.seed") == "7":
      time.sleep(0.5)  # long enough for a live status line
    lr = float(args.get("--config.optimizer.learning_rate", "0.001"))
    if lr > 0.05:
      print("loss is nan at step 3", file=sys.stderr)
      sys.exit(3)
    if lr > 0.02:
      sys.exit(0)  # "succeeds" without final metrics
    with open(os.path.join(workdir, "final_metrics.json"), "w") as f:
      json.dump({"step": 30, "eval_mlm_accuracy": lr * 100,
                 "eval_sop_accuracy": 0.5}, f)
    with open(os.path.join(workdir, "devices.json"), "w") as f:
      json.dump({"start": start, "end": time.time(), "env": {
          k: os.environ.get(k) for k in PINS}}, f)
    print("fake main done")
    """)


# `python DRIVER SYNC MODULE ARGS...`: albert_jax.tools.MODULE's command,
# its claims looked at again every 0.05 s rather than 15. It starts when the
# test says so (SYNC.go), after saying it is ready (SYNC.PID), so that
# processes started together begin together; at the end it names the JAX
# backends it started: none, or it would hold the chips its trials need
# (JAX itself is imported, by the base configs the command validates).
DRIVER = textwrap.dedent("""\
    import importlib, os, sys, time
    from albert_jax.tools import sweep
    run_trials = sweep.run_trials
    def quick(*args, **kwargs):
      return run_trials(*args, timing=sweep.Timing(poll=0.05), **kwargs)
    sweep.run_trials = quick
    sync, module, argv = sys.argv[1], sys.argv[2], sys.argv[3:]
    command = importlib.import_module("albert_jax.tools." + module)
    open(f"{sync}.{os.getpid()}", "w").close()
    deadline = time.monotonic() + 120
    while not os.path.exists(sync + ".go"):
      if time.monotonic() > deadline:
        sys.exit("the test never said go")
      time.sleep(0.01)
    rc = command.main(argv)
    bridge = sys.modules.get("jax._src.xla_bridge")
    print("jax backends:", sorted(getattr(bridge, "_backends", {})))
    sys.exit(rc)
    """)


def start_together(tmp_path, module, argv, n=2, **env):
  """`n` processes of `python -m albert_jax.tools.MODULE ARGV`, started
  together (DRIVER); their (return code, stdout, stderr)."""
  driver, sync = tmp_path / "driver.py", tmp_path / "sync"
  driver.write_text(DRIVER)
  procs = [subprocess.Popen(  # pylint: disable=consider-using-with
      [sys.executable, str(driver), str(sync), module, *argv], cwd=REPO,
      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
      env={**os.environ, "PYTHONPATH": str(REPO), **env})
           for _ in range(n)]
  try:
    deadline = time.monotonic() + 60
    while len(list(tmp_path.glob("sync.*"))) < n:
      assert all(p.poll() is None for p in procs), [p.communicate()
                                                    for p in procs]
      assert time.monotonic() < deadline
      time.sleep(0.01)
    (tmp_path / "sync.go").touch()
    outs = [p.communicate(timeout=120) for p in procs]
  finally:  # none outlives a failure
    for p in procs:
      if p.poll() is None:
        p.kill()
        p.wait()
  return [(p.returncode, *out) for p, out in zip(procs, outs)]


@pytest.fixture(name="env")
def fixture_env(tmp_path, monkeypatch):
  """Runs from the repository root; the fake trainer and a sweep-file maker."""
  monkeypatch.chdir(REPO)
  fake = tmp_path / "fake_main.py"
  fake.write_text(FAKE_MAIN)

  def write_sweep(body, name="sw.py", config="configs/tiny.py"):
    path = tmp_path / name
    path.write_text("from albert_jax.tools import sweep\n"
                    f"CONFIG = {config!r}\n" + textwrap.dedent(body))
    return str(path)

  return dict(root=tmp_path / "runs", fake=str(fake), write_sweep=write_sweep)


def _calls(root):
  path = root / "calls.txt"
  return ([json.loads(l) for l in path.read_text().splitlines()]
          if path.exists() else [])


# Expansion.


def test_product_of_axes_mappings_and_kwargs():
  trials = sweep.product(
      sweep.axis("config.optimizer.learning_rate", [1e-3, 2e-3]),
      {"config.model.share": ["all", "none"]}, seed=[0])
  assert trials == [
      {"config.optimizer.learning_rate": 1e-3, "config.model.share": "all",
       "seed": 0},
      {"config.optimizer.learning_rate": 1e-3, "config.model.share": "none",
       "seed": 0},
      {"config.optimizer.learning_rate": 2e-3, "config.model.share": "all",
       "seed": 0},
      {"config.optimizer.learning_rate": 2e-3, "config.model.share": "none",
       "seed": 0}]
  # **axes takes dotted names too.
  assert sweep.product(**{"a.b": [1, 2], "c": [3]}) == [
      {"a.b": 1, "c": 3}, {"a.b": 2, "c": 3}]


def test_zip_chain_fixed():
  assert sweep.zip_({"a": [1, 2], "b": ["x", "y"]}) == [
      {"a": 1, "b": "x"}, {"a": 2, "b": "y"}]
  assert sweep.zip_(sweep.axis("a", [1, 2]), b=[3, 4]) == [
      {"a": 1, "b": 3}, {"a": 2, "b": 4}]
  assert sweep.chain(sweep.axis("a", [1]), sweep.fixed(b=2, c=3)) == [
      {"a": 1}, {"b": 2, "c": 3}]
  assert sweep.product(sweep.chain({"a": [1, 2]}, sweep.fixed(b=0)),
                       sweep.fixed({"c.d": True})) == [
                           {"a": 1, "c.d": True}, {"a": 2, "c.d": True},
                           {"b": 0, "c.d": True}]
  assert sweep.product() == [{}]


def test_expansion_errors():
  with pytest.raises(sweep.SweepError, match=r"unequal lengths \[2, 3\]"):
    sweep.zip_(a=[1, 2], b=[1, 2, 3])
  with pytest.raises(sweep.SweepError, match="a is set twice"):
    sweep.product({"a": [1]}, sweep.fixed(a=2))


# Names and values.


def test_format_value_round_trips_through_config_flags_syntax():
  assert sweep.format_value(1e-3) == "0.001"
  assert sweep.format_value(1e-5) == "1e-05"
  assert sweep.format_value(3) == "3"
  assert sweep.format_value(True) == "true"
  assert sweep.format_value("none") == "none"
  assert sweep.format_value((1, "a")) == "(1, 'a')"


def test_trial_names_are_readable_stable_safe_and_unique():
  assert sweep.trial_name({"optimizer.learning_rate": 0.001,
                           "model.share": "none"}) == (
                               "optimizer.learning_rate=0.001,model.share=none")
  assert sweep.trial_name({}) == "base"
  # Unsafe characters or length: sanitised, then a hash of the exact trial.
  unsafe = sweep.trial_name({"data.corpus": "/data/wiki en"})
  assert unsafe == "data.corpus=_data_wiki_en-0100968be4"  # stable across runs
  assert unsafe != sweep.trial_name({"data.corpus": "_data_wiki_en"})
  long_trial = {f"model.field_{i}": 0.001 * i for i in range(20)}
  long_name = sweep.trial_name(long_trial)
  assert len(long_name) == 100 and long_name.startswith("model.field_0=0.0,")
  assert sweep.trial_name(dict(long_trial)) == long_name
  tricky = [{"a": "x/y"}, {"a": "x_y"}, {"a": "x y"}, {"a": "1"},
            {"a": 1.0}, {"a": (1, 2)}, {"a": [1, 2]}, *long_trial.items()]
  tricky = [t if isinstance(t, dict) else {t[0]: t[1]} for t in tricky]
  names = [sweep.trial_name(t) for t in tricky]
  assert len(set(names)) == len(names)
  for name in names + [long_name]:
    assert re.fullmatch(r"[A-Za-z0-9._,=+-]+", name), name


def test_file_keys_lose_config_prefix_and_duplicates_are_refused(env):
  path = env["write_sweep"]("""
      def get_sweep(arg=None):
        return sweep.axis("config.seed", [1, 2]) + [{"seed": 2}]
      """)
  with pytest.raises(sweep.SweepError, match="trial seed=2 appears twice"):
    sweep.load_sweep(path)
  path = env["write_sweep"]("""
      def get_sweep(arg=None):
        return [{"config.seed": 1, "seed": 2}]
      """)
  with pytest.raises(sweep.SweepError, match="seed is set twice"):
    sweep.load_sweep(path)


def test_sweep_argument_reaches_get_sweep(env):
  path = env["write_sweep"]("""
      def get_sweep(arg=None):
        return sweep.axis("config.seed", [int(arg or 0)])
      """)
  assert sweep.load_sweep(path)[1] == {"seed=0": {"seed": 0}}
  assert sweep.load_sweep(path + ":7")[1] == {"seed=7": {"seed": 7}}
  config, _ = sweep.load_sweep(path, config="configs/demo.py:quick")
  assert config == "configs/demo.py:quick"


# Validation: before anything is launched.


def test_unknown_keys_fail_early_with_suggestions(env, capsys):
  path = env["write_sweep"]("""
      def get_sweep(arg=None):
        return sweep.product({"config.optimizer.learning_rat": [1e-3, 2e-3],
                              "config.learning_rate": [1.0],
                              "config.model.shar": ["all"]})
      """)
  rc = sweep.main([path, f"--workdir_root={env['root']}",
                   f"--main_module={env['fake']}"])
  err = capsys.readouterr().err
  assert rc == 2
  assert ("Unknown config key 'optimizer.learning_rat' (did you mean "
          "'optimizer.learning_rate', ") in err
  assert ("Fields of optimizer: b1, b2, bias_correction, clip_norm, "
          "end_learning_rate, eps, layerwise_lr_decay, learning_rate, "
          "name, ") in err
  assert ("Unknown config key 'learning_rate' (did you mean "
          "'optimizer.learning_rate' or ") in err
  assert ("Unknown config key 'model.shar' (did you mean 'model.share', "
          in err)
  assert err.count("optimizer.learning_rat'") == 1  # once, not per trial
  assert not env["root"].exists() and not _calls(env["root"])


def test_values_of_the_wrong_type_and_extra_keys_fail_early(env, capsys):
  path = env["write_sweep"]("""
      def get_sweep(arg=None):
        return sweep.axis("config.num_train_steps", [10, 2.5])
      """)
  assert sweep.main([path, f"--workdir_root={env['root']}"]) == 2
  assert ("Bad value 2.5 for num_train_steps (trial num_train_steps=2.5)"
          in capsys.readouterr().err)
  path = env["write_sweep"]("""
      def get_sweep(arg=None):
        return sweep.axis("config.seed", [1])
      """)
  assert sweep.main([path, f"--workdir_root={env['root']}", "--",
                     "--config.batchsize=8"]) == 2
  assert ("Unknown config key 'batchsize' (did you mean 'batch_size'?)."
          in capsys.readouterr().err)
  assert not env["root"].exists()


def test_missing_file_and_missing_config(env, capsys):
  assert sweep.main(["experiments/nope.py", "--workdir_root=/tmp/x"]) == 2
  assert "No such file: experiments/nope.py" in capsys.readouterr().err
  path = env["write_sweep"]("def get_sweep(arg=None):\n  return [{}]\n",
                            config="")
  assert sweep.main([path, "--workdir_root=/tmp/x"]) == 2
  assert "sets no CONFIG and no --config" in capsys.readouterr().err


# Printed commands.


def test_print_commands_local_and_tpu(env, capsys):
  root = env["root"]
  assert sweep.main(["experiments/demo_lr.py:quick", "--print_commands",
                     f"--workdir_root={root}/"]) == 0
  n1 = ("optimizer.learning_rate=0.002,num_train_steps=30,"
        "optimizer.warmup_steps=3")
  n2 = n1.replace("0.002", "0.008")
  rest = "--config.num_train_steps=30 --config.optimizer.warmup_steps=3"
  assert capsys.readouterr().out.splitlines() == [
      f"python -m albert_jax.main --config=configs/demo.py:steps=200,finetune_steps=0 "
      f"--workdir={root}/{n1} --config.optimizer.learning_rate=0.002 {rest}",
      f"python -m albert_jax.main --config=configs/demo.py:steps=200,finetune_steps=0 "
      f"--workdir={root}/{n2} --config.optimizer.learning_rate=0.008 {rest}"]

  assert sweep.main(["experiments/demo_lr.py:quick", "--print_commands",
                     "--launcher=tpu", "--workdir_root=gs://bucket/lr",
                     "--config=configs/tiny.py:share=none", "--",
                     "--config.batch_size=64"]) == 0
  assert capsys.readouterr().out.splitlines() == [
      "bash tpu_setup.sh run --name=$TPU_NAME --zone=$ZONE -- "
      "--config=configs/tiny.py:share=none "
      f"--workdir=gs://bucket/lr/{n1} --config.optimizer.learning_rate=0.002 "
      f"{rest} --config.batch_size=64",
      "bash tpu_setup.sh run --name=$TPU_NAME --zone=$ZONE -- "
      "--config=configs/tiny.py:share=none "
      f"--workdir=gs://bucket/lr/{n2} --config.optimizer.learning_rate=0.008 "
      f"{rest} --config.batch_size=64"]
  assert not root.exists()


def test_printed_commands_quote_values_and_comment_out_done_trials(
    env, capsys):
  path = env["write_sweep"]("""
      def get_sweep(arg=None):
        return sweep.chain(sweep.fixed({"config.data.corpus": "my corpus"}),
                           sweep.fixed({"config.seed": 3}))
      """)
  done = env["root"] / "seed=3"
  done.mkdir(parents=True)
  (done / "final_metrics.json").write_text('{"step": 1}')
  assert sweep.main([path, "--print_commands",
                     f"--workdir_root={env['root']}"]) == 0
  name = sweep.trial_name({"data.corpus": "my corpus"})
  assert capsys.readouterr().out.splitlines() == [
      f"python -m albert_jax.main --config=configs/tiny.py "
      f"--workdir={env['root']}/{name} '--config.data.corpus=my corpus'",
      "# seed=3: done"]


# Local runs with the fake trainer.


def _lr_sweep(env, lrs):
  return env["write_sweep"](f"""
      def get_sweep(arg=None):
        return sweep.product(
            sweep.axis("config.optimizer.learning_rate", {lrs!r}),
            sweep.fixed({{"config.model.share": "none"}}))
      """)


def test_local_run_then_resume(env, capsys):
  root, path = env["root"], _lr_sweep(env, [0.001, 0.002])
  argv = [path, f"--workdir_root={root}", f"--main_module={env['fake']}",
          "--", "--config.batch_size=8"]
  assert sweep.main(argv) == 0
  out = capsys.readouterr().out
  n1 = "optimizer.learning_rate=0.001,model.share=none"
  n2 = "optimizer.learning_rate=0.002,model.share=none"
  assert f"[1/2] {n1}: running, log in {root}/{n1}/sweep.log" in out
  assert re.search(rf"\[2/2\] {re.escape(n2)}: ok in \d+\.\d s", out)
  assert _calls(root) == [
      ["--config=configs/tiny.py", f"--workdir={root}/{n1}",
       "--config.optimizer.learning_rate=0.001", "--config.model.share=none",
       "--config.batch_size=8"],
      ["--config=configs/tiny.py", f"--workdir={root}/{n2}",
       "--config.optimizer.learning_rate=0.002", "--config.model.share=none",
       "--config.batch_size=8"]]
  assert (root / n1 / "sweep.log").read_text() == (
      f"fake main starting in {root}/{n1}\nfake main done\n")
  table = (
      "| trial | status | optimizer.learning_rate | step | eval_mlm_accuracy "
      "| eval_sop_accuracy |\n|---|---|---|---|---|---|\n"
      f"| {n1} | ok | 0.001 | 30 | 0.1 | 0.5 |\n"
      f"| {n2} | ok | 0.002 | 30 | 0.2 | 0.5 |")
  assert out.endswith("\n" + table + "\n")
  assert (root / "results.md").read_text() == (
      f"# Sweep `{path}`\n\nBase config `configs/tiny.py`, workdirs under "
      f"`{root}/`.\n\n{table}\n")

  # Again, with one more trial: only the new one runs.
  path = _lr_sweep(env, [0.001, 0.002, 0.004])
  assert sweep.main([path, f"--workdir_root={root}",
                     f"--main_module={env['fake']}", "--",
                     "--config.batch_size=8"]) == 0
  out = capsys.readouterr().out
  assert f"[1/3] {n1}: done, skipped" in out
  assert f"[2/3] {n2}: done, skipped" in out
  assert len(_calls(root)) == 3
  assert "learning_rate=0.004" in _calls(root)[-1][1]
  assert f"| {n1} | done | 0.001 | 30 | 0.1 | 0.5 |" in out
  assert "| ok | 0.004 | 30 | 0.4 | 0.5 |" in (root / "results.md").read_text()


def test_a_rerun_with_other_arguments_is_refused_naming_them(env, capsys):
  """Done trials ran with `-- --config.batch_size=8`: the same sweep into
  the same root with other overrides, or none, or another base config,
  runs nothing and names the difference."""
  root, path = env["root"], _lr_sweep(env, [0.001, 0.002])
  argv = [path, f"--workdir_root={root}", f"--main_module={env['fake']}"]
  assert sweep.main(argv + ["--", "--config.batch_size=8"]) == 0
  n1 = "optimizer.learning_rate=0.001,model.share=none"
  assert json.loads((root / n1 / sweep.ARGS_FILE).read_text()) == [
      "--config=configs/tiny.py", "--config.optimizer.learning_rate=0.001",
      "--config.model.share=none", "--config.batch_size=8"]
  results = (root / "results.md").read_bytes()
  capsys.readouterr()
  for other, then, now in (
      (["--", "--config.batch_size=16"], "--config.batch_size=8",
       "--config.batch_size=16"),
      ([], "--config.batch_size=8", "none"),
      (["--config=configs/demo.py", "--", "--config.batch_size=8"],
       "--config=configs/tiny.py", "--config=configs/demo.py")):
    assert sweep.main(argv + other) == 2
    out = capsys.readouterr()
    assert out.out == ""
    assert out.err == (
        "sweep: 2 done trial(s) ran with other arguments than this sweep "
        f"gives them: {root}/{n1} (then {then}; now {now}) and 1 more. Rerun "
        "with the arguments they ran with, or give another --workdir_root, "
        "so that one table does not mix two setups.\n")
  assert len(_calls(root)) == 2
  assert (root / "results.md").read_bytes() == results
  # With the arguments they ran with, the rerun goes on.
  assert sweep.main(argv + ["--results_only", "--",
                            "--config.batch_size=8"]) == 0


def test_parallel_trials_overlap_and_share_accelerator_memory(
    env, capsys, monkeypatch):
  monkeypatch.setenv("FAKE_SLEEP", "1.5")
  for name in PINS:
    monkeypatch.delenv(name, raising=False)
  root, path = env["root"], _lr_sweep(env, [0.001, 0.002, 0.003])
  start = __import__("time").time()
  assert sweep.main([path, f"--workdir_root={root}", "--parallel=3",
                     f"--main_module={env['fake']}"]) == 0
  took = __import__("time").time() - start
  starts = [json.loads((d / "times.json").read_text())
            for d in sorted(root.iterdir()) if d.is_dir()]
  # All three started before the first finished sleeping: they overlapped.
  assert max(s[0] for s in starts) - min(s[0] for s in starts) < 1.5
  assert took < 3 * 1.5
  assert {s[1] for s in starts} == {"0.300"}  # 0.9 / 3 each
  # Without --devices_per_trial no trial is pinned to devices.
  assert [r["env"] for r in _pinned(root)] == 3 * [
      {**dict.fromkeys(PINS), "XLA_PYTHON_CLIENT_MEM_FRACTION": "0.300"}]
  out = capsys.readouterr().out
  assert out.count(": ok in ") == 3
  assert "| 0.003 | 30 | 0.3 | 0.5 |" in (root / "results.md").read_text()
  # A memory fraction the user set is theirs.
  monkeypatch.setenv("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.2")
  monkeypatch.setenv("FAKE_SLEEP", "0")
  path = _lr_sweep(env, [0.005])
  assert sweep.main([path, f"--workdir_root={root}", "--parallel=2",
                     f"--main_module={env['fake']}"]) == 0
  assert json.loads((root / "optimizer.learning_rate=0.005,model.share=none"
                     / "times.json").read_text())[1] == "0.2"
  assert sweep.main([path, f"--workdir_root={root}", "--parallel=0"]) == 2
  assert capsys.readouterr().err == (
      "sweep: --parallel=0; give 1 (one trial after another) or more.\n")


# Device groups: one per running trial.


def _pinned(root):
  """Each trial's devices.json: when it ran and what pinned it."""
  return [json.loads(p.read_text())
          for p in sorted(root.glob("*/devices.json"))]


def _trials_per_group(runs, key):
  """group → trials that ran on it, after checking that no two of them
  overlapped in time (each child's own start and end)."""
  spans = collections.defaultdict(list)
  for run in runs:
    spans[run["env"][key]].append((run["start"], run["end"]))
  for group, times in spans.items():
    times.sort()
    for (_, end), (start, _) in zip(times, times[1:]):
      assert end <= start, f"two trials at once on {group}"
  return {group: len(times) for group, times in spans.items()}


@pytest.fixture(name="no_pins")
def fixture_no_pins(monkeypatch):
  """No pinning inherited from the test's own environment."""
  for name in PINS:
    monkeypatch.delenv(name, raising=False)


def test_device_group_environments_for_gpus_and_tpu_chips():
  gpus = device_groups.DeviceGroups("gpu", tuple("01234567"), 2)
  assert [gpus.env(g) for g in range(4)] == [
      {"CUDA_VISIBLE_DEVICES": ids} for ids in ("0,1", "2,3", "4,5", "6,7")]
  assert gpus.label(3) == "GPUs 6,7"
  assert gpus.describe() == "4 groups of 2 of 8 GPUs"
  # A v4-8 (4 chips) in pairs: each a 1x2 slice of its own, its own port.
  v4 = device_groups.DeviceGroups("tpu", tuple("0123"), 2)
  assert v4.env(1) == {
      "TPU_VISIBLE_CHIPS": "2,3", "TPU_CHIPS_PER_PROCESS_BOUNDS": "1,2,1",
      "TPU_PROCESS_BOUNDS": "1,1,1", "TPU_PROCESS_PORT": "8477",
      "TPU_PROCESS_ADDRESSES": "localhost:8477", "CLOUD_TPU_TASK_ID": "0",
      "ALLOW_MULTIPLE_LIBTPU_LOAD": "true",
      # One host, for a worker of a multi-host slice not to wait for the
      # others.
      "TPU_HOST_BOUNDS": "1,1,1", "TPU_CHIPS_PER_HOST_BOUNDS": "1,2,1",
      "TPU_WORKER_ID": "0", "TPU_WORKER_HOSTNAMES": "localhost"}
  assert v4.env(0)["TPU_PROCESS_ADDRESSES"] == "localhost:8476"
  # A v5e-8 (8 chips): halves of 2x2, single chips, the whole host.
  def v5e(k):
    return device_groups.DeviceGroups("tpu", tuple("01234567"), k)
  assert v5e(4).env(1)["TPU_VISIBLE_CHIPS"] == "4,5,6,7"
  assert v5e(4).env(1)["TPU_CHIPS_PER_PROCESS_BOUNDS"] == "2,2,1"
  assert v5e(4).env(1)["TPU_CHIPS_PER_HOST_BOUNDS"] == "2,2,1"
  assert [v5e(1).env(g)["TPU_VISIBLE_CHIPS"] for g in range(8)] == list(
      "01234567")
  assert v5e(1).env(7)["TPU_CHIPS_PER_PROCESS_BOUNDS"] == "1,1,1"
  assert v5e(1).env(7)["TPU_PROCESS_PORT"] == "8483"
  assert v5e(8).env(0)["TPU_CHIPS_PER_PROCESS_BOUNDS"] == "2,4,1"
  assert v5e(1).label(0) == "TPU chip 0"


def test_devices_are_counted_without_claiming_them(tmp_path):
  smi = tmp_path / "nvidia-smi"
  smi.write_text("#!/bin/sh\nfor i in 0 1 2 3 4 5 6 7; do "
                 "echo \"GPU $i: NVIDIA H200 (UUID: GPU-$i)\"; done\n")
  smi.chmod(0o755)
  dev, proc = tmp_path / "dev", tmp_path / "proc"
  dev.mkdir()
  probe = dict(environ={}, dev=str(dev), proc=str(proc), nvidia_smi=str(smi))
  parallel, groups = device_groups.plan(2, None, **probe)
  assert (parallel, groups.platform, groups.groups) == (
      4, "gpu", [("0", "1"), ("2", "3"), ("4", "5"), ("6", "7")])
  # A parent's CUDA_VISIBLE_DEVICES narrows them; --num_devices takes the
  # first N.
  narrowed = {**probe, "environ": {"CUDA_VISIBLE_DEVICES": "4,5,6,7"}}
  assert device_groups.plan(2, None, **narrowed)[1].groups == [
      ("4", "5"), ("6", "7")]
  assert device_groups.plan(2, None, num_devices=6, **probe)[0] == 3
  # No nvidia-smi: the driver's /proc entries.
  probe["nvidia_smi"] = str(tmp_path / "none")
  (proc / "driver" / "nvidia" / "gpus" / "0000:01:00.0").mkdir(parents=True)
  assert device_groups.local_devices(**probe) == ("gpu", ["0"])
  # TPU chips: /dev/accelN (a v4-8), else /dev/vfio's numbered groups
  # (a v5e-8).
  probe["proc"] = str(tmp_path / "noproc")
  for i in range(4):
    (dev / f"accel{i}").touch()
  (dev / "null").touch()
  parallel, groups = device_groups.plan(2, None, **probe)
  assert (parallel, groups.platform) == (2, "tpu")
  assert groups.env(1)["TPU_VISIBLE_CHIPS"] == "2,3"
  for i in range(4):
    (dev / f"accel{i}").unlink()
  (dev / "vfio").mkdir()
  for name in [*map(str, range(8)), "vfio"]:
    (dev / "vfio" / name).touch()
  assert device_groups.local_devices(**probe) == ("tpu", list("01234567"))
  # None: CPU only.
  (dev / "vfio").rename(dev / "other")
  with pytest.raises(device_groups.DeviceGroupError) as e:
    device_groups.plan(1, None, **probe)
  assert str(e.value) == (
      "--devices_per_trial needs an accelerator and none was found here (no "
      "NVIDIA GPU in nvidia-smi -L or /proc/driver/nvidia/gpus, no TPU chip "
      "in /dev/accel* or /dev/vfio); on CPU a trial cannot be pinned to "
      "devices: run trials with --parallel alone.")
  # The commands that run trials never import JAX, which would hold the
  # chips their trials need.
  loaded = subprocess.run(
      [sys.executable, "-c", "import sys; from albert_jax.tools import "
       "downstream, sweep; print([m for m in ('jax', 'jaxlib') "
       "if m in sys.modules])"], capture_output=True, text=True, check=True,
      cwd=REPO)
  assert loaded.stdout == "[]\n"


def test_device_group_refusals_are_one_line(env, capsys, no_pins):
  del no_pins
  root, path = env["root"], _lr_sweep(env, [0.001])
  gpus8 = ["--platform=gpu", "--num_devices=8"]
  for more, message in (
      (["--devices_per_trial=0"], "--devices_per_trial=0; give 1 or more "
       "devices per trial."),
      (["--devices_per_trial=16", *gpus8], "--devices_per_trial=16 is more "
       "than the 8 GPUs here."),
      (["--devices_per_trial=3", *gpus8], "--devices_per_trial=3 does not "
       "divide the 8 GPUs here: 2 would sit idle; give one of 1, 2, 4, 8, or "
       "--num_devices=6 to leave 2 idle."),
      (["--devices_per_trial=3", "--platform=tpu", "--num_devices=6"],
       "--devices_per_trial=3: a TPU trial takes 1, 2, 4 or 8 chips of a "
       "host, the group shapes libtpu is given "
       "(TPU_CHIPS_PER_PROCESS_BOUNDS)."),
      (["--devices_per_trial=2", "--parallel=5", *gpus8], "--parallel=5 is "
       "more than the 4 groups of 2 of 8 GPUs (--devices_per_trial=2); give "
       "--parallel=4 or less, one trial per group at a time."),
      (["--devices_per_trial=1", "--num_devices=0"], "--num_devices=0; give "
       "1 or more."),
      (["--num_devices=8"], "--platform and --num_devices say which devices "
       "--devices_per_trial splits; give --devices_per_trial too."),
      (["--devices_per_trial=2", "--print_commands", *gpus8],
       "--devices_per_trial pins the trials this command runs, and with "
       "--print_commands it runs none; leave one of them out.")):
    assert sweep.main([path, f"--workdir_root={root}",
                       f"--main_module={env['fake']}", *more]) == 2, more
    assert capsys.readouterr().err == f"sweep: {message}\n"
  assert not _calls(root)


def test_trials_hold_disjoint_device_groups(env, capsys, monkeypatch,
                                            no_pins):
  """8 GPUs, 2 a trial: 4 groups, 4 trials at once, 6 in all."""
  del no_pins
  monkeypatch.setenv("FAKE_SLEEP", "0.5")
  root = env["root"]
  path = _lr_sweep(env, [0.001, 0.002, 0.003, 0.004, 0.005, 0.006])
  assert sweep.main([path, f"--workdir_root={root}", "--devices_per_trial=2",
                     "--platform=gpu", "--num_devices=8",
                     f"--main_module={env['fake']}"]) == 0
  out = capsys.readouterr().out
  runs = _pinned(root)
  assert len(runs) == 6 and out.count(": ok in ") == 6
  per_group = _trials_per_group(runs, "CUDA_VISIBLE_DEVICES")
  assert sorted(per_group) == ["0,1", "2,3", "4,5", "6,7"]
  assert sorted(per_group.values()) == [1, 1, 2, 2]
  # --parallel defaulted to the 4 groups: the first four ran together.
  starts = sorted(r["start"] for r in runs)
  assert starts[3] < min(r["end"] for r in runs)
  # Each trial owns its devices' memory; nothing else is pinned.
  assert {r["env"]["XLA_PYTHON_CLIENT_MEM_FRACTION"] for r in runs} == {None}
  assert {r["env"]["TPU_VISIBLE_CHIPS"] for r in runs} == {None}
  # The log and the console say where each trial ran.
  for trial in root.glob("*/devices.json"):
    ids = json.loads(trial.read_text())["env"]["CUDA_VISIBLE_DEVICES"]
    first = (trial.parent / "sweep.log").read_text().splitlines()[0]
    assert first == f"devices: GPUs {ids}; CUDA_VISIBLE_DEVICES={ids}"
    assert f"{trial.parent.name}: running on GPUs {ids}, log in " in out


def test_five_trials_reuse_two_tpu_groups(env, monkeypatch, no_pins):
  """A 4-chip TPU host, 2 chips a trial: 2 groups, handed on as trials end."""
  del no_pins
  monkeypatch.setenv("FAKE_SLEEP", "0.3")
  root = env["root"]
  path = _lr_sweep(env, [0.001, 0.002, 0.003, 0.004, 0.005])
  assert sweep.main([path, f"--workdir_root={root}", "--devices_per_trial=2",
                     "--platform=tpu", "--num_devices=4",
                     f"--main_module={env['fake']}"]) == 0
  runs = _pinned(root)
  assert len(runs) == 5
  per_group = _trials_per_group(runs, "TPU_VISIBLE_CHIPS")
  assert sorted(per_group) == ["0,1", "2,3"]
  assert sorted(per_group.values()) == [2, 3]
  for run in runs:
    chips = run["env"]["TPU_VISIBLE_CHIPS"]
    port = {"0,1": "8476", "2,3": "8477"}[chips]
    assert run["env"] == {
        "CUDA_VISIBLE_DEVICES": None, "TPU_VISIBLE_CHIPS": chips,
        "TPU_CHIPS_PER_PROCESS_BOUNDS": "1,2,1", "TPU_PROCESS_BOUNDS": "1,1,1",
        "TPU_PROCESS_PORT": port, "TPU_PROCESS_ADDRESSES": f"localhost:{port}",
        "CLOUD_TPU_TASK_ID": "0", "ALLOW_MULTIPLE_LIBTPU_LOAD": "true",
        "TPU_HOST_BOUNDS": "1,1,1", "TPU_CHIPS_PER_HOST_BOUNDS": "1,2,1",
        "TPU_WORKER_ID": "0", "TPU_WORKER_HOSTNAMES": "localhost",
        "XLA_PYTHON_CLIENT_MEM_FRACTION": None}


def test_failed_trials_are_reported_and_the_sweep_goes_on(env, capsys):
  root, path = env["root"], _lr_sweep(env, [0.1, 0.04, 0.001])
  rc = sweep.main([path, f"--workdir_root={root}",
                   f"--main_module={env['fake']}"])
  out = capsys.readouterr().out
  assert rc == 1
  assert len(_calls(root)) == 3  # the third trial ran after two failures
  bad, empty, good = (f"optimizer.learning_rate={lr},model.share=none"
                      for lr in ("0.1", "0.04", "0.001"))
  assert re.search(
      rf"\[1/3\] {re.escape(bad)}: FAILED \(exit code 3\) after \d+\.\d s; "
      rf"end of {re.escape(str(root / bad / 'sweep.log'))}:\n"
      rf"  fake main starting in .*\n  loss is nan at step 3\n", out)
  assert f"[2/3] {empty}: FAILED (no final_metrics.json)" in out
  assert f"[3/3] {good}: ok" in out
  assert f"2 of 3 trials failed: {bad}, {empty}" in out
  results = (root / "results.md").read_text()
  assert f"| {bad} | failed | 0.1 |  |  |  |" in results
  assert f"| {good} | ok | 0.001 | 30 | 0.1 | 0.5 |" in results

  # A rerun retries the failed trials only.
  assert sweep.main([path, f"--workdir_root={root}",
                     f"--main_module={env['fake']}"]) == 1
  assert [c[1] for c in _calls(root)[3:]] == [
      f"--workdir={root}/{bad}", f"--workdir={root}/{empty}"]


# Claims: one command run by several processes on one root.


def _statuses(out, names):
  """name → status in the results table `out` printed."""
  rows = dict(re.findall(r"^\| (\S+) \| (\w+) \|", out, re.M))
  return {name: rows.get(name) for name in names}


def test_two_processes_share_the_trials_out(env, tmp_path):
  """The same sweep started twice at once on one root, as on two hosts of
  a slice: every trial runs once in all, the failing one too; each process
  waits for the other's trials, reports every trial, ok where it ran it,
  done or failed where the other did, and exits 1 for the failure; neither
  starts a JAX backend. A later run retries the failed trial alone."""
  root = env["root"]
  path = _lr_sweep(env, [0.001, 0.002, 0.1, 0.003])
  names = [f"optimizer.learning_rate={lr},model.share=none"
           for lr in ("0.001", "0.002", "0.1", "0.003")]
  bad = names[2]
  argv = [path, f"--workdir_root={root}", f"--main_module={env['fake']}"]
  ran = start_together(tmp_path, "sweep", argv, FAKE_SLEEP="0.2")
  assert [rc for rc, _, _ in ran] == [1, 1], ran
  runs = collections.Counter(c[1] for c in _calls(root))
  assert runs == {f"--workdir={root}/{name}": 1 for name in names}
  seen = [_statuses(out, names) for _, out, _ in ran]
  for name in names:
    both = sorted(s[name] for s in seen)
    assert both == (["failed", "failed"] if name == bad else ["done", "ok"])
  for _, out, err in ran:
    assert out.endswith("jax backends: []\n"), err
  # The file written last is as whole as either.
  assert _statuses((root / "results.md").read_text(), names) in seen
  # The failed trial's claim is left, marked failed; a later run retries
  # that trial alone.
  assert json.loads((root / bad / sweep.CLAIM).read_text())["failed"]
  assert sweep.main(argv) == 1
  assert [c[1] for c in _calls(root)[4:]] == [f"--workdir={root}/{bad}"]


def _other_host(workdir, **fields):
  """Writes a claim on the trial in `workdir` held by a process on another
  host, heartbeat now."""
  workdir.mkdir(parents=True, exist_ok=True)
  (workdir / sweep.CLAIM).write_text(json.dumps({
      "owner": "theirs", "host": "another-host", "pid": 4242,
      "started": time.time(), "heartbeat": time.time(), **fields}))


def _run(env, path, stale=sweep.CLAIM_STALE_SECONDS):
  config, trials = sweep.load_sweep(path)
  return sweep.run_trials(
      {name: (config, trial) for name, trial in trials.items()},
      str(env["root"]), main_module=env["fake"],
      timing=sweep.Timing(poll=0.05, stale=stale))[0]


def test_a_claim_held_elsewhere_is_waited_for_then_taken_over_stale(
    env, capsys, caplog):
  """Another host's live claim on a trial: the other trials run, then the
  process waits, saying for what once, until the claim goes stale (its
  heartbeat stopped: that host died), takes it over and runs the trial."""
  root, path = env["root"], _lr_sweep(env, [0.001, 0.002])
  held, free = (f"optimizer.learning_rate={lr},model.share=none"
                for lr in ("0.001", "0.002"))
  _other_host(root / held)
  start = time.monotonic()
  assert _run(env, path, stale=1.0) == {held: "ok", free: "ok"}
  assert time.monotonic() - start > 1.0  # not before it went stale
  out = capsys.readouterr().out
  assert out.count("waiting for") == 1, out
  assert (f"waiting for 1 trial(s) other processes of the command run: "
          f"{held} (pid 4242 on another-host); looking again every "
          "0.05 s\n") in out
  assert [c[1] for c in _calls(root)] == [f"--workdir={root}/{free}",
                                          f"--workdir={root}/{held}"]
  assert re.search(r"Taking over \S+/claim.json from pid 4242 on "
                   r"another-host \(heartbeat 1 s ago\): its heartbeat is "
                   "stale", caplog.text), caplog.text
  assert not (root / held / sweep.CLAIM).exists()  # released: ok


def test_another_hosts_failure_is_reported_until_a_later_run(env, capsys):
  """Another host runs a trial and it fails during this run: this process,
  which waited for it, reports it failed and does not run it; a later run
  of the command (the record older than its start) retries it."""
  root, path = env["root"], _lr_sweep(env, [0.001])
  name = "optimizer.learning_rate=0.001,model.share=none"
  _other_host(root / name)
  threading.Timer(0.3, _other_host, [root / name], {"failed": True}).start()
  assert _run(env, path) == {name: "failed"}
  out = capsys.readouterr().out
  assert (f"[1/1] {name}: FAILED in pid 4242 on another-host; not run again "
          f"here (a rerun of the command retries it; its log: "
          f"{root}/{name}/sweep.log)") in out
  assert not _calls(root)
  assert _run(env, path) == {name: "ok"}
  assert len(_calls(root)) == 1


def test_an_unreadable_claim_is_held_until_stale_naming_the_file(env,
                                                                 capsys):
  root, path = env["root"], _lr_sweep(env, [0.001])
  name = "optimizer.learning_rate=0.001,model.share=none"
  (root / name).mkdir(parents=True)
  (root / name / sweep.CLAIM).write_text("{not json")
  assert _run(env, path, stale=0.5) == {name: "ok"}
  assert (f"waiting for 1 trial(s) other processes of the command run: "
          f"{name} (an unreadable claim, {root}/{name}/{sweep.CLAIM}: if no "
          "process of the command runs that trial and the file stays "
          "unreadable, delete it); looking again every 0.05 s\n"
          ) in capsys.readouterr().out


def test_a_worker_of_a_multi_host_slice_needs_devices_per_trial(tmp_path):
  """A TPU VM whose slice has several workers (its metadata, or GKE's
  TPU_WORKER_HOSTNAMES, says so): a trial not pinned to its chips would
  wait for all of them, and is refused in one line; one host, no chips or
  no answer: nothing to refuse."""
  dev = tmp_path / "dev"
  dev.mkdir()
  for i in range(4):
    (dev / f"accel{i}").touch()
  two = "w-0:uid0:10.0.0.2,w-1:uid1:10.0.0.3"
  with pytest.raises(device_groups.DeviceGroupError) as error:
    device_groups.refuse_a_slice(environ={}, dev=str(dev),
                                 endpoints=lambda: two)
  assert str(error.value) == (
      "this TPU VM is one of the 2 workers of a slice, where a trial not "
      "pinned to this host's chips waits for every worker to join it; give "
      "--devices_per_trial=K (1, 2, 4 or 8 chips) and run the same command "
      "on every worker, which share the trials out, or run each trial on "
      "the whole slice with --print_commands --launcher=tpu.")
  assert device_groups.slice_workers(
      environ={"TPU_WORKER_HOSTNAMES": "a,b,c,d"}, dev=str(tmp_path)) == 4
  for environ, where, endpoints in (
      ({}, dev, lambda: "w-0:uid0:10.0.0.2"), ({}, dev, lambda: None),
      ({}, tmp_path, lambda: two),  # no chips here: not asked
      ({"TPU_WORKER_HOSTNAMES": "localhost"}, dev, lambda: two)):
    device_groups.refuse_a_slice(environ=environ, dev=str(where),
                                 endpoints=endpoints)


def test_live_status_line_on_a_terminal(env, capsys, monkeypatch):
  path = env["write_sweep"]("""
      def get_sweep(arg=None):
        return sweep.axis("config.seed", [7])
      """)
  monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
  assert sweep.main([path, f"--workdir_root={env['root']}",
                     f"--main_module={env['fake']}"]) == 0
  out = capsys.readouterr().out
  assert "\r\x1b[K[1/1] seed=7: 0 s  fake main starting in " in out
  assert "\r\x1b[K[1/1] seed=7: ok in " in out


def test_results_only_runs_nothing(env, capsys):
  root, path = env["root"], _lr_sweep(env, [0.001, 0.002])
  done = root / "optimizer.learning_rate=0.002,model.share=none"
  done.mkdir(parents=True)
  (done / "final_metrics.json").write_text('{"step": 5, "eval_x": 0.123456}')
  assert sweep.main([path, f"--workdir_root={root}", "--results_only",
                     f"--main_module={env['fake']}"]) == 0
  assert not _calls(root)
  assert capsys.readouterr().out.splitlines()[-2:] == [
      "| optimizer.learning_rate=0.001,model.share=none | missing | 0.001 "
      "|  |  |",
      f"| {done.name} | done | 0.002 | 5 | 0.1235 |"]


def test_results_table_columns():
  trials = {"a": {"x": 1, "y": "p|q"}, "b": {"x": 2, "y": "p|q"}}
  table = sweep.results_table(
      trials, {"a": "ok", "b": "failed"},
      {"a": {"step": 10, "loss": 1.23456789, "flag": True}, "b": None})
  assert table.splitlines() == [
      "| trial | status | x | step | loss | flag |",
      "|---|---|---|---|---|---|",
      "| a | ok | 1 | 10 | 1.235 | true |",
      "| b | failed | 2 |  |  |  |"]
  # A single trial: nothing varies, so every override is shown (escaped).
  one = sweep.results_table({"a": trials["a"]}, {"a": "ok"}, {"a": None})
  assert one.splitlines()[0] == "| trial | status | x | y |"
  assert one.splitlines()[2] == r"| a | ok | 1 | p\|q |"


def test_module_runs_from_the_command_line(env):
  # The real entry point, in a subprocess: `python -m albert_jax.tools.sweep`.
  del env  # only for the working directory
  result = subprocess.run(
      [sys.executable, "-m", "albert_jax.tools.sweep", "experiments/demo_lr.py",
       "--print_commands", "--workdir_root=/nonexistent/demo_lr"],
      capture_output=True, text=True, check=False, cwd=REPO,
      env={**os.environ, "JAX_PLATFORMS": "cpu"})
  assert result.returncode == 0, result.stderr
  lines = result.stdout.splitlines()
  assert len(lines) == 6
  assert lines[-1] == (
      "python -m albert_jax.main --config=configs/demo.py:steps=200,finetune_steps=0 "
      "--workdir=/nonexistent/demo_lr/optimizer.learning_rate=0.008,"
      "model.share=none --config.optimizer.learning_rate=0.008 "
      "--config.model.share=none")
