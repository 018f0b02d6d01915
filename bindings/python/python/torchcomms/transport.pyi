# Stubs of torchcomms.transport: the same names as torchcomms._transport.
from torchcomms._transport import *
from torchcomms._transport import __all__ as __all__
