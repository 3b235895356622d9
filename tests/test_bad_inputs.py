"""A catalogue of bad inputs: each fails clearly, and nothing is lost.

Every test feeds one kind of bad input to the code path a user would hit
(the CLI, `pretrain.run`, the trainer's data setup, the checkpoint manager)
and checks that the error says what is wrong and how to fix it, and that
what was there before (a workdir's checkpoint and config, the input files)
is untouched. Where the code skips bad input instead of failing, the test
checks that it is counted and reported. RELIABILITY.md maps each case to
its test, here or elsewhere in tests/.
"""

import contextlib
import errno
import gzip
import hashlib
import importlib.util
import itertools
import json
import logging
import os
import re
import subprocess
import sys

import jax
import jax.numpy as jnp
from locations import CONFIGS
from locations import CORPUS
from locations import REPO
import ml_collections
import numpy as np
import orbax.checkpoint as ocp
import pytest
# The trainer's real state structure, filled with random values.
from training.test_checkpoints import abstract_state  # pylint: disable=g-bad-import-order
from training.test_checkpoints import random_state
from training.test_checkpoints import tiny_config

from albert_jax.text import documents as documents_lib
from albert_jax.data import loader as loader_lib
from albert_jax.data import pipeline
from albert_jax.data import prepare as prep
from albert_jax.interop import CheckpointError
from albert_jax.interop.pretrained import load_pretrained
from albert_jax.text import run_tokenizer
from albert_jax.text import train_tokenizer as text_train
from albert_jax.text.tokenizer import Tokenizer
from albert_jax.training import checkpoint_shapes
from albert_jax.training import checkpoints
from albert_jax.training import defaults
from albert_jax.training import pretrain

VOCAB, SEQ = 300, 32


def snapshot(root):
  """{relative path: sha256} of every file under `root`."""
  out = {}
  for directory, _, files in os.walk(root):
    for name in files:
      path = os.path.join(directory, name)
      with open(path, "rb") as f:
        out[os.path.relpath(path, root)] = hashlib.sha256(f.read()).digest()
  return out


@pytest.fixture(scope="module")
def lines():
  with gzip.open(CORPUS, "rt", encoding="utf-8") as f:
    return [line.strip() for line in itertools.islice(f, 400)]


