"""Reloading fine-tuned models: `load_pretrained(workdir)` → `.predict` on
raw text agrees with the run's own eval predictions, for every task type;
the prediction CLI on a small file; prediction sharded over 4 CPU devices
as training shards; `embed` on a pre-training model."""

import gzip
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import tensorflow_datasets as tfds

import albert_jax
import albert_jax.text.train_tokenizer
from albert_jax import config_lib
from albert_jax import storage
from albert_jax.finetune.serving import fine_tuned as predict_lib
from albert_jax.finetune.serving import prediction_files
from albert_jax.finetune import run as ft
from albert_jax.interop import CheckpointError
from albert_jax.interop import workdir as workdir_lib
from locations import REPO
import tfds_fakes  # pylint: disable=g-bad-import-order

# Every run compiles the same few programs; later runs read them back.

SEQ = 32
WORDS = ("war peace taxes union congress year strong proud bad new sea "
         "ship king city river").split()


def _config(task, tiny_spm, steps=4, **data):
  c = config_lib.finetune_config(
      task, learning_rate=3e-3, batch_size=8, num_train_steps=steps,
      warmup_steps=1, max_seq_length=SEQ, dropout=0.0)
  for k, v in config_lib.tiny_model(vocab_size=300,
                                    max_position_embeddings=SEQ).items():
    c.model[k] = v
  c.model.classifier_dropout_prob = 0.0
  c.data.tokenizer = tiny_spm
  c.data.update(data)
  c.log_every_steps = steps
  c.eval_every_steps = c.checkpoint_every_steps = steps // 2
  c.async_checkpoints = False
  c.fast_compile = True
  return c


def _sentence(rng, n=5):
  return " ".join(rng.choice(WORDS, n))


def _write(path, lines):
  path.write_text("".join(lines), encoding="utf-8")
  return str(path)


@pytest.fixture(scope="module")
def classifier(tmp_path_factory, tiny_spm):
  """(workdir, eval texts, result) of a 3-label classification run."""
  d = tmp_path_factory.mktemp("classify")
  rng = np.random.default_rng(0)
  rows = [(_sentence(rng), "abc"[i % 3]) for i in range(30)]
  header = ["text\tlabel\n"]
  train = _write(d / "train.tsv", header + [f"{t}\t{l}\n" for t, l in rows])
  evals = rows[:7]
  evalf = _write(d / "eval.tsv", header + [f"{t}\t{l}\n" for t, l in evals])
  config = _config("files", tiny_spm, train_file=train, eval_file=evalf,
                   text_column="text", label_column="label")
  result = ft.run(config, str(d / "work"))
  return str(d / "work"), [t for t, _ in evals], result


def _eval_predictions(workdir, name="eval_predictions.tsv"):
  lines = (storage.path(workdir) / "predictions" / name).read_text()
  return [line.split("\t") for line in lines.splitlines()[1:]]


def test_classifier_round_trip(classifier):
  workdir, texts, result = classifier
  model = albert_jax.load_pretrained(workdir)
  assert isinstance(model, predict_lib.FineTuned)
  assert (model.task, model.task_type, model.labels) == (
      "files", "classification", ("a", "b", "c"))
  assert model.step == 4
  got = model.predict(texts)
  want = [row[1] for row in _eval_predictions(workdir)]
  assert [g["label"] for g in got] == want
  for g in got:
    assert set(g) == {"label", "probability", "probabilities", "logits"}
    assert g["probability"] == max(g["probabilities"].values())
    assert abs(sum(g["probabilities"].values()) - 1) < 1e-9
  one = model.predict(texts[0])
  assert one["label"] == want[0]
  np.testing.assert_allclose(one["logits"], got[0]["logits"], rtol=0,
                             atol=1e-5)
  best = albert_jax.load_pretrained(workdir, step="best")
  assert best.step == result["best_step"]
  assert albert_jax.load_pretrained(workdir, step=2).step == 2


def test_classifier_errors(classifier, tmp_path):
  workdir, texts, _ = classifier
  model = albert_jax.load_pretrained(workdir)
  with pytest.raises(predict_lib.PredictError,
                     match=r"fine-tuned on single texts"):
    model.predict([("a", "b")])
  with pytest.raises(CheckpointError, match=r"No checkpoint at step 3"):
    albert_jax.load_pretrained(workdir, step=3)
  with pytest.raises(CheckpointError, match=r"step='best' applies to "
                     "fine-tuning workdirs"):
    albert_jax.load_pretrained(str(tmp_path), step="best")


