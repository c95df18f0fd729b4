"""deltacast.net: the authenticated TCP frame link, over real sockets on 127.0.0.1."""

from __future__ import annotations

import socket
import struct
import threading
import time

import numpy as np
import pytest

import deltacast as dc
from deltacast.net import FrameClient, FrameServer, generate_token

from conftest import perturb, random_array, same_bits


def serve(n, work):
    """Runs ``work(i)`` for ``n`` clients in threads; their results (or exceptions)."""
    out: list = [None] * n

    def run(i):
        try:
            out[i] = work(i)
        except BaseException as e:  # reported by the caller
            out[i] = e

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    return threads, out


def finish(threads, out):
    for t in threads:
        t.join(30)
    for o in out:
        if isinstance(o, BaseException):
            raise o
    return out


def test_frames_of_every_size_reach_every_client_bit_exact_and_acks_come_back():
    token = generate_token()
    assert len(token) >= 32 and token != generate_token()
    server = FrameServer(secret=token, timeout_s=20)
    assert server.authenticated and server.address.startswith("127.0.0.1:")
    rng = np.random.default_rng(7)
    frames = [b"", b"x", rng.integers(0, 256, 3 << 20, dtype=np.uint8), bytes(range(256)) * 7]

    def client(i):
        c = FrameClient(server.address, secret=token, timeout_s=20)
        got = [c.recv_frame() for _ in frames]
        c.send_ack(10 + i, 0xFFFF_FFFF_FFFF_FFF0 + i, i != 1, f"client {i} é")
        return got

    threads, out = serve(3, client)
    ids = server.wait_for_receivers(3, 20)
    assert len(ids) == 3 and len(set(ids)) == 3
    assert {r["id"] for r in server.receivers()} == set(ids)
    assert all(r["version"] is None for r in server.receivers())
    for f in frames:
        assert server.broadcast(f) == []
    acks = sorted(server.collect_acks(), key=lambda a: a["version"])
    for got in finish(threads, out):
        assert [bytes(g) for g in got] == [bytes(f) for f in frames]
    assert [(a["version"], a["ok"]) for a in acks] == [(10, True), (11, False), (12, True)]
    assert [a["state_digest"] - 0xFFFF_FFFF_FFFF_FFF0 for a in acks] == [0, 1, 2]
    assert acks[0]["message"] == "client 0 é"
    server.close()


def test_a_wrong_secret_is_refused_by_name_and_the_real_client_still_joins():
    token = generate_token()
    server = FrameServer(secret=token, timeout_s=10)
    with pytest.raises(dc.AuthenticationError, match="frame server 127.0.0.1"):
        FrameClient(server.address, secret="not-the-secret-0123456789", timeout_s=5)
    with pytest.raises(dc.LinkError):
        FrameClient(server.address, secret=None, timeout_s=5)
    threads, out = serve(1, lambda i: FrameClient(server.address, secret=token).recv_frame())
    assert len(server.wait_for_receivers(1, 10)) == 1
    server.broadcast(b"ok")
    assert finish(threads, out) == [b"ok"]


def test_strangers_that_send_garbage_silence_or_a_huge_length_do_not_stop_real_clients():
    token = generate_token()
    server = FrameServer(secret=token, timeout_s=3)
    host, port = server.address.rsplit(":", 1)
    strangers = []
    for payload in (b"GET / HTTP/1.1\r\n\r\n", b"", struct.pack("<BQ", 1, 1 << 62), b"\x00" * 9):
        s = socket.create_connection((host, int(port)))
        s.sendall(payload)
        strangers.append(s)
    threads, out = serve(2, lambda i: FrameClient(server.address, secret=token).recv_frame())
    ids = server.wait_for_receivers(2, 10)
    assert len(ids) == 2, ids
    assert server.broadcast(b"for members") == []
    assert finish(threads, out) == [b"for members"] * 2
    for s in strangers:
        s.close()


def test_no_secret_means_loopback_only_and_waits_time_out():
    with pytest.raises(dc.InvalidArgumentError, match="without a shared secret"):
        FrameServer("0.0.0.0:0", secret=None)
    server = FrameServer(timeout_s=1)
    assert not server.authenticated
    t0 = time.monotonic()
    with pytest.raises(dc.SyncTimeoutError):
        server.wait_for_receivers(1, 0.5)
    assert time.monotonic() - t0 < 5
    c = FrameClient(server.address, timeout_s=1, idle_timeout_s=0.3)
    server.wait_for_receivers(1, 5)
    with pytest.raises(dc.SyncTimeoutError):
        c.recv_frame()
    with pytest.raises(dc.InvalidArgumentError):
        FrameClient(server.address, timeout_s=-1)
    with pytest.raises(dc.InvalidArgumentError):
        FrameServer(secret="short")


def test_a_frame_above_the_limit_is_refused_before_sending():
    server = FrameServer(timeout_s=5, max_frame=1000)
    with pytest.raises(dc.InvalidArgumentError, match="exceeds max_frame"):
        server.broadcast(b"x" * 1001)


def test_a_sender_syncs_a_receiver_over_the_link():
    rng = np.random.default_rng(3)
    table = dc.SlotTable([("w", "bf16", (257, 31)), ("b", "f32", (5,))])
    arrays = {s.name: random_array(rng, s.dtype, tuple(s.shape)) for s in table}
    sender = dc.Sender(table, bucket_size=4096)
    server = FrameServer(timeout_s=20)

    def receive(_):
        c = FrameClient(server.address, timeout_s=20)
        rx = dc.Receiver(table, table.zeros())
        for _ in range(3):
            while (o := rx.receive(c.recv_frame())) is None:
                pass
            c.send_ack(o.version, o.state_digest)
        return rx

    threads, out = serve(1, receive)
    server.wait_for_receivers(1, 20)
    results = []
    for step in range(3):
        if step:
            perturb(rng, arrays["w"], 0.05)
        r = sender.sync(arrays)
        for f in r.frames:
            server.broadcast(f)
        (ack,) = server.collect_acks()
        assert (ack["version"], ack["state_digest"]) == (r.version, r.state_digest)
        results.append(r.kind)
    (rx,) = finish(threads, out)
    assert results == ["seed", "delta", "delta"]
    for name, a in arrays.items():
        assert same_bits(rx.arrays[name], a)
