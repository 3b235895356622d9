"""Shared pieces of the `configs/*.py` files: argument parsing and presets.

A config file is `get_config(arg)` returning an ml-collections ConfigDict, as
in big_vision; the text after `:` in `--config=configs/x.py:a=1,b=two` is
`arg`. Field-level overrides come from `--config.model.hidden_size=1024`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import ml_collections

from albert_jax import hints
from albert_jax.model.config import ModelConfig
from albert_jax.training import defaults

# name: (hidden, layers, heads, ffn). All ALBERT releases: vocab 30000, E=128.
ALBERT_SIZES = {
    "base": (768, 12, 12, 3072),
    "large": (1024, 24, 16, 4096),
    "xlarge": (2048, 24, 16, 8192),
    "xxlarge": (4096, 12, 64, 16384),
}
BERT_SIZES = {
    "base": (768, 12, 12, 3072),
    "large": (1024, 24, 16, 4096),
}
# Small enough that init + a forward pass take well under a second on CPU,
# yet every dimension differs so a transposed weight cannot go unnoticed.
TINY = dict(vocab_size=1000, embedding_size=32, hidden_size=64,
            num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
            max_position_embeddings=128)


_KIND_NAMES = {int: "an integer", float: "a number"}


def parse_arg(arg: str | None, **spec: Any) -> ml_collections.ConfigDict:
  """Parses "k=v,k2=v2" into a ConfigDict typed by `spec`'s defaults.

  A bare `name` means name=True. Unknown names are refused with the closest
  valid ones, so a typo in `:arg` cannot silently fall back to a default.
  """
  result = ml_collections.ConfigDict(dict(spec))
  if not arg:
    return result
  for item in arg.split(","):
    if not item:
      continue
    key, sep, value = item.partition("=")
    key = key.strip()
    if key not in spec:
      raise ValueError(
          f"Unknown config argument {key!r}{hints.did_you_mean(key, spec, 3)}"
          f"; valid: {sorted(spec)}")
    default = spec[key]
    if not sep:
      value = "true"
    if isinstance(default, bool):
      if value.lower() not in ("true", "false", "1", "0"):
        raise ValueError(f"Config argument {key} must be true/false, got "
                         f"{value!r}.")
      result[key] = value.lower() in ("true", "1")
    elif isinstance(default, (int, float)):
      kind = type(default)
      try:
        result[key] = kind(value)
      except ValueError:
        raise ValueError(
            f"Config argument {key} must be {_KIND_NAMES[kind]}, got "
            f"{value!r}; e.g. {key}={default}.") from None
    else:
      result[key] = value
  return result


def model_config(**overrides: Any) -> ml_collections.ConfigDict:
  """The `model` section: every ModelConfig field, defaults then overrides."""
  values = {f.name: f.default for f in dataclasses.fields(ModelConfig)}
  ModelConfig.from_dict({**values, **overrides})  # validate early
  values.update(overrides)
  return ml_collections.ConfigDict(values)


def albert_model(size: str, version: int = 2) -> ml_collections.ConfigDict:
  """An official ALBERT release's model section.

  v2 (default) has no dropout; v1 has dropout 0.1, except xxlarge, which
  has none in either version. Both use gelu_new, the tanh form: it is what
  the official code computes for the "gelu" its releases' albert_config.json
  name, so both releases were trained with it. HF's v1 config.json files say
  "gelu", which transformers runs as the exact erf form; loading one of
  those runs erf, as transformers does (`interop.hf_config`).
  """
  if size not in ALBERT_SIZES:
    raise ValueError(f"Unknown ALBERT size {size!r}; choose one of "
                     f"{sorted(ALBERT_SIZES)}.")
  if version not in (1, 2):
    raise ValueError(f"ALBERT version must be 1 or 2, got {version}.")
  hidden, layers, heads, ffn = ALBERT_SIZES[size]
  dropout = 0.1 if version == 1 and size != "xxlarge" else 0.0
  return model_config(
      vocab_size=30000, embedding_size=128, hidden_size=hidden,
      num_hidden_layers=layers, num_attention_heads=heads,
      intermediate_size=ffn, hidden_act="gelu_new",
      hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout,
      share="all", embedding_projection=True)


def bert_model(size: str) -> ml_collections.ConfigDict:
  """BERT's model section: no sharing, no factorisation, vocab 30522."""
  if size not in BERT_SIZES:
    raise ValueError(f"Unknown BERT size {size!r}; choose one of "
                     f"{sorted(BERT_SIZES)}.")
  hidden, layers, heads, ffn = BERT_SIZES[size]
  return model_config(
      vocab_size=30522, embedding_size=hidden, hidden_size=hidden,
      num_hidden_layers=layers, num_attention_heads=heads,
      intermediate_size=ffn, hidden_act="gelu", hidden_dropout_prob=0.1,
      attention_probs_dropout_prob=0.1, share="none",
      embedding_projection=False)


