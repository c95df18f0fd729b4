"""Type stubs of the extension module `deltacast._native` (re-exported by `deltacast`)."""

# ruff: noqa: E501

from collections.abc import Callable, Iterable, Mapping, Sequence
from os import PathLike
from typing import Any, Literal, Union, final

import numpy as np
import numpy.typing as npt

from .links import GatherLink

__all__ = [
    "Slot",
    "SlotTable",
    "Sender",
    "SyncResult",
    "Receiver",
    "SyncOutcome",
    "Converter",
    "Param",
    "Layout",
    "RankSender",
    "RankSyncResult",
    "load_safetensors",
    "save_safetensors",
    "read_sync_file",
    "write_sync_file",
    "frame_header",
    "DEFAULT_BUCKET_SIZE",
    "DEFAULT_CHUNK_ELEMS",
]

DEFAULT_BUCKET_SIZE: int
DEFAULT_CHUNK_ELEMS: int
DEFAULT_STAGE_BYTES: int  # the GPU sync's stage size (deltacast.cuda)
DEFAULT_CAPACITY: float  # the GPU senders' delta capacity (deltacast.cuda)

_Path = Union[str, PathLike[str]]
_DType = Union[str, Any]  # "bf16", "f16", "f32", "f8_e4m3", "f8_e5m2", torch names, a torch dtype
_Shape = Sequence[int]
# A numpy array (bf16 as uint16/int16 bits, fp8 as uint8) or a CPU torch tensor.
_ArrayLike = Union[npt.NDArray[Any], Any]
_Arrays = Union[Mapping[str, _ArrayLike], Sequence[_ArrayLike]]
_Frame = Union[bytes, bytearray, memoryview, npt.NDArray[np.uint8]]
_Kind = Literal["seed", "delta", "verify"]
_Slots = Union["SlotTable", Iterable[Union["Slot", tuple[str, _DType, _Shape]]]]

@final
class Slot:
    """One final tensor as the receiver names it."""

    def __new__(cls, name: str, dtype: _DType, shape: _Shape) -> Slot: ...
    @property
    def name(self) -> str: ...
    @property
    def dtype(self) -> str: ...
    @property
    def shape(self) -> tuple[int, ...]: ...
    @property
    def numel(self) -> int: ...
    @property
    def nbytes(self) -> int: ...

@final
class SlotTable:
    """The ordered slot table every side agrees on; its hash travels in every frame."""

    def __new__(cls, slots: Iterable[Union[Slot, tuple[str, _DType, _Shape]]]) -> SlotTable: ...
    @staticmethod
    def from_safetensors(path: _Path) -> SlotTable: ...
    @staticmethod
    def from_params(params: Sequence[Param]) -> SlotTable: ...
    @property
    def hash(self) -> str: ...  # 16 hex digits, as the CLI prints it
    @property
    def names(self) -> list[str]: ...
    @property
    def total_elements(self) -> int: ...
    @property
    def total_bytes(self) -> int: ...
    def index(self, name: str) -> int: ...
    def zeros(self) -> dict[str, npt.NDArray[Any]]: ...
    def __len__(self) -> int: ...
    def __contains__(self, name: str, /) -> bool: ...
    def __getitem__(self, key: Union[int, str], /) -> Slot: ...
    def __iter__(self) -> Any: ...
    def __eq__(self, other: object, /) -> bool: ...
    def __hash__(self) -> int: ...

@final
class SyncResult:
    """What one sync did on the sender, with its frames."""

    kind: _Kind
    version: int
    changed: int
    elements: int
    wire_bytes: int
    full_bytes: int
    flushes: int
    chunks: int
    codecs: dict[str, int]
    base_digest: int
    state_digest: int
    # bytes, or read-only uint8 arrays with frame_type="numpy"
    frames: list[Any]
    seconds: float
    rust_seconds: float
    @property
    def changed_ratio(self) -> float: ...

@final
class SyncOutcome:
    """What a completed sync did on the receiver."""

    kind: _Kind
    version: int
    flushes: int
    changed: int
    wire_bytes: int
    state_digest: int
    rust_seconds: float