@pytest.fixture(scope="module")
def tokenizer(lines, tmp_path_factory):
  d = tmp_path_factory.mktemp("spm")
  (d / "corpus.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
  return text_train.train(str(d / "corpus.txt"), VOCAB,
                          output=d / "spiece.model", seed=1, num_threads=2)


@pytest.fixture(scope="module")
def data_dir(lines, tokenizer, tmp_path_factory):
  out = tmp_path_factory.mktemp("data")
  docs = [[s for s in lines[i:i + 6] if s] for i in range(0, len(lines), 6)]
  prep.prepare(iter(docs), prep.PrepareConfig(
      tokenizer=tokenizer.path, output_dir=str(out), max_seq_length=SEQ,
      docs_per_block=100, eval_fraction=0.0, seed=0), progress=None)
  return str(out)


def run_config(tokenizer, data_dir, **model):
  """configs/tiny.py sized to the prepared data, as `pretrain.run` takes it."""
  config = tiny_config(**model)
  config.data.tokenizer = tokenizer.path
  config.data.data_dir = data_dir
  config.eval_batches = 0
  return config


@pytest.fixture
def workdir(tmp_path):
  """A workdir holding a checkpoint of the tiny model and its config."""
  abstract, shardings = abstract_state(tiny_config())
  mngr = checkpoints.manager(tmp_path)
  checkpoints.save(mngr, random_state(abstract, shardings, step=4),
                   {"step": 4, "data_position": 4})
  mngr.wait_until_finished()
  (tmp_path / "config.json").write_text(tiny_config().to_json_best_effort(),
                                        encoding="utf-8")
  return tmp_path


def data_config(corpus, vocab_size=VOCAB, tokenizer_path="", **data):
  """The trainer's config, as far as `ensure_tokenizer` and
  `ensure_dataset` read it."""
  config = ml_collections.ConfigDict(defaults.upgrade(dict(
      seed=0, model=dict(vocab_size=vocab_size),
      data=dict(corpus=str(corpus), format="sentences",
                tokenizer=tokenizer_path, data_dir="", max_seq_length=SEQ,
                objective="sop", nsp_negatives_in_sop=False,
                short_seq_prob=0.1, dupe_factor=1, eval_fraction=0.0,
                num_workers=1))))
  config.data.update(data)
  return config


def ensure_tokenizer(config, workdir):
  """`run_tokenizer.ensure` as the trainer calls it with `config`."""
  return run_tokenizer.ensure(config.data, workdir,
                              vocab_size=config.model.vocab_size,
                              seed=config.seed)


def ensure_dataset(config, workdir, tokenizer):
  """`pipeline.ensure_dataset` as the trainer calls it with `config`."""
  return pipeline.ensure_dataset(config.data, workdir, tokenizer,
                                 seed=config.seed)


def cli(*args, cwd=REPO, timeout=300):
  env = {**os.environ, "JAX_PLATFORMS": "cpu"}
  return subprocess.run([sys.executable, "-m", "albert_jax.main", *args],
                        cwd=cwd, env=env, capture_output=True, text=True,
                        timeout=timeout)


@pytest.fixture(scope="module")
def cli_once(tmp_path_factory):
  """Runs the CLI once per argument list for the whole module (each run
  takes seconds). "{run}" in an argument is a fresh workdir path, also
  given as the result's `.workdir`."""
  runs, root = {}, tmp_path_factory.mktemp("cli")

  def run(*args):
    if args not in runs:
      workdir = root / f"run{len(runs)}"
      runs[args] = cli(*(a.format(run=workdir) for a in args))
      runs[args].workdir = workdir
    return runs[args]
  return run


################################################################################
# The command line and the config.
################################################################################

UNKNOWN_KEYS = ("--config.batch_sz=3", "--config.optimizr.learning_rate=1")


@pytest.mark.parametrize("override, wanted", [
    (UNKNOWN_KEYS[0], "batch_size"), (UNKNOWN_KEYS[1], "optimizer")])
def test_unknown_config_key_names_the_closest(cli_once, override, wanted):
  proc = cli_once("--config=configs/tiny.py", override, "--workdir={run}")
  assert proc.returncode != 0
  key = override.split("=")[0][len("--config."):]
  bad = key.split(".")[0]
  assert proc.stderr.splitlines()[-1].startswith(
      f"error: Unknown config key {key!r}: config has no field {bad!r} "
      f"(did you mean {wanted!r}"), proc.stderr[-2000:]
  assert not proc.workdir.exists()  # failed before writing anything


WRONG_TYPES = ("--config.batch_size=abc", "--config.async_checkpoints=maybe")


@pytest.mark.parametrize("override, expected", [
    (WRONG_TYPES[0], "--config.batch_size=abc: invalid literal for int()"),
    (WRONG_TYPES[1], "--config.async_checkpoints=maybe: ('Non-boolean"),
])
def test_wrong_value_type_names_flag_and_value(cli_once, override, expected):
  proc = cli_once("--config=configs/tiny.py", override, "--workdir={run}")
  assert proc.returncode != 0
  assert expected in proc.stderr, proc.stderr[-2000:]
  assert not proc.workdir.exists()


@pytest.mark.parametrize("override", UNKNOWN_KEYS[:1] + WRONG_TYPES[:1])
def test_config_override_errors_print_no_traceback(cli_once, override):
  proc = cli_once("--config=configs/tiny.py", override, "--workdir={run}")
  assert proc.returncode != 0
  assert "Traceback" not in proc.stderr, proc.stderr[-2000:]


def load_config(file, arg=None):
  spec = importlib.util.spec_from_file_location("config", CONFIGS / file)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config(arg)


TASK_CHOICES = (
    "('glue/cola', 'glue/sst2', 'glue/mrpc', 'glue/qqp', 'glue/stsb', "
    "'glue/mnli', 'glue/qnli', 'glue/rte', 'glue/wnli', 'glue/ax', "
    "'files', 'race/high', 'race/middle', 'race/all', 'choice/files', "
    "'squad/v1.1', 'squad/v2.0', 'ner/files', 'ner/conll2003')")


def test_misspelt_finetuning_names_are_refused_with_the_closest():
  """config.data.task, task_type and v2_head are checked at start, and the
  registry checks a task name wherever a task is made."""
  from albert_jax.training import config_check  # pylint: disable=g-import-not-at-top
  from albert_jax.finetune import registry  # pylint: disable=g-import-not-at-top
  with pytest.raises(ValueError) as e:
    registry.make_task("ner/file", {})
  assert str(e.value) == (
      "Unknown task config.data.task='ner/file' (did you mean 'ner/files'?); "
      "use glue/NAME (cola, sst2, mrpc, qqp, stsb, mnli, qnli, rte, wnli, "
      "ax) or files, race/high, race/middle, race/all, choice/files, "
      "squad/v1.1, squad/v2.0, ner/files, ner/conll2003 ('files', ner/files "
      "and choice/files read your own TSV/CSV/JSONL, CoNLL-format and "
      "multiple-choice files).")
  classify = load_config("classify.py")
  classify.data.task = "GLUE/SST-2"
  classify.data.task_type = "regresion"
  with pytest.raises(config_check.ConfigError) as e:
    config_check.check(classify, registry.task_names(),
                       registry.config_choices())
  assert str(e.value) == (
      "config.data.task_type='regresion' must be one of ('classification', "
      "'regression') (did you mean 'regression'?), e.g. "
      "--config.data.task_type=regression; config.data.task='GLUE/SST-2' "
      f"must be one of {TASK_CHOICES} (did you mean 'glue/sst2'?), e.g. "
      "--config.data.task=glue/sst2.")
  squad = load_config("squad.py", "version=2.0")
  squad.data.v2_head = "simpel"
  with pytest.raises(config_check.ConfigError) as e:
    config_check.check(squad, choices=registry.config_choices())
  assert str(e.value) == (
      "config.data.v2_head='simpel' must be one of ('official', 'simple') "
      "(did you mean 'simple'?), e.g. --config.data.v2_head=simple.")
  # The optimizer's name too (it used to fail only when the optimizer was
  # built).
  squad.data.v2_head = "simple"
  squad.optimizer.name = "adam"
  with pytest.raises(config_check.ConfigError) as e:
    config_check.check(squad)
  assert str(e.value) == (
      "config.optimizer.name='adam' must be one of ('adamw', 'lamb') (did "
      "you mean 'adamw'?), e.g. --config.optimizer.name=adamw.")


def test_a_misspelt_task_on_the_command_line_writes_nothing(cli_once):
  proc = cli_once("--config=configs/classify.py", "--config.data.task=file",
                  "--workdir={run}")
  assert proc.returncode == 1
  assert proc.stderr.splitlines()[-1] == (
      "error: config.data.task='file' must be one of "
      f"{TASK_CHOICES} (did you mean 'files'?), e.g. "
      "--config.data.task=files.")
  assert "Traceback" not in proc.stderr
  assert not proc.workdir.exists()


def test_config_file_argument_of_wrong_type():
  sys.path.insert(0, str(CONFIGS))
  try:
    import tiny  # pylint: disable=import-outside-toplevel
  finally:
    sys.path.pop(0)
  with pytest.raises(ValueError, match=r"layers must be an integer, got "
                     r"'two'; e\.g\. layers=2\."):
    tiny.get_config("layers=two")
  with pytest.raises(ValueError, match=r"dropout must be a number, got "
                     r"'lots'; e\.g\. dropout=0\.0\."):
    tiny.get_config("dropout=lots")


def test_malformed_mesh_override(cli_once, tokenizer, data_dir):
  # `--config.mesh=data` parses, as the tuple ('data',): the mesh check
  # says what the form must be.
  proc = cli_once("--config=configs/tiny.py", "--config.mesh=data",
                  f"--config.data.tokenizer={tokenizer.path}",
                  f"--config.data.data_dir={data_dir}",
                  f"--config.model.vocab_size={VOCAB}",
                  f"--config.data.max_seq_length={SEQ}", "--workdir={run}")
  assert proc.returncode != 0
  assert ("config.mesh must be a non-empty sequence of (axis name, size) "
          "pairs") in proc.stderr, proc.stderr[-2000:]
  assert """--config.mesh="(('data',-1),('fsdp',1),('tensor',1))\"""" in (
      proc.stderr)
  assert os.listdir(proc.workdir) == []  # no checkpoint, no config.json


def test_mesh_not_matching_device_count(tokenizer, data_dir, workdir):
  config = run_config(tokenizer, data_dir)
  config.mesh = (("data", 2), ("fsdp", 2))
  before = snapshot(workdir)
  with pytest.raises(ValueError, match=(
      r"Mesh \{'data': 2, 'fsdp': 2\} has 4 devices but 1 are available; "
      r"set one axis to -1 or fix the sizes in config\.mesh")):
    pretrain.run(config, str(workdir))
  assert snapshot(workdir) == before


def test_batch_not_divisible_by_data_parallel_size(tokenizer, data_dir,
                                                   workdir):
  before = snapshot(workdir)
  proc = cli("--config=configs/tiny.py", "--num_fake_devices=2",
             "--config.batch_size=7",
             f"--config.data.tokenizer={tokenizer.path}",
             f"--config.data.data_dir={data_dir}",
             f"--config.model.vocab_size={VOCAB}",
             f"--config.data.max_seq_length={SEQ}",
             "--config.masking.max_predictions=5", f"--workdir={workdir}")
  assert proc.returncode != 0
  assert ("batch_size 7 must be divisible by the data-parallel size (2)"
          in proc.stderr), proc.stderr[-2000:]
  assert snapshot(workdir) == before


################################################################################
# Corpora.
################################################################################


def test_empty_corpus(tokenizer, tmp_path):
  empty = tmp_path / "empty.txt"
  empty.write_text("\n \n\n", encoding="utf-8")
  # Training a tokenizer on it ...
  with pytest.raises(ValueError, match=(
      r"Cannot train a tokenizer on config\.data\.corpus=.*empty\.txt.*No "
      r"usable sentences.*Point config\.data\.corpus at UTF-8 text")):
    ensure_tokenizer(data_config(empty), str(tmp_path / "run"))
  assert not os.path.exists(tmp_path / "run" / "spm" / "spiece.model")
  assert not list((tmp_path / "run" / "spm").glob("*.partial.*"))
  # ... or preparing it with a tokenizer given.
  config = data_config(empty, tokenizer_path=tokenizer.path)
  with pytest.raises(ValueError, match=(
      r"Nothing to train on: config\.data\.corpus=.*empty\.txt.* holds no "
      r"documents\. Check config\.data\.corpus and config\.data\.format")):
    ensure_dataset(config, str(tmp_path / "run"), tokenizer)
  assert not os.path.exists(tmp_path / "run" / "data" / "dataset.json")
  # A corpus that matches no file at all.
  with pytest.raises(FileNotFoundError, match=(
      r"config\.data\.corpus=.*nothing-\*\.txt.*No files match")):
    ensure_tokenizer(data_config(tmp_path / "nothing-*.txt"),
                     str(tmp_path / "run"))
  assert empty.read_text(encoding="utf-8") == "\n \n\n"


def test_single_sentence_documents(tokenizer, lines, tmp_path):
  corpus = tmp_path / "lines.txt"
  text = "\n\n".join(lines[:60]) + "\n"  # a blank line after every sentence
  corpus.write_text(text, encoding="utf-8")
  config = data_config(corpus, tokenizer_path=tokenizer.path)
  with pytest.raises(ValueError, match=(
      r"all \d+ documents of config\.data\.corpus=.*single sentence.*at least "
      r"2 sentences\. Add documents of several sentences.*"
      r"--config\.data\.objective=none")):
    ensure_dataset(config, str(tmp_path / "run"), tokenizer)
  assert not os.listdir(tmp_path / "run" / "data")  # no partial dataset
  # The suggested fix works.
  config.data.objective = "none"
  out = ensure_dataset(config, str(tmp_path / "run"), tokenizer)
  meta = json.loads((tmp_path / "run" / "data" / "dataset.json").read_text())
  assert out.endswith("data") and meta["splits"]["train"]["instances"] > 0
  assert corpus.read_text(encoding="utf-8") == text


def test_non_utf8_lines_are_skipped_and_counted(lines, tmp_path, caplog):
  corpus = tmp_path / "dirty.txt"
  good = "\n".join(lines) + "\n"
  corpus.write_bytes(b"Caf\xe9 au lait is French.\n" + good.encode()
                     + b"\nLatin-1 \xff\xfe here.\nAnd more.\n")
  config = data_config(corpus)
  # The tokenizer is trained on the rest, with a summary that counts.
  with caplog.at_level(logging.WARNING):
    tok = ensure_tokenizer(config, str(tmp_path / "run"))
  assert ("Skipped 2 line(s) that are not UTF-8, 0 line(s) over "
          f"{documents_lib.MAX_LINE_BYTES} bytes") in caplog.text
  caplog.clear()
  with caplog.at_level(logging.WARNING):
    ensure_dataset(config, str(tmp_path / "run"), tok)
  text = caplog.text
  assert f"{corpus}:1" in text and f"{corpus}:{len(lines) + 3}" in text
  assert "Skipped 2 line(s) that are not UTF-8" in text
  meta = json.loads((tmp_path / "run" / "data" / "dataset.json").read_text())
  assert meta["read"]["skipped_non_utf8"] == 2
  assert meta["splits"]["train"]["instances"] > 0


def test_megabyte_lines(lines, tmp_path, caplog):
  """A 1 MB line is read, tokenised and cut to max_seq_length (quickly);
  one over documents.MAX_LINE_BYTES (1 MiB) is skipped and counted."""
  words = itertools.cycle(" ".join(lines).split())
  sentence = " ".join(itertools.islice(words, 200_000))[:1_000_000]
  assert len(sentence.encode()) == 1_000_000
  too_long = "x" * (documents_lib.MAX_LINE_BYTES + 1)
  corpus = tmp_path / "long.txt"
  corpus.write_text("\n".join(lines[:120]) + "\n\nA short one.\n" + sentence
                    + "\nThe end.\n\nAnother.\n" + too_long + "\nLast.\n",
                    encoding="utf-8")
  config = data_config(corpus)
  with caplog.at_level(logging.WARNING):
    tok = ensure_tokenizer(config, str(tmp_path / "run"))
  assert ("Skipped 0 line(s) that are not UTF-8, 1 line(s) over "
          f"{documents_lib.MAX_LINE_BYTES} bytes") in caplog.text
  caplog.clear()
  with caplog.at_level(logging.WARNING):
    data = ensure_dataset(config, str(tmp_path / "run"), tok)
  assert "line longer than" in caplog.text
  meta = json.loads((tmp_path / "run" / "data" / "dataset.json").read_text())
  assert meta["read"]["skipped_long_lines"] == 1
  # Every other line was read, the megabyte one included.
  written = corpus.read_text(encoding="utf-8").split("\n")
  assert meta["read"]["sentences"] == sum(map(bool, written)) - 1
  # Every instance on disk fits max_seq_length (the loader checks each).
  instances = meta["splits"]["train"]["instances"]
  loader = loader_lib.Loader(
      data, "train", global_batch_size=instances, prefetch=0,
      vocab=loader_lib.Vocabulary.from_tokenizer(tok), process_index=0,
      process_count=1)
  assert loader.local_batch(0)["input_ids"].shape == (instances, SEQ)


################################################################################
# Tokenizers.
################################################################################


def test_missing_tokenizer_file(tmp_path):
  config = data_config(tmp_path / "corpus.txt",
                       tokenizer_path=str(tmp_path / "nope" / "spiece.model"))
  with pytest.raises(FileNotFoundError, match=(
      r"config\.data\.tokenizer '.*nope/spiece\.model' does not exist; give "
      r"the path of a SentencePiece \.model .*or leave config\.data\."
      r"tokenizer empty to train one in the workdir")):
    ensure_tokenizer(config, str(tmp_path / "run"))


def test_tokenizer_from_file_missing_is_file_not_found(tmp_path):
  with pytest.raises(FileNotFoundError, match="nope.model"):
    Tokenizer.from_file(str(tmp_path / "nope.model"))


@pytest.mark.parametrize("damage", ["garbage", "truncated"])
def test_corrupt_tokenizer_file(tokenizer, tmp_path, damage):
  path = tmp_path / "spiece.model"
  with open(tokenizer.path, "rb") as f:
    whole = f.read()
  path.write_bytes(b"\x00garbage" * 40 if damage == "garbage"
                   else whole[:len(whole) // 3])
  config = data_config(tmp_path / "corpus.txt", tokenizer_path=str(path))
  with pytest.raises(ValueError, match=(
      r"config\.data\.tokenizer '.*spiece\.model' cannot be read as a "
      r"tokenizer \(.*\); it is damaged or not a SentencePiece \.model.*"
      r"Give the path of a SentencePiece \.model")):
    ensure_tokenizer(config, str(tmp_path / "run"))
  # The workdir's own tokenizer, damaged: the message says how to recover.
  (tmp_path / "run" / "spm").mkdir(parents=True)
  (tmp_path / "run" / "spm" / "spiece.model").write_bytes(path.read_bytes())
  with pytest.raises(ValueError, match=(
      r"The workdir's tokenizer .* cannot be read.*Delete it \(and the "
      r"workdir's data/\) to train a new one")):
    ensure_tokenizer(data_config(tmp_path / "corpus.txt"),
                     str(tmp_path / "run"))


def test_wordpiece_vocab_with_a_repeated_line(tmp_path):
  path = tmp_path / "vocab.txt"
  path.write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nthe\n##s\nthe\n",
                  encoding="utf-8")
  with pytest.raises(ValueError, match="the"):
    Tokenizer.from_file(str(path))


def test_a_text_file_is_not_read_as_a_vocabulary(tmp_path):
  notes = tmp_path / "notes.txt"
  notes.write_text("secret one\nsecret two\n", encoding="utf-8")
  with pytest.raises(ValueError) as e:
    Tokenizer.from_file(str(notes))
  assert str(e.value) == (
      f"{notes} is not a WordPiece vocab.txt: no line is \"[UNK]\", which "
      "every BERT vocabulary has. Give a tokenizer's vocab.txt (or its "
      "spiece.model / tokenizer.json).")


def test_a_recorded_tokenizer_path_never_leads_out_of_the_workdir(
    tokenizer, tmp_path):
  """A workdir's config.json naming `../…` is refused; a relative path is
  read inside the workdir; absolute ones the user gave stay allowed."""
  work = tmp_path / "w"
  (work / "spm").mkdir(parents=True)
  (work / "spm" / "spiece.model").write_bytes(open(tokenizer.path,
                                                   "rb").read())
  (tmp_path / "notes.txt").write_text("[UNK]\nsecret\n", encoding="utf-8")
  (work / "link").symlink_to(tmp_path)
  for escape in ("../notes.txt", "spm/../../notes.txt", "link/notes.txt"):
    with pytest.raises(ValueError) as e:
      run_tokenizer.find({"data": {"tokenizer": escape}}, str(work))
    assert str(e.value) == (
        f"{work}/config.json records data.tokenizer={escape!r}, a relative "
        "path that leads outside the workdir; albert_jax does not follow "
        "it. Give the file yourself (e.g. .tokenizer = "
        "Tokenizer.from_file(PATH)), or record an absolute path or gs:// "
        "URL in config.json.")
  found = run_tokenizer.find({"data": {"tokenizer": "spm/spiece.model"}},
                             str(work))
  assert found.path == str(work / "spm" / "spiece.model")
  assert run_tokenizer.find({"data": {"tokenizer": tokenizer.path}},
                            str(work)).path == tokenizer.path


################################################################################
# Checkpoints and workdirs.
################################################################################


def test_checkpoint_of_another_model_shape(tokenizer, data_dir, workdir):
  before = snapshot(workdir)
  with pytest.raises(checkpoint_shapes.CheckpointShapeError) as error:
    pretrain.run(run_config(tokenizer, data_dir, hidden_size=48), str(workdir))
  message = str(error.value)
  assert "Checkpoint step 4" in message and "another shape" in message
  assert ("params/pooler/bias: checkpoint (64,), model (48,)" in message), (
      message)
  assert "Use the config the checkpoint was written with, or a new workdir" in (
      message)
  # Neither the checkpoint nor the config.json that describes it changed.
  assert snapshot(workdir) == before


def test_hf_directory_of_an_unsupported_model_type(tmp_path):
  config = {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"],
            "n_embd": 64, "n_layer": 2, "vocab_size": 100}
  (tmp_path / "config.json").write_text(json.dumps(config), encoding="utf-8")
  (tmp_path / "model.safetensors").write_bytes(b"not read")
  before = snapshot(tmp_path)
  with pytest.raises(CheckpointError, match=(
      r"model_type='gpt2'; albert_jax reads checkpoints of model types "
      r"albert, bert")):
    load_pretrained(str(tmp_path))
  assert snapshot(tmp_path) == before


def test_unwritable_workdir(tokenizer, data_dir, tmp_path):
  blocker = tmp_path / "file"
  blocker.write_text("not a directory", encoding="utf-8")
  with pytest.raises(PermissionError, match=(
      r"Cannot write to workdir .*file/run.*choose a directory you can "
      r"write, e\.g\. --workdir=")):
    pretrain.run(run_config(tokenizer, data_dir), str(blocker / "run"))
  assert blocker.read_text(encoding="utf-8") == "not a directory"
  # A file where the checkpoints directory belongs.
  (tmp_path / "w").mkdir()
  (tmp_path / "w" / "checkpoints").write_text("mine", encoding="utf-8")
  with pytest.raises(NotADirectoryError, match=(
      r"w/checkpoints is a file, where the workdir's checkpoints directory "
      r"belongs; move it away, or choose another --workdir")):
    checkpoints.manager(str(tmp_path / "w"))
  assert (tmp_path / "w" / "checkpoints").read_text() == "mine"


class _FailingCommit:
  """A write future that fails as a full disk does, in orbax's thread,
  after the real writes (waited for first) are done."""

  def result(self, timeout=None):
    del timeout
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def _small_state(step):
  return {"step": jnp.int32(step),
          "params": {"w": jnp.arange(6, dtype=jnp.float32).reshape(2, 3)
                          * step}}


# orbax logs the background thread's failure; tensorstore may report it late.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.parametrize("where", ["background write", "save call"])
def test_disk_full_during_a_checkpoint(tmp_path, monkeypatch, where):
  mngr = checkpoints.manager(tmp_path, keep=5)
  checkpoints.save(mngr, _small_state(1), {"step": 1})
  mngr.wait_until_finished()
  kept = snapshot(os.path.join(tmp_path, "checkpoints", "1"))

  if where == "background write":  # fails after save returned
    write = ocp.StandardCheckpointHandler.async_save

    async def full_disk(self, *args, **kwargs):
      return list(await write(self, *args, **kwargs) or []) + [
          _FailingCommit()]
    monkeypatch.setattr(ocp.StandardCheckpointHandler, "async_save",
                        full_disk)
  else:  # fails inside save itself, for every item (no write goes on)
    async def full_disk(self, *args, **kwargs):
      del self, args, kwargs
      raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    for handler in (ocp.StandardCheckpointHandler, ocp.JsonCheckpointHandler):
      monkeypatch.setattr(handler, "async_save", full_disk)

  with pytest.raises(checkpoints.CheckpointWriteError) as error:
    checkpoints.save(mngr, _small_state(2), {"step": 2})
    mngr.wait_until_finished()
  assert error.value.errno == errno.ENOSPC
  message = str(error.value)
  assert "Writing checkpoint step 2 to" in message
  assert "No space left on device" in message
  assert "(steps [1]) are intact" in message and "resumes from step 1" in (
      message)
  assert "Free space on that disk" in message

  # The run stops here (as the trainer does, on any exception). Space freed,
  # the previous checkpoint is intact and is what a rerun restores.
  with contextlib.suppress(checkpoints.CheckpointWriteError):
    mngr.close()  # what an exiting process would wait for
  monkeypatch.undo()
  assert snapshot(os.path.join(tmp_path, "checkpoints", "1")) == kept
  abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype),
                          _small_state(0))
  shardings = jax.tree.map(
      lambda _: jax.sharding.SingleDeviceSharding(jax.devices()[0]), abstract)
  mngr = checkpoints.manager(tmp_path, keep=5)
  state, meta = checkpoints.restore_latest(mngr, abstract, shardings)
  assert meta["step"] == 1
  np.testing.assert_array_equal(state["params"]["w"],
                                _small_state(1)["params"]["w"])
  # And training can save step 2 after all.
  checkpoints.save(mngr, _small_state(2), {"step": 2})
  mngr.wait_until_finished()
  state, meta = checkpoints.restore_latest(checkpoints.manager(tmp_path),
                                           abstract, shardings)
  assert meta["step"] == 2 and int(state["step"]) == 2


