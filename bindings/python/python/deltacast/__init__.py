"""deltacast: lossless delta sync of model weights from a trainer to inference engines.

A ``Sender`` (one process holding whole tensors) or a set of ``RankSender``s (one per trainer
rank, each holding shards) diffs the weights against what it last sent and emits frames that
carry only the elements whose bits changed. A ``Receiver`` applies them in place into the
arrays it holds, all or nothing, and proves with a state digest that its bits equal the
trainer's.

Arrays are numpy arrays or CPU torch tensors, read and written in place without copies;
bf16 travels as uint16 bits (``t.view(torch.uint16).numpy()``), fp8 as uint8. See
``deltacast.torch`` for models, and docs/python.md.
"""

from __future__ import annotations

from ._errors import (
    AuthenticationError,
    BaseDigestMismatchError,
    ChecksumError,
    DeltacastError,
    DigestMismatchError,
    FlushOrderError,
    IncompleteSyncError,
    InvalidArgumentError,
    IoError,
    CudaError,
    NcclError,
    IpcLinkError,
    LinkError,
    ReceiverRefusedError,
    SyncTimeoutError,
    MalformedFrameError,
    SafetensorsError,
    SlotMismatchError,
    SlotTableMismatchError,
    TruncatedError,
    UnknownSlotError,
    UnsupportedDTypeError,
    UnsupportedWireVersionError,
    VersionMismatchError,
)
from ._native import (
    DEFAULT_BUCKET_SIZE,
    DEFAULT_CHUNK_ELEMS,
    Converter,
    Layout,
    Param,
    RankSender,
    RankSyncResult,
    Receiver,
    Sender,
    Slot,
    SlotTable,
    SyncOutcome,
    SyncResult,
    frame_header,
    load_safetensors,
    read_sync_file,
    save_safetensors,
    write_sync_file,
)

__version__ = "0.1.0"

DTYPES = ("bf16", "f16", "f32", "f8_e4m3", "f8_e5m2")
"""The element types deltacast syncs (canonical names; torch names are accepted too)."""

__all__ = [
    "AuthenticationError",
    "LinkError",
    "DEFAULT_BUCKET_SIZE",
    "DEFAULT_CHUNK_ELEMS",
    "DTYPES",
    "BaseDigestMismatchError",
    "ChecksumError",
    "Converter",
    "DeltacastError",
    "DigestMismatchError",
    "FlushOrderError",
    "IncompleteSyncError",
    "InvalidArgumentError",
    "IoError",
    "CudaError",
    "NcclError",
    "IpcLinkError",
    "ReceiverRefusedError",
    "SyncTimeoutError",
    "Layout",
    "MalformedFrameError",
    "Param",
    "RankSender",
    "RankSyncResult",
    "Receiver",
    "SafetensorsError",
    "Sender",
    "Slot",
    "SlotMismatchError",
    "SlotTable",
    "SlotTableMismatchError",
    "SyncOutcome",
    "SyncResult",
    "TruncatedError",
    "UnknownSlotError",
    "UnsupportedDTypeError",
    "UnsupportedWireVersionError",
    "VersionMismatchError",
    "frame_header",
    "load_safetensors",
    "read_sync_file",
    "save_safetensors",
    "write_sync_file",
]
