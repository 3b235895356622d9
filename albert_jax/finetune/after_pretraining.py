"""Fine-tuning right after pre-training, as the demo does: the fine-tune
of the fresh model in `WORKDIR/finetune`, the same fine-tune from random
weights in `WORKDIR/finetune_random_init` (the baseline that shows what
pre-training bought), and the best checkpoint reloaded on new texts."""

from __future__ import annotations

import logging
import os
from typing import Any

from albert_jax import storage
from albert_jax.finetune import registry
from albert_jax.finetune.run import run
from albert_jax.finetune.serving import fine_tuned as predict_lib
from albert_jax.text import run_tokenizer
from albert_jax.training import config_check
from albert_jax.training import defaults

log = logging.getLogger(__name__)

RANDOM_INIT = "<random>"  # _from_random's marker: keep init empty.
RANDOM_INIT_DIR = "finetune_random_init"


def run_after_pretraining(config, pretrain_workdir: str,
                          random_init: bool = False) -> dict[str, Any]:
  """Fine-tunes the model a pre-training run just wrote (`config.finetune`
  of a pre-training config), in `pretrain_workdir/finetune`.

  With `random_init`, the same fine-tune (same model shape, tokenizer,
  data split, steps and seed) starts from random weights instead, in
  `pretrain_workdir/finetune_random_init`: the baseline that shows what
  pre-training bought (`config.compare_random_init` in the demo).

  `config.init` defaults to the pre-training workdir. `config.data.
  split_from` is cut into the fine-tuning workdir as any fine-tune's is
  (`data_files.split_in_workdir`).

  With `config.predict_texts` (texts the data does not hold), the best
  checkpoint is reloaded as a user would (`albert_jax.load_pretrained`)
  and predicts them: the result's "new_predictions" lists {"text", "label",
  "probability"} (or {"text", "score"} for regression) per text.
  """
  config = config.copy_and_resolve_references()
  defaults.fill(config)  # a stage of an earlier version's config
  config_check.check(config, choices=registry.config_choices())
  workdir = os.fspath(storage.path(storage.as_str(pretrain_workdir))
                      / (RANDOM_INIT_DIR if random_init else "finetune"))
  if random_init:
    config = _from_random(config, pretrain_workdir)
  result = run(_with_init(config, pretrain_workdir), workdir)
  texts = [] if random_init else list(config.get("predict_texts") or ())
  if texts and "preempted_at" not in result:
    result["new_predictions"] = predict_new(workdir, texts)
  return result


def predict_new(workdir: str, texts: list[str]) -> list[dict[str, Any]]:
  """The best checkpoint of fine-tuning `workdir`, reloaded, on `texts`:
  {"text", "label", "probability"} (classification) or {"text", "score"}
  per text, also logged."""
  model = predict_lib.load(workdir, "best")
  out = []
  for text, pred in zip(texts, model.predict(texts)):
    kept = {k: pred[k] for k in ("label", "probability", "score")
            if k in pred}
    out.append({"text": text, **kept})
    log.info("Prediction of step %s on a new text: %s — %r", model.step,
             ", ".join(f"{k} {v:.3f}" if isinstance(v, float) else
                       f"{k} {v}" for k, v in kept.items()), text)
  return out


def _from_random(config, pretrain_workdir: str):
  """`config` fine-tuning the pre-trained run's model shape and tokenizer
  from random weights: no init, the run's full model section and its
  tokenizer file."""
  from albert_jax.interop import workdir as workdir_lib  # pylint: disable=g-import-not-at-top
  recorded = workdir_lib.read_workdir_config(pretrain_workdir)
  tokenizer = run_tokenizer.find(recorded, pretrain_workdir)
  if tokenizer is None:
    raise ValueError(f"{pretrain_workdir} has no tokenizer to fine-tune a "
                     "random-init baseline with.")
  with config.unlocked():
    config.init = RANDOM_INIT
    config.data.tokenizer = tokenizer.path
    for key, value in recorded["model"].items():
      if config.model.get(key) is None:
        config.model[key] = value
  return config


def _with_init(config, pretrain_workdir: str):
  """`config` with `init` defaulting to the pre-training workdir."""
  with config.unlocked():
    if config.init == RANDOM_INIT:
      config.init = ""
    elif not config.init:
      config.init = pretrain_workdir
  return config
