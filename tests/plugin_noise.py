"""What XLA's CUDA plugin prints on a host without a GPU, left out of a
command's output before it is compared.

The test extra installs the plugin (the `gpu_aot` extra, for compiling for
an H100 on this host). Its libraries' static initialisers print "Could not
find cuda drivers on your machine" (after absl's "All log messages before
absl::InitializeLog()" notice) to the process's stderr whenever jax loads
them, before any of the project's own output; nothing else is dropped.
"""

import re

_NOISE = re.compile(
    r"^(WARNING: All log messages before absl::InitializeLog\(\) is called "
    r"are written to STDERR|I\d{4} [\d:. ]+\d+ cudart_stub\.cc:\d+\] Could "
    r"not find cuda drivers on your machine, GPU will not be used\.)$")


def without_plugin_noise(text: str) -> str:
  """`text` without the CUDA plugin's start-up lines."""
  return "".join(line for line in text.splitlines(keepends=True)
                 if not _NOISE.match(line.rstrip("\n")))
