"""``torchcomms._backend_wrapper._BackendWrapper``: where torch.distributed looks for the c10d
backend over a ``TorchComm`` when ``torchcomms._comms`` has none (torch >= 2.14 imports it while
``torch.distributed`` itself is being imported, so this module only touches ``torch._C``).

The class is :class:`torchcomms._c10d._BackendWrapper`, also ``torchcomms._BackendWrapper`` and,
where torch can use it as a c10d backend, ``torchcomms._comms._BackendWrapper``.
"""

from torchcomms._c10d import _BackendWrapper, _BackendWrapperOptions

__all__ = ["_BackendWrapper", "_BackendWrapperOptions"]
