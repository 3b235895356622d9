"""FineTuneSpec: one description of a fine-tuned model for the run,
--compile_only and prediction.

  * each task family's `batch_features` are what its `load` gives (names,
    per-row shapes, dtypes);
  * the spec's parameters, from zeros of those features, are those of the
    model on real rows, and a spec rebuilt from what the run records
    (`fine_tuned.spec_from_record`) has the same parameter tree;
  * `--compile_only` compiles the fine-tuning step of every task family:
    those on your files (classification, regression, NER, multiple choice)
    and the TFDS ones, GLUE, SQuAD (both heads) and RACE, which build
    their step without their data; with the spec's FLOPs.
"""

import json

import jax
import ml_collections
import numpy as np
import pytest

from albert_jax import config_lib
from albert_jax.finetune.serving import fine_tuned as predict_lib
from albert_jax.finetune import registry
from albert_jax.finetune import spec as spec_lib
from albert_jax.model import flops as flops_lib
from albert_jax.model.config import ModelConfig
from albert_jax.tools import compile_only

SEQ = 32
WORDS = ("the", "cat", "sat", "on", "a", "mat", "dog", "ran", "far", "away")


def _lines(rng, n):
  return " ".join(rng.choice(WORDS, n))


@pytest.fixture(name="files", scope="module")
def fixture_files(tmp_path_factory):
  """Data files of each task family that reads your own files: name →
  config.data fields."""
  d = tmp_path_factory.mktemp("spec_files")
  rng = np.random.default_rng(0)
  (d / "cls.tsv").write_text("text\tlabel\n" + "".join(
      f"{_lines(rng, 6)}\t{['pos', 'neg', 'odd'][i % 3]}\n" for i in range(9)))
  (d / "reg.tsv").write_text("text\tlabel\n" + "".join(
      f"{_lines(rng, 6)}\t{i / 3:.2f}\n" for i in range(9)))
  conll = ["-DOCSTART- -X- -X- O\n", "\n"]
  for _ in range(4):
    conll += [f"{w} NN B-NP {t}\n" for w, t in zip(
        rng.choice(WORDS, 5), rng.choice(("O", "B-PER", "I-PER"), 5))]
    conll.append("\n")
  (d / "ner.txt").write_text("".join(conll))
  (d / "choice.jsonl").write_text("".join(json.dumps(
      {"context": _lines(rng, 8), "start": "then", "endings": [
          _lines(rng, 3) for _ in range(3)], "label": i % 3}) + "\n"
                                            for i in range(6)))
  # The TFDS families build head and batch from their names alone: no
  # download is allowed, so the test fails if one reads its data.
  tfds = dict(tfds_download=False, tfds_data_dir=str(d / "no_tfds"))
  return {
      "glue": ("glue/mrpc", tfds),
      "squad": ("squad/v1.1", tfds),
      "squad_official": ("squad/v2.0", {**tfds, "v2_head": "official"}),
      "race": ("race/high", {**tfds, "max_qa_length": 8}),
      "ner_conll2003": ("ner/conll2003", tfds),
      "classification": ("files", dict(
          train_file=str(d / "cls.tsv"), eval_file=str(d / "cls.tsv"),
          text_column="text", label_column="label")),
      "regression": ("files", dict(
          train_file=str(d / "reg.tsv"), eval_file=str(d / "reg.tsv"),
          text_column="text", label_column="label",
          task_type="regression")),
      "token_classification": ("ner/files", dict(
          train_file=str(d / "ner.txt"), eval_file=str(d / "ner.txt"))),
      "multiple_choice": ("choice/files", dict(
          train_file=str(d / "choice.jsonl"),
          eval_file=str(d / "choice.jsonl"), context_column="context",
          question_column="start", choices_column="endings",
          label_column="label", max_qa_length=8)),
  }


def _model_config(vocab_size):
  return ModelConfig.from_dict(config_lib.tiny_model(
      vocab_size=vocab_size, max_position_embeddings=SEQ))


def _task(files, kind):
  name, data = files[kind]
  return registry.make_task(name, ml_collections.ConfigDict(data))


KINDS = ("classification", "regression", "token_classification",
         "multiple_choice")
TFDS_KINDS = ("glue", "squad", "squad_official", "race", "ner_conll2003")


@pytest.mark.parametrize("kind", KINDS)
def test_batch_features_are_what_load_gives(files, kind, tiny_tokenizer):
  task = _task(files, kind)
  split = task.load(task.train_split, tiny_tokenizer, SEQ)
  loaded = {k: (v.shape[1:], np.dtype(v.dtype))
            for k, v in split.features.items()}
  for name, (shape, dtype) in task.batch_features(SEQ).items():
    assert loaded[name] == (shape, np.dtype(dtype)), name


