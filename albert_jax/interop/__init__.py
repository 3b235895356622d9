"""Reading and writing other codebases' checkpoints.

Modules:
  tensor_map: the tensor tables that drive every conversion, and shape
    checks.
  hf_config: HF `config.json` ↔ ModelConfig for ALBERT, BERT, RoBERTa and
    ELECTRA.
  hf_albert, hf_bert: HF tensor names ↔ albert_jax parameters.
  hf_files: safetensors (single or sharded) and weights-only torch files.
  tf_checkpoint: google-research/albert TF1 release directories.
  workdir: albert_jax training workdirs.
  sources: which of those a path is, and loading it.
  text_inputs: text → padded id rows for `Pretrained` (masks, pairs).

`albert_jax.interop.hf` and `albert_jax.interop.pretrained` are the public entry points.

Checkpoint directories are local (`~` expanded) or `gs://BUCKET/...`: every
file is reached through `albert_jax.storage`.
"""

import os


class CheckpointError(ValueError):
  """A checkpoint that cannot be loaded, with what to do about it."""


def child(directory, name: str) -> str:
  """`directory/name`, with `directory` as the user wrote it (so messages
  name it so); `albert_jax.storage.path` resolves it."""
  return f"{os.fspath(directory).rstrip('/')}/{name}"
