"""albert_jax.tools.sweep: trial expansion, names, validation, commands, local runs.

The local runs launch a fake trainer (a short script written by the tests,
given with --main_module) that records its arguments and writes
final_metrics.json, so a whole sweep takes well under a second.
"""

import json
import os
import re
import subprocess
import sys
import textwrap

import pytest

from albert_jax.tools import sweep
from locations import REPO


FAKE_MAIN = textwrap.dedent("""\
    import json, os, sys, time
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
    print("fake main done")
    """)


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
  monkeypatch.delenv("XLA_PYTHON_CLIENT_MEM_FRACTION", raising=False)
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
