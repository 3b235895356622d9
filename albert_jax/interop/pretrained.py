"""`load_pretrained`: a pre-trained encoder from a checkpoint directory.

It reads an HF `save_pretrained` directory (ALBERT, BERT, RoBERTa or
ELECTRA), a google-research/albert TF1 release or an albert_jax training
workdir into a `Pretrained` (config, parameters, tokenizer and a forward
call, with `fill_mask` and `embed`); `albert_jax.interop.sources` tells the
kinds apart and reads each, and `albert_jax.interop.text_inputs` encodes
text for `fill_mask` and `embed`. `Pretrained.to_hf` writes any of the HF
layouts back. Directories are local (`~` expanded) or `gs://BUCKET/...`.

A fine-tuned model (a fine-tuning workdir, a transformers task checkpoint)
is refused here with a pointer to `albert_jax.load_pretrained`
(`albert_jax.finetune.serving.load_pretrained`), which reads every kind and returns those
with their task heads.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import os
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from albert_jax import storage
from albert_jax.interop import CheckpointError
from albert_jax.interop import child
from albert_jax.interop import hf
from albert_jax.interop import hf_config as hf_config_lib
from albert_jax.interop import sources
from albert_jax.interop import text_inputs
from albert_jax.interop.hf_files import read_state_dict
from albert_jax.model import albert as albert_lib
from albert_jax.model.config import ModelConfig

__all__ = ["Pretrained", "load_pretrained", "read_state_dict"]

log = logging.getLogger(__name__)


@dataclasses.dataclass
class Pretrained:
  """A loaded model: its config, parameters, tokenizer and a forward call.

  Attributes:
    config: the model section as an ml-collections ConfigDict.
    model_config: the same as a frozen ModelConfig.
    params: parameter pytree (NumPy or jax arrays).
    tokenizer: the checkpoint's tokenizer, or None where it has no
      vocabulary file.
    heads: the heads the checkpoint holds, of ("mlm", "sop", "rtd").
    pooler: whether it holds the [CLS] pooler.
    missing: parts the checkpoint's family can hold but this checkpoint
      lacks, by name (never filled randomly).
    step: the training step of a workdir or TF checkpoint; None for HF
      directories.
    model_type: the HF family the weights came from ("albert", "bert",
      "roberta", "electra"), which `to_hf` writes by default; None for a
      workdir, whose family follows from its config.
  """
  config: Any
  model_config: ModelConfig
  params: Any
  tokenizer: Any = None
  heads: tuple[str, ...] = ()
  pooler: bool = True
  missing: tuple[str, ...] = ()
  step: int | None = None
  model_type: str | None = None

  def __post_init__(self):
    self.params = _unbox(self.params)
    self.heads = tuple(self.heads)
    self.module = albert_lib.Albert(self.model_config, pooler=self.pooler,
                                heads=self.heads)
    misfit = self._tokenizer_misfit()
    if misfit:
      # Loaded anyway, for model(ids); fill_mask and embed refuse it.
      log.warning("%s", misfit)

  def _tokenizer_misfit(self) -> str | None:
    from albert_jax.text import tokenizer as tokenizer_lib  # pylint: disable=g-import-not-at-top
    problem = self.tokenizer and tokenizer_lib.misfit(
        self.tokenizer, self.model_config.vocab_size)
    if not problem:
      return None
    return (f"The tokenizer ({self.tokenizer.path or 'in memory'}) {problem}; "
            "set .tokenizer to the one the model was trained with.")

  def _check_tokenizer(self) -> None:
    """Refuses a tokenizer whose ids the model cannot embed (fill_mask and
    embed encode text with it)."""
    misfit = self._tokenizer_misfit()
    if misfit:
      raise ValueError(misfit)

  def __call__(self, input_ids, token_type_ids=None, attention_mask=None):
    """Forward pass.

    Args:
      input_ids: [B, T] int, each in [0, vocab_size).
      token_type_ids: [B, T] int in [0, type_vocab_size), default zeros.
      attention_mask: [B, T] int or bool, 1 = token, 0 = padding (values
        above 1 mark packed sequences); default all ones.

    Returns:
      dict of "sequence_output" [B, T, H] and, where the checkpoint has them,
      "pooled_output" [B, H], "mlm_logits" [B, T, V], "sop_logits" [B, 2],
      "rtd_logits" [B, T], "lm_logits" [B, T, V] (a causal model's scores
      for each next token).

    Raises:
      ValueError: ids that are not [B, T] integers in [0, vocab_size) (a
        gather would clip them to the last row and give wrong outputs
        without an error), or token types or a mask not of their shape and
        range.
    """
    cfg = self.model_config
    ids = _array(input_ids, "input_ids")
    albert_lib.check_ids(ids, cfg.vocab_size)
    ids = jnp.asarray(ids, jnp.int32)
    if token_type_ids is None:
      tt = jnp.zeros_like(ids)
    else:
      tt = _companion(token_type_ids, "token_type_ids", ids.shape,
                      cfg.type_vocab_size, "0 for the first segment and 1 "
                      "for the second")
    if attention_mask is None:
      mask = jnp.ones_like(ids)
    else:
      mask = _companion(attention_mask, "attention_mask", ids.shape, None,
                        "1 for a token and 0 for padding")
    return _forward(cfg, self.pooler, self.heads, self.params, ids, tt, mask)

  def fill_mask(self, text: str, top_k: int = 5) -> dict[str, Any]:
    """Predicts the tokens behind each "[MASK]" in `text` with the MLM head.

    The text is split on the mask marker ("[MASK]", or the vocabulary's own
    mask piece such as "<mask>"); the pieces between markers are encoded one
    by one and the mask id put between them, inside `[CLS] ... [SEP]`. So a
    marker always stands for exactly one token, and a marker inside a word
    ends that word (the text after it starts a new one). One forward pass
    gives every mask's distribution over the whole vocabulary, special
    tokens included; the input is padded to a multiple of 32 tokens, so
    texts of similar length reuse one compiled forward.

    Args:
      text: one text with one or more mask markers.
      top_k: how many candidates to return per mask, 1 to the vocabulary
        size.

    Returns:
      dict of
        "predictions": one list per mask, in text order, of top_k
          (token piece, probability) pairs, most probable first.
        "token_ids": [num_masks, top_k] int the candidates' ids.
        "probabilities": [num_masks, top_k] float32 their softmax
          probabilities (float32 softmax of the MLM logits).
        "positions": [num_masks] int the masks' indices in "input_ids".
        "input_ids": [T] int the encoded input, [CLS] and [SEP] included.
        "filled_text": the input with every mask replaced by its most
          probable token, decoded (so normalised as the tokenizer
          normalises, e.g. lower-cased for ALBERT; special tokens dropped).

    Raises:
      ValueError: the model is causal, the checkpoint has no MLM head or no
        tokenizer, its vocabulary has no mask, [CLS] or [SEP] piece, the
        text has no mask marker, the input is longer than the model's
        positions, or top_k is out of range.
    """
    if self.model_config.causal:
      raise ValueError(
          "fill_mask predicts a masked token from the text on both sides, "
          "and this model is causal (GPT-style): it reads left to right and "
          "was trained to predict the next token. Call the model instead: "
          "its 'lm_logits'[:, t] score the token after position t.")
    if "mlm" not in self.heads:
      raise ValueError(
          "fill_mask needs a masked-LM head, and this checkpoint has none "
          f"(heads: {self.heads}; missing: {self.missing}). Load a "
          "checkpoint that holds one, e.g. an HF *ForMaskedLM or "
          "*ForPreTraining directory, an official ALBERT release or an "
          "albert_jax pre-training workdir.")
    self._check_tokenizer()
    ids, positions = text_inputs.mask_input_ids(
        self.tokenizer, text, self.model_config.max_position_embeddings)
    vocab = self.model_config.vocab_size
    if (isinstance(top_k, bool) or not isinstance(top_k, (int, np.integer))
        or not 1 <= top_k <= vocab):
      raise ValueError(f"top_k must be an integer from 1 to the vocabulary "
                       f"size {vocab}; got {top_k!r}.")
    # Padded to a multiple of 32 tokens so texts of similar length share one
    # compiled forward; padded keys get no attention, so the real tokens'
    # logits are those of the unpadded input.
    length = min(-(-len(ids) // 32) * 32,
                 self.model_config.max_position_embeddings)
    batch = np.full((1, length), self.tokenizer.pad_id or 0, np.int32)
    batch[0, :len(ids)] = ids
    mask = (np.arange(length) < len(ids)).astype(np.int32)[None]
    logits = self(batch, None, mask)["mlm_logits"][0, positions]
    probs = np.asarray(jax.nn.softmax(logits.astype(jnp.float32), axis=-1))
    # Stable sort so ties keep the lower id first, as torch.topk does on CPU.
    top = np.argsort(-probs, axis=-1, kind="stable")[:, :top_k]
    top_probs = np.take_along_axis(probs, top, axis=-1)
    tok = self.tokenizer
    predictions = [[(tok.id_to_piece(i), float(p)) for i, p in zip(row, pr)]
                   for row, pr in zip(top.tolist(), top_probs)]
    filled = np.asarray(ids)
    filled[positions] = top[:, 0]
    return {"predictions": predictions, "token_ids": top,
            "probabilities": top_probs, "positions": positions,
            "input_ids": np.asarray(ids),
            "filled_text": tok.decode(filled[1:-1])}

  def embed(self, texts, pooling: str = "mean",
            batch_size: int = 32) -> np.ndarray:
    """Sentence vectors of texts (or (text, text) pairs).

    Each input is encoded as `[CLS] a [SEP] (b [SEP])` and padded to a
    multiple of 32 tokens (so similar lengths share one compiled forward),
    in batches of `batch_size`.

    Args:
      texts: a text, a (text, text) pair, or a list of either.
      pooling: "mean" (the mean of the real tokens' final hidden states,
        padding excluded) or "pooled" (the [CLS] pooler's output, where
        the checkpoint has a pooler).
      batch_size: inputs per forward pass.

    Returns:
      [N, H] float32 (one row per input; [H] for a single input).

    Raises:
      ValueError: an unknown pooling, "pooled" without a pooler, no
        tokenizer, or an input longer than the model's positions.
    """
    if pooling not in ("mean", "pooled"):
      raise ValueError(f"pooling={pooling!r}; choose 'mean' or 'pooled'.")
    if pooling == "pooled" and not self.pooler:
      raise ValueError("pooling='pooled' reads the [CLS] pooler, which this "
                       "checkpoint lacks; use pooling='mean'.")
    if self.tokenizer is None:
      raise ValueError("embed needs the checkpoint's tokenizer, and it has "
                       "none; set .tokenizer = Tokenizer.from_file(...).")
    self._check_tokenizer()
    single = not isinstance(texts, list)
    items = [texts] if single else texts
    limit = self.model_config.max_position_embeddings
    encoded = text_inputs.encode_pairs(self.tokenizer, items, limit)
    pad = self.tokenizer.pad_id or 0
    out = []
    for start in range(0, len(encoded), batch_size):
      arrays = text_inputs.pad_rows(encoded[start:start + batch_size], pad,
                                    limit)
      result = self(arrays["input_ids"], arrays["token_type_ids"],
                    arrays["attention_mask"])
      if pooling == "pooled":
        out.append(np.asarray(result["pooled_output"], np.float32))
      else:
        mask = arrays["attention_mask"][..., None].astype(np.float32)
        hidden = np.asarray(result["sequence_output"], np.float32)
        out.append((hidden * mask).sum(1) / mask.sum(1))
    vectors = np.concatenate(out)
    return vectors[0] if single else vectors

  def to_hf(self, path: str, model_type: str | None = None) -> None:
    """Writes an HF checkpoint directory that `from_pretrained` loads.

    The directory holds config.json, model.safetensors in the parameters'
    dtype with tied tensors omitted, and the tokenizer's files if there is a
    tokenizer. The architecture follows from the family and the heads, e.g.
    AlbertForPreTraining, BertForMaskedLM, RobertaModel or
    ElectraForPreTraining.

    Args:
      path: directory to write, local or gs://; created if needed.
      model_type: the family to write; default the one loaded from, else the
        one the config's structure implies (share="all" with a projection is
        ALBERT; share="none" is BERT, RoBERTa with positions from padding,
        ELECTRA with a projection or the "rtd" head).

    Raises:
      ValueError: the model has no equivalent in that family (the message
        says why); a causal model has none in any of them.
    """
    from safetensors.numpy import save  # pylint: disable=g-import-not-at-top
    cfg = self.model_config
    if cfg.causal:
      raise ValueError(
          "This model is causal (GPT-style); the HF ALBERT, BERT, RoBERTa "
          "and ELECTRA classes attend in both directions, so a checkpoint "
          "written for them would silently run a different model.")
    model_type = (model_type or self.model_type
                  or hf_config_lib.infer_model_type(cfg, self.heads))
    params = jax.tree.map(np.asarray, self.params)
    state = hf.params_to_hf(params, cfg, model_type)
    parts = {h: h in params for h in ("pooler", "mlm", "sop", "rtd")}
    arch = hf.architecture_for(parts, model_type)
    storage.path(path).mkdir(parents=True, exist_ok=True)
    storage.write_atomic(
        child(path, "config.json"),
        json.dumps(hf_config_lib.config_to_hf(cfg, model_type, arch), indent=2))
    storage.write_atomic(child(path, "model.safetensors"),
                         save(state, metadata={"format": "pt"}))
    if self.tokenizer is not None:
      self.tokenizer.save(path)


# One compiled forward per (config, parts, shapes), shared by every model
# loaded with them.
@functools.partial(jax.jit, static_argnums=(0, 1, 2))
def _forward(cfg: ModelConfig, pooler: bool, heads: tuple[str, ...], params,
             ids, token_type_ids, attention_mask):
  module = albert_lib.Albert(cfg, pooler=pooler, heads=heads)
  return module.apply({"params": params}, ids, token_type_ids, attention_mask)


def _array(value, name: str):
  """`value` as an array (NumPy for lists), refusing ragged rows."""
  if hasattr(value, "shape") and hasattr(value, "dtype"):
    return value
  try:
    return np.asarray(value)
  except ValueError:
    raise ValueError(f"{name} must be [batch, seq] with rows of one length; "
                     "pad the shorter rows (and mark the padding 0 in "
                     "attention_mask).") from None


def _companion(value, name: str, shape, limit: int | None, meaning: str):
  """token_type_ids or attention_mask, checked against the ids' `shape`
  and, where known, values in [0, limit) (>= 0 where `limit` is None), as
  int32."""
  value = _array(value, name)
  if tuple(value.shape) != tuple(shape):
    raise ValueError(f"{name} has shape {tuple(value.shape)} but input_ids "
                     f"{tuple(shape)}; give one value per token: {meaning}.")
  if not (jnp.issubdtype(value.dtype, jnp.integer)
          or jnp.issubdtype(value.dtype, jnp.bool_)):
    raise ValueError(f"{name} must be integers, got dtype {value.dtype}: "
                     f"{meaning}.")
  if not isinstance(value, jax.core.Tracer) and value.size:
    values = np.asarray(value)
    low, high = int(values.min()), int(values.max())
    if low < 0 or (limit is not None and high >= limit):
      allowed = f"[0, {limit - 1}]" if limit is not None else "0 or more"
      raise ValueError(f"{name} holds values in [{low}, {high}] but the "
                       f"model takes {allowed}: {meaning}.")
  return jnp.asarray(value, jnp.int32)


def _unbox(tree):
  """Strips logical-partitioning boxes, leaving arrays (or shapes)."""
  import flax.linen as nn  # pylint: disable=g-import-not-at-top
  return nn.meta.unbox(tree)


def _to_config_dict(cfg: ModelConfig):
  import ml_collections  # pylint: disable=g-import-not-at-top
  return ml_collections.ConfigDict(cfg.to_dict())


def load_pretrained(path: str, step: int | str | None = None,
                    **overrides) -> "Pretrained":
  """Loads a pre-trained encoder's checkpoint directory.

  Args:
    path: an HF `save_pretrained` directory (ALBERT, BERT, RoBERTa or
      ELECTRA), a google-research/albert TF release directory or an
      albert_jax training workdir (its config.json and checkpoints/); local
      (`~` expanded) or gs://BUCKET/PATH.
    step: for a workdir, the checkpoint step to read (default: the newest
      readable one); for a TF release, read `model.ckpt-{step}` (default:
      the only checkpoint, else `model.ckpt-best`, else the newest).
    **overrides: ModelConfig fields to change, e.g. dtype="bfloat16" or
      attention_impl="xla"; shape-defining fields must match the weights.
      One more keyword applies to ELECTRA training workdirs only:
      electra_part="discriminator" (the default; HF's
      ElectraForPreTraining, heads ("rtd",)) or "generator" (its masked LM,
      ElectraForMaskedLM, heads ("mlm",)). The run stores both over one
      embedding table; the part's parameters are taken from it. An HF
      ELECTRA directory holds one part already and takes no electra_part.

  Returns:
    A `Pretrained`. Heads the checkpoint lacks are listed in `.missing`
    and logged; they are never initialised randomly behind the user's back.

  Raises:
    CheckpointError: not a checkpoint directory, a fine-tuned model (use
      `albert_jax.load_pretrained`), an unsupported model type, unreadable
      weights, a workdir without checkpoints, a config whose shapes differ
      from the weights' (the message lists the mismatched tensors), or
      electra_part for anything but an ELECTRA workdir.
  """
  path = os.fspath(path)
  loaded = sources.load(path, step, overrides)
  if isinstance(loaded, sources.TaskCheckpoint):
    raise CheckpointError(
        f"{path} is a transformers task checkpoint (a fine-tuned "
        f"{loaded.task_class[len('For'):]} head): load it with "
        "albert_jax.load_pretrained, which returns the model with its head.")
  return from_fields(path, loaded)


def from_fields(path: str, loaded: dict[str, Any]) -> "Pretrained":
  """A `Pretrained` from `sources.load`'s fields for `path` (its missing
  heads logged)."""
  if loaded["missing"]:
    log.warning("%s has no weights for %s; those outputs are not produced "
                "(nothing is initialised randomly).", path,
                ", ".join(loaded["missing"]))
  return Pretrained(config=_to_config_dict(loaded["model_config"]), **loaded)
