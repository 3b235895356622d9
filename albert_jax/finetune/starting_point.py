"""What a fine-tune starts from: the pre-trained encoder's weights, model
config and tokenizer (`config.init`, or random weights), checked against
each other, and placed into the task model's parameters."""

from __future__ import annotations

import dataclasses
import logging
import math
from typing import Any, Mapping

import jax
import jax.numpy as jnp
import numpy as np

from albert_jax import tree as tree_lib
from albert_jax.model.config import ModelConfig
from albert_jax.text import run_tokenizer
from albert_jax.text import tokenizer as tokenizer_lib

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class StartOptions:
  """What a fine-tune starts from, read once from its config.

  Attributes:
    init: `config.init`, the pre-trained checkpoint (an albert_jax
      workdir, HF directory or official TF release); "" for random weights.
    model: `config.model`, field → value; None keeps the checkpoint's.
    tokenizer: `config.data.tokenizer`; "" for the checkpoint's own.
    reinit_pooler: `config.reinit_pooler`: the pooler starts from random
      values, not the checkpoint's.
    lm_aux_weight: `config.lm_aux_weight` as given (`lm_aux_weight`
      checks it).
  """
  init: str
  model: Mapping[str, Any]
  tokenizer: str
  reinit_pooler: bool
  lm_aux_weight: Any

  @classmethod
  def from_config(cls, config) -> StartOptions:
    """The options of a fine-tuning config.

    Reads: init, model, data.tokenizer, reinit_pooler, lm_aux_weight.
    """
    return cls(init=config.init, model=dict(config.model.items()),
               tokenizer=config.data.get("tokenizer") or "",
               reinit_pooler=config.reinit_pooler,
               lm_aux_weight=config.lm_aux_weight)

  @property
  def overrides(self) -> dict[str, Any]:
    """`model`'s set fields, which override the checkpoint's."""
    return {k: v for k, v in self.model.items() if v is not None}


def lm_aux_weight(weight, model_config: ModelConfig | None = None,
                  init: str = "") -> float:
  """`config.lm_aux_weight`, checked.

  Args:
    weight: the value of `config.lm_aux_weight`.
    model_config: the model it is for, if known.
    init: `config.init`, which the error for a bidirectional model names
      ("": `config.model`).

  Raises:
    ValueError: not a finite number >= 0, or, given `model_config`, > 0 on
      a bidirectional model.
  """
  if (isinstance(weight, bool) or not isinstance(weight, (int, float))
      or not math.isfinite(weight) or weight < 0):
    raise ValueError(
        f"config.lm_aux_weight must be a number >= 0 (0 turns GPT-1's "
        f"auxiliary language-modelling loss off; GPT-1 used 0.5), got "
        f"{weight!r}.")
  if weight > 0 and model_config is not None and not model_config.causal:
    raise ValueError(
        f"config.lm_aux_weight={weight} adds GPT-1's next-token loss, which "
        f"needs a causal (GPT) model, and {init or 'config.model'} "
        "is bidirectional (model.causal=False): each token sees the one it "
        "would predict. Fine-tune a causal model (the workdir of a "
        "config.pretraining='causal_lm' run, e.g. configs/gpt_small.py) or "
        "set --config.lm_aux_weight=0.")
  return float(weight)


def check_tokenizer(tokenizer, own, model_config: ModelConfig, path: str,
                    init: str) -> None:
  """Refuses a configured tokenizer whose ids would mean other words to the
  checkpoint: more pieces than its embedding table has rows (the ids past
  the end gave NaN losses), or, where the checkpoint has its own tokenizer,
  other pieces for the same ids (it fine-tuned silently on the wrong
  words)."""
  problem = tokenizer_lib.misfit(tokenizer, model_config.vocab_size)
  if problem:
    raise ValueError(
        f"config.data.tokenizer {path} {problem} (the checkpoint {init}); "
        "use the tokenizer it was pre-trained with (leave "
        "config.data.tokenizer empty where the checkpoint has one).")
  if own is None:
    return
  differs = next((i for i in range(min(tokenizer.vocab_size, own.vocab_size))
                  if tokenizer.id_to_piece(i) != own.id_to_piece(i)), None)
  if differs is not None or tokenizer.vocab_size != own.vocab_size:
    where = (f"id {differs} is {tokenizer.id_to_piece(differs)!r} there and "
             f"{own.id_to_piece(differs)!r} in the checkpoint's"
             if differs is not None else
             f"{tokenizer.vocab_size} pieces against {own.vocab_size}")
    raise ValueError(
        f"config.data.tokenizer {path} is not the tokenizer {init} was "
        f"pre-trained with ({where}); leave config.data.tokenizer empty to "
        "use the checkpoint's own.")


