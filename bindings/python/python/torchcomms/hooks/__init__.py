"""Hooks that observe a communicator's operations: the flight recorder, clog, NaN checks."""

from torchcomms.hooks.clog import clog
from torchcomms.hooks.fr import FlightRecorderHook
from torchcomms.hooks.nan_check import NanCheckHook

__all__ = [
    "clog",
    "FlightRecorderHook",
    "NanCheckHook",
]

for _name in __all__:
    globals()[_name].__module__ = "torchcomms.hooks"
del _name
