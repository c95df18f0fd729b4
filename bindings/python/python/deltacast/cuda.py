"""The GPU sync: CUDA tensors on the trainer, NCCL (or CUDA IPC) to the receivers, no host
copies.

The trainer's rank makes a ``GpuSender`` over its (contiguous, CUDA) tensors; each rollout
process makes a ``GpuReceiver`` over the tensors it serves from, e.g. an HF model's
parameters. Every ``sender.sync()`` diffs the tensors against a snapshot on the GPU (or, with
``snapshot="pinned"``, in pinned host memory the GPU reads over PCIe), sends the
changed elements (or everything, when that is smaller) with NCCL broadcasts, and returns once
every receiver has applied the sync, checked its digest and acked. A receiver applies nothing
unless the digests it computes equal the trainer's.

Tensors are borrowed by ``data_ptr()``: keep them alive and do not reallocate them (in-place
updates such as ``p.copy_(...)`` or an optimizer step are fine). Work is ordered after
torch's current stream, and finished when the call returns.

    uid = deltacast.cuda.nccl_unique_id() if rank == 0 else None   # share it, e.g.
    # via torch.distributed's store or broadcast_object_list
    comm = deltacast.cuda.NcclComm(uid, nranks, rank, device)
    sender = deltacast.cuda.GpuSender(comm, model.named_parameters(), device=device)
    sender.seed()
    ... optimizer.step(); sender.sync()

Where NCCL cannot run, e.g. the trainer and a rollout engine on one GPU (NCCL refuses two
ranks on one device), an ``IpcComm`` takes the place of the ``NcclComm``: the processes of one
machine, rank 0 (the sender) listening on a loopback port, the bytes passing through staging
buffers on its GPU that the others map by CUDA IPC. Whoever holds those IPC handles can read
the weights, so every rank first proves it holds a shared secret (the HMAC handshake of the
TCP links): rank 0 makes one and hands it to the others the way it hands out the address
(or set ``DELTACAST_SECRET``, or pass ``secret_file=``):

    if rank == 0:
        store.set("deltacast_ipc_secret", deltacast.cuda.IpcComm.generate_secret())
    secret = store.get("deltacast_ipc_secret").decode()
    comm = deltacast.cuda.IpcComm("127.0.0.1:29512", nranks, rank, device, secret=secret)
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping, Optional, Sequence, Tuple, Union

from . import _native
from ._native import FrameFeed, IpcComm, NcclComm

__all__ = [
    "available",
    "nccl_unique_id",
    "NcclComm",
    "IpcComm",
    "FrameFeed",
    "GpuSender",
    "GpuShardedSender",
    "GpuReceiver",
    "dim0_shard",
    "dtensor_shards",
    "DEFAULT_STAGE_BYTES",
    "DEFAULT_CAPACITY",
]

#: Default ``GpuSender(stage_bytes=...)``: 2 GiB (a 7B model in BF16 goes in 7 stages).
DEFAULT_STAGE_BYTES: int = _native.DEFAULT_STAGE_BYTES

#: Default ``capacity`` of both senders: deltas of up to 30 % of a stage's elements; more goes
#: dense. The delta buffers take about 3.6 bytes per BF16 element of the largest stage per
#: buffer set (two with several stages; 2.4 with ``entropy="off"``).
DEFAULT_CAPACITY: float = _native.DEFAULT_CAPACITY

_DTYPES = {
    "torch.bfloat16": "BF16",
    "torch.float16": "F16",
    "torch.float32": "F32",
    "torch.float8_e4m3fn": "F8_E4M3",
    "torch.float8_e5m2": "F8_E5M2",
}


def available() -> Tuple[bool, str]:
    """``(True, description)`` when the GPU sync can run here, else ``(False, why)``."""
    return _native.cuda_available()


def nccl_unique_id() -> bytes:
    """A fresh NCCL unique id (128 bytes) for ``NcclComm``; make it on one rank only."""
    return _native.nccl_unique_id()


def _specs(named: Iterable[Tuple[str, Any]], device: int) -> Tuple[list, list]:
    """(name, data_ptr, dtype, shape) tuples, and the tensors (kept referenced)."""
    specs, kept = [], []
    for name, t in named:
        if t.device.type != "cuda" or (t.device.index or 0) != device:
            raise _errors().InvalidArgumentError(
                f"tensor {name!r} is on {t.device}, the sync runs on cuda:{device}"
            )
        if not t.is_contiguous():
            raise _errors().InvalidArgumentError(f"tensor {name!r} is not contiguous")
        dtype = _DTYPES.get(str(t.dtype))
        if dtype is None:
            raise _errors().UnsupportedDTypeError(f"tensor {name!r} has dtype {t.dtype}")
        specs.append((name, int(t.data_ptr()), dtype, [int(d) for d in t.shape]))
        kept.append(t)
    return specs, kept


def _errors():
    from . import _errors

    return _errors


def _stream(device: int) -> int:
    import torch

    return int(torch.cuda.current_stream(device).cuda_stream)


def _check_options(entropy: Union[bool, str], snapshot: str, stage_bytes: int) -> str:
    """Checks the senders' common options; returns ``entropy`` as "on", "off" or "auto"."""
    entropy = {True: "on", False: "off"}.get(entropy, entropy)
    if entropy not in ("on", "off", "auto"):
        raise _errors().InvalidArgumentError(
            f'entropy={entropy!r}: True/"on", False/"off" or "auto"'
        )
    if snapshot not in ("device", "pinned"):
        raise _errors().InvalidArgumentError(
            f'snapshot={snapshot!r}: "device" or "pinned" (pinned host memory)'
        )
    if isinstance(stage_bytes, bool) or not isinstance(stage_bytes, int) or not (
        0 <= stage_bytes < 1 << 64
    ):
        raise _errors().InvalidArgumentError(
            f"stage_bytes={stage_bytes!r}: a whole number of bytes, 0 for one stage"
        )
    return entropy