################################################################################
# Damaged project files: one line naming the file, what is wrong, the fix.
################################################################################


_TORN = ('{"format": "albert_jax', "[1, 2]", "\xff\xfe")


@pytest.mark.parametrize("text", _TORN)
def test_a_damaged_dataset_json_names_itself_and_the_fix(tmp_path, text):
  from albert_jax import storage  # pylint: disable=g-import-not-at-top
  (tmp_path / loader_lib.METADATA).write_bytes(text.encode("latin-1"))
  with pytest.raises(storage.DamagedFileError) as e:
    loader_lib.read_metadata(str(tmp_path))
  message = str(e.value)
  assert message.startswith(f"{tmp_path}/{loader_lib.METADATA} is damaged (")
  assert message.endswith(
      f"; prepare the data again: delete {tmp_path} and rerun (a run prepares "
      "its workdir's data/ itself), or run `python -m albert_jax.data.prepare` "
      "into it.")
  assert "\n" not in message


def test_dataset_json_shards_outside_the_directory_are_refused(data_dir,
                                                               tmp_path):
  from albert_jax import storage  # pylint: disable=g-import-not-at-top
  metadata = json.loads(open(f"{data_dir}/{loader_lib.METADATA}").read())
  metadata["splits"]["train"]["files"][0] = "../elsewhere/train-0.array_record"
  (tmp_path / loader_lib.METADATA).write_text(json.dumps(metadata))
  with pytest.raises(storage.DamagedFileError, match=re.escape(
      f"{tmp_path}/{loader_lib.METADATA} is damaged (its \"splits\" are not "
      f"lists of shard file names inside {tmp_path}); prepare the data "
      "again")):
    loader_lib.read_metadata(str(tmp_path))


