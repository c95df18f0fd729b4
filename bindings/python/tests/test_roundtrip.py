"""Sender → Receiver on random arrays of every dtype: bit-exact, in place, digests agree."""

from __future__ import annotations

import gc
import re
import types

import numpy as np
import pytest

import deltacast as dc
from conftest import deliver, model, perturb, random_array, same_bits


@pytest.mark.parametrize("codec", ["auto", "abs32+raw", "gaps+ulp", "bitmap+raw", "steps+esc"])
def test_every_dtype_round_trips(rng, codec):
    table, src = model(rng)
    sender = dc.Sender(table, bucket_size=4096, chunk_elems=256, codec=codec)
    dst = table.zeros()
    receiver = dc.Receiver(table, dst)
    assert receiver.version is None

    for step in range(1, 6):
        if step > 1:
            for a in src.values():
                perturb(rng, a, 0.05)
        result = sender.sync(src)
        assert result.kind == ("seed" if step == 1 else "delta")
        assert result.version == step
        assert result.flushes == len(result.frames) >= 1
        assert result.wire_bytes == sum(len(f) for f in result.frames)
        assert max(len(f) for f in result.frames) <= 4096
        assert result.elements == table.total_elements
        assert 0.0 <= result.changed_ratio <= 1.0
        assert result.rust_seconds <= result.seconds
        outcome = deliver(receiver, result.frames)
        assert outcome.version == step == receiver.version
        assert outcome.kind == result.kind
        assert outcome.changed == result.changed
        assert outcome.state_digest == result.state_digest == receiver.state_digest
        assert receiver.digests == sender.digests
        for name in src:
            assert same_bits(src[name], dst[name]), name
    assert receiver.recompute_digests() == []


def test_nan_payloads_and_signed_zeros(rng):
    """Bits that compare equal or unequal as floats are still told apart as bits."""
    table = dc.SlotTable([dc.Slot("w", "f32", (8,)), dc.Slot("h", "bf16", (6,))])
    w = np.array([0.0, -0.0, np.inf, -np.inf, 1.0, 2.0, 3.0, 4.0], dtype=np.float32)
    w.view(np.uint32)[4] = 0x7FC0_0001  # quiet NaN with a payload
    w.view(np.uint32)[5] = 0x7F80_0001  # signalling NaN
    w.view(np.uint32)[6] = 0x0000_0001  # smallest subnormal
    h = np.array([0x0000, 0x8000, 0x7FC1, 0xFFC0, 0x0001, 0x3F80], dtype=np.uint16)
    src = {"w": w, "h": h}
    sender, dst = dc.Sender(table), table.zeros()
    receiver = dc.Receiver(table, dst)
    deliver(receiver, sender.sync(src).frames)
    assert same_bits(dst["w"], w) and same_bits(dst["h"], h)

    # +0 → -0 and one NaN payload → another: equal or NaN as floats, different bits.
    w.view(np.uint32)[0] = 0x8000_0000
    w.view(np.uint32)[4] = 0x7FC0_0002
    h[0], h[2] = 0x8000, 0x7FC2
    result = sender.sync(src)
    assert result.changed == 4
    deliver(receiver, result.frames)
    assert same_bits(dst["w"], w) and same_bits(dst["h"], h)

    # Unchanged bits, NaNs included: an empty delta.
    result = sender.sync(src)
    assert result.kind == "delta" and result.changed == 0
    deliver(receiver, result.frames)


def test_list_and_mapping_inputs_and_int_views(rng):
    table = dc.SlotTable([("a", "bfloat16", (4, 4)), ("b", "torch.float32", [5])])
    a = random_array(rng, "bf16", (4, 4)).view(np.int16)  # bf16 bits as int16 also work
    b = random_array(rng, "f32", (5,))
    sender = dc.Sender(table)
    dst = [np.zeros((4, 4), np.uint16), np.zeros(5, np.uint32)]  # f32 bits as uint32
    receiver = dc.Receiver(table, dst)
    deliver(receiver, sender.sync([a, b]).frames)
    perturb(rng, a, 0.3)
    deliver(receiver, sender.sync(types.MappingProxyType({"a": a, "b": b})).frames)
    assert same_bits(dst[0], a) and same_bits(dst[1], b)


def test_receiver_keeps_arrays_alive(rng):
    table, src = model(rng, dtypes=("bf16",))

    def make():
        return dc.Receiver(table, table.zeros())  # nobody else holds the arrays

    receiver = make()
    gc.collect()
    deliver(receiver, dc.Sender(table).sync(src).frames)
    for name, arr in receiver.arrays.items():
        assert same_bits(arr, src[name])


def test_receiver_from_checkpoint_version(rng):
    """A receiver whose arrays already hold version v takes the delta for v + 1."""
    table, src = model(rng, dtypes=("f16",))
    sender = dc.Sender(table)
    first = sender.sync(src)
    copy = {k: v.copy() for k, v in src.items()}
    receiver = dc.Receiver(table, copy, version=first.version)
    perturb(rng, src["layer0.weight"], 0.1)
    outcome = deliver(receiver, sender.sync(src).frames)
    assert outcome.kind == "delta" and outcome.version == 2
    assert same_bits(copy["layer0.weight"], src["layer0.weight"])


