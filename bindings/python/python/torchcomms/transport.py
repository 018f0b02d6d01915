"""``torchcomms.transport``: the same names as :mod:`torchcomms._transport`."""

from torchcomms._transport import *  # noqa: F401,F403
from torchcomms._transport import __all__  # noqa: F401
