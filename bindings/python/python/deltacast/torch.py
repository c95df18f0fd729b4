"""torch helpers: models and tensors (plain or FSDP2/TP DTensors) as what deltacast takes.

torch is imported lazily, so ``import deltacast`` works without it. Tensors are viewed, never
copied: a CPU tensor becomes a numpy array sharing its memory (bf16 as int16 bits, fp8 as
uint8 bits), so a ``Receiver`` writes straight into the model's parameters.

CUDA tensors are not supported yet (the GPU path is a separate build); a trainer can sync
``.cpu()`` copies meanwhile.

Typical use, trainer rank (FSDP2 or plain)::

    link = deltacast.torch.TorchDistributedLink()          # over torch.distributed
    sender = deltacast.torch.rank_sender(model, link)
    for step in ...:
        optimizer.step()
        result = sender.sync(deltacast.torch.local_arrays(model))
        if result.is_leader: broadcast(result.frames)

receiver::

    receiver = deltacast.torch.receiver(model)             # writes into model's parameters
    for frame in frames: receiver.receive(frame)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterable, Mapping, Tuple, Union

import numpy as np

from . import _native
from ._errors import InvalidArgumentError, UnsupportedDTypeError

if TYPE_CHECKING:
    import torch

    Named = Union["torch.nn.Module", Mapping[str, "torch.Tensor"], Iterable[Tuple[str, "torch.Tensor"]]]

__all__ = [
    "TorchDistributedLink",
    "dtype_name",
    "is_dtensor",
    "layout_of",
    "local_arrays",
    "params_of",
    "placement_spec",
    "rank_sender",
    "receiver",
    "slot_table",
    "to_numpy",
]


def _torch():
    try:
        import torch
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError("deltacast.torch needs torch installed") from e
    return torch


def dtype_name(dtype: Any) -> str:
    """The deltacast name of a torch dtype ("bf16", "f16", "f32", "f8_e4m3", "f8_e5m2")."""
    torch = _torch()
    names = {
        torch.bfloat16: "bf16",
        torch.float16: "f16",
        torch.float32: "f32",
    }
    for attr, name in (("float8_e4m3fn", "f8_e4m3"), ("float8_e5m2", "f8_e5m2")):
        if hasattr(torch, attr):
            names[getattr(torch, attr)] = name
    try:
        return names[dtype]
    except KeyError:
        raise UnsupportedDTypeError(
            f"dtype {dtype} is not supported: deltacast syncs bf16, f16, f32, f8_e4m3fn and f8_e5m2"
        ) from None


def is_dtensor(t: Any) -> bool:
    """Whether ``t`` is a DTensor (FSDP2, TP), by its attributes, across torch versions."""
    return all(hasattr(t, a) for a in ("placements", "device_mesh", "to_local"))


def to_numpy(t: "torch.Tensor") -> np.ndarray:
    """A numpy array sharing ``t``'s memory: bf16 as int16 bits, fp8 as uint8 bits, f16/f32
    as themselves. A DTensor gives its local piece. Refuses CUDA and non-contiguous tensors
    rather than copying (a receiver's writes would go to the copy)."""
    torch = _torch()
    if is_dtensor(t):
        t = t.to_local()
    if t.device.type != "cpu":
        raise InvalidArgumentError(
            f"tensor on {t.device}: this build of deltacast syncs CPU memory only (the CUDA "
            "path is a separate build); a sender may pass t.cpu() copies"
        )
    if not t.is_contiguous():
        raise InvalidArgumentError(
            "tensor is not contiguous: deltacast reads and writes tensors in place"
        )
    name = dtype_name(t.dtype)
    t = t.detach()
    if name == "bf16":
        t = t.view(torch.int16)
    elif name in ("f8_e4m3", "f8_e5m2"):
        t = t.view(torch.uint8)
    return t.numpy()


def _named(model: "Named") -> list[tuple[str, "torch.Tensor"]]:
    if hasattr(model, "named_parameters"):
        return list(model.named_parameters())
    if isinstance(model, Mapping):
        return list(model.items())
    return list(model)


def placement_spec(p: Any) -> tuple:
    """A torch placement as plain data: ("S", dim), ("_S", dim, split_factor), ("R",), ("P",)."""
    if type(p).__name__ == "_StridedShard":
        return ("_S", int(p.dim), int(p.split_factor))
    if p.is_shard():
        return ("S", int(p.dim))
    if p.is_replicate():
        return ("R",)
    if p.is_partial():
        return ("P",)
    raise InvalidArgumentError(f"unknown placement {p!r}")


def layout_of(t: Any) -> "_native.Layout | None":
    """The ``Layout`` of a DTensor on this rank, or None for a plain tensor (held whole)."""
    if not is_dtensor(t):
        return None
    mesh = t.device_mesh
    coords = mesh.get_coordinate()
    return _native.Layout(
        list(mesh.shape),
        None if coords is None else [int(c) for c in coords],
        [placement_spec(p) for p in t.placements],
        [int(d) for d in t.shape],
    )


def params_of(
    model: "Named",
    convert: Mapping[str, Any] | None = None,
    dtype: Any = None,
) -> list["_native.Param"]:
    """A ``Param`` per parameter (full shape, also for DTensors). ``convert`` maps a name to
    a slot name or ``Converter`` (default: same name, same shape); ``dtype`` overrides the
    tensors' dtype (a trainer syncing a bf16 copy of fp32 masters)."""
    convert = convert or {}
    out = []
    for name, p in _named(model):
        d = dtype_name(dtype if dtype is not None else p.dtype)
        out.append(_native.Param(name, d, [int(x) for x in p.shape], convert.get(name)))
    return out


def slot_table(
    model: "Named", convert: Mapping[str, Any] | None = None, dtype: Any = None
) -> "_native.SlotTable":
    """The receivers' slot table of a model's parameters (after ``convert``)."""
    return _native.SlotTable.from_params(params_of(model, convert, dtype))


def local_arrays(model: "Named", dtype: Any = None, cpu: bool = False) -> dict[str, np.ndarray]:
    """This rank's piece of every parameter as a numpy view (DTensors: ``to_local()``).
    With ``dtype``, tensors of another dtype are converted first (a copy, e.g. fp32 masters
    to bf16), else everything is zero-copy. With ``cpu``, GPU tensors are copied to the CPU
    (a trainer on GPUs, until the CUDA path exists)."""
    out = {}
    for name, p in _named(model):
        t = p.to_local() if is_dtensor(p) else p
        t = t.detach()
        if cpu and t.device.type != "cpu":
            t = t.to("cpu", dtype=dtype) if dtype is not None else t.cpu()
        if dtype is not None and t.dtype != dtype:
            t = t.to(dtype).contiguous()
        elif not t.is_contiguous():
            t = t.contiguous()
        out[name] = to_numpy(t)
    return out


def rank_sender(
    model: "Named",
    link: Any = None,
    convert: Mapping[str, Any] | None = None,
    dtype: Any = None,
    **kwargs: Any,
) -> "_native.RankSender":
    """A ``RankSender`` for this rank's parameters: layouts read from the DTensors (plain
    tensors count as held whole by every rank). ``link`` defaults to a world of one; pass a
    ``TorchDistributedLink`` under torch.distributed. Keyword arguments go to ``RankSender``."""
    named = _named(model)
    params = params_of(named, convert, dtype)
    layouts = [layout_of(p) for _, p in named]
    return _native.RankSender(params, layouts, link, **kwargs)


def receiver(
    model: "Named",
    slots: Any = None,
    version: int | None = None,
) -> "_native.Receiver":
    """A ``Receiver`` that writes into ``model``'s parameters in place (CPU). ``slots``
    defaults to the table of the parameters as they are (names, dtypes, shapes, in order); it
    must equal the sender's (compare ``.hash``)."""
    named = _named(model)
    if slots is None:
        slots = slot_table(named)
    arrays = {name: to_numpy(p) for name, p in named}
    return _native.Receiver(slots, arrays, version=version)


class TorchDistributedLink:
    """A gather link over ``torch.distributed`` (gloo on CPU, NCCL on GPU), for
    ``RankSender``. Every rank of ``group`` must create one and call ``sync`` together."""

    def __init__(self, group: Any = None, device: Any = None) -> None:
        torch = _torch()
        import torch.distributed as dist

        self._torch = torch
        self._dist = dist
        self.group = group
        self.rank = dist.get_rank(group)
        self.world = dist.get_world_size(group)
        if device is None:
            if dist.get_backend(group) == "nccl":
                device = torch.device("cuda", torch.cuda.current_device())
            else:
                device = torch.device("cpu")
        self.device = torch.device(device)
        # send/recv take global ranks.
        self._global = [
            dist.get_global_rank(group, r) if group is not None else r for r in range(self.world)
        ]

    def _tensor(self, data: bytes) -> "torch.Tensor":
        torch = self._torch
        if not data:
            return torch.empty(0, dtype=torch.uint8, device=self.device)
        return torch.frombuffer(bytearray(data), dtype=torch.uint8).to(self.device)

    def all_gather(self, data: bytes) -> list[bytes]:
        torch, dist = self._torch, self._dist
        size = torch.tensor([len(data)], dtype=torch.int64, device=self.device)
        sizes = [torch.empty_like(size) for _ in range(self.world)]
        dist.all_gather(sizes, size, group=self.group)
        lens = [int(s.item()) for s in sizes]
        longest = max(lens)
        if longest == 0:
            return [b""] * self.world
        # Collectives need equal sizes: pad to the longest, cut after.
        buf = torch.zeros(longest, dtype=torch.uint8, device=self.device)
        if data:
            buf[: len(data)] = self._tensor(data)
        rows = [torch.empty_like(buf) for _ in range(self.world)]
        dist.all_gather(rows, buf, group=self.group)
        return [r[:n].cpu().numpy().tobytes() for r, n in zip(rows, lens)]

    def send_to_leader(self, data: bytes) -> None:
        self._dist.send(self._tensor(data), dst=self._global[0], group=self.group)

    def recv_from(self, rank: int, nbytes: int) -> bytes:
        torch = self._torch
        buf = torch.empty(nbytes, dtype=torch.uint8, device=self.device)
        self._dist.recv(buf, src=self._global[rank], group=self.group)
        return buf.cpu().numpy().tobytes()