@final
class Sender:
    """Trainer side for one process that holds whole slots. ``sync``/``seed`` take one array
    per slot in its own dtype, or float32 for a ``bf16`` slot (rounded on the fly) or an
    ``f8_e4m3`` slot ``X`` (block-quantized on the fly; its ``X_scale_inv`` slot takes
    ``None`` or is left out of the mapping)."""

    def __new__(
        cls,
        slots: _Slots,
        *,
        bucket_size: int = ...,
        chunk_elems: int = ...,
        codec: str = "auto",
        frame_type: Literal["bytes", "numpy"] = "bytes",
    ) -> Sender: ...
    def sync(self, arrays: _Arrays, *, sink: Callable[[Any], object] | None = None) -> SyncResult: ...
    def seed(self, arrays: _Arrays, *, sink: Callable[[Any], object] | None = None) -> SyncResult: ...
    def resend_seed(
        self, arrays: _Arrays | None = None, *, sink: Callable[[Any], object] | None = None
    ) -> SyncResult: ...
    def verify(self, *, sink: Callable[[Any], object] | None = None) -> SyncResult: ...
    def request_seed(self) -> None: ...
    @property
    def version(self) -> int: ...
    @property
    def state_digest(self) -> int: ...
    @property
    def digests(self) -> dict[str, int]: ...
    @property
    def table(self) -> SlotTable: ...

@final
class Receiver:
    """Applies syncs in place into the arrays it was given, all or nothing."""

    def __new__(
        cls,
        slots: _Slots,
        arrays: _Arrays,
        *,
        version: int | None = None,
        apply_as_received: bool = False,
        commit_on_demand: bool = False,
    ) -> Receiver: ...
    def receive(self, frame: _Frame) -> SyncOutcome | None: ...
    def recompute_digests(self) -> list[str]: ...
    def abort_sync(self) -> None: ...
    def commit(self) -> SyncOutcome: ...
    @property
    def awaits_commit(self) -> bool: ...
    @property
    def version(self) -> int | None: ...
    @property
    def state_digest(self) -> int: ...
    @property
    def digests(self) -> dict[str, int]: ...
    @property
    def is_staging(self) -> bool: ...
    @property
    def apply_as_received(self) -> bool: ...
    @property
    def table(self) -> SlotTable: ...
    @property
    def arrays(self) -> dict[str, npt.NDArray[Any]]: ...

@final
class ChangeReceiver:
    """Checks syncs for bits it does not hold (one member of a group), hands out the changes."""

    def __new__(cls, slots: _Slots) -> ChangeReceiver: ...
    def receive(
        self,
        frame: _Frame,
        read: Callable[[list[tuple[str, npt.NDArray[np.int64]]]], tuple[Any, Any]],
    ) -> bool: ...
    def settle(self, sums: Sequence[int]) -> None: ...
    def changes(
        self,
    ) -> list[
        tuple[str, npt.NDArray[np.int64], npt.NDArray[np.uint8], npt.NDArray[np.uint8]]
    ]: ...
    def commit(self) -> SyncOutcome: ...
    def abort_sync(self) -> None: ...
    def lose(self) -> None: ...
    @property
    def part(self) -> list[int] | None: ...
    @property
    def version(self) -> int | None: ...
    @property
    def is_staging(self) -> bool: ...
    @property
    def awaits_group(self) -> bool: ...
    @property
    def awaits_commit(self) -> bool: ...
    @property
    def state_digest(self) -> int: ...
    @property
    def digests(self) -> dict[str, int]: ...
    @property
    def table(self) -> SlotTable: ...

@final
class FrameServer:
    """A sender's end of the authenticated TCP frame link."""

    def __new__(
        cls,
        address: str = "127.0.0.1:0",
        *,
        secret: str | bytes | None = None,
        timeout_s: float = 60.0,
        max_frame: int | None = None,
    ) -> FrameServer: ...
    @property
    def address(self) -> str: ...
    @property
    def authenticated(self) -> bool: ...
    def wait_for_receivers(self, n: int, timeout_s: float | None = None) -> list[int]: ...
    def receivers(self) -> list[dict[str, Any]]: ...
    def broadcast(self, frame: _Frame) -> list[int]: ...
    def send_to(self, receiver_id: int, frame: _Frame) -> None: ...
    def collect_acks(self) -> list[dict[str, Any]]: ...
    def disconnect(self, receiver_id: int, reason: str) -> None: ...
    def close(self, reason: str = "closed") -> None: ...

class FrameClient:
    """A receiver's end of the authenticated TCP frame link."""

    def __new__(
        cls,
        address: str,
        *,
        secret: str | bytes | None = None,
        version: int | None = None,
        state_digest: int = 0,
        timeout_s: float = 60.0,
        idle_timeout_s: float | None = None,
        max_frame: int | None = None,
    ) -> FrameClient: ...
    @property
    def server(self) -> str: ...
    def recv_frame(self) -> bytes: ...
    def send_ack(
        self, version: int, state_digest: int, ok: bool = True, message: str = ""
    ) -> None: ...
    def close(self, reason: str = "closed") -> None: ...

