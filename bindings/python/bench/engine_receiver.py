"""Side by side, one process: deltas into an engine's bf16 parameters (identity layout, 8 slots
of 2M elements, every slot touched) through (a) LayoutReceiver (the ChangeReceiver: reads and
writes the changed elements only, no copy of the state) and (b) the approach it replaced: a
plain Receiver into a host shadow copy of the checkpoint, then apply_slot of every slot whose
digest moved. Both end bit-identical to the sender (checked). Needs torch (an engine venv):

    ~/.cache/deltacast/engines/vllm-0.33.0/bin/python bindings/python/bench/engine_receiver.py
"""
import time

import deltacast
import numpy as np
import torch
from deltacast.integrations.layout import EngineLayout, ParamLayout, Block
from deltacast.integrations.layout_apply import apply_slot
from deltacast.integrations.engine_receiver import LayoutReceiver
N, S = 2_000_000, 8
names = [f"w{i}" for i in range(S)]

def whole(n):
    return Block(slot=n, src=0, dst=0, length=N, count=1, src_stride=0, dst_stride=0)


params = {n: ParamLayout(shape=(N,), blocks=[whole(n)]) for n in names}
lay = EngineLayout(rank=0, world=1, slots={n: (N,) for n in names}, params=params)
table = deltacast.SlotTable([(n, "bf16", (N,)) for n in names])
rng = np.random.default_rng(1)
cur = {n: rng.integers(0, 1 << 16, N, dtype=np.uint16) for n in names}
sender = deltacast.Sender(table)
seed = sender.sync(cur).frames
params_a = {n: torch.zeros(N, dtype=torch.bfloat16) for n in names}
params_b = {n: torch.zeros(N, dtype=torch.bfloat16) for n in names}
rx_a = LayoutReceiver(table, lay, params_a)
rx_a.receive_all(seed)
shadow = {n: np.zeros(N, dtype=np.uint16) for n in names}
rx_b = deltacast.Receiver(table, shadow)
for f in seed:
    rx_b.receive(f)
for n in names:
    apply_slot(lay, params_b, n, torch.from_numpy(shadow[n]).view(torch.bfloat16))
mb = sum(a.nbytes for a in shadow.values()) / 1e6
print(f"# {time.strftime('%Y-%m-%d')}, {N * S / 1e6:.0f}M bf16 elements, {S} slots; "
      f"shadow copy (b only): {mb:.0f} MB per rank")
for density in (0.001, 0.01, 0.05):
    ta = tb = 0.0
    for rep in range(3):
        for n in names:
            pos = rng.choice(N, size=int(N * density), replace=False)
            cur[n][pos] ^= 1
        frames = sender.sync(cur).frames
        t = time.perf_counter(); rx_a.receive_all(frames); ta += time.perf_counter() - t
        t = time.perf_counter()
        before = dict(rx_b.digests)
        for f in frames: rx_b.receive(f)
        for n in names:
            if rx_b.digests[n] != before[n]:
                apply_slot(lay, params_b, n, torch.from_numpy(shadow[n]).view(torch.bfloat16))
        tb += time.perf_counter() - t
        for n in names:
            want = torch.from_numpy(cur[n].view(np.int16))
            assert torch.equal(params_a[n].view(torch.int16), want)
            assert torch.equal(params_b[n].view(torch.int16), params_a[n].view(torch.int16))
    print(f"density {density:.3f}: change receiver {ta / 3 * 1e3:.1f} ms, "
          f"shadow+apply_slot {tb / 3 * 1e3:.1f} ms per sync, ratio {ta / tb:.2f}")
