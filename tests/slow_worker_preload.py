"""A Dask worker preload that holds a new worker back before it registers with its scheduler.

The local contract world's ``slow()``: the other worlds' test servers delay readiness by a second, and a
local worker must not be able to register inside the short timeouts of the timed-out tests, however fast
this machine starts one. Dask runs ``dask_setup`` before the worker registers.
"""
import time

HOLD_SECONDS = 2.0


def dask_setup(worker) -> None:
    time.sleep(HOLD_SECONDS)
