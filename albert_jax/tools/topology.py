"""Abstract TPU devices of a named slice, for compiling without the TPU.

`libtpu` (the `tpu` extra: `pip install 'albert_jax[tpu]'`, libtpu 0.0.52
with jax 0.10.2) describes any TPU slice on any host:
`jax.experimental.topologies.get_topology_desc` gives its devices, a mesh of
them is a mesh like any other, and `jax.jit(...).lower(...).compile()` over
it runs the real TPU compiler, Mosaic included, as MaxText's
`train_compile.py` does. Nothing runs and no TPU is touched.

A topology is named GENERATION:SHAPE, chips along each axis of the slice:
v4:2x4x4 (a v4-64 slice: 32 chips), v5e:16x16 (v5litepod-256), v5p:4x4x4
(v5p-128: 64 chips), v6e:16x16 (v6e-256). v4 and v5p chips hold two
TensorCores that JAX drives as one device ("megacore"), which v4 must be
asked for; axes that span a whole pod side wrap around (a torus), as on the
real slice.
"""

from __future__ import annotations

import contextlib
import importlib.util
import math
import os
import re
import tempfile

# Two processes may not load libtpu at once unless this is set (the
# compile-only devices touch no TPU, so sharing it is safe).
MULTIPLE_LOAD_ENV = "ALLOW_MULTIPLE_LIBTPU_LOAD"
INSTALL_HINT = ("install the TPU compiler with pip install 'albert_jax[tpu]' "
                "(libtpu 0.0.52, the release that matches jax 0.10.2)")
EXAMPLES = "v5e:4x4, v5e:16x16, v4:2x4x4, v5p:4x4x4, v6e:16x16"
# HBM per chip in GiB, by `device_kind`. v5e's 16 GB are decimal gigabytes.
HBM_GIB = {
    "TPU v4": 32.0,
    "TPU v5 lite": 16e9 / 1024 ** 3,
    "TPU v5": 95.0,
    "TPU v6 lite": 32.0,
}
# Generations whose chips are one megacore device of two TensorCores.
_MEGACORE = ("v4", "v5p", "v5")
# Side lengths at which a slice's axis closes into a ring: a 16-chip side of
# a v5e / v6e pod, a 3D slice made of whole 4x4x4 cubes.
_WRAP_2D = 16
_CUBE = 4
_NAME = re.compile(r"^([a-z0-9]+)[:=_]((?:\d+x)*\d+)$")


def libtpu_available() -> bool:
  """Whether the TPU compiler (the `libtpu` package) is installed."""
  return importlib.util.find_spec("libtpu") is not None


def parse(name: str) -> tuple[str, tuple[int, ...]]:
  """"v5e:4x4" → ("v5e", (4, 4)); ValueError for another form."""
  match = _NAME.match(name.strip().lower())
  if not match:
    raise ValueError(
        f"--topology={name!r} is not a TPU topology name; use "
        f"GENERATION:SHAPE, chips per axis, e.g. {EXAMPLES}.")
  return match.group(1), tuple(int(d) for d in match.group(2).split("x"))


def topology_kwargs(name: str) -> dict:
  """`get_topology_desc` arguments for the slice `name` (see the module
  docstring: megacore chips, wrap-around axes)."""
  generation, dims = parse(name)
  kwargs: dict = {"topology_name": name.strip(), "platform": "tpu"}
  if generation in _MEGACORE:
    kwargs["chip_config_name"] = "megacore"
  if len(dims) == 3:
    whole_cubes = all(d % _CUBE == 0 for d in dims)
    kwargs["wrap"] = (whole_cubes,) * 3
  elif len(dims) == 2:
    kwargs["wrap"] = tuple(d == _WRAP_2D for d in dims) + (False,)
  return kwargs


@contextlib.contextmanager
def _stderr_to(path: str):
  """Sends file descriptor 2 to `path` (libtpu writes its start-up
  warnings, about the cloud metadata a CPU host lacks, straight to it)."""
  saved = os.dup(2)
  with open(path, "wb") as sink:
    os.dup2(sink.fileno(), 2)
    try:
      yield
    finally:
      os.dup2(saved, 2)
      os.close(saved)


def devices(name: str) -> list:
  """The compile-only devices of the TPU slice `name`, one per chip.

  Raises:
    OSError: libtpu is not installed.
    ValueError: libtpu does not know the topology.
  """
  if not libtpu_available():
    raise OSError(f"--topology={name} needs libtpu: {INSTALL_HINT}.")
  kwargs = topology_kwargs(name)
  os.environ.setdefault(MULTIPLE_LOAD_ENV, "1")
  from jax.experimental import topologies  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top
  with tempfile.NamedTemporaryFile(suffix=".log") as log:
    try:
      with _stderr_to(log.name):
        found = topologies.get_topology_desc(**kwargs).devices
    except jax.errors.JaxRuntimeError as e:
      message = str(e).splitlines()[0]
      raise ValueError(f"--topology={name!r}: libtpu refuses it ({message}); "
                       f"use GENERATION:SHAPE, e.g. {EXAMPLES}.") from e
  chips = math.prod(parse(name)[1])
  if len(found) != chips:
    raise ValueError(f"--topology={name!r} gave {len(found)} devices for "
                     f"{chips} chips; libtpu {_libtpu_version()} may not "
                     "know this generation's chip layout.")
  return list(found)


def hbm_gib(device_kind: str) -> float | None:
  """HBM of one chip of `device_kind` in GiB (None if not known)."""
  return HBM_GIB.get(device_kind)


def _libtpu_version() -> str:
  from importlib import metadata  # pylint: disable=g-import-not-at-top
  try:
    return metadata.version("libtpu")
  except metadata.PackageNotFoundError:
    return "(not installed)"
