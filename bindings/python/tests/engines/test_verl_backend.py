"""deltacast as verl's checkpoint engine, against verl 0.9.1 from PyPI, without Ray.

Trainer ranks and rollout workers run as processes (tests/engines/_verl_worker.py); this test
is the driver and issues, for every sync, what verl's ``CheckpointEngineManager.update_weights``
issues: ``prepare`` on every worker, ``build_topology`` here, ``init_process_group`` on every
worker, trainer ``send_weights`` together with rollout ``update_weights`` (verl's own
``CheckpointEngineWorker``), ``finalize``. Every trainer rank drains a generator of the step's
full fp32 tensors. After each sync every rollout worker's SGLang model (updated by verl's own
``delta_flush`` consumer) must equal, bit for bit, a fresh model that loaded torch's bf16
rounding of the trainer's fp32 state with SGLang's ``load_weights``; so must the backend's
mirror."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from engine_case import require

require("sglang")
require("verl")

WORKER = Path(__file__).with_name("_verl_worker.py")
STEPS = 10


class Proc:
    """One worker process and its command line."""

    def __init__(self, role: str, index: int, world: int, workdir: Path, options: dict) -> None:
        self.name = f"{role}{index}"
        self.log_path = workdir / f"{self.name}.log"
        self.log = open(self.log_path, "w")
        env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
        cmd = [sys.executable, str(WORKER), role, str(index), str(world), str(workdir)]
        self.p = subprocess.Popen(
            cmd + [json.dumps(options)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.log,
            text=True,
            env=env,
        )

    def send(self, **cmd) -> None:
        assert self.p.stdin is not None
        self.p.stdin.write(json.dumps(cmd) + "\n")
        self.p.stdin.flush()

    def answer(self) -> dict:
        assert self.p.stdout is not None
        for line in self.p.stdout:
            if line.startswith("@@ "):
                out = json.loads(line[3:])
                if not out["ok"]:
                    raise AssertionError(f"{self.name} failed:\n{out['error']}\n{self.tail()}")
                return out
            self.log.write(line)
        raise AssertionError(f"{self.name} exited (code {self.p.wait()}):\n{self.tail()}")

    def tail(self) -> str:
        self.log.flush()
        return "".join(self.log_path.read_text().splitlines(True)[-40:])

    def stop(self) -> None:
        if self.p.poll() is None:
            try:
                self.send(op="quit")
                self.p.wait(timeout=30)
            except Exception:
                self.p.kill()
                self.p.wait()
        self.log.close()


def all_answer(procs: list[Proc], timeout: float) -> list[dict]:
    """Every worker's answer, read concurrently (the workers wait for each other)."""
    out: list = [None] * len(procs)

    def read(i: int) -> None:
        try:
            out[i] = procs[i].answer()
        except BaseException as e:  # reported below, with the others
            out[i] = e

    threads = [threading.Thread(target=read, args=(i,), daemon=True) for i in range(len(procs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
    for p, o in zip(procs, out):
        if o is None:
            raise AssertionError(f"{p.name} did not answer within {timeout} s:\n{p.tail()}")
        if isinstance(o, BaseException):
            raise o
    return out


def session(
    tmp_path: Path,
    trainers: int,
    rollouts: int,
    options: dict,
    steps: int = STEPS,
    drop: int = -1,
    late: int = -1,
    stranger: int = -1,
) -> list[dict]:
    """Runs the workers through a seed and ``steps`` deltas, checking every rollout after each;
    at step ``drop`` the rollouts' consumer applies nothing (the check must catch it); at step
    ``late`` one more rollout worker joins (verl scaling up); at step ``stranger`` local
    processes that are not rollout workers knock on every trainer rank's link first."""
    from deltacast.integrations.verl import DeltacastCheckpointEngine

    procs = [Proc("trainer", r, trainers, tmp_path, options) for r in range(trainers)]
    procs += [Proc("rollout", i, 0, tmp_path, options) for i in range(rollouts)]
    actors, rolls = procs[:trainers], procs[trainers:]
    results = []
    try:
        for step in range(steps + 1):
            if step == late:
                newcomer = Proc("rollout", len(rolls), 0, tmp_path, options)
                procs.append(newcomer)
                rolls.append(newcomer)
                rollouts += 1
            for p in procs:
                p.send(op="prepare")
            meta = [a["metadata"] for a in all_answer(procs, 300)]
            if step == stranger:
                knock_on_every_trainer_link(meta[:trainers])
            kw_a, kw_r = DeltacastCheckpointEngine.build_topology(trainers, rollouts, meta)
            for i, p in enumerate(actors):
                p.send(op="init", kwargs={k: v[i] for k, v in kw_a.items()})
            for i, p in enumerate(rolls):
                p.send(op="init", kwargs={k: v[i] for k, v in kw_r.items()})
            all_answer(procs, 300)
            for p in procs:
                p.send(op="sync", step=step, drop=step == drop)
            answers = all_answer(procs, 300)
            for p in procs:
                p.send(op="finalize")
            all_answer(procs, 60)
            for p in rolls:
                p.send(op="check")
            checks = all_answer(rolls, 300)
            for p, c in zip(rolls, checks):
                assert not c["bad_params"], f"step {step}, {p.name}: {c['bad_params']}"
                assert not c["bad_mirror"], f"step {step}, {p.name}: mirror {c['bad_mirror']}"
            results.append(
                {
                    "step": step,
                    "metrics": answers[0]["metrics"],
                    "flushes": [a["flushes"] for a in answers[trainers:]],
                    "nans": checks[0]["nans"],
                }
            )
    finally:
        for p in procs:
            p.stop()
    return results


def knock_on_every_trainer_link(meta: list[dict]) -> None:
    """What a stranger on the node can do with a trainer rank's address alone: wrong secret and
    no secret are refused by name; garbage, silence and a huge length claim nothing."""
    import socket
    import struct

    import deltacast as dc
    from deltacast.net import FrameClient

    for m in meta:
        assert m["token"], "without a configured secret each trainer rank makes a token"
        with pytest.raises(dc.AuthenticationError, match="frame server 127.0.0.1"):
            FrameClient(m["address"], secret="not-the-token-0123456789abcdef", timeout_s=5)
        with pytest.raises(dc.LinkError, match="requires the shared secret"):
            FrameClient(m["address"], secret=None, timeout_s=5)
        host, port = m["address"].rsplit(":", 1)
        for payload in (b"GET / HTTP/1.1\r\n\r\n", b"", struct.pack("<BQ", 1, 1 << 62)):
            with socket.create_connection((host, int(port))) as s:
                s.sendall(payload)


@pytest.mark.parametrize("trainers", [2, 4])
def test_seed_and_ten_deltas_bit_exact_through_verls_consumer(tmp_path: Path, trainers: int) -> None:
    results = session(tmp_path, trainers, 2, {"timeout_s": 120.0})
    kinds = [r["metrics"]["deltacast/seed"] for r in results]
    assert kinds == [1.0] + [0.0] * STEPS, kinds
    for r in results:
        for flushes in r["flushes"]:
            if r["step"] == 0:
                assert flushes and set(flushes) == {"dense"}, r
            elif r["step"] == 7:
                assert flushes == [], r  # nothing changed: nothing to apply
            else:
                assert "indices" in flushes, r
    # The NaN of step 4 went dense (verl's consumers read NaN as "unchanged"); so did its
    # removal at step 6? No: a finite new value travels as indices.
    by_step = {r["step"]: r for r in results}
    assert by_step[4]["nans"] == 1 and "dense" in by_step[4]["flushes"][0]
    assert by_step[6]["nans"] == 0
    changed = [r["metrics"]["deltacast/changed_ratio_rank0"] for r in results[1:]]
    assert 0 < min(c for c in changed if c > 0) and max(changed) < 1, changed


def test_the_check_sees_a_consumer_that_applied_nothing(tmp_path: Path) -> None:
    with pytest.raises(AssertionError, match="step 2, rollout0"):
        session(tmp_path, 2, 1, {"timeout_s": 120.0}, steps=2, drop=2)


def test_a_rollout_worker_that_joins_late_is_seeded_and_the_others_take_deltas(
    tmp_path: Path,
) -> None:
    results = session(tmp_path, 2, 1, {"timeout_s": 120.0}, steps=4, late=3)
    kinds = [r["metrics"]["deltacast/seed"] for r in results]
    assert kinds == [1.0, 0.0, 0.0, 0.0, 0.0], kinds  # the trainer never re-seeds everyone
    first, newcomer = results[3]["flushes"]
    assert "indices" in first and set(newcomer) == {"dense"}, results[3]
    assert all("indices" in f for f in results[4]["flushes"]), results[4]


def test_a_trainer_link_beyond_loopback_needs_a_configured_secret(tmp_path: Path, monkeypatch) -> None:
    from deltacast.integrations.verl import EngineOptions, _Trainer

    monkeypatch.delenv("DELTACAST_SECRET", raising=False)
    for host in ("0.0.0.0", "10.1.2.3", "trainer-node"):
        with pytest.raises(ValueError, match="not loopback; set secret_file"):
            _Trainer(EngineOptions(host=host), 1 << 20).prepare()
    secret = tmp_path / "secret"
    secret.write_text("s" * 40 + "\n")
    meta = _Trainer(EngineOptions(host="0.0.0.0", secret_file=str(secret)), 1 << 20).prepare()
    assert meta["token"] is None and meta["address"].startswith("0.0.0.0:"), meta


def test_strangers_on_the_trainer_links_are_refused_and_the_sync_goes_on(tmp_path: Path) -> None:
    results = session(tmp_path, 2, 1, {"timeout_s": 120.0}, steps=2, stranger=1)
    assert [r["metrics"]["deltacast/seed"] for r in results] == [1.0, 0.0, 0.0], results
