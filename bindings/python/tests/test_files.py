"""safetensors checkpoints and sync files."""

from __future__ import annotations

import os

import numpy as np
import pytest

import deltacast as dc
from conftest import deliver, model, perturb, same_bits


def test_safetensors_round_trip_with_slots(tmp_path, rng):
    table, arrays = model(rng)
    path = tmp_path / "model.safetensors"
    dc.save_safetensors(path, arrays, table)
    assert os.listdir(tmp_path) == ["model.safetensors"]  # no temp file left behind
    loaded = dc.load_safetensors(path)
    assert sorted(loaded) == sorted(arrays)
    for name, a in arrays.items():
        assert same_bits(loaded[name], a), name
        assert loaded[name].flags.writeable and loaded[name].flags.c_contiguous
    # The file's table: names sorted, dtypes as given (bf16 survives as bf16, not uint16).
    on_disk = dc.SlotTable.from_safetensors(path)
    assert on_disk.names == sorted(arrays)
    assert {s.name: s.dtype for s in on_disk} == {s.name: s.dtype for s in table}
    assert loaded["layer0.weight"].dtype == np.uint16  # bf16 bits
    assert loaded["layer2.weight"].dtype == np.float32


def test_safetensors_infers_unambiguous_dtypes(tmp_path):
    arrays = {"w": np.ones((2, 3), np.float32), "h": np.ones(4, np.float16)}
    dc.save_safetensors(tmp_path / "a.safetensors", arrays)
    table = dc.SlotTable.from_safetensors(tmp_path / "a.safetensors")
    assert [(s.name, s.dtype, s.shape) for s in table] == [("h", "f16", (4,)), ("w", "f32", (2, 3))]
    with pytest.raises(dc.InvalidArgumentError, match="slots="):
        dc.save_safetensors(tmp_path / "b.safetensors", {"x": np.ones(2, np.uint16)})
    assert not (tmp_path / "b.safetensors").exists()


def test_checkpoint_plus_sync_file_gives_the_new_checkpoint(tmp_path, rng):
    """The file workflow: a base checkpoint, a sync file, a receiver that loads the base at
    its version and applies the file."""
    table, arrays = model(rng, dtypes=("bf16", "f32"))
    sender = dc.Sender(table, bucket_size=2048)
    sender.sync(arrays)  # version 1
    base = tmp_path / "v1.safetensors"
    dc.save_safetensors(base, arrays, table)
    for a in arrays.values():
        perturb(rng, a, 0.05)
    delta = sender.sync(arrays)
    sync_file = tmp_path / "v2.dcast"
    dc.write_sync_file(sync_file, delta.frames)
    frames = dc.read_sync_file(sync_file)
    assert frames == delta.frames
    assert dc.frame_header(frames[-1])["is_final"]
    # The table hash has one spelling: bytes 16..24 of every frame header (a little-endian
    # u64, docs/wire-format.md) as 16 hex digits, in the header dict as on the table.
    for f in frames:
        raw = int.from_bytes(bytes(f)[16:24], "little")
        assert dc.frame_header(f)["table_hash"] == f"{raw:016x}" == table.hash

    # A receiver over the loaded checkpoint, whose table order is the file's (sorted): it
    # must use the sender's table, so pass the arrays by name.
    held = dc.load_safetensors(base)
    receiver = dc.Receiver(table, held, version=1)
    outcome = deliver(receiver, frames)
    assert outcome.version == 2 and outcome.state_digest == delta.state_digest
    for name, a in arrays.items():
        assert same_bits(held[name], a)


def test_bad_sync_files(tmp_path, rng):
    table, arrays = model(rng, dtypes=("f16",))
    frames = dc.Sender(table, bucket_size=1024).sync(arrays).frames
    path = tmp_path / "s.dcast"
    dc.write_sync_file(path, frames)
    data = path.read_bytes()
    path.write_bytes(data[:-3])
    with pytest.raises(dc.TruncatedError):
        dc.read_sync_file(path)
    with pytest.raises(dc.InvalidArgumentError):
        dc.write_sync_file(path, [frames[0] + b"x"])
    with pytest.raises(dc.MalformedFrameError):
        dc.write_sync_file(path, [b"\x00" * 80])
    assert path.read_bytes() == data[:-3]  # failed writes left the file alone
