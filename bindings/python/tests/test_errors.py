"""Every failure maps to its exception class, and a failed sync leaves the arrays untouched."""

from __future__ import annotations

import errno

import numpy as np
import pytest

import deltacast as dc
from conftest import deliver, model, perturb, same_bits


def snapshot(arrays):
    return {k: v.copy() for k, v in arrays.items()}


def unchanged(before, arrays):
    return all(same_bits(before[k], arrays[k]) for k in before)


@pytest.fixture(params=[False, True], ids=["staged", "in-place"])
def synced(rng, request):
    """A sender and a receiver at version 1, and the next delta (several flushes); the
    receiver stages a sync until its last flush, or writes each flush as it arrives (then a
    failed sync must put back what the earlier flushes wrote)."""
    table, src = model(rng, dtypes=("bf16", "f32"))
    sender = dc.Sender(table, bucket_size=1024, chunk_elems=128)
    dst = table.zeros()
    receiver = dc.Receiver(table, dst, apply_as_received=request.param)
    assert receiver.apply_as_received == request.param
    deliver(receiver, sender.sync(src).frames)
    for a in src.values():
        perturb(rng, a, 0.2)
    delta = sender.sync(src)
    assert delta.kind == "delta" and delta.flushes >= 3
    return table, src, sender, dst, receiver, delta


def test_hierarchy():
    for name in dc._errors.__all__:
        assert issubclass(getattr(dc, name), dc.DeltacastError)
    assert issubclass(dc.InvalidArgumentError, ValueError)
    assert issubclass(dc.IoError, OSError)
    assert issubclass(dc.ChecksumError, dc.MalformedFrameError)
    assert issubclass(dc.BaseDigestMismatchError, dc.DigestMismatchError)


