"""kvtier: a tiered KV-cache offload daemon's client for Python inference engines.

The classes are the C++ client SDK's, bound with nanobind (``kvtier._kvtier``); see each
docstring for shapes, units and the exceptions raised. Engine integrations live in
``kvtier.integrations`` (the vLLM KV connector, the SGLang HiCache storage backend) and import
their engine only when imported themselves.

The cache fails open: when kvtierd is down or slow, lookups and loads report a miss (the
result's ``fail_open`` says why) and the engine recomputes. Errors that are the caller's own
raise a subclass of :class:`kvtier.Error`, one per status code.
"""

from kvtier.errors import (
    Aborted,
    AlreadyExists,
    Cancelled,
    DataLoss,
    DeadlineExceeded,
    Error,
    FailedPrecondition,
    Internal,
    InvalidArgument,
    IoError,
    NotFound,
    OutOfRange,
    PermissionDenied,
    ResourceExhausted,
    Unavailable,
    Unimplemented,
    Unknown,
)
from kvtier._kvtier import (
    AdminClient,
    ChunkLease,
    ChunkReservation,
    Client,
    GpuArena,
    LayerwiseLoader,
    LayerwiseStorer,
    LoadResult,
    LookupResult,
    Namespace,
    PagedKvCache,
    PrefetchProgress,
    PrefetchTicket,
    Runtime,
    StoreResult,
    Stream,
)

__version__ = "0.1.0"

__all__ = [
    "Aborted",
    "AdminClient",
    "AlreadyExists",
    "Cancelled",
    "ChunkLease",
    "ChunkReservation",
    "Client",
    "DataLoss",
    "DeadlineExceeded",
    "Error",
    "FailedPrecondition",
    "GpuArena",
    "Internal",
    "InvalidArgument",
    "IoError",
    "LayerwiseLoader",
    "LayerwiseStorer",
    "LoadResult",
    "LookupResult",
    "Namespace",
    "NotFound",
    "OutOfRange",
    "PagedKvCache",
    "PermissionDenied",
    "PrefetchProgress",
    "PrefetchTicket",
    "ResourceExhausted",
    "Runtime",
    "StoreResult",
    "Stream",
    "Unavailable",
    "Unimplemented",
    "Unknown",
    "__version__",
]
