"""`load_pretrained`: one call from a checkpoint directory to a usable model.

Accepts a directory written by transformers' `save_pretrained` for
`AlbertForPreTraining`, `AlbertForMaskedLM` or `AlbertModel`. Weights are read
from safetensors; nothing is ever unpickled. A `pytorch_model.bin` is read only
through `torch.load(weights_only=True)`, which refuses arbitrary objects.

Also accepts an albert_jax training workdir (the trainer's `config.json` and
`checkpoints/`): the model is rebuilt from the config's `model` section, its
heads from `data.objective`, and only the parameters of the newest (or a
chosen) checkpoint are read, onto one CPU device, without the optimizer state.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from typing import Any, Mapping

import jax
import jax.numpy as jnp
import numpy as np

from albert_jax import hf
from albert_jax import models
from albert_jax.model_config import ModelConfig

log = logging.getLogger(__name__)


class CheckpointError(ValueError):
  """A checkpoint that cannot be loaded, with what to do about it."""


# The class named in config.json, not AutoModel: that would drop the heads.
_CONVERT_HOW = (
    "convert it to safetensors once, in an environment you trust: load it "
    "with the transformers class named in its config.json 'architectures' "
    "(e.g. `transformers.AlbertForPreTraining.from_pretrained(dir)`) and "
    "call `.save_pretrained(dir, safe_serialization=True)`")


def _read_safetensors(path: str) -> dict[str, np.ndarray]:
  """All tensors of one safetensors file; bfloat16 comes back as ml_dtypes."""
  # Importing ml_dtypes registers bfloat16 with NumPy, which safetensors needs.
  import ml_dtypes  # noqa: F401  pylint: disable=g-import-not-at-top
  from safetensors import SafetensorError  # pylint: disable=g-import-not-at-top
  from safetensors.numpy import load_file  # pylint: disable=g-import-not-at-top
  try:
    return load_file(path)
  except (SafetensorError, OSError, ValueError, TypeError) as e:
    raise CheckpointError(
        f"{path} is not a readable safetensors file ({e}). It may be "
        "truncated or corrupt: re-download or re-export it.") from e


def _read_sharded(path: str, index: str) -> dict[str, np.ndarray]:
  """Tensors of a sharded checkpoint described by `index`."""
  try:
    with open(index, encoding="utf-8") as f:
      weight_map = json.load(f)["weight_map"]
    files = sorted(set(weight_map.values()))
  except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError,
          AttributeError) as e:
    raise CheckpointError(
        f"{index} is not a valid shard index (a JSON object with a "
        f"'weight_map' of tensor name → file): {e!r}") from e
  missing = [n for n in files if not os.path.isfile(os.path.join(path, n))]
  if missing:
    raise CheckpointError(
        f"{index} names shard file(s) that are not in {path}: {missing}. "
        "The download is incomplete: fetch every shard.")
  state = {}
  for name in files:
    state.update(_read_safetensors(os.path.join(path, name)))
  absent = sorted(set(weight_map) - set(state))
  if absent:
    raise CheckpointError(
        f"{index} lists tensors that no shard holds: {absent[:8]}"
        + (f" and {len(absent) - 8} more" if len(absent) > 8 else ""))
  return state


def read_state_dict(path: str) -> dict[str, np.ndarray]:
  """Tensors of an HF checkpoint directory as NumPy arrays.

  Looks for `model.safetensors`, a sharded `model.safetensors.index.json`, or
  `pytorch_model.bin` (via `torch.load(weights_only=True)`), in that order.
  """
  single = os.path.join(path, "model.safetensors")
  index = os.path.join(path, "model.safetensors.index.json")
  if os.path.exists(single):
    return _read_safetensors(single)
  if os.path.exists(index):
    return _read_sharded(path, index)
  binary = os.path.join(path, "pytorch_model.bin")
  if os.path.exists(binary):
    return _read_torch_bin(binary)
  raise CheckpointError(
      f"No weights in {path}: expected model.safetensors, "
      "model.safetensors.index.json or pytorch_model.bin.")


def _read_torch_bin(path: str) -> dict[str, np.ndarray]:
  """A `pytorch_model.bin` state dict, through torch's weights-only loader.

  Floating tensors come back as float32 (NumPy has no bfloat16 of torch's);
  anything but a flat mapping of names to tensors is refused.
  """
  how = _CONVERT_HOW
  try:
    import torch  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise CheckpointError(
        f"{path} is a PyTorch pickle and torch is not installed; albert_jax "
        f"never unpickles without torch's weights_only guard. Install the "
        f"'hf' extra, or {how}.") from e
  try:
    state = torch.load(path, map_location="cpu", weights_only=True)
  except Exception as e:  # torch raises UnpicklingError and others
    raise CheckpointError(
        f"torch.load(weights_only=True) refused {path}: {e}. Either it holds "
        "more than tensors (pickled objects are never loaded, as they can run "
        f"code) or it is corrupt; {how}.") from e
  if not isinstance(state, Mapping):
    raise CheckpointError(
        f"{path} holds a {type(state).__name__}, not a state dict of "
        f"tensors; {how}.")
  odd = sorted(str(k) for k, v in state.items()
               if not isinstance(k, str) or not isinstance(v, torch.Tensor))
  if odd:
    raise CheckpointError(
        f"{path} holds entries that are not named tensors: {odd[:8]}; {how}.")
  return {k: v.detach().cpu().float().numpy() if v.dtype.is_floating_point
          else v.detach().cpu().numpy() for k, v in state.items()}


def _abstract_params(cfg: ModelConfig, pooler: bool, heads: tuple[str, ...]):
  module = models.Albert(cfg, pooler=pooler, heads=heads)
  shapes = jax.eval_shape(module.init, jax.random.key(0),
                          jnp.zeros((1, 1), jnp.int32))
  return module, models_unbox(shapes["params"])


def models_unbox(tree):
  """Strips logical-partitioning boxes, leaving arrays (or shapes)."""
  import flax.linen as nn  # pylint: disable=g-import-not-at-top
  return nn.meta.unbox(tree)


def check_shapes(params, expected, what: str) -> None:
  """Raises CheckpointError listing every path whose shape differs."""
  flat_got = dict(_flatten(params))
  flat_want = dict(_flatten(expected))
  problems = []
  for key in sorted(set(flat_got) | set(flat_want)):
    got, want = flat_got.get(key), flat_want.get(key)
    if got is None:
      problems.append(f"  {key}: missing (model expects {tuple(want.shape)})")
    elif want is None:
      problems.append(f"  {key}: unexpected {tuple(np.shape(got))}")
    elif tuple(np.shape(got)) != tuple(want.shape):
      problems.append(f"  {key}: checkpoint {tuple(np.shape(got))}, model "
                      f"{tuple(want.shape)}")
  if problems:
    raise CheckpointError(
        f"{what} does not fit the model config; mismatched parameters:\n"
        + "\n".join(problems[:30])
        + (f"\n  ... and {len(problems) - 30} more" if len(problems) > 30
           else ""))


def _flatten(tree, prefix=""):
  if isinstance(tree, Mapping):
    for k, v in tree.items():
      yield from _flatten(v, f"{prefix}/{k}" if prefix else str(k))
  else:
    yield prefix, tree


@dataclasses.dataclass
class Pretrained:
  """A loaded model: its config, parameters, tokenizer and a forward call.

  Attributes:
    config: the model section as an ml-collections ConfigDict.
    model_config: the same as a frozen ModelConfig.
    params: parameter pytree (NumPy or jax arrays).
    tokenizer: the checkpoint's tokenizer, or None where it has no
      vocabulary file.
    heads: the heads the checkpoint holds, of ("mlm", "sop").
    pooler: whether it holds the [CLS] pooler.
    missing: parts the checkpoint lacks, by name (never filled randomly).
    step: the training step of a workdir checkpoint; None for HF
      directories.
  """
  config: Any
  model_config: ModelConfig
  params: Any
  tokenizer: Any = None
  heads: tuple[str, ...] = ()
  pooler: bool = True
  missing: tuple[str, ...] = ()
  step: int | None = None

  def __post_init__(self):
    self.params = models_unbox(self.params)
    self.module = models.Albert(self.model_config, pooler=self.pooler,
                                heads=self.heads)
    self._apply = jax.jit(
        lambda p, ids, tt, mask: self.module.apply({"params": p}, ids, tt,
                                                   mask))

  def __call__(self, input_ids, token_type_ids=None, attention_mask=None):
    """Forward pass.

    Args:
      input_ids: [B, T] int.
      token_type_ids: [B, T] int, default zeros.
      attention_mask: [B, T], 1 = token, 0 = padding; default all ones.

    Returns:
      dict of "sequence_output" [B, T, H] and, where the checkpoint has them,
      "pooled_output" [B, H], "mlm_logits" [B, T, V], "sop_logits" [B, 2].
    """
    ids = jnp.asarray(input_ids, jnp.int32)
    tt = (jnp.zeros_like(ids) if token_type_ids is None
          else jnp.asarray(token_type_ids, jnp.int32))
    mask = (jnp.ones_like(ids) if attention_mask is None
            else jnp.asarray(attention_mask, jnp.int32))
    return self._apply(self.params, ids, tt, mask)

  def to_hf(self, path: str) -> None:
    """Writes an HF checkpoint directory that `from_pretrained` loads.

    The directory holds config.json (architecture chosen from the heads:
    AlbertForPreTraining, AlbertForMaskedLM or AlbertModel),
    model.safetensors in the parameters' dtype with tied tensors omitted, and
    the tokenizer's files if there is a tokenizer.

    Args:
      path: directory to write; created if needed.
    """
    from safetensors.numpy import save_file  # pylint: disable=g-import-not-at-top
    os.makedirs(path, exist_ok=True)
    params = jax.tree.map(np.asarray, self.params)
    arch = hf.architecture_for({"mlm": "mlm" in self.heads,
                                "sop": "sop" in self.heads})
    # A bare AlbertModel saves its tensors without the `albert.` prefix.
    prefix = "" if arch == "AlbertModel" else "albert."
    state = hf.params_to_hf(params, self.model_config, prefix=prefix)
    with open(os.path.join(path, "config.json"), "w", encoding="utf-8") as f:
      json.dump(hf.config_to_hf(self.model_config, arch), f, indent=2)
    save_file(state, os.path.join(path, "model.safetensors"),
              metadata={"format": "pt"})
    if self.tokenizer is not None:
      self.tokenizer.save(path)


def _to_config_dict(cfg: ModelConfig):
  import ml_collections  # pylint: disable=g-import-not-at-top
  return ml_collections.ConfigDict(cfg.to_dict())


def load_pretrained(path: str, step: int | None = None,
                    **overrides) -> Pretrained:
  """Loads a checkpoint directory.

  Args:
    path: an HF `save_pretrained` directory of an ALBERT model, or an
      albert_jax training workdir (its config.json and checkpoints/).
    step: for a workdir, the checkpoint step to read (default: the newest
      readable one).
    **overrides: ModelConfig fields to change, e.g. dtype="bfloat16" or
      attention_impl="xla"; shape-defining fields must match the weights.

  Returns:
    A `Pretrained`. Heads the checkpoint lacks are listed in `.missing` and
    logged; they are never initialised randomly behind the user's back.

  Raises:
    CheckpointError: not a checkpoint directory, unreadable weights, a
      workdir without checkpoints, or a config whose shapes differ from the
      weights' (the message lists the mismatched parameters).
  """
  path = os.fspath(path)
  if not os.path.isdir(path):
    raise CheckpointError(f"{path} is not a directory.")
  workdir_config = _read_workdir_config(path)
  if workdir_config is not None:
    return _load_workdir(path, workdir_config, step, overrides)
  if step is not None:
    raise CheckpointError(
        f"step={step} applies to albert_jax training workdirs; {path} is not "
        "one (it has no trainer config.json with checkpoints/).")
  if not os.path.exists(os.path.join(path, "config.json")):
    raise CheckpointError(
        f"{path} has no config.json; expected a directory written by "
        "transformers' save_pretrained.")
  try:
    cfg = hf.config_from_hf(hf.read_config(path))
  except (ValueError, TypeError) as e:
    raise CheckpointError(f"{path}/config.json: {e}") from e
  if overrides:
    cfg = ModelConfig.from_dict({**cfg.to_dict(), **overrides})
  state = read_state_dict(path)
  try:
    params, parts = hf.params_from_hf(state, cfg)
  except ValueError as e:
    note = f" (with overrides {overrides})" if overrides else ""
    raise CheckpointError(f"Checkpoint {path}{note}: {e}") from e
  if parts["sop"] and not parts["pooler"]:
    raise CheckpointError(
        f"Checkpoint {path} has a sentence-order head but no pooler, which "
        "that head reads; it is not a layout transformers writes.")
  heads = tuple(h for h in models.HEADS if parts[h])
  _, expected = _abstract_params(cfg, parts["pooler"], heads)
  check_shapes(params, expected, f"Checkpoint {path}")
  missing = tuple(name for name, present in (
      ("pooler", parts["pooler"]), ("mlm", parts["mlm"]),
      ("sop", parts["sop"])) if not present)
  if missing:
    log.warning("%s has no weights for %s; those outputs are not produced "
                "(nothing is initialised randomly).", path, ", ".join(missing))
  params = jax.tree.map(
      lambda x: jnp.asarray(x, cfg.parameter_dtype), params)
  return Pretrained(config=_to_config_dict(cfg), model_config=cfg,
                    params=params, tokenizer=_tokenizer(path),
                    heads=heads, pooler=parts["pooler"], missing=missing)


def _tokenizer(path: str):
  """The directory's tokenizer (spiece.model, tokenizer.json, vocab.txt)."""
  from albert_jax.tokenizer import Tokenizer  # pylint: disable=g-import-not-at-top
  return Tokenizer.find_in(path)


################################################################################
# albert_jax training workdirs.
################################################################################


def _read_workdir_config(path: str) -> dict | None:
  """The trainer's resolved config (config.json), or None for an HF dir.

  A trainer config is a JSON object with a `model` section; an HF config is
  flat (`model_type`, `hidden_size`, ...). A `checkpoints/` directory without
  a trainer config is an error rather than an HF directory.
  """
  config_path = os.path.join(path, "config.json")
  has_checkpoints = os.path.isdir(os.path.join(path, "checkpoints"))
  if not os.path.exists(config_path):
    if has_checkpoints:
      raise CheckpointError(
          f"{path} has checkpoints/ but no config.json; the trainer writes "
          "the run's config there, which is needed to rebuild the model.")
    return None
  try:
    with open(config_path, encoding="utf-8") as f:
      config = json.load(f)
  except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
    if has_checkpoints:
      raise CheckpointError(f"{config_path} is not readable JSON: {e}") from e
    return None  # the HF path reports its own error
  if isinstance(config, dict) and isinstance(config.get("model"), dict):
    return config
  if has_checkpoints and "model_type" not in config:
    raise CheckpointError(
        f"{config_path} has no `model` section; expected the config.json "
        "that albert_jax's trainer writes into its workdir.")
  return None


def _workdir_tokenizer(path: str, config: Mapping[str, Any]):
  """The tokenizer the run trained with: data.tokenizer or WORKDIR/spm."""
  from albert_jax.tokenizer import Tokenizer  # pylint: disable=g-import-not-at-top
  configured = str((config.get("data") or {}).get("tokenizer") or "")
  own = os.path.join(path, "spm", "spiece.model")
  # The trainer's order: a configured tokenizer wins over the workdir's.
  for candidate in (configured, own) if configured else (own,):
    if candidate and os.path.exists(candidate):
      return Tokenizer.from_file(candidate)
  log.warning("No tokenizer found for %s (looked for %s); .tokenizer is None.",
              path, " and ".join(c for c in (configured, own) if c))
  return None


def _load_workdir(path: str, config: Mapping[str, Any], step: int | None,
                  overrides: Mapping[str, Any]) -> Pretrained:
  """`load_pretrained` for an albert_jax training workdir."""
  from albert_jax import checkpoints  # pylint: disable=g-import-not-at-top
  note = f" with overrides {dict(overrides)}" if overrides else ""
  try:
    cfg = ModelConfig.from_dict({**config["model"], **overrides})
  except (ValueError, TypeError) as e:
    raise CheckpointError(
        f"{path}/config.json: the model section{note} is not a valid "
        f"ModelConfig: {e}") from e
  objective = (config.get("data") or {}).get("objective", "sop")
  heads = ("mlm", "sop") if objective in ("sop", "nsp") else ("mlm",)
  _, abstract = _abstract_params(cfg, True, heads)
  try:
    params, restored_step = checkpoints.restore_params(path, abstract,
                                                       step=step)
  except FileNotFoundError as e:
    raise CheckpointError(f"Workdir {path}: {e}") from e
  except checkpoints.CheckpointShapeError as e:
    raise CheckpointError(
        f"Workdir {path}: its config.json{note} (objective {objective!r}, "
        f"heads {heads}) does not describe the model in checkpoint step "
        f"{e.step}.\n{e}") from e
  except checkpoints.UnreadableCheckpointError as e:
    raise CheckpointError(f"Workdir {path}: {e}") from e
  params = jax.tree.map(lambda x: jnp.asarray(x, cfg.parameter_dtype), params)
  return Pretrained(config=_to_config_dict(cfg), model_config=cfg,
                    params=params, tokenizer=_workdir_tokenizer(path, config),
                    heads=heads, pooler=True, missing=(),
                    step=restored_step)