class _Sender:
    """What both senders offer over their native object (``self._native``, on CUDA device
    ``self.device``). A sharded sender's calls are collective over the trainer ranks, its
    ``close`` the leader's alone, and its ``digests`` the whole tensors' (the same on every
    rank)."""

    def seed(self) -> dict:
        """Sends every tensor whole; returns metrics once every receiver acked."""
        return self._native.seed(_stream(self.device))

    def sync(self) -> dict:
        """Sends what changed since the last sync (a seed when one is due): a dict with
        ``kind`` ('delta', 'dense' or 'seed'), ``version``, ``changed``, ``numel``,
        ``changed_ratio``, ``payload_bytes``, ``chunks``, ``time_ms``, ``diff_ms``."""
        return self._native.sync(_stream(self.device))

    def close(self) -> None:
        """Tells the receivers no sync follows (their ``receive()`` returns ``None``)."""
        self._native.close()

    def request_seed(self) -> None:
        """Makes the next ``sync()`` a seed (a receiver joined late or asked for one; on a
        sharded sender the leader's request, or any rank's, wins)."""
        self._native.request_seed()

    @property
    def version(self) -> int:
        """The version of the last sync that went out whole (0 before the first)."""
        return self._native.version

    @property
    def state_digest(self) -> int:
        """The combined digest receivers must ack."""
        return self._native.state_digest

    @property
    def digests(self) -> dict:
        """Per-tensor digests of that version, by name."""
        return self._native.digests


