"""Gather links implemented in Python, for ``RankSender``.

A link is any object with ``rank`` and ``world`` (ints) and three methods, called by every
rank in the same order (the core's lockstep plan guarantees it):

- ``all_gather(data: bytes) -> list[bytes]``: every rank's ``data``, in rank order;
- ``send_to_leader(data: bytes) -> None``: a non-leader rank sends bytes to rank 0;
- ``recv_from(rank: int, nbytes: int) -> bytes``: rank 0 receives exactly ``nbytes`` from
  ``rank``.

``thread_links`` connects ranks that are threads of one process (tests, single-host demos);
``deltacast.torch.TorchDistributedLink`` runs over ``torch.distributed``.
"""

from __future__ import annotations

import queue
import threading
from typing import Protocol, Sequence

__all__ = ["GatherLink", "ThreadLink", "thread_links"]


class GatherLink(Protocol):
    """What ``RankSender`` needs from the ranks' transport."""

    rank: int
    world: int

    def all_gather(self, data: bytes) -> Sequence[bytes]: ...

    def send_to_leader(self, data: bytes) -> None: ...

    def recv_from(self, rank: int, nbytes: int) -> bytes: ...


class _World:
    def __init__(self, world: int, timeout: float) -> None:
        self.world = world
        self.timeout = timeout
        self.barrier = threading.Barrier(world)
        self.slots: list[bytes | None] = [None] * world
        self.to_leader: list[queue.Queue[bytes]] = [queue.Queue() for _ in range(world)]

    def wait(self) -> None:
        try:
            self.barrier.wait(self.timeout)
        except threading.BrokenBarrierError:
            raise TimeoutError(
                "collective broken: a rank failed, or did not arrive within "
                f"{self.timeout} s"
            ) from None


class ThreadLink:
    """One rank's end of an in-process link (see ``thread_links``)."""

    def __init__(self, world: _World, rank: int) -> None:
        self._w = world
        self.rank = rank
        self.world = world.world

    def all_gather(self, data: bytes) -> list[bytes]:
        w = self._w
        w.slots[self.rank] = bytes(data)
        w.wait()  # every rank wrote
        rows = [bytes(s) for s in w.slots if s is not None]
        w.wait()  # every rank read, so the next call may overwrite
        if len(rows) != w.world:
            raise RuntimeError("all_gather lost a row")
        return rows

    def send_to_leader(self, data: bytes) -> None:
        if self.rank == 0:
            raise ValueError("the leader does not send to itself")
        self._w.to_leader[self.rank].put(bytes(data))

    def recv_from(self, rank: int, nbytes: int) -> bytes:
        if self.rank != 0:
            raise ValueError("only the leader receives")
        try:
            data = self._w.to_leader[rank].get(timeout=self._w.timeout)
        except queue.Empty:
            raise TimeoutError(f"nothing from rank {rank} within {self._w.timeout} s") from None
        if len(data) != nbytes:
            raise RuntimeError(f"rank {rank} sent {len(data)} bytes, expected {nbytes}")
        return data

    def abort(self) -> None:
        """Breaks the world's barrier, so ranks blocked in a collective raise instead of
        waiting for a rank that failed."""
        self._w.barrier.abort()

    def reset(self) -> None:
        """Makes the world usable again after a failed collective (call once, when no rank is
        inside one): mends the barrier and drops undelivered messages."""
        w = self._w
        w.barrier.reset()
        w.slots = [None] * w.world
        for q in w.to_leader:
            while not q.empty():
                q.get_nowait()


def thread_links(world: int, *, timeout: float = 60.0) -> list[ThreadLink]:
    """``world`` connected links, one per rank, for ranks that run as threads of one process.
    A collective that some rank does not reach within ``timeout`` seconds raises
    ``TimeoutError`` instead of hanging."""
    if world < 1:
        raise ValueError("a world needs at least one rank")
    w = _World(world, timeout)
    return [ThreadLink(w, r) for r in range(world)]