def test_seed_verify_and_request_seed(rng):
    table, src = model(rng, dtypes=("bf16", "f32"))
    sender, dst = dc.Sender(table), table.zeros()
    receiver = dc.Receiver(table, dst)
    deliver(receiver, sender.sync(src).frames)
    check = sender.verify()
    assert check.kind == "verify" and check.version == 1
    assert deliver(receiver, check.frames).kind == "verify"
    sender.request_seed()
    again = sender.sync(src)
    assert again.kind == "seed" and again.version == 2
    deliver(receiver, again.frames)
    forced = sender.seed(src)
    assert forced.kind == "seed" and forced.version == 3
    deliver(receiver, forced.frames)
    assert receiver.version == 3


def test_sink_streams_frames(rng):
    table, src = model(rng, dtypes=("f32",))
    sender = dc.Sender(table, bucket_size=2048)
    got = []
    result = sender.sync(src, sink=got.append)
    assert result.frames == [] and len(got) == result.flushes > 1
    receiver = dc.Receiver(table, table.zeros())
    deliver(receiver, got)


def test_uint8_array_frames(rng):
    table, src = model(rng, dtypes=("f8_e4m3",))
    frames = dc.Sender(table).sync(src).frames
    receiver = dc.Receiver(table, table.zeros())
    deliver(receiver, [np.frombuffer(f, dtype=np.uint8) for f in frames])
    deliver(receiver, [bytearray(f) for f in dc.Sender(table).sync(src).frames])


def test_gil_is_released(rng):
    """Two senders in two threads run concurrently (a crude check that neither holds the GIL
    for the whole sync): both finish and give the same frames."""
    import threading

    table = dc.SlotTable([dc.Slot("w", "bf16", (1 << 20,))])
    w = random_array(rng, "bf16", (1 << 20,))
    results = [None, None]

    def run(i):
        results[i] = dc.Sender(table).sync({"w": w})

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results[0].frames == results[1].frames


def test_reprs_and_table(rng):
    table, _ = model(rng, dtypes=("bf16",))
    assert "slots" in repr(table)
    assert repr(table[0]) == "Slot('layer0.weight', 'bf16', (37, 29))"
    assert table.index("layer0.bias") == 1
    assert table.names[0] == "layer0.weight"
    assert dc.SlotTable(list(table)) == table
    assert dc.SlotTable(list(table)).hash == table.hash
    # The hash is spelt as the CLI prints it, 16 lowercase hex digits, in the repr too.
    assert isinstance(table.hash, str) and re.fullmatch("[0-9a-f]{16}", table.hash), table.hash
    assert f"hash {table.hash})" in repr(table)
    assert dc.SlotTable(list(table)[::-1]).hash != table.hash
    with pytest.raises(IndexError):
        table[100]
    with pytest.raises(dc.UnknownSlotError):
        table["nope"]
    assert dc.Slot("x", "F8_E4M3", (2,)).dtype == "f8_e4m3"
    assert dc.Slot("x", "float8_e5m2", (2,)).nbytes == 2


def test_numpy_frames_are_zero_copy_and_read_only(rng, tmp_path):
    table, src = model(rng, dtypes=("bf16", "f32"))
    sender = dc.Sender(table, bucket_size=2048, frame_type="numpy")
    plain = dc.Sender(table, bucket_size=2048)
    result = sender.sync(src)
    frames = result.frames
    assert all(isinstance(f, np.ndarray) and f.dtype == np.uint8 and f.ndim == 1 for f in frames)
    assert not frames[0].flags.writeable
    assert [bytes(f) for f in frames] == plain.sync(src).frames  # same bytes as bytes frames
    receiver = dc.Receiver(table, table.zeros())
    deliver(receiver, frames)
    perturb(rng, src["layer0.weight"], 0.1)
    got = []
    sender.sync(src, sink=got.append)
    assert all(isinstance(f, np.ndarray) for f in got)
    dc.write_sync_file(tmp_path / "d.dcast", got)
    deliver(receiver, dc.read_sync_file(tmp_path / "d.dcast"))
    assert same_bits(receiver.arrays["layer0.weight"], src["layer0.weight"])
    with pytest.raises(dc.InvalidArgumentError):
        dc.Sender(table, frame_type="memoryview")


def test_stage_then_commit(rng):
    """With commit_on_demand the arrays keep the version held until commit(); abort drops."""
    table, src = model(rng, dtypes=("bf16", "f32"))
    sender = dc.Sender(table, bucket_size=4096)
    dst = table.zeros()
    receiver = dc.Receiver(table, dst, commit_on_demand=True)
    for step in range(3):
        if step:
            for a in src.values():
                perturb(rng, a, 0.05)
        before = {n: a.copy() for n, a in dst.items()}
        frames = sender.sync(src).frames
        assert all(receiver.receive(f) is None for f in frames)
        assert receiver.awaits_commit
        for n in dst:
            assert same_bits(dst[n], before[n]), n
        with pytest.raises(dc.InvalidArgumentError):
            receiver.receive(frames[0])
        outcome = receiver.commit()
        assert outcome.version == step + 1 == receiver.version
        assert outcome.state_digest == sender.state_digest
        for n in src:
            assert same_bits(dst[n], src[n]), n
    for a in src.values():
        perturb(rng, a, 0.05)
    held = {n: a.copy() for n, a in dst.items()}
    for f in sender.sync(src).frames:
        receiver.receive(f)
    receiver.abort_sync()
    assert not receiver.awaits_commit and receiver.version == 3
    for n in dst:
        assert same_bits(dst[n], held[n]), n
    with pytest.raises(dc.InvalidArgumentError):
        receiver.commit()