class GpuSender(_Sender):
    """The trainer side. ``named_tensors``: ``(name, tensor)`` pairs (``named_parameters()``
    works; parameters are read through ``.data``). ``snapshots``: optional tensors of the
    same shapes and dtypes to hold the previous version (else allocated inside).
    ``capacity``: the fraction of all elements the delta buffers hold (their memory); a stage
    changing more goes whole. Within it each stage goes whole, as a plain delta or
    entropy-coded by its predicted time on the link (each report's ``"choice"``: the rates
    learned and the changed fraction above which stages go whole).
    ``snapshot``: where the snapshot allocated inside lives: ``"device"`` (GPU memory, as
    much again as the tensors) or ``"pinned"`` (page-locked host memory that the diff reads
    over PCIe and refreshes in place: no GPU memory for it, a diff about as long as copying
    the tensors host-to-device once); not with ``snapshots``.
    ``entropy``: whether deltas also use the entropy codecs (gaps positions, ulp values:
    about 1.2 bytes per change on AdamW steps instead of about 6, for some GPU time on both
    sides): ``True``/``"on"``, ``False``/``"off"``, or ``"auto"`` (default: the codecs the
    sender's cost model predicts faster on this link, the other retried every 16 deltas
    while it is predicted within 1.25×; on NVLink or CUDA IPC that is usually off, across
    nodes on). Each report says ``"entropy"``: whether
    that sync used them.
    ``stage_bytes``: a sync goes in stages of whole tensors of at least this many bytes
    (default 2 GiB; 0: one stage): receivers check and apply one stage while the sender
    diffs the next, and a stage that fails undoes the ones before it. Reports say
    ``"stages"`` and ``"dense_stages"`` (stages sent whole).

    ``wire_dtypes``: float32 tensors to sync as bfloat16 slots, rounded on the fly as the
    diff reads them (no converted copy): ``torch.bfloat16`` (or ``"BF16"``) for every float32
    tensor, or a dict of tensor name to dtype for some. Receivers hold bfloat16 for those
    slots. The rounding is torch's round-to-nearest-even (subnormals kept, past the largest
    bfloat16 to ±Inf); every NaN becomes ``bf16_nan`` (default ``0xFFFF``, what torch's
    contiguous CPU ``.to(torch.bfloat16)`` gives, as the CPU ``Sender``; torch's scalar path
    gives ``0x7FC0``). Lent ``snapshots`` are then bfloat16; not with ``snapshot="pinned"``.
    A float32 tensor ``X`` of two or more dimensions may also go as block FP8
    (``torch.float8_e4m3fn`` or ``"F8_E4M3"`` in the dict): each sync first quantizes it on
    the GPU, in 128x128 blocks of its last two dimensions, into an FP8 buffer and a float32
    scale buffer held here (a quarter and 1/16384 of the tensor's bytes), exactly as the CPU
    ``Sender`` and vLLM's ``per_block_cast_to_fp8`` do (docs/python.md), and syncs them as
    the slots ``X`` (FP8) and ``X_scale_inv`` (float32, right after it): the receivers hold
    an FP8 weight and its ``weight_scale_inv``, as vLLM and SGLang load them. Not with lent
    ``snapshots``. (Not yet run on a GPU: tests/test_cuda_fp8.py is its check.)
    Any other pair of dtypes raises ``UnsupportedDTypeError`` (its ``slot`` names the tensor).

    After every ``seed()`` / ``sync()``, refused ones included, the snapshot holds exactly the
    tensors' bits at the time of the call (rounded, for converted tensors), so code that lends
    ``snapshots`` can read the previous version from them before the next sync.
    """

    def __init__(
        self,
        comm: Union[NcclComm, IpcComm],
        named_tensors: Iterable[Tuple[str, Any]],
        device: Optional[int] = None,
        root: int = 0,
        snapshots: Optional[Sequence[Any]] = None,
        chunk_elems: int = _native.DEFAULT_CHUNK_ELEMS,
        capacity: float = _native.DEFAULT_CAPACITY,
        timeout_s: float = 300.0,
        snapshot: str = "device",
        entropy: Union[bool, str] = "auto",
        stage_bytes: int = _native.DEFAULT_STAGE_BYTES,
        wire_dtypes: Union[None, Any, Mapping[str, Any]] = None,
        bf16_nan: Optional[int] = None,
    ):
        entropy = _check_options(entropy, snapshot, stage_bytes)
        if bf16_nan is not None and (
            isinstance(bf16_nan, bool) or not isinstance(bf16_nan, int)
            or not 0 <= bf16_nan <= 0xFFFF
        ):
            raise _errors().InvalidArgumentError(f"bf16_nan={bf16_nan!r}: bf16 bits, 0..=0xFFFF")
        if snapshot == "pinned" and snapshots is not None:
            raise _errors().InvalidArgumentError(
                'snapshot="pinned" allocates the snapshot in host memory: lend no snapshots'
            )
        self.device = comm.device if device is None else int(device)
        named = [(n, getattr(t, "data", t)) for n, t in named_tensors]
        named, self._fp8 = _fp8_exports(named, wire_dtypes, self.device)
        if self._fp8 is not None and snapshots is not None:
            raise _errors().InvalidArgumentError(
                "FP8 wire dtypes quantize into buffers held here: lend no snapshots"
            )
        specs, self._tensors = _specs(named, self.device)
        # Each slot's dtype on the wire; the specs keep the tensors' own as their sources.
        sources = [d for _, _, d, _ in specs]
        specs = [(n, p, _wire_dtype(wire_dtypes, n, d), s) for n, p, d, s in specs]
        snap_ptrs = None
        self._snapshots = None
        if snapshots is not None:
            snaps = list(snapshots)
            if len(snaps) != len(named):
                raise _errors().InvalidArgumentError(
                    f"{len(snaps)} snapshots for {len(named)} tensors"
                )
            snap_specs, self._snapshots = _specs(
                [(n, s) for (n, _), s in zip(named, snaps)], self.device
            )
            for (n, _, d, shape), (_, _, sd, sshape) in zip(specs, snap_specs):
                if (d, shape) != (sd, sshape):
                    raise _errors().InvalidArgumentError(
                        f"snapshot of {n!r} is {sd}{sshape}, the slot {d}{shape}"
                    )
            snap_ptrs = [p for _, p, _, _ in snap_specs]
        self._native = _native.NativeGpuSender(
            comm, specs, snap_ptrs, root, chunk_elems, capacity, timeout_s, snapshot,
            entropy, int(stage_bytes), sources, bf16_nan,
        )

    def seed(self) -> dict:
        self._quantize()
        return super().seed()

    def sync(self) -> dict:
        self._quantize()
        return super().sync()

    def _quantize(self) -> None:
        """The FP8 tensors' new bits and scales, on torch's current stream before the sync."""
        if self._fp8 is not None:
            self._fp8[0].run(_stream(self.device))

    @property
    def staging_bytes(self) -> int:
        """Device bytes held besides the tensors: the snapshot when allocated here on the
        device, the delta buffers (``capacity``), the bitmap scratch, the packed positions
        (and the buffers of FP8 wire dtypes)."""
        held = [] if self._fp8 is None else self._fp8[1][1::3] + self._fp8[1][2::3]
        return self._native.staging_bytes + sum(t.numel() * t.element_size() for t in held)

    @property
    def host_bytes(self) -> int:
        """Pinned host bytes held: the snapshot with ``snapshot="pinned"``, else 0."""
        return self._native.host_bytes

    @property
    def bf16_nan(self) -> int:
        """The bf16 bits every NaN of a float32 tensor synced as bfloat16 becomes."""
        return self._native.bf16_nan