def encoder_start(start: StartOptions) -> tuple[ModelConfig, Any, Any]:
  """(model config, pre-trained encoder params or None, tokenizer).

  The encoder params are the checkpoint's embeddings, encoder and pooler
  (not the pooler with `start.reinit_pooler`: it then starts from random
  values, as the task head does), plus its "lm" head where
  `start.lm_aux_weight` > 0 (and it has one).
  """
  overrides = start.overrides
  lm_aux = lm_aux_weight(start.lm_aux_weight) > 0
  if start.init:
    from albert_jax.finetune.serving.load_pretrained import load_pretrained  # pylint: disable=g-import-not-at-top
    pre = load_pretrained(start.init, **overrides)
    lm_aux_weight(start.lm_aux_weight, pre.model_config, start.init)
    if pre.tokenizer is None and not start.tokenizer:
      raise ValueError(
          f"{start.init} has no tokenizer; set config.data.tokenizer to its "
          "SentencePiece .model, vocab.txt or tokenizer.json.")
    tokenizer = pre.tokenizer
    if start.tokenizer:
      tokenizer = run_tokenizer.load(start.tokenizer,
                                     "config.data.tokenizer",
                                     run_tokenizer.CONFIGURED_FIX)
      check_tokenizer(tokenizer, pre.tokenizer, pre.model_config,
                      start.tokenizer, start.init)
    reinit = start.reinit_pooler
    parts = (("embeddings", "encoder") + (() if reinit else ("pooler",))
             + (("lm",) if lm_aux else ()))
    encoder = {k: pre.params[k] for k in parts if k in pre.params}
    if reinit:
      log.info("config.reinit_pooler: the pooler starts from random values, "
               "not %s's.", start.init)
    elif "pooler" not in encoder:
      log.warning("%s has no pooler weights; the pooler starts from random "
                  "values.", start.init)
    return pre.model_config, encoder, tokenizer
  if not start.tokenizer:
    raise ValueError(
        "Set config.init to a pre-trained checkpoint (albert_jax workdir, HF "
        "directory or official ALBERT release) or, to fine-tune from random "
        "weights, config.data.tokenizer plus the full config.model.")
  log.warning("config.init is empty: fine-tuning from random weights.")
  model_config = ModelConfig.from_dict(overrides)
  lm_aux_weight(start.lm_aux_weight, model_config, start.init)
  return model_config, None, run_tokenizer.load(
      start.tokenizer, "config.data.tokenizer",
      run_tokenizer.CONFIGURED_FIX)


def place_encoder(state, shardings, encoder, required=()) -> dict:
  """Puts the pre-trained arrays into `params["albert"]`, checking shapes.

  `required`: parts of `params["albert"]` that must come from `encoder`
  wherever the model has parameters for them (the "lm" head of
  `lm_aux_weight`, which must never start from random values).
  """
  target = state["params"]["albert"]
  absent = [k for k in required if k in target and k not in encoder]
  if absent:
    raise ValueError(
        f"config.lm_aux_weight > 0 decodes through the pre-trained "
        f"next-token head, and the checkpoint has no {absent[0]!r} "
        f"parameters ({', '.join(tree_lib.flatten(target[absent[0]]))}). "
        "Start from the workdir of a config.pretraining='causal_lm' run, "
        "which saves them, or set --config.lm_aux_weight=0.")
  flat_new = dict(jax.tree_util.tree_flatten_with_path(encoder)[0])
  problems = []
  for path, leaf in jax.tree_util.tree_flatten_with_path(target)[0]:
    top = getattr(path[0], "key", None)
    if top not in encoder:
      continue
    if path not in flat_new:
      problems.append(f"{jax.tree_util.keystr(path)}: missing")
    elif tuple(np.shape(flat_new[path])) != tuple(leaf.shape):
      problems.append(f"{jax.tree_util.keystr(path)}: checkpoint "
                      f"{tuple(np.shape(flat_new[path]))}, model "
                      f"{tuple(leaf.shape)}")
  if problems:
    raise ValueError("The pre-trained weights do not fit the model: "
                     + "; ".join(problems[:10]))
  def put(path, leaf, sharding):
    top = getattr(path[0], "key", None)
    if top not in encoder:
      return leaf
    return jax.device_put(jnp.asarray(flat_new[path], leaf.dtype), sharding)
  albert = jax.tree_util.tree_map_with_path(
      put, target, shardings["params"]["albert"])
  return {**state, "params": {**state["params"], "albert": albert}}