def test_forward_refuses_ids_the_model_cannot_embed(classifier, tmp_path):
  workdir, texts, _ = classifier
  model = albert_jax.load_pretrained(workdir)
  features = {k: np.zeros((2, 8), np.int32)
              for k in ("input_ids", "token_type_ids", "attention_mask")}
  vocab = model.model_config.vocab_size
  features["input_ids"][1, 3] = vocab  # one past the last row
  with pytest.raises(ValueError, match=re.escape(
      f"input_ids holds ids in [0, {vocab}] but the model's vocabulary has "
      f"{vocab} entries ([0, {vocab - 1}]); use the tokenizer the model was "
      "trained with.")):
    model(features)
  features["input_ids"] = features["input_ids"].astype(np.float32)
  with pytest.raises(ValueError, match="must be integer token ids"):
    model(features)
  # A workdir whose tokenizer/ was swapped for a larger vocabulary.
  copy = tmp_path / "copy"
  shutil.copytree(workdir, copy)
  tok_dir = copy / predict_lib.TOKENIZER_DIR
  for f in tok_dir.iterdir():
    f.unlink()
  big = albert_jax.text.train_tokenizer.train(
      [_write(tmp_path / "c.txt", [f"w{i} x{i} y{i}\n" for i in range(400)])],
      vocab + 50, output=str(tok_dir / "spiece.model"), seed=0)
  with pytest.raises(CheckpointError, match=re.escape(
      f"{copy}/tokenizer has {big.vocab_size} pieces but the model embeds "
      f"{vocab} ids ([0, {vocab - 1}]), so its ids from {vocab} on would be "
      "misread: it is not the vocabulary this run featurized with; restore "
      "the run's own tokenizer/.")):
    albert_jax.load_pretrained(str(copy))


def test_predict_cli_streams_a_gzipped_file(classifier, tmp_path, capsys):
  workdir, texts, _ = classifier
  rows = "".join(json.dumps({"text": t, "id": i}) + "\n"
                 for i, t in enumerate(texts))
  source = tmp_path / "in.jsonl.gz"
  source.write_bytes(gzip.compress(rows.encode()))
  out = tmp_path / "out.jsonl"
  assert prediction_files.main([f"--model={workdir}", f"--input={source}",
                           f"--output={out}", "--batch_size=4",
                           "--no_progress"]) == 0
  lines = [json.loads(x) for x in out.read_text().splitlines()]
  assert [x["row"] for x in lines] == list(range(len(texts)))
  assert [x["label"] for x in lines] == [
      row[1] for row in _eval_predictions(workdir)]
  assert capsys.readouterr().err.startswith(
      f"{len(texts)} predictions written to {out} (step 4 of {workdir}).")
  bad = tmp_path / "bad.tsv"
  bad.write_text("words\nhello\n")
  assert prediction_files.main([f"--model={workdir}", f"--input={bad}",
                           f"--output={out}", "--no_progress"]) == 2
  assert capsys.readouterr().err == (
      f"error: {bad}, line 2: no column 'text' (columns: ['words']); name "
      "the text columns with --columns.\n")


@pytest.mark.parametrize("change, problem", [
    ({"max_seq_length": 10**12}, "max_seq_length 1000000000000 is not a "
     "whole number in [1, 32], the model's positions"),
    ({"max_seq_length": "32"}, "max_seq_length '32' is not a whole number "
     "in [1, 32], the model's positions"),
    ({"labels": "abc"}, "labels 'abc' are not a list of two or more "
     "distinct label names"),
    ({"labels": ["a", "a", "b"]}, "labels ['a', 'a', 'b'] are not a list of "
     "two or more distinct label names"),
    ({"task_type": 5}, "task_type 5 is not one of ('classification', "
     "'regression', 'multiple_choice', 'question_answering', "
     "'token_classification')"),
    ({"lm_head": "yes"}, "lm_head 'yes' is not true or false"),
])
def test_a_damaged_task_json_is_refused_before_it_shapes_anything(
    classifier, tmp_path, change, problem):
  workdir, _, _ = classifier
  copy = tmp_path / "copy"
  shutil.copytree(workdir, copy)
  task_file = copy / workdir_lib.TASK_FILE
  task_file.write_text(json.dumps({**json.loads(task_file.read_text()),
                                   **change}))
  with pytest.raises(CheckpointError) as e:
    albert_jax.load_pretrained(str(copy))
  assert str(e.value) == (
      f"{copy}/{workdir_lib.TASK_FILE} is damaged ({problem}); a fine-tuning "
      "run writes it when it starts: rerun the fine-tuning command on this "
      "workdir, or restore the file.")