def tiny_model(*, share: str = "all", projection: bool = True,
               **overrides: Any) -> ml_collections.ConfigDict:
  """A tiny ALBERT (or, with share="none" and no projection, a tiny BERT).

  Without the E→H projection the embedding width must equal the hidden
  width, so it follows `hidden_size` rather than making the caller say so.
  """
  values = {**TINY, "share": share, "embedding_projection": projection,
            **overrides}
  if not projection and "embedding_size" not in overrides:
    values["embedding_size"] = values["hidden_size"]
  return model_config(**values)


BUNDLED_CORPUS = "bundled"  # albert_jax/data/bundled/corpus/*.txt.gz


def _run_fields(c: ml_collections.ConfigDict, optimizer: str,
                learning_rate: float, batch_size: int, num_train_steps: int,
                warmup_steps: int) -> None:
  """Batch, steps, optimizer, mesh and sharding rules: the fields every run
  (pre-training or fine-tuning) has."""
  c.batch_size = batch_size  # global, across all hosts
  c.take_over_workdir = defaults.RUN["take_over_workdir"]
  c.accumulation_steps = 1   # micro-batches per step, inside the jitted step
  c.num_train_steps = num_train_steps
  c.optimizer = ml_collections.ConfigDict(dict(
      name=optimizer, learning_rate=learning_rate, warmup_steps=warmup_steps,
      end_learning_rate=0.0, power=1.0, b1=0.9, b2=0.999, eps=1e-6,
      weight_decay=0.01, bias_correction=False, clip_norm=1.0,
      **defaults.RUN["optimizer"]))  # schedule, layerwise_lr_decay
  c.profile = ml_collections.ConfigDict(defaults.RUN["profile"])
  c.goodput = ml_collections.ConfigDict(defaults.RUN["goodput"])

  # Mesh axes and sizes (-1: the rest of the devices) and the rules that map
  # logical parameter/activation axes onto them.
  # Tuples, because ml-collections can override tuple fields from the command
  # line (--config.mesh="(('data',16),('fsdp',4))") but not list fields.
  from albert_jax import sharding  # pylint: disable=g-import-not-at-top
  c.mesh = sharding.DEFAULT_MESH
  c.sharding_rules = tuple(
      (name, tuple(t) if isinstance(t, (list, tuple)) else t)
      for name, t in sharding.DEFAULT_RULES)


