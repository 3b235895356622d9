"""Local copies for libraries that open files only by a local name.

SentencePiece's trainer and the `tokenizers` library's `from_file` and
`save` take local file names. For a `gs://` path (see `albert_jax.storage`)
they get a copy in a temporary directory, or write into one that is then
uploaded, so local and Cloud Storage paths give the same files and the same
tokenizers.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from typing import Iterator, Sequence

from albert_jax import storage


@contextlib.contextmanager
def local_files(paths: Sequence[str | os.PathLike]) -> Iterator[list[str]]:
  """Local file names holding the bytes of `paths`, for the `with` block.

  A local path is itself (`~` expanded). A `gs://` object is copied, under
  its own name, into a temporary directory that is removed afterwards; the
  paths may share a name only if all of them are local.
  """
  with contextlib.ExitStack() as stack:
    out, tmp = [], None
    for p in paths:
      if not storage.is_remote(p):
        out.append(os.fspath(storage.path(p)))
        continue
      if tmp is None:
        tmp = stack.enter_context(tempfile.TemporaryDirectory(
            prefix="albert_jax_"))
      local = os.path.join(tmp, storage.path(p).name)
      if os.path.exists(local):
        raise ValueError(f"{os.fspath(p)}: a second file named "
                         f"{os.path.basename(local)}; copy one at a time.")
      with open(local, "wb") as f:
        f.write(storage.path(p).read_bytes())
      out.append(local)
    yield out


def publish(local_dir: str, target: str | os.PathLike,
            last: str | None = None) -> None:
  """Copies the files of the local directory `local_dir` into `target`.

  Each file is written whole (`storage.write_atomic`); `last`, when given,
  goes after all the others, so its presence in `target` means the set is
  complete. Subdirectories are not copied.
  """
  names = sorted(n for n in os.listdir(local_dir)
                 if os.path.isfile(os.path.join(local_dir, n)))
  if last is not None:
    if last not in names:
      raise FileNotFoundError(f"{os.path.join(local_dir, last)} was not "
                              "written; nothing was copied.")
    names = [n for n in names if n != last] + [last]
  directory = storage.path(target)
  directory.mkdir(parents=True, exist_ok=True)
  for name in names:
    with open(os.path.join(local_dir, name), "rb") as f:
      storage.write_atomic(directory / name, f.read())
