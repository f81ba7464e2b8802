"""kvtier's exceptions: one class per status code, all under :class:`Error`.

Raised for errors that are the caller's own (a bad argument, a namespace not opened by this
client) and by AdminClient, which does not fail open. Loads, lookups and stores that meet
daemon trouble do not raise: their result's ``fail_open`` says why the cache reported a miss.
Several classes also derive from the matching builtin (``InvalidArgument`` is a
``ValueError``), so generic handlers keep working.
"""

from __future__ import annotations


class Error(Exception):
    """Base of every kvtier exception. ``code`` is the status code's name."""

    code: str = "UNKNOWN"


class Cancelled(Error):
    """The call was cancelled."""

    code = "CANCELLED"


class Unknown(Error):
    """An error of unknown kind."""

    code = "UNKNOWN"


class InvalidArgument(Error, ValueError):
    """A bad argument; the message names it. Nothing was changed."""

    code = "INVALID_ARGUMENT"


class DeadlineExceeded(Error, TimeoutError):
    """The daemon did not answer within the deadline."""

    code = "DEADLINE_EXCEEDED"


class NotFound(Error, LookupError):
    """What was named does not exist."""

    code = "NOT_FOUND"


class AlreadyExists(Error):
    """It exists already."""

    code = "ALREADY_EXISTS"


class PermissionDenied(Error, PermissionError):
    """The daemon refused this peer."""

    code = "PERMISSION_DENIED"


class ResourceExhausted(Error):
    """Out of memory, slots or another bounded resource."""

    code = "RESOURCE_EXHAUSTED"


class FailedPrecondition(Error):
    """The object is not in a state that allows the call (e.g. committed twice)."""

    code = "FAILED_PRECONDITION"


class Aborted(Error):
    """The operation was aborted."""

    code = "ABORTED"


class OutOfRange(Error, IndexError):
    """An index out of range."""

    code = "OUT_OF_RANGE"


class Unimplemented(Error, NotImplementedError):
    """Not supported by this build or backend."""

    code = "UNIMPLEMENTED"


class Internal(Error):
    """A bug in kvtier."""

    code = "INTERNAL"


class Unavailable(Error, ConnectionError):
    """The daemon (or the GPU runtime) cannot be reached or used."""

    code = "UNAVAILABLE"


class DataLoss(Error):
    """Stored data was found corrupt."""

    code = "DATA_LOSS"


class IoError(Error, OSError):
    """An I/O call failed."""

    code = "IO_ERROR"


# Status code name -> class; the extension raises through this table.
BY_CODE: dict[str, type[Error]] = {
    cls.code: cls
    for cls in (
        Cancelled,
        Unknown,
        InvalidArgument,
        DeadlineExceeded,
        NotFound,
        AlreadyExists,
        PermissionDenied,
        ResourceExhausted,
        FailedPrecondition,
        Aborted,
        OutOfRange,
        Unimplemented,
        Internal,
        Unavailable,
        DataLoss,
        IoError,
    )
}