def base_config(model: ml_collections.ConfigDict, *, objective: str = "sop",
                optimizer: str = "lamb", learning_rate: float = 0.00176,
                batch_size: int = 4096, num_train_steps: int = 125_000,
                warmup_steps: int = 3125, max_seq_length: int = 512,
                max_predictions: int = 20) -> ml_collections.ConfigDict:
  """A full pre-training config around a model section.

  Defaults are the paper's ALBERT recipe: batch 4096, LAMB at lr 0.00176,
  125k steps with 3125 warmup, sequences of 512 with 20 predictions.
  """
  c = ml_collections.ConfigDict()
  c.job = defaults.PRETRAINING["job"]
  c.model = model
  c.seed = 0
  c.pretraining = defaults.PRETRAINING["pretraining"]

  # Text → instances. An empty tokenizer/data_dir means: build it in the
  # workdir from `corpus` (trained / prepared once, reused on resume);
  # tokenizer_type says what to train: "sentencepiece" (ALBERT's unigram
  # model) or "bpe" (RoBERTa's byte-level BPE). exact_length and pack:
  # training/defaults.py (a packed row's instances each keep their own
  # positions, [CLS] and sentence label; attention never crosses them).
  added = defaults.PRETRAINING
  c.data = ml_collections.ConfigDict(dict(
      corpus=BUNDLED_CORPUS, format="sentences", tokenizer="",
      tokenizer_type="sentencepiece",
      data_dir="", max_seq_length=max_seq_length, objective=objective,
      short_seq_prob=0.1, dupe_factor=1, nsp_negatives_in_sop=False,
      exact_length=added["data"]["exact_length"], eval_fraction=0.01,
      num_workers=1, prefetch=2, dynamic_masking=True,
      pack=added["data"]["pack"]))
  c.masking = ml_collections.ConfigDict(dict(
      max_predictions=max_predictions, masked_lm_prob=0.15, max_ngram=3,
      favor_shorter_ngram=True, whole_word=True,
      **added["masking"]))  # mask_token_prob, random_token_prob

  _run_fields(c, optimizer, learning_rate, batch_size, num_train_steps,
              warmup_steps)

  c.log_every_steps = 50
  c.eval_every_steps = 1000
  c.eval_batches = 10
  c.checkpoint_every_steps = 1000
  c.keep_checkpoints = 3
  c.best_metric = "mlm_accuracy"  # eval metric the best checkpoint is kept by
  c.async_checkpoints = True
  c.max_consecutive_nonfinite = defaults.RUN["max_consecutive_nonfinite"]
  c.peak_tflops_per_device = 0.0  # 0: look up the device kind for MFU
  c.fast_compile = defaults.RUN["fast_compile"]
  return c


BERT_RECIPES = ("bert", "albert")


def bert_config(size: str, recipe: str = "bert") -> ml_collections.ConfigDict:
  """A BERT pre-training config: BERT's model, trained by one of two recipes.

  recipe="bert" is Devlin et al. (2019) and the official run_pretraining.py:
  masked LM + next-sentence prediction, single-token masking (15%, 80/10/10;
  at most 76 predictions in 512 tokens), Adam with decoupled weight decay
  0.01 and no bias correction (the official AdamWeightDecayOptimizer),
  lr 1e-4 with 10k warmup steps and linear decay, global-norm clipping 1.0,
  batch 256 × 512 for 1M steps. (BERT ran 90% of its steps at length 128;
  one length is used here.)

  recipe="albert" is the ALBERT paper's BERT baseline (Lan et al., 2020,
  Tables 1-2): the same model trained exactly as ALBERT is, with n-gram
  masking, sentence-order prediction and LAMB at 0.00176, batch 4096 for
  125k steps.
  """
  if recipe not in BERT_RECIPES:
    raise ValueError(f"Unknown BERT recipe {recipe!r}; choose one of "
                     f"{', '.join(BERT_RECIPES)}.")
  model = bert_model(size)
  if recipe == "albert":
    return base_config(model)
  c = base_config(model, objective="nsp", optimizer="adamw",
                  learning_rate=1e-4, batch_size=256,
                  num_train_steps=1_000_000, warmup_steps=10_000,
                  max_seq_length=512, max_predictions=76)
  c.masking.update(dict(max_ngram=1, whole_word=False))
  return c


def electra_config(model, *, generator_fraction: float, **run: Any):
  """An ELECTRA run's ConfigDict around a model section (the
  discriminator's): `base_config(model, **run)` with ELECTRA's
  data, masking, optimizer and `electra` section.

  Masking is token-level, 15%, and each chosen token becomes [MASK] (85%)
  or stays itself (15%), never a random token. ELECTRA has no sentence-pair
  task: its data builder packs consecutive sentences of one document, in
  order and without a label; the nearest instances here are RoBERTa's packed
  full sentences (`data.objective="none"`), which may also cross documents.
  """
  from albert_jax.training import electra  # pylint: disable=g-import-not-at-top
  c = base_config(model, objective="none", optimizer="adamw", **run)
  c.pretraining = "electra"
  c.electra = ml_collections.ConfigDict(dataclasses.asdict(
      electra.ElectraOptions(generator_fraction=generator_fraction)))
  c.masking.update(dict(max_ngram=1, whole_word=False, mask_token_prob=0.85,
                        random_token_prob=0.0))
  # The discriminator's accuracy is no measure of progress (its task gets
  # harder as the generator improves); the generator's rises steadily.
  c.best_metric = "mlm_accuracy"
  return c


