"""weft: collective communication for PyTorch.

``import weft`` registers the torch.distributed backend ``"weft"``
(``dist.init_process_group("weft")``). ``weft.Communicator`` is the torch-free
core API over any writable C-contiguous buffer (numpy arrays, CPU torch tensors).
``weft.DistributedDataParallel`` and the Horovod-style ``broadcast_parameters`` /
``broadcast_optimizer_state`` are for training with torch.
"""

from weft._backend import monitored_barrier
from weft._backend import register as _register_backend
from weft._C import (  # noqa: F401
    AbortedError,
    Communicator,
    Error,
    Handle,
    InvalidArgument,
    PeerError,
    TimeoutError,
    algorithms,
    host_id,
)
from weft.broadcast import broadcast_optimizer_state, broadcast_parameters
from weft.ddp import DistributedDataParallel

_register_backend()

__all__ = [
    "Communicator",
    "Handle",
    "Error",
    "InvalidArgument",
    "PeerError",
    "TimeoutError",
    "AbortedError",
    "algorithms",
    "host_id",
    "monitored_barrier",
    "DistributedDataParallel",
    "broadcast_parameters",
    "broadcast_optimizer_state",
]