@pytest.mark.parametrize("kind", KINDS)
def test_params_from_the_spec_and_from_the_record(files, kind, tiny_tokenizer,
                                                  fast_compile):
  task = _task(files, kind)
  split = task.load(task.train_split, tiny_tokenizer, SEQ)
  cfg = _model_config(tiny_tokenizer.vocab_size)
  spec = spec_lib.for_task(task, cfg, SEQ)
  assert spec.model is spec.model  # built once
  # Zeros of the declared features give the parameters real rows give.
  real = {k: v[:2] for k, v in split.features.items()}
  want = jax.jit(lambda r: spec.model.init(r, real, deterministic=True),
                 compiler_options=fast_compile)(jax.random.key(0))["params"]
  got = jax.jit(spec.init_params, compiler_options=fast_compile)(
      jax.random.key(0))
  assert jax.tree.map(np.shape, got) == jax.tree.map(np.shape, want)
  for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  # What the run records rebuilds the same model for prediction.
  info = {"task": task.name, **task.describe(), "max_seq_length": SEQ,
          "lm_head": False, "model": cfg.to_dict()}
  recorded = predict_lib.spec_from_record(info, cfg)
  assert (jax.tree.map(lambda x: (x.shape, x.dtype),
                       recorded.abstract_params())
          == jax.tree.map(lambda x: (x.shape, x.dtype),
                          spec.abstract_params()))


@pytest.mark.parametrize("kind", TFDS_KINDS)
def test_a_tfds_task_records_the_model_it_trains(files, kind):
  task = _task(files, kind)
  cfg = _model_config(300)
  spec = spec_lib.for_task(task, cfg, SEQ)
  info = {"task": task.name, **task.describe(), "max_seq_length": SEQ,
          "lm_head": False, "model": cfg.to_dict()}
  assert predict_lib.task_info_problem(info, cfg) is None
  recorded = predict_lib.spec_from_record(info, cfg)
  assert (jax.tree.map(lambda x: (x.shape, x.dtype),
                       recorded.abstract_params())
          == jax.tree.map(lambda x: (x.shape, x.dtype),
                          spec.abstract_params()))


def test_batch_schema_and_flops(files, tiny_tokenizer):
  task = _task(files, "multiple_choice")
  cfg = _model_config(tiny_tokenizer.vocab_size)
  spec = spec_lib.for_task(task, cfg, SEQ, lm_head=True)
  schema = spec.batch_schema(8)
  assert schema["input_ids"] == ((8, 3, SEQ), np.int32)
  assert schema["label"] == ((8,), np.int32)
  assert schema["weights"] == ((8,), np.float32)
  assert (spec.sequences(8), spec.tokens_per_row) == (24, 3 * SEQ)
  # Each of the 3 choices is a sequence the encoder reads, with the lm head.
  assert spec.flops_per_step(8) == flops_lib.training_flops_per_step(
      cfg, 24, SEQ, 0, heads=("lm",))
  attention = flops_lib.forward_flops_breakdown(
      cfg, SEQ, 0, heads=("lm",))["attention_scores"]
  assert spec.attention_flops_per_step(8) == 3 * 24 * attention


@pytest.mark.parametrize("kind, pack", [(k, 0) for k in KINDS + TFDS_KINDS]
                         + [("classification", 4)])
def test_compile_only_compiles_each_task_family(files, kind, pack, tiny_spm,
                                                tiny_tokenizer):
  name, data = files[kind]
  data = {**data, "pack": pack}
  c = config_lib.finetune_config(name, learning_rate=1e-3, batch_size=4,
                                 num_train_steps=2, warmup_steps=1,
                                 max_seq_length=SEQ, dropout=0.0)
  for k, v in config_lib.tiny_model(
      vocab_size=tiny_tokenizer.vocab_size,
      max_position_embeddings=SEQ).items():
    c.model[k] = v
  c.data.tokenizer = tiny_spm
  c.data.update(data)
  built = compile_only.compile_train_step(c)
  task = _task(files, kind)
  spec = spec_lib.for_task(task, _model_config(tiny_tokenizer.vocab_size),
                           SEQ, pack=pack)
  if pack:  # rows of up to 4 examples: one label and [CLS] per slot
    assert spec.batch_schema(4)["labels"] == ((4, 4), np.int32)
    assert spec.batch_schema(4)["cls_positions"] == ((4, 4), np.int32)
  assert built.target.name == f"finetune {task.name}"
  assert built.target.flops_per_step == spec.flops_per_step(4)
  assert {k: tuple(v.shape) for k, v in built.batch.items()} == {
      k: shape for k, (shape, _) in spec.batch_schema(4).items()}
  assert compile_only.memory(built.compiled)["total"] > 0
