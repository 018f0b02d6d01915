"""NanCheckHook: raise before a collective sends NaNs."""

from torchcomms.hooks.nan_check.nan_check import NanCheckHook

__all__ = ["NanCheckHook"]