@pytest.mark.parametrize("text", _TORN)
def test_a_damaged_recipe_json_names_itself_and_the_fix(tmp_path, text):
  from albert_jax import storage  # pylint: disable=g-import-not-at-top
  from albert_jax.training import recipe  # pylint: disable=g-import-not-at-top
  (tmp_path / recipe.RECIPE).write_bytes(text.encode("latin-1"))
  with pytest.raises(storage.DamagedFileError) as e:
    recipe.check(tiny_config(), str(tmp_path))
  message = str(e.value)
  assert message.startswith(f"{tmp_path}/{recipe.RECIPE} is damaged (")
  assert message.endswith(
      "; it records the recipe this workdir was trained with, so a resume "
      "can be checked against it: restore it, or delete it to resume without "
      "that check (the next run records it anew).")


@pytest.mark.parametrize("text", _TORN + ('{"best_step": "soon"}',))
def test_a_damaged_final_metrics_json_names_itself_and_the_fix(tmp_path,
                                                              text):
  from albert_jax import storage  # pylint: disable=g-import-not-at-top
  from albert_jax.finetune.serving import fine_tuned as predict_lib  # pylint: disable=g-import-not-at-top
  from albert_jax.tools import sweep  # pylint: disable=g-import-not-at-top
  path = tmp_path / "final_metrics.json"
  path.write_bytes(text.encode("latin-1"))
  with pytest.raises(storage.DamagedFileError) as e:
    predict_lib.best_step(str(tmp_path))
  assert str(e.value).startswith(f"{path} is damaged (")
  assert str(e.value).endswith(
      "; rerun the fine-tuning command on this workdir to write it again, or "
      "load step=None (the newest) or step=N.")
  if "best_step" not in text:
    with pytest.raises(sweep.SweepError) as e:
      sweep.read_metrics(str(tmp_path))
    assert str(e.value).endswith(
        "; delete it, and the sweep runs that trial again (it resumes from "
        "the trial's checkpoints).")


@pytest.mark.parametrize("planted", ["metrics.jsonl", "checkpoints"])
def test_a_workdir_with_a_link_out_of_it_is_refused(tmp_path, planted):
  """Before anything is written: metrics used to be appended through a
  planted link to a file outside the workdir."""
  outside = tmp_path / "outside"
  outside.mkdir()
  (outside / "notes.txt").write_text("mine\n")
  work = tmp_path / "w"
  work.mkdir()
  target = outside / "notes.txt" if planted == "metrics.jsonl" else outside
  (work / planted).symlink_to(target)
  before = snapshot(tmp_path)
  with pytest.raises(PermissionError) as e:
    pretrain.run(tiny_config(), str(work))
  assert str(e.value) == (
      f"{work}/{planted} is a symbolic link to {target}, outside the "
      "workdir; albert_jax writes only inside its workdir and follows no "
      "link it did not make. Replace the link with the file or directory "
      "itself, or use another workdir.")
  assert snapshot(tmp_path) == before
  # A link that stays inside the workdir is the user's business.
  (work / planted).unlink()
  (work / "sub").mkdir()
  (work / planted).symlink_to(work / "sub")
  from albert_jax import storage  # pylint: disable=g-import-not-at-top
  storage.refuse_links_out(str(work))
