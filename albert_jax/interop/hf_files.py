"""HF checkpoint files as NumPy arrays, without ever unpickling.

Weights come from `model.safetensors` or a sharded
`model.safetensors.index.json`; a `pytorch_model.bin` is read only through
`torch.load(weights_only=True)`, which refuses arbitrary objects, and only if
it holds nothing but named tensors.
"""

from __future__ import annotations

import json
import os
from typing import Mapping

import numpy as np

from albert_jax.interop import CheckpointError

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
