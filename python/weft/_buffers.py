"""Output allocation for weft.Communicator calls made without ``out=``."""


def empty_like(buf, count: int):
    """A new 1-D array (or tensor) of ``count`` elements of ``buf``'s kind and dtype."""
    if hasattr(buf, "new_empty"):
        return buf.new_empty((count,))
    import numpy as np

    return np.empty(count, dtype=np.asarray(buf).dtype)