def test_a_damaged_tokenizer_copy_is_one_line(classifier, tmp_path):
  workdir, _, _ = classifier
  copy = tmp_path / "copy"
  shutil.copytree(workdir, copy)
  model = copy / predict_lib.TOKENIZER_DIR / "spiece.model"
  model.write_bytes(b"\x00garbage" * 40)
  with pytest.raises(CheckpointError) as e:
    albert_jax.load_pretrained(str(copy))
  message = str(e.value)
  assert message.startswith(f"{copy}/{predict_lib.TOKENIZER_DIR} cannot be "
                            "read as a tokenizer (")
  assert message.endswith("); it is damaged: restore the run's own "
                          "tokenizer/ from a copy, or fine-tune again.")
  assert "\n" not in message


def test_task_json_sizes_and_shape_are_checked(classifier, tmp_path):
  workdir, _, _ = classifier
  copy = tmp_path / "copy"
  shutil.copytree(workdir, copy)
  task_file = copy / workdir_lib.TASK_FILE
  info = json.loads(task_file.read_text())
  task_file.write_text(json.dumps({**info, "model": {**info["model"],
                                                     "vocab_size": 10**12}}))
  with pytest.raises(CheckpointError, match=re.escape(
      "model.vocab_size=1000000000000 is more than albert_jax builds (at "
      "most 4194304)")):
    albert_jax.load_pretrained(str(copy))
  task_file.write_text("[1, 2]")
  with pytest.raises(CheckpointError, match=re.escape(
      f"{copy}/{workdir_lib.TASK_FILE} is damaged (it holds a JSON list, not "
      "an object)")):
    albert_jax.load_pretrained(str(copy))


def test_predict_cli_never_destroys_its_input_or_earlier_output(
    classifier, tmp_path, capsys):
  workdir, texts, _ = classifier
  source = tmp_path / "in.jsonl"
  source.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
  before = source.read_bytes()
  args = [f"--model={workdir}", "--no_progress"]
  # The input named again, directly and through a symlink.
  link = tmp_path / "link.jsonl"
  link.symlink_to(source)
  for same in (source, tmp_path / "." / "in.jsonl", link):
    assert prediction_files.main(args + [f"--input={source}",
                                      f"--output={same}"]) == 2
    assert capsys.readouterr().err == (
        f"error: --output={same} is the input file; writing the predictions "
        "there would destroy it. Give another --output, e.g. "
        "--output=predictions.jsonl.\n")
    assert source.read_bytes() == before
  out = tmp_path / "out.jsonl"
  assert prediction_files.main(args + [f"--input={source}",
                                    f"--output={out}"]) == 0
  good = out.read_bytes()
  assert len(good.splitlines()) == len(texts)
  # A rerun that fails on its input keeps the earlier output as it was.
  bad = tmp_path / "bad.tsv"
  bad.write_text("words\nhello\n")
  assert prediction_files.main(args + [f"--input={bad}",
                                    f"--output={out}"]) == 2
  assert "no column 'text'" in capsys.readouterr().err
  assert out.read_bytes() == good
  # A lone UTF-16 surrogate in a JSON line (it reached SentencePiece as a
  # pybind11 cast error): one line naming the file and the line.
  odd = tmp_path / "odd.jsonl"
  odd.write_text('{"text": "fine"}\n{"text": "half \\udc00"}\n')
  assert prediction_files.main(args + [f"--input={odd}",
                                    f"--output={out}"]) == 2
  err = capsys.readouterr().err
  assert err.startswith(f"error: {odd}, line 2: 'half \\udc00' holds a lone "
                        "UTF-16 surrogate (\\udc00)") and err.count("\n") == 1
  assert out.read_bytes() == good
  assert sorted(os.listdir(tmp_path)) == ["bad.tsv", "in.jsonl", "link.jsonl",
                                          "odd.jsonl", "out.jsonl"]
  # Bad sizes and a missing folder: one line each, before the model loads.
  for flag, message in (
      ("--batch_size=0", "--batch_size=0 must be a whole number >= 1, e.g. "
       "--batch_size=32."),
      ("--batch_size=-3", "--batch_size=-3 must be a whole number >= 1, e.g. "
       "--batch_size=32."),
      (f"--output={tmp_path}/no/such/o.jsonl",
       f"--output={tmp_path}/no/such/o.jsonl: its folder {tmp_path}/no/such "
       f"does not exist; create it (mkdir -p {tmp_path}/no/such) or write "
       "into an existing folder.")):
    assert prediction_files.main(
        [f"--model={tmp_path}/not-a-workdir", "--no_progress",
         f"--input={source}", f"--output={out}", flag]) == 2
    assert capsys.readouterr().err == f"error: {message}\n"
  assert out.read_bytes() == good