def generate_token() -> str: ...

class Converter:
    """How one trainer parameter maps to receiver slots."""

    @staticmethod
    def identity(slot: str) -> Converter: ...
    @staticmethod
    def fused_qkv(q: str, k: str, v: str, sizes: Sequence[int]) -> Converter: ...
    @staticmethod
    def fused_experts(gate: str, up: str) -> Converter: ...
    @staticmethod
    def split(dim: int, pieces: Sequence[tuple[str, int]], *, stacked: bool = False) -> Converter: ...

@final
class Param:
    """A trainer parameter: name, dtype, full shape, and its slots."""

    def __new__(
        cls, name: str, dtype: _DType, shape: _Shape, convert: str | Converter | None = None
    ) -> Param: ...
    @property
    def name(self) -> str: ...
    @property
    def dtype(self) -> str: ...
    @property
    def shape(self) -> tuple[int, ...]: ...
    @property
    def slots(self) -> list[Slot]: ...

# "S(0)", "Shard(dim=0)", "_S(0, 2)", "R", "Replicate()", "P", or ("S", 0), ("_S", 0, 2), ("R",)
_Placement = Union[str, tuple[Any, ...], Any]

@final
class Layout:
    """A DTensor's layout seen from one rank, as plain data."""

    def __new__(
        cls,
        mesh_shape: _Shape,
        coords: _Shape | None,
        placements: Sequence[_Placement],
        global_shape: _Shape,
    ) -> Layout: ...
    @staticmethod
    def replicated(world: int, rank: int, global_shape: _Shape) -> Layout: ...
    @property
    def mesh_shape(self) -> list[int]: ...
    @property
    def coords(self) -> list[int]: ...
    @property
    def global_shape(self) -> list[int]: ...
    @property
    def placements(self) -> list[str]: ...
    @property
    def local_shape(self) -> list[int]: ...
    @property
    def offset(self) -> list[int]: ...
    @property
    def global_ranges(self) -> list[tuple[int, int]]: ...
    @property
    def is_replica(self) -> bool: ...

@final
class RankSyncResult:
    """What one sharded sync did, seen from one rank."""

    kind: _Kind
    version: int
    rank: int
    is_leader: bool
    local_changed: int
    changed: int
    elements: int
    wire_bytes: int
    flushes: int
    chunks: int
    codecs: dict[str, int]
    state_digest: int
    gathered_bytes: int
    payload_bytes: int
    matrix_bytes: int
    rounds: int
    sub_rounds: int
    frames: list[Any]
    seconds: float
    rust_seconds: float
    @property
    def changed_ratio(self) -> float: ...

@final
class RankSender:
    """One trainer rank's sender over a gather link; rank 0 emits the frames."""

    def __new__(
        cls,
        params: Sequence[Param],
        layouts: Sequence[Layout | None] | Mapping[str, Layout | None] | None = None,
        link: GatherLink | None = None,
        *,
        bucket_size: int = ...,
        chunk_elems: int = ...,
        codec: str = "auto",
        round_bytes: int | None = None,
        frame_type: Literal["bytes", "numpy"] = "bytes",
    ) -> RankSender: ...
    def sync(self, local: _Arrays, *, sink: Callable[[Any], object] | None = None) -> RankSyncResult: ...
    def request_seed(self) -> None: ...
    @property
    def version(self) -> int: ...
    @property
    def state_digest(self) -> int: ...
    @property
    def digests(self) -> dict[str, int]: ...
    @property
    def rank(self) -> int: ...
    @property
    def world(self) -> int: ...
    @property
    def table(self) -> SlotTable: ...
    @property
    def local_shapes(self) -> dict[str, list[int]]: ...

def load_safetensors(path: _Path) -> dict[str, npt.NDArray[Any]]: ...
def save_safetensors(path: _Path, arrays: _Arrays, slots: _Slots | None = None) -> None: ...
def read_sync_file(path: _Path) -> list[bytes]: ...
def write_sync_file(path: _Path, frames: Iterable[_Frame]) -> None: ...
def frame_header(frame: _Frame) -> dict[str, Any]: ...

# The GPU sync (deltacast.cuda wraps these with torch tensors).
_TensorSpec = tuple[str, int, str, list[int]]  # (name, data_ptr, dtype name, shape)

def cuda_available() -> tuple[bool, str]: ...
def nccl_unique_id() -> bytes: ...

