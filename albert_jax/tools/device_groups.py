r"""One device group per trial: a host's accelerators split into disjoint
groups of K, each trial process pinned to one group while it runs.

`--parallel=N` alone starts N trial processes that all see every device of
the host, each given 1/N of an accelerator's memory. `--devices_per_trial=K`
(the sweep's and the downstream suite's) splits the host's devices into
groups of K instead — GPUs 0,1 | 2,3 | 4,5 | 6,7 for K=2 on eight — and a
trial takes a free group, runs on it alone, and hands it back when it ends,
when the next trial takes it: at most one trial per group at any time.
`--parallel` defaults to the number of groups; more is refused. The pinning
is the environment each platform documents, set on the trial's process:

  * NVIDIA GPUs: CUDA_VISIBLE_DEVICES=i,j.
  * A Cloud TPU VM: TPU_VISIBLE_CHIPS=i,j, the group's shape as
    TPU_CHIPS_PER_PROCESS_BOUNDS, TPU_PROCESS_BOUNDS=1,1,1 (one process, a
    slice of its own), a port of its own, ALLOW_MULTIPLE_LIBTPU_LOAD, and
    the same one-host topology in the names the runtime reads for a host
    (TPU_HOST_BOUNDS=1,1,1, TPU_CHIPS_PER_HOST_BOUNDS, TPU_WORKER_ID=0,
    TPU_WORKER_HOSTNAMES=localhost), so that on a worker of a multi-host
    slice the trial does not wait for the other workers (see `tpu_env`).
    K counts chips; a v2 or v3 chip is two JAX devices.
  * CPU: no device to pin; refused.

The devices are counted without claiming them: the parent never starts
JAX, whose runtime would hold the chips the trials need. GPUs are the lines
of `nvidia-smi -L` (else the entries of /proc/driver/nvidia/gpus), TPU chips
the /dev/accelN files (else the numbered groups of /dev/vfio, as newer
TPU VMs show them), as Ray's TPU accelerator manager counts them. A CUDA_VISIBLE_DEVICES or
TPU_VISIBLE_CHIPS already set narrows the devices to those it lists.
`--platform` and `--num_devices` say them instead of probing (a host where
the probe fails, or a dry run); `--num_devices=6` on eight GPUs splits the
first six and leaves two idle, as a K that does not divide the devices
would, which is refused rather than done unasked.

On a multi-host TPU slice the same command runs on every worker, each
splitting its own host's chips (the sweep's claims share the trials out,
albert_jax/tools/sweep.py). A trial there without `--devices_per_trial`
would be a process not pinned to its host's chips, which libtpu makes a
member of the whole slice, waiting for the other workers: a command with
trials to run refuses that (`refuse_a_slice`), the slice's workers counted
from the metadata JAX reads them from. None of this has been run on a
multi-host slice here; it follows the sources `tpu_env` cites.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import subprocess
from typing import Callable, Mapping
import urllib.request

PLATFORMS = ("gpu", "tpu")
_NOUN = {"gpu": "GPU", "tpu": "TPU chip"}
# The variable that lists a process's devices, which a parent's setting
# narrows to.
VISIBLE = {"gpu": "CUDA_VISIBLE_DEVICES", "tpu": "TPU_VISIBLE_CHIPS"}
# TPU_CHIPS_PER_PROCESS_BOUNDS of a group of K chips of one host, as JAX's
# multi-process test runner (jax/_src/test_multiprocess.py) and Ray's TPU
# accelerator manager set them: 1 → 1,1,1, 2 → 1,2,1, 4 (a v4 host, half a
# v5e/v6e host) → 2,2,1, 8 (a whole v5e/v6e host) → 2,4,1.
TPU_BOUNDS = {1: "1,1,1", 2: "1,2,1", 4: "2,2,1", 8: "2,4,1"}
# Group g's libtpu port: 8476 (libtpu's, as in the JAX team's recipe for
# several processes on one TPU VM) + g, unique among running trials.
TPU_PORT = 8476


class DeviceGroupError(ValueError):
  """--devices_per_trial that cannot be honoured here: one line saying why."""


def _plural(n: int, platform: str) -> str:
  return f"{n} {_NOUN[platform]}{'' if n == 1 else 's'}"


def tpu_env(chips: tuple[str, ...], group: int) -> dict[str, str]:
  """The environment that gives one process `chips` of a TPU VM as a slice
  of its own, beside other such processes on the other chips.

  Followed: the JAX team's recipe for several processes on one TPU VM
  (gist.github.com/skye/f82ba45d2445bb19d53545538754f9a3, "non-communicating
  processes": chips per process as the group's shape, process bounds
  1,1,1, the visible chips and a port unique to the process), with the
  current names JAX's own runner of several TPU processes sets
  (jax/_src/test_multiprocess.py: TPU_VISIBLE_CHIPS, TPU_PROCESS_PORT,
  TPU_PROCESS_ADDRESSES, CLOUD_TPU_TASK_ID, ALLOW_MULTIPLE_LIBTPU_LOAD,
  which libtpu needs to load in a second process of the host).

  On a worker of a multi-host slice the runtime reads the slice's topology
  from the VM's metadata and waits for every worker to join (as
  pytorch/xla#7714 found running one worker of a pod); a process on a
  subset of one host's chips says one host instead: TPU_HOST_BOUNDS=1,1,1
  and the chips' shape as TPU_CHIPS_PER_HOST_BOUNDS, as Ray's TPU
  accelerator manager sets them for a subset of a host
  (ray/_private/accelerators/tpu.py, after jax-ml/jax#14977) and as that
  issue's fix ran one worker alone; TPU_WORKER_ID=0 and
  TPU_WORKER_HOSTNAMES=localhost complete the one-host picture, as a
  maintainer there advised. TPU_SKIP_MDS_QUERY=1, which that advice also
  gives, is not set: the runtime would then need the chips' type too
  (TPU_ACCELERATOR_TYPE), which only the metadata names.
  """
  port = str(TPU_PORT + group)
  shape = TPU_BOUNDS[len(chips)]
  return {"TPU_VISIBLE_CHIPS": ",".join(chips),
          "TPU_CHIPS_PER_PROCESS_BOUNDS": shape,
          "TPU_PROCESS_BOUNDS": "1,1,1",
          "TPU_PROCESS_PORT": port,
          "TPU_PROCESS_ADDRESSES": f"localhost:{port}",
          "CLOUD_TPU_TASK_ID": "0",
          "ALLOW_MULTIPLE_LIBTPU_LOAD": "true",
          "TPU_HOST_BOUNDS": "1,1,1",
          "TPU_CHIPS_PER_HOST_BOUNDS": shape,
          "TPU_WORKER_ID": "0",
          "TPU_WORKER_HOSTNAMES": "localhost"}


@dataclasses.dataclass(frozen=True)
class DeviceGroups:
  """A host's devices of one platform, in groups of `per_group`.

  Attributes:
    platform: "gpu" or "tpu".
    devices: their ids as VISIBLE[platform] lists them ("0", "1", ...).
    per_group: K; divides len(devices).
  """
  platform: str
  devices: tuple[str, ...]
  per_group: int

  @property
  def groups(self) -> list[tuple[str, ...]]:
    k = self.per_group
    return [self.devices[i:i + k] for i in range(0, len(self.devices), k)]

  def env(self, group: int) -> dict[str, str]:
    """What pins a process to group number `group`."""
    ids = self.groups[group]
    if self.platform == "tpu":
      return tpu_env(ids, group)
    return {VISIBLE["gpu"]: ",".join(ids)}

  def label(self, group: int) -> str:
    """"GPUs 2,3", "TPU chip 0": the group as a log line names it."""
    ids = self.groups[group]
    return f"{_NOUN[self.platform]}{'' if len(ids) == 1 else 's'} " + (
        ",".join(ids))

  def describe(self) -> str:
    """"4 groups of 2 of 8 GPUs"."""
    n = len(self.groups)
    return (f"{n} group{'' if n == 1 else 's'} of {self.per_group} of "
            f"{_plural(len(self.devices), self.platform)}")


def count_gpus(nvidia_smi: str = "nvidia-smi", proc: str = "/proc") -> int:
  """NVIDIA GPUs of the host, without a CUDA context: `nvidia-smi -L`'s
  "GPU i: ..." lines, else the driver's /proc/driver/nvidia/gpus entries."""
  try:
    out = subprocess.run([nvidia_smi, "-L"], capture_output=True, text=True,
                         timeout=60, check=False)
    if out.returncode == 0:
      return sum(line.startswith("GPU ") for line in out.stdout.splitlines())
  except (OSError, subprocess.TimeoutExpired):
    pass
  gpus = os.path.join(proc, "driver", "nvidia", "gpus")
  return len(os.listdir(gpus)) if os.path.isdir(gpus) else 0


def count_tpu_chips(dev: str = "/dev") -> int:
  """TPU chips of the host, without loading libtpu: /dev/accelN, else the
  numbered groups of /dev/vfio, as Ray's TPU accelerator manager counts
  them (ray/_private/accelerators/tpu.py)."""
  if not os.path.isdir(dev):
    return 0
  accel = [n for n in os.listdir(dev) if re.fullmatch(r"accel\d+", n)]
  if accel:
    return len(accel)
  vfio = os.path.join(dev, "vfio")
  return (sum(n.isdigit() for n in os.listdir(vfio))
          if os.path.isdir(vfio) else 0)


_PROBES = {"gpu": "nvidia-smi -L or /proc/driver/nvidia/gpus",
           "tpu": "/dev/accel* or /dev/vfio"}


def local_devices(platform: str | None = None, num_devices: int | None = None,
                  *, environ: Mapping[str, str] | None = None,
                  dev: str = "/dev", proc: str = "/proc",
                  nvidia_smi: str = "nvidia-smi") -> tuple[str, list[str]]:
  """(platform, device ids) of this host: `platform` or the first found
  (GPUs, then TPU chips); the ids a parent's CUDA_VISIBLE_DEVICES or
  TPU_VISIBLE_CHIPS lists, else 0..N-1, N counted or `num_devices`; the
  first `num_devices` of them where it is given."""
  environ = os.environ if environ is None else environ
  count = {"gpu": lambda: count_gpus(nvidia_smi, proc),
           "tpu": lambda: count_tpu_chips(dev)}
  found = None
  if platform is None:
    for p in PLATFORMS:
      if (found := count[p]()) > 0:
        platform = p
        break
    else:
      raise DeviceGroupError(
          "--devices_per_trial needs an accelerator and none was found "
          "here (no NVIDIA GPU in nvidia-smi -L or /proc/driver/nvidia/gpus, "
          "no TPU chip in /dev/accel* or /dev/vfio); on CPU a trial cannot "
          "be pinned to devices: run trials with --parallel alone.")
  listed = environ.get(VISIBLE[platform])
  if listed is not None:
    ids = [i.strip() for i in listed.split(",") if i.strip()]
    where = f"{VISIBLE[platform]} lists"
  else:
    if num_devices is None:
      found = count[platform]() if found is None else found
    ids = [str(i) for i in range(num_devices if found is None else found)]
    where = "found here"
  if num_devices is not None:
    if num_devices > len(ids):
      raise DeviceGroupError(
          f"--num_devices={num_devices} is more than the "
          f"{_plural(len(ids), platform)} {where} ({','.join(ids)}).")
    ids = ids[:num_devices]
  if not ids:
    raise DeviceGroupError(
        f"no {_NOUN[platform]} " + (f"in {VISIBLE[platform]}={listed!r}"
                                    if listed is not None else
                                    f"found here ({_PROBES[platform]})")
        + "; give --num_devices if there are some.")
  return platform, ids


def device_groups(per_trial: int, platform: str | None = None,
                  num_devices: int | None = None, **probe) -> DeviceGroups:
  """This host's devices in groups of `per_trial`; DeviceGroupError where
  they cannot be (K more than the devices, a K that leaves some idle, a
  group shape libtpu is not given)."""
  platform, ids = local_devices(platform, num_devices, **probe)
  n, what = len(ids), _plural(len(ids), platform)
  if per_trial > n:
    raise DeviceGroupError(f"--devices_per_trial={per_trial} is more than "
                           f"the {what} here.")
  if platform == "tpu" and per_trial not in TPU_BOUNDS:
    raise DeviceGroupError(
        f"--devices_per_trial={per_trial}: a TPU trial takes 1, 2, 4 or 8 "
        "chips of a host, the group shapes libtpu is given "
        "(TPU_CHIPS_PER_PROCESS_BOUNDS).")
  if idle := n % per_trial:
    fit = [k for k in range(1, n + 1) if n % k == 0
           and (platform != "tpu" or k in TPU_BOUNDS)]
    raise DeviceGroupError(
        f"--devices_per_trial={per_trial} does not divide the {what} here: "
        f"{idle} would sit idle; give one of {', '.join(map(str, fit))}, or "
        f"--num_devices={n - idle} to leave {idle} idle.")
  return DeviceGroups(platform, tuple(ids), per_trial)


def plan(per_trial: int | None, parallel: int | None,
         platform: str | None = None, num_devices: int | None = None, *,
         print_commands: bool = False, **probe
         ) -> tuple[int, DeviceGroups | None]:
  """(trials at once, device groups or None) from the command's flags.

  Without `per_trial`, today's `--parallel` (default 1), no groups. With
  it, `parallel` defaults to the number of groups and may not exceed it.
  `probe`: `local_devices`'s keywords (tests give fake /dev and the like).
  """
  if per_trial is None:
    if platform is not None or num_devices is not None:
      raise DeviceGroupError(
          "--platform and --num_devices say which devices "
          "--devices_per_trial splits; give --devices_per_trial too.")
    return (1 if parallel is None else parallel), None
  if per_trial < 1:
    raise DeviceGroupError(f"--devices_per_trial={per_trial}; give 1 or "
                           "more devices per trial.")
  if num_devices is not None and num_devices < 1:
    raise DeviceGroupError(f"--num_devices={num_devices}; give 1 or more.")
  if print_commands:
    raise DeviceGroupError(
        "--devices_per_trial pins the trials this command runs, and with "
        "--print_commands it runs none; leave one of them out.")
  groups = device_groups(per_trial, platform, num_devices, **probe)
  n = len(groups.groups)
  if parallel is not None and parallel > n:
    raise DeviceGroupError(
        f"--parallel={parallel} is more than the {groups.describe()} "
        f"(--devices_per_trial={per_trial}); give --parallel={n} or less, "
        "one trial per group at a time.")
  return (n if parallel is None else parallel), groups


# A Cloud TPU VM's metadata: its slice's workers, as JAX reads them
# (jax/_src/clusters/cloud_tpu_cluster.py).
METADATA = ("http://{host}/computeMetadata/v1/instance/attributes/"
            "worker-network-endpoints")


def _slice_endpoints() -> str | None:
  """This TPU VM's metadata `worker-network-endpoints`; None unanswered."""
  host = os.environ.get("GCE_METADATA_IP", "metadata.google.internal")
  request = urllib.request.Request(METADATA.format(host=host),
                                   headers={"Metadata-Flavor": "Google"})
  try:
    with urllib.request.urlopen(request, timeout=5) as response:
      return response.read().decode("utf-8", errors="replace")
  except (OSError, ValueError):
    return None


def slice_workers(*, environ: Mapping[str, str] | None = None,
                  dev: str = "/dev",
                  endpoints: Callable[[], str | None] = _slice_endpoints
                  ) -> int | None:
  """How many hosts this TPU VM's slice has: the entries of
  TPU_WORKER_HOSTNAMES (set on GKE), else of the VM's metadata
  `worker-network-endpoints`, asked only where this host has TPU chips;
  None where neither says (not a TPU VM, no metadata server)."""
  environ = os.environ if environ is None else environ
  listed = environ.get("TPU_WORKER_HOSTNAMES") or (
      endpoints() if count_tpu_chips(dev) else None)
  if not listed:
    return None
  return len([w for w in listed.split(",") if w.strip()])


def refuse_a_slice(**probe) -> None:
  """DeviceGroupError where this host is one worker of a multi-host TPU
  slice, on which a trial not pinned to its chips would wait for every
  worker to join it. `probe`: `slice_workers`'s keywords."""
  workers = slice_workers(**probe)
  if workers is not None and workers > 1:
    raise DeviceGroupError(
        f"this TPU VM is one of the {workers} workers of a slice, where a "
        "trial not pinned to this host's chips waits for every worker to "
        "join it; give --devices_per_trial=K (1, 2, 4 or 8 chips) and run "
        "the same command on every worker, which share the trials out, or "
        "run each trial on the whole slice with --print_commands "
        "--launcher=tpu.")


def add_flags(parser: argparse.ArgumentParser) -> None:
  """--devices_per_trial, --platform and --num_devices, alike on every
  command that runs trials."""
  add = parser.add_argument
  add("--devices_per_trial", type=int, metavar="K", help="Split this host's "
      "accelerators into groups of K and run each trial on one group alone "
      "(CUDA_VISIBLE_DEVICES on NVIDIA GPUs; TPU_VISIBLE_CHIPS and its "
      "bounds on a TPU VM, K of 1, 2, 4 or 8 chips), a group going to the "
      "next trial when its trial ends; --parallel defaults to the number "
      "of groups. On a multi-host TPU slice: the same command on every "
      "worker, each splitting its own chips, the trials shared out.")
  add("--platform", choices=PLATFORMS, help="With --devices_per_trial: the "
      "accelerators, instead of probing for them (nvidia-smi -L, "
      "/dev/accel*, /dev/vfio).")
  add("--num_devices", type=int, metavar="N", help="With "
      "--devices_per_trial: split the first N devices (default: all "
      "found), without counting them.")