def _fp8_exports(named: list, wire_dtypes: Any, device: int) -> Tuple[list, Optional[tuple]]:
    """``named`` with each float32 tensor whose wire dtype is F8_E4M3 replaced by an FP8 buffer
    and its scale buffer (``X``, ``X_scale_inv``), and (the quantizer that fills them, the
    tensors it reads and writes: source, FP8, scales per tensor), or None when there is none."""
    import torch

    if wire_dtypes is not None and not isinstance(wire_dtypes, Mapping):
        if _dtype_name(wire_dtypes) == "F8_E4M3":
            raise _errors().InvalidArgumentError(
                "block FP8 is chosen per tensor (its projections, not its norms): pass "
                "wire_dtypes as a dict of tensor name to dtype"
            )
    out, jobs, held = [], [], []
    for name, t in named:
        own = _DTYPES.get(str(t.dtype))
        if own != "F32" or _wire_dtype(wire_dtypes, name, own) != "F8_E4M3":
            out.append((name, t))
            continue
        if t.dim() < 2:
            raise _errors().UnsupportedDTypeError(
                f"tensor {name!r}: block FP8 quantizes tensors of two or more dimensions"
            )
        if not t.is_contiguous() or t.device.type != "cuda" or (t.device.index or 0) != device:
            raise _errors().InvalidArgumentError(
                f"tensor {name!r}: contiguous and on cuda:{device}, to quantize it to FP8"
            )
        *lead, rows, cols = t.shape
        q = torch.empty(t.shape, dtype=torch.float8_e4m3fn, device=t.device)
        s = torch.empty((*lead, -(-rows // 128), -(-cols // 128)), dtype=torch.float32, device=t.device)
        out += [(name, q), (name + "_scale_inv", s)]
        jobs.append((int(t.data_ptr()), int(q.data_ptr()), int(s.data_ptr()), [int(d) for d in t.shape]))
        held += [t, q, s]
    if not jobs:
        return out, None
    quantizer = _native.Fp8Quantizer(device, jobs)
    quantizer.run(_stream(device))  # the buffers hold real bits from the start
    return out, (quantizer, held)


def _dtype_name(dtype: Any) -> str:
    """A torch dtype (or a deltacast dtype name) as the native side names it."""
    if isinstance(dtype, str):
        return dtype
    name = _DTYPES.get(str(dtype))
    if name is None:
        raise _errors().UnsupportedDTypeError(f"dtype {dtype} cannot be synced")
    return name


def _wire_dtype(wire_dtypes: Any, name: str, own: str) -> str:
    """The slot dtype of tensor ``name`` (own dtype ``own``) under ``wire_dtypes``: a mapping
    by name, one dtype for every float32 tensor, or None (every tensor as it is)."""
    if wire_dtypes is None:
        return own
    if isinstance(wire_dtypes, Mapping):
        return _dtype_name(wire_dtypes[name]) if name in wire_dtypes else own
    return _dtype_name(wire_dtypes) if own == "F32" else own


def dim0_shard(rows: int, rank: int, world: int) -> Tuple[int, int]:
    """``(first_row, rows)`` of ``rank``'s dim-0 shard of a tensor with ``rows`` rows, cut as
    ``torch.chunk`` (and FSDP2's ``Shard(0)``) cut it: ``ceil(rows / world)`` rows per rank,
    fewer or none for the last ones."""
    if world < 1 or not 0 <= rank < world or rows < 0:
        raise _errors().InvalidArgumentError(f"rank {rank} of {world}, {rows} rows")
    per = -(-rows // world)
    first = min(rank * per, rows)
    return first, min(per, rows - first)


def dtensor_shards(named_tensors: Iterable[Tuple[str, Any]], rank: Optional[int] = None) -> list:
    """``(name, local_tensor, full_shape, first_index)`` for ``GpuShardedSender`` from a
    model's ``named_parameters()`` under FSDP2 (``fully_shard``), HSDP or other DTensor
    meshes: each rank's block comes from the core's placement engine (torch's own chunking
    rule, every mesh dimension). A block must be one contiguous run of the flattened tensor —
    ``Shard(0)`` on any number of mesh dimensions, with ``Replicate()`` dimensions (HSDP) whose
    replicas send nothing; a block that is several runs (a ``Shard(1)`` of a matrix, a TP
    slice under FSDP) is refused with its name, as the GPU sharded sender takes one run per rank
    and tensor, and the ranks' runs of a tensor must follow each other in the trainers'
    rank order (the sender checks that on every rank alike). Plain tensors count as
    replicated: the trainer rank ``rank`` (pass the trainers' ``NcclComm.rank``; default: the
    torch.distributed rank) sends them when it is 0. Call it while FSDP2 holds its parameters
    sharded (not inside an unsharded forward)."""
    from .torch import layout_of

    out = []
    for name, t in named_tensors:
        t = getattr(t, "data", t)
        full = [int(d) for d in t.shape]
        layout = layout_of(t)
        if layout is None:
            local = t
            me = _default_rank() if rank is None else rank
            replica, shape, first = me != 0, full, 0
        else:
            local = t.to_local()
            replica, shape = layout.is_replica, layout.local_shape
            runs = layout.global_ranges
            if len(runs) > 1:
                raise _errors().InvalidArgumentError(
                    f"{name!r}: its block (offset {layout.offset}, shape {shape}) of {full} is "
                    f"not one run of the flattened tensor but {len(runs)}; the GPU sharded "
                    "sender takes one run per rank (Shard(0) and Replicate() meshes)"
                )
            first = runs[0][0] if runs else 0
        if [int(d) for d in local.shape] != list(shape):
            raise _errors().InvalidArgumentError(
                f"{name!r}: a local tensor of shape {list(local.shape)}, "
                f"{list(shape)} expected from its placements"
            )
        # A view, never a copy: the sender must read the tensor the optimizer updates.
        if not local.is_contiguous():
            raise _errors().InvalidArgumentError(f"tensor {name!r} is not contiguous")
        flat = local.reshape(-1)
        out.append((name, flat[:0] if replica else flat, full, 0 if replica else first))
    return out


def _default_rank() -> int:
    import torch.distributed as dist

    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


class GpuShardedSender(_Sender):
    """One trainer rank of a sharded model (e.g. FSDP2): each rank diffs only its own shards;
    the leader (trainer rank 0) gathers exactly the encoded changes of every rank over
    ``trainers`` (an ``NcclComm`` of the trainer ranks, or an ``IpcComm`` when they share a
    machine, e.g. several ranks on one GPU: its gathers then pass through host memory) and
    sends each sync to the receivers over ``receivers`` (its ``NcclComm`` or ``IpcComm`` with
    them, in which it is ``root``; ``None`` on the other ranks). Receivers are plain
    ``GpuReceiver``s over the whole tensors.

    ``shards``: ``(name, local_tensor, full_shape, first_index)`` per tensor, in the same
    order on every rank; ``local_tensor`` holds elements ``first_index ..`` of the flattened
    whole tensor, and the ranks' shards of a tensor must follow each other in rank order and
    cover it exactly (``dtensor_shards(model.named_parameters())`` makes them under FSDP2).
    The other options are ``GpuSender``'s. Every call is collective over the trainer ranks:
    every rank calls ``seed()`` / ``sync()`` after each optimizer step. The leader returns once
    every receiver applied and acked (a refusal raises ``ReceiverRefusedError`` there); the
    other ranks return as soon as the leader holds their part, so they can go on training
    while it sends, and learn the outcome at their next call (after a refusal, every rank's
    next call is a seed).
    """

    def __init__(
        self,
        trainers: Union[NcclComm, IpcComm],
        receivers: Optional[Union[NcclComm, IpcComm]],
        shards: Iterable[Tuple[str, Any, Sequence[int], int]],
        device: Optional[int] = None,
        root: int = 0,
        chunk_elems: int = _native.DEFAULT_CHUNK_ELEMS,
        capacity: float = _native.DEFAULT_CAPACITY,
        timeout_s: float = 300.0,
        snapshot: str = "device",
        entropy: Union[bool, str] = "auto",
        stage_bytes: int = _native.DEFAULT_STAGE_BYTES,
    ):
        try:
            entropy = _check_options(entropy, snapshot, stage_bytes)
            self.device = trainers.device if device is None else int(device)
            shards = list(shards)
            specs, self._tensors = _specs([(n, t) for n, t, _, _ in shards], self.device)
            native_shards = []
            for (name, ptr, dtype, _), (_, t, full, first) in zip(specs, shards):
                native_shards.append(
                    (name, ptr, dtype, [int(d) for d in full], int(first), int(t.numel()))
                )
        except Exception as e:
            # The constructor is collective: take part as a refusal, so that the other
            # trainer ranks fail at once instead of waiting out their timeout.
            if isinstance(trainers, (NcclComm, IpcComm)):
                _native.decline_sharded(trainers, f"{type(e).__name__}: {e}", timeout_s)
            raise
        self._native = _native.NativeGpuShardedSender(
            trainers, receivers, native_shards, root, chunk_elems, capacity, timeout_s,
            snapshot, entropy, int(stage_bytes),
        )


class GpuReceiver:
    """The receiving side: applies each sync in place into ``named_tensors`` (e.g. a model's
    ``named_parameters()``), all or nothing, after checking the trainer's digests. No copy of
    the model is made; a delta needs only buffers of its own size.

    ``comm``: the link to the sender (``NcclComm``, ``IpcComm``), or a ``FrameFeed`` when the
    syncs arrive as frames on the host (a CPU ``Sender``, a socket, a sync file): push a sync's
    frames into the feed, then ``receive()`` decodes and applies it on the GPU."""

    def __init__(
        self,
        comm: Union[NcclComm, IpcComm, FrameFeed],
        named_tensors: Iterable[Tuple[str, Any]],
        device: Optional[int] = None,
        root: int = 0,
        timeout_s: float = 300.0,
        commit_on_demand: bool = False,
    ):
        self.device = comm.device if device is None else int(device)
        named = [(n, getattr(t, "data", t)) for n, t in named_tensors]
        specs, self._tensors = _specs(named, self.device)
        self._names = [name for name, _ in named]
        self._native = _native.NativeGpuReceiver(comm, specs, root, timeout_s)
        self._native.set_commit_on_demand(bool(commit_on_demand))

    @property
    def commit_on_demand(self) -> bool:
        """Stage, then commit: with this on, ``receive()`` receives, checks and acks a sync
        whole (every digest settled against the sender's) but writes nothing, so the tensors
        keep serving the version held; ``commit()`` writes it (the only part that needs
        readers paused) and ``abort_sync()`` drops it. Seeds and dense stages then need staging
        the size of their tensors. Call ``commit()`` or ``abort_sync()`` before the next
        ``receive()``; a sender waits for its receivers' acks, not their commits."""
        return self._native.commits_on_demand

    @commit_on_demand.setter
    def commit_on_demand(self, on: bool) -> None:
        self._native.set_commit_on_demand(bool(on))

    @property
    def awaits_commit(self) -> bool:
        """Whether a verified sync waits for ``commit()``."""
        return self._native.awaits_commit

    def commit(self) -> dict:
        """Writes the verified sync that waits into the tensors (after the work queued on
        torch's current stream) and takes its version; the receive's report with the commit's
        own ``time_ms``. A device error part way puts the old bits back (the version held
        stays, or, when it cannot, none is held and a seed must follow) and raises."""
        return self._native.commit(_stream(self.device))

    def abort_sync(self) -> None:
        """Drops the verified sync that waits; nothing was written, the version held stays.
        Its sender had the ack: its next delta is refused here and it reseeds."""
        self._native.abort_sync()

    def receive(self, idle_timeout_s: Optional[float] = None) -> Optional[dict]:
        """Blocks for the next sync and applies it; ``None`` when the sender closed. Raises a
        ``DeltacastError`` subclass when the sync was refused (nothing applied), and
        ``SyncTimeoutError`` when no sync started within ``idle_timeout_s`` (default: wait
        for ever, a training step can be long)."""
        return self._native.receive(_stream(self.device), idle_timeout_s)

    def verify(self) -> None:
        """Recomputes the digests of the weights held; raises ``DigestMismatchError`` when
        they were changed behind the receiver's back (the next sync must be a seed)."""
        self._native.verify()

    @property
    def version(self) -> Optional[int]:
        """The version held; ``None`` before the first seed or once the state was lost."""
        return self._native.version

    @property
    def digests(self) -> dict:
        """Per-tensor digests of the version held, by name."""
        return dict(zip(self._names, self._native.digests))

    @property
    def staging_bytes(self) -> int:
        """Device bytes held besides the tensors: the receive buffers of the largest delta so
        far (seeds and dense syncs land in the tensors directly)."""
        return self._native.staging_bytes