class NcclComm:
    def __new__(cls, unique_id: bytes, nranks: int, rank: int, device: int) -> NcclComm: ...
    @property
    def rank(self) -> int: ...
    @property
    def nranks(self) -> int: ...
    @property
    def device(self) -> int: ...

class IpcComm:
    def __new__(
        cls,
        address: str,
        nranks: int,
        rank: int,
        device: int,
        timeout_s: float = 300.0,
        slots: int = 4,
        slot_bytes: int = ...,
        *,
        secret: str | bytes | None = None,
        secret_file: str | PathLike[str] | None = None,
    ) -> IpcComm: ...
    @staticmethod
    def generate_secret() -> str: ...
    @property
    def refused(self) -> list[str]: ...
    @property
    def rank(self) -> int: ...
    @property
    def nranks(self) -> int: ...
    @property
    def device(self) -> int: ...

class FrameFeed:
    def __new__(cls, device: int) -> FrameFeed: ...
    def push(self, frame: _Frame) -> None: ...
    def clear(self) -> None: ...
    @property
    def pending_bytes(self) -> int: ...
    @property
    def device(self) -> int: ...

class NativeGpuSender:
    def __new__(
        cls,
        comm: NcclComm | IpcComm,
        tensors: Sequence[_TensorSpec],
        snapshots: Sequence[int] | None = None,
        root: int = 0,
        chunk_elems: int = ...,
        capacity: float = ...,
        timeout_s: float = 300.0,
        snapshot: str = "device",
        entropy: str = "auto",
        stage_bytes: int = ...,
        sources: Sequence[str] | None = None,
        bf16_nan: int | None = None,
    ) -> NativeGpuSender: ...
    def seed(self, stream: int) -> dict[str, Any]: ...
    def sync(self, stream: int) -> dict[str, Any]: ...
    def close(self) -> None: ...
    def request_seed(self) -> None: ...
    @property
    def version(self) -> int: ...
    @property
    def state_digest(self) -> int: ...
    @property
    def digests(self) -> dict[str, int]: ...
    @property
    def staging_bytes(self) -> int: ...
    @property
    def host_bytes(self) -> int: ...
    @property
    def bf16_nan(self) -> int: ...

def decline_sharded(trainers: NcclComm | IpcComm, why: str, timeout_s: float = 300.0) -> None: ...

class NativeGpuShardedSender:
    def __new__(
        cls,
        trainers: NcclComm | IpcComm,
        receivers: NcclComm | IpcComm | None,
        shards: Sequence[tuple[str, int, str, Sequence[int], int, int]],
        root: int = 0,
        chunk_elems: int = ...,
        capacity: float = ...,
        timeout_s: float = 300.0,
        snapshot: str = "device",
        entropy: str = "auto",
        stage_bytes: int = ...,
    ) -> NativeGpuShardedSender: ...
    def seed(self, stream: int) -> dict[str, Any]: ...
    def sync(self, stream: int) -> dict[str, Any]: ...
    def close(self) -> None: ...
    def request_seed(self) -> None: ...
    @property
    def version(self) -> int: ...
    @property
    def state_digest(self) -> int: ...
    @property
    def digests(self) -> dict[str, int]: ...

class Fp8Quantizer:
    """fp32 CUDA tensors quantized to block FP8 by deltacast's kernel: each job
    ``(src, dst, scales, shape)`` by device pointer (fp32 in, E4M3FN bytes and one fp32 scale
    per 128x128 block out)."""

    def __new__(cls, device: int, jobs: Sequence[tuple[int, int, int, Sequence[int]]]) -> Fp8Quantizer: ...
    def run(self, stream: int) -> None: ...
    @property
    def blocks(self) -> int: ...

class NativeGpuReceiver:
    def __new__(
        cls,
        comm: NcclComm | IpcComm | FrameFeed,
        tensors: Sequence[_TensorSpec],
        root: int = 0,
        timeout_s: float = 300.0,
    ) -> NativeGpuReceiver: ...
    def receive(self, stream: int, idle_timeout_s: float | None = None) -> dict[str, Any] | None: ...
    def verify(self) -> None: ...
    def set_commit_on_demand(self, on: bool) -> None: ...
    @property
    def commits_on_demand(self) -> bool: ...
    @property
    def awaits_commit(self) -> bool: ...
    def commit(self, stream: int) -> dict[str, Any]: ...
    def abort_sync(self) -> None: ...
    @property
    def version(self) -> int | None: ...
    @property
    def digests(self) -> list[int]: ...
    @property
    def staging_bytes(self) -> int: ...