def test_a_prediction_cut_short_leaves_no_file_under_its_name(classifier,
                                                               tmp_path):
  """While rows are being written, nothing is under the output's name, so a
  kill at any moment leaves no finished-looking file; an error part-way
  leaves nothing at all."""
  workdir, texts, _ = classifier
  model = albert_jax.load_pretrained(workdir)
  source = tmp_path / "in.jsonl"
  source.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
  out = tmp_path / "out.jsonl.gz"
  seen = []

  class Dies:
    """`model`, whose third chunk is cut short (as a kill would)."""
    task_type, settings = model.task_type, model.settings

    def predict(self, inputs, batch_size):
      seen.append(sorted(os.listdir(tmp_path)))
      if len(seen) == 3:
        raise KeyboardInterrupt
      return model.predict(inputs, batch_size=batch_size)

  with pytest.raises(KeyboardInterrupt):
    prediction_files.predict_file(Dies(), str(source), str(out), chunk_rows=2,
                               progress=False)
  assert len(seen) == 3
  for listing in seen[1:]:  # a temporary file beside, not the output
    assert len(listing) == 2 and listing[0] == "in.jsonl", listing
    assert re.fullmatch(r"out\.jsonl\.gz\.[0-9a-f]{32}\.tmp", listing[1])
  assert sorted(os.listdir(tmp_path)) == ["in.jsonl"]
  assert prediction_files.predict_file(model, str(source), str(out),
                                    progress=False) == len(texts)
  assert len(gzip.decompress(out.read_bytes()).splitlines()) == len(texts)
  assert sorted(os.listdir(tmp_path)) == ["in.jsonl", "out.jsonl.gz"]


def test_a_prediction_killed_leaves_no_file_under_its_name(classifier,
                                                          tmp_path):
  """SIGKILL of the predict command's process group while it writes (its
  first chunk of 1024 rows is out, four more are to come): nothing is
  under the output's name, only the temporary file beside it."""
  workdir, texts, _ = classifier
  source = tmp_path / "in.tsv"
  source.write_text("text\n" + "".join(f"{texts[i % len(texts)]}\n"
                                       for i in range(5000)))
  out = tmp_path / "out.jsonl"
  proc = subprocess.Popen(  # pylint: disable=consider-using-with
      [sys.executable, "-m", "albert_jax.predict", f"--model={workdir}",
       f"--input={source}", f"--output={out}", "--batch_size=64",
       "--no_progress"], cwd=REPO, stdout=subprocess.DEVNULL,
      stderr=subprocess.PIPE, start_new_session=True)
  try:
    deadline = time.monotonic() + 240
    while not any(n.endswith(".tmp") for n in os.listdir(tmp_path)):
      assert proc.poll() is None, proc.stderr.read().decode()[-3000:]
      assert time.monotonic() < deadline, "no temporary file appeared"
      time.sleep(0.01)
    os.killpg(proc.pid, signal.SIGKILL)
    assert proc.wait(timeout=60) == -signal.SIGKILL
  finally:
    if proc.poll() is None:
      os.killpg(proc.pid, signal.SIGKILL)
      proc.wait()
    proc.stderr.close()
  [partial] = [n for n in sorted(os.listdir(tmp_path)) if n != "in.tsv"]
  assert re.fullmatch(r"out\.jsonl\.[0-9a-f]{32}\.tmp", partial), partial


################################################################################
# Several devices: the training code's sharding.
################################################################################


