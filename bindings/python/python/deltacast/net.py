"""Frames over TCP: deltacast's authenticated frame link (the Rust ``deltacast-net`` crate).

``FrameServer`` is a sender's end: it listens, authenticates each receiver (HMAC-SHA256
challenge–response on a shared secret), fans frames out to all of them or to one, and collects
their acks of (version, state digest). ``FrameClient`` is a receiver's end. Without a secret
(argument, or ``DELTACAST_SECRET``) a server binds loopback only. Every length read from the
wire is checked against a limit before anything is allocated; every wait has a timeout.
``generate_token`` makes a secret to hand to the other side through a channel already trusted.
See docs/python.md ("Frames over TCP")."""

from __future__ import annotations

from ._native import FrameClient, FrameServer, generate_token

__all__ = ["FrameClient", "FrameServer", "generate_token"]
