"""Abstract TPU and GPU devices of a named slice, for compiling without them.

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

GPUs work the same way through the CUDA plugin (the `gpu_aot` extra:
`pip install 'albert_jax[gpu_aot]'`, `jax-cuda12-plugin` without its CUDA
libraries): a GPU topology is the card's `GpuTargetConfigProto`
(`gpu_targets/NAME.txtpb`: SM count, memory size and bandwidth, compute
capability, cuDNN version) and XLA:GPU compiles for it on a CPU host, its
fusions, GEMM rewrites and cuDNN calls as on the card (GEMM autotuning
aside, which needs the card). Named h100 (one H100 SXM 80GB), h100:8 (eight
on one host), h100:2x8 (two hosts of eight), and the same for h200.
"""

from __future__ import annotations

import contextlib
import importlib.util
import math
import os
import pathlib
import re
import tempfile

# Two processes may not load libtpu at once unless this is set (the
# compile-only devices touch no TPU, so sharing it is safe).
MULTIPLE_LOAD_ENV = "ALLOW_MULTIPLE_LIBTPU_LOAD"
INSTALL_HINT = ("install the TPU compiler with pip install 'albert_jax[tpu]' "
                "(libtpu 0.0.52, the release that matches jax 0.10.2)")
GPU_INSTALL_HINT = ("install XLA:GPU's compiler with pip install "
                    "'albert_jax[gpu_aot]' (jax-cuda12-plugin matching "
                    "jaxlib, without the CUDA libraries)")
EXAMPLES = ("v5e:4x4, v5e:16x16, v4:2x4x4, v5p:4x4x4, v6e:16x16, h100, "
            "h100:8, h200")
# GPU cards with a target config in gpu_targets/ (the name is the file's).
GPU_TARGETS = ("h100", "h200")
_GPU_NAME = re.compile(r"^(h100|h200)(?:[:=_](?:(\d+)x)?(\d+))?$")
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


def is_gpu(name: str) -> bool:
  """Whether `name` names GPUs ("h100", "h200:8") rather than a TPU slice."""
  return _GPU_NAME.match(name.strip().lower()) is not None


def gpu_plugin_available() -> bool:
  """Whether XLA:GPU's compiler (the `jax-cuda12-plugin` package) is
  installed."""
  return importlib.util.find_spec("jax_plugins.xla_cuda12") is not None


def gpu_target_config(card: str) -> str:
  """The `GpuTargetConfigProto` text of a card of `GPU_TARGETS`."""
  path = pathlib.Path(__file__).with_name("gpu_targets") / f"{card}.txtpb"
  return path.read_text(encoding="utf-8")


def gpu_topology(name: str) -> tuple[str, str]:
  """"h100:2x8" → ("h100", "1x2x8"): the card and XLA's topology string
  (slices x hosts x GPUs per host)."""
  match = _GPU_NAME.match(name.strip().lower())
  if not match:
    raise ValueError(f"--topology={name!r} is not a GPU topology name; use "
                     "CARD, CARD:GPUS or CARD:HOSTSxGPUS with CARD one of "
                     f"{GPU_TARGETS}, e.g. h100, h100:8, h200:2x8.")
  card, hosts, gpus = match.group(1), match.group(2) or "1", match.group(3)
  if gpus is not None and (int(gpus) < 1 or int(hosts) < 1):
    raise ValueError(f"--topology={name!r}: hosts and GPUs must be >= 1.")
  return card, f"1x{hosts}x{gpus or 1}"


def _gpu_devices(name: str) -> list:
  """The compile-only devices of the GPUs `name` (see `gpu_topology`)."""
  if not gpu_plugin_available():
    raise OSError(f"--topology={name} needs the CUDA plugin: "
                  f"{GPU_INSTALL_HINT}.")
  card, shape = gpu_topology(name)
  from jax.experimental import topologies  # pylint: disable=g-import-not-at-top
  try:
    found = topologies.get_topology_desc(
        platform="cuda", target_config=gpu_target_config(card),
        topology=shape).devices
  except Exception as e:  # pylint: disable=broad-except
    raise OSError(
        f"--topology={name}: the CUDA plugin gave no devices "
        f"({str(e).splitlines()[0]}); on a host without a GPU run with "
        "JAX_PLATFORMS=cpu (python -m albert_jax.main sets it for "
        "--topology).") from e
  return list(found)


@contextlib.contextmanager
def gpu_lowering(card: str):
  """Lowering for a card with no GPU present: JAX asks cuDNN's runtime for
  its version before it lowers cuDNN attention, and a host without the
  CUDA libraries has none; the target config's cuDNN version answers
  instead (on a GPU host the runtime's own answer stands)."""
  from jax._src.cudnn import fused_attention_stablehlo as cudnn  # pylint: disable=g-import-not-at-top
  try:
    cudnn.check_cudnn_version()
    yield
    return
  except RuntimeError:
    pass
  text = gpu_target_config(card)
  version = re.search(r"dnn_version_info \{\s*major: (\d+)\s*minor: (\d+)",
                      text)
  number = int(version.group(1)) * 10000 + int(version.group(2)) * 100
  original = cudnn.check_cudnn_version
  cudnn.check_cudnn_version = lambda: number
  try:
    yield
  finally:
    cudnn.check_cudnn_version = original


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
  """The compile-only devices of the TPU slice or GPUs `name`, one per chip.

  Raises:
    OSError: libtpu (or, for GPUs, the CUDA plugin) is not installed.
    ValueError: libtpu does not know the topology.
  """
  if is_gpu(name):
    return _gpu_devices(name)
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
  """HBM of one chip or card of `device_kind` in GiB (None if not known);
  a GPU's from its target config."""
  if device_kind in HBM_GIB:
    return HBM_GIB[device_kind]
  for card in GPU_TARGETS:
    spec = gpu_spec(card)
    if spec["device_kind"] == device_kind:
      return spec["memory_bytes"] / 1024 ** 3
  return None


def gpu_spec(card: str) -> dict:
  """What a card's target config says that a report needs: its
  `device_kind`, memory bytes, HBM bytes/s and SM count."""
  text = gpu_target_config(card)
  field = lambda key: re.search(rf"^\s*{key}: (.+)$", text, re.M).group(1)  # noqa: E731
  return {"device_kind": field("device_description_str").strip('"'),
          "memory_bytes": int(field("device_memory_size")),
          "hbm_bytes_per_second": float(field("memory_bandwidth")),
          "sm_count": int(field("core_count"))}


def _libtpu_version() -> str:
  from importlib import metadata  # pylint: disable=g-import-not-at-top
  try:
    return metadata.version("libtpu")
  except metadata.PackageNotFoundError:
    return "(not installed)"
