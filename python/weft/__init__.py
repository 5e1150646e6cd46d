"""weft: collective communication for PyTorch.

``weft.Communicator`` is the torch-free core API over any writable
C-contiguous buffer (numpy arrays, CPU torch tensors).
"""

from weft._C import (  # noqa: F401
    AbortedError,
    Communicator,
    Error,
    Handle,
    InvalidArgument,
    PeerError,
    TimeoutError,
    algorithms,
)

__all__ = [
    "Communicator",
    "Handle",
    "Error",
    "InvalidArgument",
    "PeerError",
    "TimeoutError",
    "AbortedError",
    "algorithms",
]
