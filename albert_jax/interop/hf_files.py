"""HF checkpoint files as NumPy arrays, without ever unpickling.

Weights come from `model.safetensors` or a sharded
`model.safetensors.index.json`; a `pytorch_model.bin` is read only through
`torch.load(weights_only=True)`, which refuses arbitrary objects, and only if
it holds nothing but named tensors. Files are read as bytes through
`albert_jax.storage`, so a directory may be local or `gs://`.
"""

from __future__ import annotations

import io
import json
from typing import Mapping

import numpy as np

from albert_jax import storage
from albert_jax.interop import CheckpointError
from albert_jax.interop import child

# The class named in config.json, not AutoModel: that would drop the heads.
_CONVERT_HOW = (
    "convert it to safetensors once, in an environment you trust: load it "
    "with the transformers class named in its config.json 'architectures' "
    "(e.g. `transformers.AlbertForPreTraining.from_pretrained(dir)`) and "
    "call `.save_pretrained(dir, safe_serialization=True)`")


def _numpy_dtype(name: str) -> np.dtype:
  """A safetensors dtype name ("F32", "BF16", ...) as a NumPy dtype;
  bfloat16 and the float8s as ml_dtypes'."""
  import ml_dtypes  # pylint: disable=g-import-not-at-top
  special = {"BF16": ml_dtypes.bfloat16, "F8_E4M3": ml_dtypes.float8_e4m3fn,
             "F8_E5M2": ml_dtypes.float8_e5m2, "BOOL": np.bool_}
  if name in special:
    return np.dtype(special[name])
  kind = {"F": "f", "I": "i", "U": "u", "C": "c"}.get(name[:1])
  if kind is None or not name[1:].isdigit():
    raise ValueError(f"unknown tensor dtype {name!r}")
  return np.dtype(f"<{kind}{int(name[1:]) // 8}")


def _read_safetensors(path: str) -> dict[str, np.ndarray]:
  """All tensors of one safetensors file (local or gs://, read as bytes);
  bfloat16 comes back as ml_dtypes'."""
  from safetensors import deserialize  # pylint: disable=g-import-not-at-top
  from safetensors import SafetensorError  # pylint: disable=g-import-not-at-top
  try:
    return {name: np.frombuffer(t["data"], _numpy_dtype(t["dtype"])).reshape(
        t["shape"]) for name, t in deserialize(storage.path(path).read_bytes())}
  except (SafetensorError, OSError, ValueError, TypeError) as e:
    raise CheckpointError(
        f"{path} is not a readable safetensors file ({e}). It may be "
        "truncated or corrupt: re-download or re-export it.") from e


def _read_sharded(path: str, index: str) -> dict[str, np.ndarray]:
  """Tensors of a sharded checkpoint described by `index`."""
  try:
    weight_map = json.loads(storage.path(index).read_bytes())["weight_map"]
    files = sorted(set(weight_map.values()))
  except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError,
          AttributeError) as e:
    raise CheckpointError(
        f"{index} is not a valid shard index (a JSON object with a "
        f"'weight_map' of tensor name → file): {e!r}") from e
  # Shards sit beside their index: a name with a directory part (`../x`,
  # `/etc/x`, `sub/x`) would read a file from elsewhere.
  outside = [n for n in files if not isinstance(n, str) or n in ("", ".", "..")
             or "/" in n or "\\" in n]
  if outside:
    raise CheckpointError(
        f"{index} names shard(s) {outside[:4]} that are not file names in "
        f"{path}; a sharded checkpoint's shards sit beside its index, and "
        "albert_jax reads nothing outside the checkpoint directory. Fix the "
        "index's weight_map, or re-download the checkpoint.")
  missing = [n for n in files if not storage.path(child(path, n)).is_file()]
  if missing:
    raise CheckpointError(
        f"{index} names shard file(s) that are not in {path}: {missing}. "
        "The download is incomplete: fetch every shard.")
  state = {}
  for name in files:
    state.update(_read_safetensors(child(path, name)))
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
  single = child(path, "model.safetensors")
  index = child(path, "model.safetensors.index.json")
  if storage.path(single).exists():
    return _read_safetensors(single)
  if storage.path(index).exists():
    return _read_sharded(path, index)
  binary = child(path, "pytorch_model.bin")
  if storage.path(binary).exists():
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
  data = storage.path(path).read_bytes()
  try:
    state = torch.load(io.BytesIO(data), map_location="cpu",
                       weights_only=True)
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
