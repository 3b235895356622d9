"""`run(fn, *args)`: fn(*args) in a new Python process, for tests that start
a jax.profiler trace.

Another test in the same pytest worker may have compiled for a TPU topology,
which loads libtpu's PJRT plugin into that process; jax.profiler then calls
the plugin's tracer and the process crashes where there is no TPU
(`albert_jax.training.profiling.tracer_problem`). `fn` must be a module-level
function of a test module (the new process imports it by name; pytest's
sys.path travels with it).
"""

import concurrent.futures
import multiprocessing


def run(fn, *args, timeout: float = 600):
  context = multiprocessing.get_context("spawn")
  with concurrent.futures.ProcessPoolExecutor(1, mp_context=context) as pool:
    return pool.submit(fn, *args).result(timeout=timeout)