# Run in a subprocess: 4 CPU devices must be set before JAX starts, and this
# process's JAX (conftest.py) has one. Prints, as JSON, the mesh, each
# parameter's shape and shard shape, each batch's and its shards' shapes
# and its sharding's spec, the predictions, and the mesh taken in place of
# one the devices cannot form.
_SHARDED_SCRIPT = r"""
import json, sys
import jax
jax.config.update("jax_default_matmul_precision", "highest")
import albert_jax
from albert_jax.finetune.serving import fine_tuned as predict_lib
from albert_jax.finetune.serving import prediction_files

workdir, texts = sys.argv[1], json.loads(sys.argv[2])
model = albert_jax.load_pretrained(workdir)
batches = []
apply = model._apply

def recording_apply(params, batch):
  ids = batch["input_ids"]
  batches.append({"shape": list(ids.shape), "spec": str(ids.sharding.spec),
                  "shards": sorted({str(s.data.shape)
                                    for s in ids.addressable_shards}),
                  "devices": len(ids.sharding.device_set)})
  return apply(params, batch)

model._apply = recording_apply
params = {
    jax.tree_util.keystr(path, simple=True, separator="/"): [
        list(leaf.shape), list(leaf.addressable_shards[0].data.shape),
        len(leaf.sharding.device_set)]
    for path, leaf in jax.tree_util.tree_flatten_with_path(model.params)[0]}
# A run's mesh these devices cannot form gives way to the default.
fallback, _ = predict_lib.prediction_mesh([["data", 16], ["fsdp", 4]])
print(json.dumps({"devices": jax.device_count(),
                  "mesh": dict(model.mesh.shape),
                  "fallback": dict(fallback.shape), "params": params,
                  "predictions": model.predict(texts, batch_size=3),
                  "batches": batches}))
"""


def _assert_same_predictions(got, want):
  """Labels equal, probabilities within 1e-5."""
  assert [g["label"] for g in got] == [w["label"] for w in want]
  for g, w in zip(got, want):
    assert list(g["probabilities"]) == list(w["probabilities"])
    np.testing.assert_allclose(list(g["probabilities"].values()),
                               list(w["probabilities"].values()), rtol=0,
                               atol=1e-5)


