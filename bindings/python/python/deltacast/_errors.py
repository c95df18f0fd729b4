"""Exception classes, one per kind of core error.

They live in Python (not in the extension) so that a class can also derive from the builtin a
caller would naturally catch: ``InvalidArgumentError`` is a ``ValueError``, ``IoError`` is an
``OSError``. The native module raises them by name; every one derives from ``DeltacastError``.
"""

from __future__ import annotations

__all__ = [
    "DeltacastError",
    "LinkError",
    "AuthenticationError",
    "MalformedFrameError",
    "ChecksumError",
    "TruncatedError",
    "UnsupportedWireVersionError",
    "SlotTableMismatchError",
    "VersionMismatchError",
    "IncompleteSyncError",
    "FlushOrderError",
    "DigestMismatchError",
    "BaseDigestMismatchError",
    "InvalidArgumentError",
    "SlotMismatchError",
    "UnknownSlotError",
    "UnsupportedDTypeError",
    "SafetensorsError",
    "IoError",
    "CudaError",
    "NcclError",
    "IpcLinkError",
    "SyncTimeoutError",
    "ReceiverRefusedError",
]


class DeltacastError(Exception):
    """Base of every error raised by deltacast."""


class MalformedFrameError(DeltacastError):
    """A frame's bytes are not a valid frame (bad magic, bad manifest, bad section, unknown
    slot id or dtype). Nothing of its sync is applied."""


class ChecksumError(MalformedFrameError):
    """A frame's checksum does not match its bytes: it was corrupted on the way."""


class TruncatedError(MalformedFrameError):
    """A frame or file ends before the lengths it declares."""


class UnsupportedWireVersionError(MalformedFrameError):
    """The frame was written by a deltacast with another wire format version."""


class SlotTableMismatchError(DeltacastError):
    """The frame was built for another slot table (other names, dtypes or shapes).

    Attributes ``frame`` and ``local`` hold the two table hashes, spelt as ``SlotTable.hash``
    (16 hex digits)."""


class VersionMismatchError(DeltacastError):
    """A delta does not follow the receiver's version (a sync was lost or replayed): ask the
    sender for a seed. Attributes ``current``, ``got``, ``expected``."""


class IncompleteSyncError(DeltacastError):
    """A sync lacks part of what it must carry (a digest, seed elements), or a sharded sync
    could not send every frame."""


class FlushOrderError(DeltacastError):
    """A flush arrived out of order (one was lost or duplicated). Attributes ``version``,
    ``expected``, ``got``."""


class DigestMismatchError(DeltacastError):
    """After applying, the receiver's state digest differs from the sender's: the sync was
    refused and the weights are untouched. Attributes ``slot``, ``expected``, ``actual``."""


class BaseDigestMismatchError(DigestMismatchError):
    """The receiver's weights are not the state the delta starts from (they changed behind
    the receiver's back, or it holds another checkpoint): ask for a seed."""


class InvalidArgumentError(DeltacastError, ValueError):
    """An argument does not fit: wrong dtype, shape, layout, option value."""


class SlotMismatchError(InvalidArgumentError):
    """A buffer does not fit its slot (size, dtype, shape). Attribute ``slot``."""


class UnknownSlotError(InvalidArgumentError):
    """A slot name that the table does not hold."""


class UnsupportedDTypeError(InvalidArgumentError):
    """A dtype deltacast does not sync (only bf16, f16, f32, f8_e4m3 and f8_e5m2)."""


class SafetensorsError(DeltacastError):
    """A safetensors file could not be read or written."""


class IoError(DeltacastError, OSError):
    """A file could not be read or written."""


class CudaError(DeltacastError):
    """The GPU path failed: no driver or device, a driver call, a kernel compile, or this
    build has no GPU path."""


class NcclError(CudaError):
    """NCCL could not be loaded, or a collective failed (often: a peer rank died). The
    communicator is aborted; make a new one."""


class IpcLinkError(CudaError):
    """The CUDA-IPC link failed: a peer closed its connection (often: it died), or the link
    could not be set up. The link is aborted; make a new one."""


class LinkError(DeltacastError, ConnectionError):
    """A TCP frame link failed: the peer went away, broke the protocol, refused the
    connection, or sent more than the limits allow. The message names the peer."""


class AuthenticationError(LinkError):
    """The peer did not prove the shared secret (or we could not prove ours)."""


class SyncTimeoutError(DeltacastError, TimeoutError):
    """A sync did not complete in time (a peer is stuck or gone); the communicator was
    aborted, so no rank stays blocked."""


class ReceiverRefusedError(DeltacastError):
    """At least one receiver refused the sync (its digest or input checks failed; it applied
    nothing). The sender's next sync is a seed. Attribute ``receivers``."""