def smoke_run(c) -> None:
  """Shrinks a config's run, in place, to a CPU smoke test of a minute or so:
  20 steps of 8 × 32 tokens, evaluated and checkpointed at 10 and 20."""
  c.batch_size = 8
  c.num_train_steps = 20
  c.optimizer.warmup_steps = 2
  c.data.max_seq_length = 32
  c.data.eval_fraction = 0.2
  c.masking.max_predictions = 5
  c.log_every_steps = 5
  c.eval_every_steps = c.checkpoint_every_steps = 10
  c.eval_batches = 2


def model_overrides(**values: Any) -> ml_collections.ConfigDict:
  """A model section of overrides: every ModelConfig field, empty (None,
  typed) unless given, so any can be set from the command line while the
  rest come from the pre-trained checkpoint."""
  c = ml_collections.ConfigDict()
  for field in dataclasses.fields(ModelConfig):
    if field.name in values:
      c[field.name] = values[field.name]
    else:
      c[field.name] = ml_collections.config_dict.placeholder(
          type(field.default))
  unknown = set(values) - {f.name for f in dataclasses.fields(ModelConfig)}
  if unknown:
    raise ValueError(f"Unknown model fields {sorted(unknown)}.")
  return c


def finetune_config(task: str, *, learning_rate: float, batch_size: int,
                    num_train_steps: int, warmup_steps: int,
                    max_seq_length: int, dropout: float,
                    optimizer: str = "adamw") -> ml_collections.ConfigDict:
  """A fine-tuning config (`--config.init=PATH` names the starting model).

  `dropout` is the paper's Table 14 "DR": hidden and attention dropout in the
  encoder; the task head keeps the official 0.1 (model.classifier_dropout_prob).
  The official scripts fine-tune with AdamW (no bias correction), linear
  warmup then linear decay, and clip gradients at global norm 1.
  """
  c = ml_collections.ConfigDict()
  c.job = "finetune"
  c.init = ""  # albert_jax workdir, HF directory or official TF release
  c.model = model_overrides(hidden_dropout_prob=dropout,
                            attention_probs_dropout_prob=dropout)
  c.seed = 0
  # Examples a row (albert_jax/finetune/packing.py). Unset: up to 8 where
  # rows can hold several (classification, regression and tagging on an
  # encoder, without lm_aux_weight), one elsewhere; K >= 2: up to K (refused where
  # rows cannot pack); 0: one example a row.
  c.data = ml_collections.ConfigDict(dict(
      task=task, max_seq_length=max_seq_length, tokenizer="",
      tfds_data_dir=ml_collections.config_dict.placeholder(str),
      pack=ml_collections.config_dict.placeholder(int)))
  _run_fields(c, optimizer, learning_rate, batch_size, num_train_steps,
              warmup_steps)
  c.eval_batch_size = 0  # 0: batch_size
  c.lm_aux_weight = defaults.FINETUNING["lm_aux_weight"]
  # reinit_pooler: as Zhang et al. 2021 ("Revisiting few-sample BERT
  # fine-tuning") re-initialise it for small data. On a 400-step demo
  # checkpoint, whose pooler gives nearly one output for every input, it
  # did not change the result (REPRODUCTION.md).
  c.reinit_pooler = defaults.FINETUNING["reinit_pooler"]
  c.log_every_steps = 50
  c.eval_every_steps = 1000
  c.checkpoint_every_steps = 1000
  c.keep_checkpoints = 2
  c.async_checkpoints = True
  c.max_consecutive_nonfinite = defaults.RUN["max_consecutive_nonfinite"]
  c.peak_tflops_per_device = 0.0
  c.fast_compile = defaults.RUN["fast_compile"]
  return c