def test_prediction_is_sharded_as_training_is(classifier, tmp_path):
  workdir, texts, _ = classifier
  # The run's recorded mesh is what prediction takes: here FSDP over 2 of
  # the 4 devices, so weights with an `embed` axis are split in two.
  copy = tmp_path / "work"
  shutil.copytree(workdir, copy)
  config = json.loads((copy / "config.json").read_text())
  assert config["mesh"] == [["data", -1], ["fsdp", 1], ["tensor", 1]]
  config["mesh"] = [["data", 2], ["fsdp", 2], ["tensor", 1]]
  (copy / "config.json").write_text(json.dumps(config))
  env = {**os.environ, "JAX_PLATFORMS": "cpu",
         "XLA_FLAGS": (os.environ.get("XLA_FLAGS", "")
                       + " --xla_force_host_platform_device_count=4")}
  proc = subprocess.run(
      [sys.executable, "-c", _SHARDED_SCRIPT, str(copy), json.dumps(texts)],
      env=env, cwd=REPO, capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr[-5000:]
  out = json.loads(proc.stdout.splitlines()[-1])
  assert out["devices"] == 4
  assert out["mesh"] == {"data": 2, "fsdp": 2, "tensor": 1}
  assert out["fallback"] == {"data": 4, "fsdp": 1, "tensor": 1}
  assert ("WARNING:albert_jax.finetune.serving.fine_tuned:The run's mesh does not "
          "fit: Mesh {'data': 16, 'fsdp': 4} has 64 devices but 4 are "
          "available; set one axis to -1 or fix the sizes in config.mesh. "
          "Predicting on mesh data=4, fsdp=1, tensor=1 instead."
          ) in proc.stderr.splitlines()
  # Every weight is on all 4 devices; FSDP halves each one's hidden
  # (`embed`, 64) axis and stores the others whole on every device.
  params = out["params"]
  assert {devices for _, _, devices in params.values()} == {4}
  split = {k: [a // b for a, b in zip(shape, shard)]
           for k, (shape, shard, _) in params.items() if shape != shard}
  assert len(params) == 27 and len(split) == 16
  assert all(sorted(parts) == [1] * (len(parts) - 1) + [2]
             for parts in split.values())
  assert params["albert/encoder/ffn/intermediate/kernel"][:2] == [
      [1, 64, 128], [1, 32, 128]]
  assert params["head/classifier/kernel"][:2] == [[64, 3], [32, 3]]
  assert params["albert/embeddings/word_embeddings/embedding"][:2] == [
      [300, 32], [300, 32]]
  # 7 rows at batch_size 3: batches of 4 (a multiple of the 4 data-parallel
  # devices), the second ending in a padding row; one row per device.
  assert len(texts) == 7
  assert out["batches"] == [
      {"shape": [4, SEQ], "spec": "P(('data', 'fsdp'),)",
       "shards": [f"(1, {SEQ})"], "devices": 4}] * 2
  want = albert_jax.load_pretrained(workdir).predict(texts, batch_size=3)
  assert len(out["predictions"]) == 7
  _assert_same_predictions(out["predictions"], want)


def test_predict_cli_on_fake_devices(classifier, tmp_path):
  workdir, texts, _ = classifier
  source = tmp_path / "in.tsv"
  source.write_text("text\n" + "".join(f"{t}\n" for t in texts))
  out = tmp_path / "out.jsonl"
  # --num_fake_devices alone makes the 4 devices, as for training.
  flags = " ".join(f for f in os.environ.get("XLA_FLAGS", "").split()
                   if "device_count" not in f)
  proc = subprocess.run(
      [sys.executable, "-m", "albert_jax.predict", f"--model={workdir}",
       f"--input={source}", f"--output={out}", "--batch_size=3",
       "--no_progress", "--num_fake_devices=4"],
      env={**os.environ, "XLA_FLAGS": flags}, cwd=REPO, capture_output=True,
      text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr[-5000:]
  assert proc.stderr.splitlines()[-1] == (
      f"7 predictions written to {out} (step 4 of {workdir}; mesh data=4, "
      "fsdp=1, tensor=1).")
  lines = [json.loads(x) for x in out.read_text().splitlines()]
  assert [x["row"] for x in lines] == list(range(7))
  model = albert_jax.load_pretrained(workdir)
  _assert_same_predictions(lines, model.predict(texts, batch_size=3))


def test_predict_cli_fake_devices_must_come_first(classifier, tmp_path,
                                                  capsys):
  workdir, _, _ = classifier
  with pytest.raises(SystemExit) as exit_info:
    prediction_files.main([f"--model={workdir}", "--input=x.tsv",
                      f"--output={tmp_path / 'out.jsonl'}",
                      "--num_fake_devices=4"])
  assert exit_info.value.code == 2
  assert capsys.readouterr().err.splitlines()[-1] == (
      "python -m albert_jax.predict: error: --num_fake_devices=4 takes "
      "effect only as JAX starts, but it has started with 1 device(s); "
      "pass it to `python -m albert_jax.predict`.")


################################################################################
# Question answering (SQuAD v2.0, ALBERT's official head).
################################################################################


def _squad_rows(n, seed):
  rng = np.random.default_rng(seed)
  rows = []
  for i in range(n):
    context = _sentence(rng, 30)
    words = context.split()
    start = int(rng.integers(0, 25))
    answer = " ".join(words[start:start + 2]) if i % 3 else ""
    at = len(" ".join(words[:start])) + (start > 0)
    rows.append({
        "id": f"q{seed}-{i}", "title": "t", "context": context,
        "question": f"where is the {words[start]} ?",
        "answers": {"text": [answer] if answer else [],
                    "answer_start": [at] if answer else []},
        "is_impossible": not answer,
        "plausible_answers": {"text": [], "answer_start": []}})
  return rows


def test_question_answering_round_trip(tmp_path, tiny_spm):
  train, dev = _squad_rows(16, 0), _squad_rows(6, 1)
  config = _config("squad/v2.0", tiny_spm, doc_stride=8, max_query_length=8,
                   n_best_size=5, max_answer_length=6, v2_head="official",
                   tfds_download=False, start_n_top=3, end_n_top=3)
  served = {"train": train, "validation": dev}
  with tfds.testing.mock_data(as_dataset_fn=tfds_fakes.serving(
      lambda builder, split: served[split])):
    ft.run(config, str(tmp_path))
  want = json.loads((tmp_path / "predictions" / "predictions.json")
                    .read_text())
  model = albert_jax.load_pretrained(str(tmp_path), step="best")
  assert (model.task, model.task_type, model.labels) == (
      "squad/v2.0", "question_answering", None)
  got = model.predict([(r["question"], r["context"]) for r in dev])
  assert {r["id"]: g["answer"] for r, g in zip(dev, got)} == want
  for r, g in zip(dev, got):
    assert set(g) == {"answer", "start", "end", "probability", "score",
                      "null_odds", "no_answer"}
    if g["no_answer"]:
      assert (g["answer"], g["start"], g["end"]) == ("", None, None)
    else:
      assert r["context"][g["start"]:g["end"]] == g["answer"]
  # Without a threshold no answer is dropped but those with no valid span.
  kept = model.predict([(r["question"], r["context"]) for r in dev],
                       null_threshold=float("inf"))
  for g in kept:
    assert g["no_answer"] == (g["score"] is None)


################################################################################
# Multiple choice on files, and token classification.
################################################################################


def test_multiple_choice_round_trip(tmp_path, tiny_spm):
  rng = np.random.default_rng(2)

  def rows(n):
    out = []
    for i in range(n):
      endings = [_sentence(rng, 3) for _ in range(3)]
      out.append({"context": _sentence(rng, 8), "start": "then the",
                  "endings": endings, "label": i % 3})
    return out
  train, dev = rows(16), rows(5)
  for name, data in (("train", train), ("eval", dev)):
    _write(tmp_path / f"{name}.jsonl", [json.dumps(r) + "\n" for r in data])
  config = _config("choice/files", tiny_spm,
                   train_file=str(tmp_path / "train.jsonl"),
                   eval_file=str(tmp_path / "eval.jsonl"),
                   context_column="context", question_column="start",
                   choices_column="endings", label_column="label",
                   max_qa_length=12)
  ft.run(config, str(tmp_path / "work"))
  model = albert_jax.load_pretrained(str(tmp_path / "work"))
  assert (model.task, model.task_type) == ("choice/files", "multiple_choice")
  want = [int(r[1]) for r in _eval_predictions(str(tmp_path / "work"))]
  got = model.predict([(r["context"], r["start"], r["endings"]) for r in dev])
  assert [g["choice"] for g in got] == want
  assert [g["answer"] for g in got] == [r["endings"][k]
                                        for r, k in zip(dev, want)]
  # The trained columns are what a file row is read by.
  assert model.predict([{k: r[k] for k in ("context", "start", "endings")}
                        for r in dev]) == got


CONLL_TAGS = ("O", "B-PER", "I-PER", "B-LOC")


def _conll_sentences(n, seed):
  rng = np.random.default_rng(seed)
  out = []
  for _ in range(n):
    words = list(rng.choice(WORDS, 6))
    tags = list(rng.choice(CONLL_TAGS, 6))
    out.append((words, tags))
  return out


def test_token_classification_round_trip(tmp_path, tiny_spm):
  files = {}
  for name, seed, n in (("train", 3, 16), ("eval", 4, 5)):
    lines = ["-DOCSTART- -X- -X- O\n", "\n"]
    for words, tags in _conll_sentences(n, seed):
      lines += [f"{w} NN B-NP {t}\n" for w, t in zip(words, tags)] + ["\n"]
    files[f"{name}_file"] = _write(tmp_path / f"{name}.txt", lines)
  config = _config("ner/files", tiny_spm, **files)
  result = ft.run(config, str(tmp_path / "work"))
  assert {"eval_precision", "eval_recall", "eval_f1",
          "eval_accuracy"} <= set(result)
  # The prediction file comes from the best checkpoint.
  model = albert_jax.load_pretrained(str(tmp_path / "work"), "best")
  assert (model.task_type, model.labels) == (
      "token_classification", ("O", "B-LOC", "B-PER", "I-PER"))
  lines = (tmp_path / "work" / "predictions" / "eval_predictions.txt"
           ).read_text().split("\n\n")
  want = [[line.split()[2] for line in block.splitlines()]
          for block in lines if block.strip()]
  sentences = [" ".join(w) for w, _ in _conll_sentences(5, 4)]
  got = model.predict(sentences)
  assert [g["tags"] for g in got] == want
  for text, g in zip(sentences, got):
    for e in g["entities"]:
      assert text[e["start"]:e["end"]] == e["text"]
      assert e["label"] in ("PER", "LOC")
  # Trained and predicted with sentences packed side by side (the default),
  # the tags are those of one sentence a row.
  assert model.pack == 8
  assert [g["tags"] for g in predict_lib.load(
      str(tmp_path / "work"), "best", pack=0).predict(sentences)] == want