def test_corrupted_last_flush_applies_nothing(synced):
    table, src, sender, dst, receiver, delta = synced
    before = snapshot(dst)
    frames = list(delta.frames)
    bad = bytearray(frames[-1])
    bad[len(bad) // 2] ^= 0x10
    frames[-1] = bytes(bad)
    for f in frames[:-1]:
        assert receiver.receive(f) is None
    assert receiver.is_staging
    # Staged: nothing written yet; in place: the first flushes already are.
    assert unchanged(before, dst) != receiver.apply_as_received
    with pytest.raises(dc.ChecksumError) as info:
        receiver.receive(frames[-1])
    assert info.value.expected != info.value.computed
    assert not receiver.is_staging
    assert unchanged(before, dst) and receiver.version == 1
    # The intact sync still applies afterwards.
    deliver(receiver, delta.frames)
    assert all(same_bits(src[k], dst[k]) for k in src)


def test_truncated_and_garbage_frames(synced):
    *_, dst, receiver, delta = synced
    before = snapshot(dst)
    with pytest.raises(dc.TruncatedError):
        receiver.receive(delta.frames[0][:-9])
    with pytest.raises(dc.MalformedFrameError):
        receiver.receive(b"NOPE" + bytes(100))
    with pytest.raises(dc.MalformedFrameError):
        receiver.receive(b"")
    assert unchanged(before, dst)


def test_wrong_version(synced, rng):
    table, src, sender, dst, receiver, delta = synced
    for a in src.values():
        perturb(rng, a, 0.1)
    skipped_ahead = sender.sync(src)  # version 3, but the receiver never got version 2
    before = snapshot(dst)
    with pytest.raises(dc.VersionMismatchError) as info:
        receiver.receive(skipped_ahead.frames[0])
    e = info.value
    assert (e.current, e.got, e.expected) == (1, 3, 2)
    assert unchanged(before, dst)
    # A seed brings it back.
    sender.request_seed()
    deliver(receiver, sender.sync(src).frames)
    assert all(same_bits(src[k], dst[k]) for k in src)


def test_out_of_order_flush(synced):
    *_, dst, receiver, delta = synced
    before = snapshot(dst)
    with pytest.raises(dc.FlushOrderError) as info:
        receiver.receive(delta.frames[1])
    assert info.value.got == 1
    receiver.receive(delta.frames[0])
    with pytest.raises(dc.FlushOrderError):
        receiver.receive(delta.frames[2])  # flush 1 lost
    assert not receiver.is_staging
    assert unchanged(before, dst)


def test_wrong_table(synced):
    table, src, sender, dst, receiver, delta = synced
    other = dc.SlotTable([dc.Slot(s.name, s.dtype, s.shape) for s in table][::-1])
    stranger = dc.Receiver(other, other.zeros())
    with pytest.raises(dc.SlotTableMismatchError) as info:
        stranger.receive(delta.frames[0])
    assert info.value.frame == table.hash and info.value.local == other.hash


def test_weights_changed_behind_receivers_back(synced):
    """Memory changed behind the receiver: found by recompute_digests and by a verify sync."""
    table, src, sender, dst, receiver, delta = synced
    deliver(receiver, delta.frames)
    name = "layer1.weight"
    dst[name].reshape(-1).view(np.uint32)[3] ^= 1
    assert receiver.recompute_digests() == [name]
    with pytest.raises(dc.DigestMismatchError) as info:
        deliver(receiver, sender.verify().frames)
    assert info.value.slot == name


def test_receiver_on_the_wrong_base(synced):
    """A receiver that claims version 1 but holds other bits refuses the delta for 2."""
    table, src, sender, dst, receiver, delta = synced
    other = table.zeros()
    stale = dc.Receiver(table, other, version=1)
    before = snapshot(other)
    with pytest.raises(dc.BaseDigestMismatchError) as info:
        deliver(stale, delta.frames)
    assert info.value.slot in table
    assert unchanged(before, other)


def test_sink_exception_propagates_and_forces_a_seed(rng):
    table, src = model(rng, dtypes=("f32",))
    sender = dc.Sender(table)

    class Boom(Exception):
        pass

    def sink(frame):
        raise Boom("network down")

    with pytest.raises(Boom):
        sender.sync(src, sink=sink)
    assert sender.sync(src).kind == "seed"
    with pytest.raises(Boom):
        sender.sync(src, sink=sink)
    assert sender.sync(src).kind == "seed"


def test_bad_arguments(rng):
    table = dc.SlotTable([dc.Slot("a", "bf16", (4, 4)), dc.Slot("b", "f32", (3,))])
    good = {"a": np.zeros((4, 4), np.uint16), "b": np.zeros(3, np.float32)}
    with pytest.raises(dc.UnsupportedDTypeError):
        dc.Slot("x", "int64", (1,))
    with pytest.raises(dc.InvalidArgumentError):
        dc.Sender(table, codec="zip")
    with pytest.raises(ValueError):
        dc.Sender(table, bucket_size=10)
    with pytest.raises(dc.InvalidArgumentError, match="duplicate"):
        dc.SlotTable([dc.Slot("a", "f32", (1,)), dc.Slot("a", "f32", (1,))])

    def refuse(exc, match, **change):
        arrays = dict(good, **change)
        with pytest.raises(exc, match=match):
            dc.Receiver(table, arrays)

    refuse(dc.SlotMismatchError, "float16 for a bf16 slot", a=np.zeros((4, 4), np.float16))
    refuse(dc.SlotMismatchError, "shape", a=np.zeros((16,), np.uint16))
    refuse(dc.SlotMismatchError, "bytes per element", b=np.zeros(3, np.float64))
    refuse(dc.SlotMismatchError, "C-contiguous", a=np.zeros((4, 8), np.uint16)[:, ::2])
    refuse(dc.SlotMismatchError, "byte-swapped", b=np.zeros(3, ">f4"))
    ro = np.zeros(3, np.float32)
    ro.flags.writeable = False
    refuse(dc.SlotMismatchError, "read-only", b=ro)
    refuse(dc.InvalidArgumentError, "numpy array", b=[0.0, 0.0, 0.0])
    with pytest.raises(dc.UnknownSlotError, match="`b`"):
        dc.Receiver(table, {"a": good["a"]})
    with pytest.raises(dc.InvalidArgumentError, match="extra"):
        dc.Receiver(table, dict(good, extra=np.zeros(1)))
    with pytest.raises(dc.InvalidArgumentError, match="1 arrays given for 2 slots"):
        dc.Sender(table).sync([good["a"]])
    # A sender only reads: read-only arrays are fine.
    dc.Sender(table).sync(dict(good, b=ro))
    # The error names the slot.
    try:
        dc.Receiver(table, dict(good, b=np.zeros(4, np.float32)))
    except dc.SlotMismatchError as e:
        assert e.slot == "b"


def test_tied_arrays_are_refused():
    table = dc.SlotTable([dc.Slot("embed", "bf16", (4, 4)), dc.Slot("lm_head", "bf16", (4, 4))])
    shared = np.zeros((4, 4), np.uint16)
    with pytest.raises(dc.InvalidArgumentError, match="share memory"):
        dc.Receiver(table, {"embed": shared, "lm_head": shared})
    both = np.zeros((8, 4), np.uint16)
    dc.Receiver(table, {"embed": both[:4], "lm_head": both[4:]})  # adjacent is fine


def test_io_errors(tmp_path):
    missing = tmp_path / "nope.dcast"
    with pytest.raises(dc.IoError) as info:
        dc.read_sync_file(missing)
    assert isinstance(info.value, OSError) and info.value.errno == errno.ENOENT
    with pytest.raises(dc.IoError):
        dc.load_safetensors(missing)
    (tmp_path / "bad.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{notjson")
    with pytest.raises(dc.SafetensorsError):
        dc.load_safetensors(tmp_path / "bad.safetensors")