def table_14_config(table: dict[str, tuple], key: str, *, task: str,
                    what: str) -> ml_collections.ConfigDict:
  """A fine-tuning config from a row of the ALBERT paper's Table 14.

  Args:
    table: row name → (learning rate, batch size, dropout, train steps,
      warmup steps, max sequence length), as configs/glue.py and
      configs/squad.py list them.
    key: the row the config's argument chose ("mrpc", "2.0").
    task: the task's registry name ("glue/mrpc").
    what: how the error for an unknown `key` names it ("GLUE task").
  """
  if key not in table:
    raise ValueError(f"Unknown {what} {key!r}; choose one of "
                     f"{sorted(table)}.")
  lr, batch, dropout, steps, warmup, length = table[key]
  return finetune_config(
      task, learning_rate=lr, batch_size=batch, num_train_steps=steps,
      warmup_steps=warmup, max_seq_length=length, dropout=dropout)


def classify_config(*, learning_rate: float = 2e-5, batch_size: int = 32,
                    num_train_steps: int = 1000, warmup_steps: int = 100,
                    max_seq_length: int = 128, dropout: float = 0.0
                    ) -> ml_collections.ConfigDict:
  """Fine-tuning on the user's own TSV/CSV/JSONL files (the "files" task;
  its keys are documented in
  albert_jax/finetune/tasks/classification/files.py)."""
  c = finetune_config("files", learning_rate=learning_rate,
                      batch_size=batch_size, num_train_steps=num_train_steps,
                      warmup_steps=warmup_steps,
                      max_seq_length=max_seq_length, dropout=dropout)
  str_ = ml_collections.config_dict.placeholder(str)
  c.data.update(dict(
      train_file="", eval_file="", test_file=str_,
      text_column=ml_collections.config_dict.placeholder(str),
      text_columns=ml_collections.config_dict.placeholder(tuple),
      label_column="label",
      labels=ml_collections.config_dict.placeholder(tuple),
      task_type="classification",
      header=ml_collections.config_dict.placeholder(tuple),
      metric=ml_collections.config_dict.placeholder(str),
      # One labelled file instead of three: cut into stratified
      # train/eval/test files (used when fine-tuning after pre-training).
      split_from="", split_fractions=(0.8, 0.1, 0.1)))
  return c


# The bundled labelled tasks (albert_jax/data/bundled/labeled/): name →
# (file, train/eval/test fractions its one file is cut into).
BUNDLED_TASKS = {
    # Which corpus a held-out sentence comes from, from documents
    # pre-training never sees; few labels (6% train), where pre-training
    # pays.
    "source": ("bundled/labeled/corpus_source.tsv.gz", (0.06, 0.24, 0.7)),
    # The SpamAssassin e-mails (CC0).
    "spam": ("bundled/labeled/spam_assassin.tsv.gz", (0.8, 0.1, 0.1)),
}


def bundled_task_config(task: str, steps: int = 150
                        ) -> ml_collections.ConfigDict:
  """Fine-tuning on a bundled labelled task, as the demo does: its file cut
  by `config.seed` into stratified train/eval/test files in the workdir,
  `steps` steps of batch 32 at 1e-4, sequences of 128.

  Raises:
    ValueError: a task not in BUNDLED_TASKS.
  """
  if task not in BUNDLED_TASKS:
    raise ValueError(f"Unknown bundled task {task!r}; use one of "
                     f"{', '.join(BUNDLED_TASKS)}.")
  c = classify_config(learning_rate=1e-4, batch_size=32,
                      num_train_steps=steps,
                      warmup_steps=max(steps // 10, 1), max_seq_length=128)
  c.data.split_from, c.data.split_fractions = BUNDLED_TASKS[task]
  c.data.text_column = "text"
  c.data.label_column = "label"
  c.log_every_steps = 10
  c.eval_every_steps = c.checkpoint_every_steps = max(steps // 2, 1)
  return c
