"""One worker of the verl backend test, run as its own process (test_verl_backend.py drives it):

    python _verl_worker.py trainer RANK WORLD WORKDIR OPTIONS_JSON
    python _verl_worker.py rollout INDEX 0 WORKDIR OPTIONS_JSON

It reads one JSON command per line on stdin and answers each with one line ``@@ {json}`` on
stdout (anything else there is the packages' own logging). Commands, in the order verl's
``CheckpointEngineManager.update_weights`` issues them: ``prepare``, ``init`` (the kwargs that
``build_topology`` made for this worker), ``sync`` (trainer: ``send_weights`` of a generator of
the step's fp32 tensors; rollout: verl's ``CheckpointEngineWorker.update_weights``, whose server
adapter feeds every flush to verl's own SGLang consumer ``delta_loader.apply_delta`` on a real
SGLang Qwen2 model), ``finalize``, and for rollouts ``check``: the model's parameters against a
fresh model that loaded the step's checkpoint (torch's own bf16 rounding of the fp32 state)
with SGLang's ``load_weights``, bit for bit."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import traceback
from pathlib import Path

ARCH = "qwen2"
CONSUMER = "verl.workers.rollout.sglang_rollout.delta_loader.apply_delta"


def fp32_states(torch, shapes: dict, steps: int):
    """The trainer's fp32 parameters at steps 0..steps (the same in every process): random
    weights, then noise of a per-step size, with edge values set at fixed steps: ±0, fp32
    subnormals (which round to bf16 subnormals or zero), ±inf, a value that rounds up to inf,
    a NaN (step 4, gone at step 6), a step that changes nothing (7)."""
    g = torch.Generator().manual_seed(1234)
    w = {n: torch.randn(s, generator=g, dtype=torch.float32) * 0.05 for n, s in shapes.items()}
    yield {n: t.clone() for n, t in w.items()}
    names = list(shapes)
    for step in range(1, steps + 1):
        scale = {1: 3e-5, 2: 1e-4, 3: 1e-6, 5: 3e-3}.get(step, 2e-5)
        for n in names:
            noise = torch.randn(w[n].shape, generator=g, dtype=torch.float32)
            if step != 7:
                w[n] += scale * noise
        norm = w["model.layers.0.input_layernorm.weight"]
        if step == 2:
            edge = [0.0, -0.0, 1e-40, -1e-39, 9.2e-41, float("inf"), float("-inf"), 3.4e38]
            norm[: len(edge)] = torch.tensor(edge, dtype=torch.float32)
        if step == 4:
            norm[9] = float("nan")
        if step == 6:
            norm[9] = 0.5
        yield {n: t.clone() for n, t in w.items()}


def reply(obj: dict) -> None:
    sys.stdout.write("@@ " + json.dumps(obj) + "\n")
    sys.stdout.flush()


def engine_kwargs(options: dict) -> dict:
    return {"deltacast": options}


class Adapter:
    """The rollout server adapter verl hands ``receive_weights`` to: each ``delta_flush``
    item goes to verl's own SGLang consumer, in this process, on the live model."""

    def __init__(self, model) -> None:
        self.model = model
        self.flushes: list[str] = []
        # A test of the test: take the flushes but apply none (the check must see it).
        self.drop = False

    async def update_weights(self, weights, global_steps=None, wire_format="named_tensors", **kw):
        import importlib

        import torch

        assert wire_format == "delta_flush", wire_format
        mod, fn = CONSUMER.rsplit(".", 1)
        apply = getattr(importlib.import_module(mod), fn)
        self.flushes = []
        for named, is_last in weights:
            spec = json.loads(bytes(dict(named)["__delta_spec__"].numpy().tobytes()))
            self.flushes.append(spec["encoding"])
            if self.drop:
                continue
            with torch.no_grad():
                apply(self.model, named)
            del is_last


def main() -> int:
    role, index, world, workdir, options = sys.argv[1:6]
    index, world, workdir, options = int(index), int(world), Path(workdir), json.loads(options)
    import torch

    from deltacast.integrations import tiny
    from verl.checkpoint_engine.base import CheckpointEngineRegistry, CheckpointEngineWorker
    from verl.utils.import_utils import import_external_libs
    from verl.workers.config import CheckpointEngineConfig, RolloutConfig

    torch.set_num_threads(1)
    cfg = tiny.CONFIGS[ARCH]
    shapes = tiny.hf_shapes(cfg)
    states = fp32_states(torch, shapes, 64)
    current: dict = {}
    ce_config = CheckpointEngineConfig(
        backend="deltacast",
        custom_backend_module="deltacast.integrations.verl",
        engine_kwargs=engine_kwargs(options),
        update_weights_bucket_megabytes=1,
    )
    if role == "trainer":
        # As verl's actor worker builds it (engine_workers.py).
        import_external_libs(ce_config.custom_backend_module)
        engine = CheckpointEngineRegistry.new(
            "deltacast",
            is_master=index == 0,
            bucket_size=ce_config.update_weights_bucket_megabytes << 20,
            **options,
        )
        worker = None
        model = adapter = None
    else:
        from deltacast.integrations import sglang_model as glue

        glue.init_distributed(1, 0, str(workdir / f"dist-rollout-{index}"))
        cdir = tiny.write_config(workdir / f"config-{index}", ARCH)
        model = glue.build_model(cdir, "bfloat16")
        adapter = Adapter(model)
        # What Ray sets for a worker of a group of one; the process group already exists
        # (SGLang's), so verl's own initialisation keeps it.
        for k, v in (("WORLD_SIZE", "1"), ("RANK", "0"), ("MASTER_ADDR", "127.0.0.1")):
            os.environ.setdefault(k, v)
        os.environ.setdefault("MASTER_PORT", "1")
        worker = CheckpointEngineWorker(
            RolloutConfig(name="sglang", checkpoint_engine=ce_config), None, server_adapter=adapter
        )
        engine = worker.checkpoint_engine

    for line in sys.stdin:
        cmd = json.loads(line)
        try:
            op = cmd["op"]
            if op == "prepare":
                reply({"ok": True, "metadata": engine.prepare()})
            elif op == "init":
                engine.init_process_group(**cmd["kwargs"])
                reply({"ok": True})
            elif op == "sync":
                step = cmd["step"]
                while len(current) == 0 or current["step"] < step:
                    current.update(step=current.get("step", -1) + 1, w=next(states))
                if role == "trainer":
                    gen = ((n, t) for n, t in current["w"].items())
                    metrics = asyncio.run(engine.send_weights(gen, global_steps=step))
                    reply({"ok": True, "metrics": metrics})
                else:
                    adapter.drop = bool(cmd.get("drop"))
                    asyncio.run(worker.update_weights(global_steps=step))
                    reply({"ok": True, "flushes": adapter.flushes})
            elif op == "finalize":
                engine.finalize()
                reply({"ok": True})
            elif op == "check":
                reply({"ok": True, **check(torch, model, engine, current["w"], workdir, index)})
            elif op == "quit":
                reply({"ok": True})
                break
            else:
                raise ValueError(f"unknown op {op!r}")
        except Exception:
            reply({"ok": False, "error": traceback.format_exc()})
    return 0


def check(torch, model, engine, w: dict, workdir: Path, index: int) -> dict:
    """The live model and the backend's mirror against the step's bf16 checkpoint."""
    from deltacast.integrations import sglang_model as glue
    from deltacast.integrations import tiny

    expected = {n: t.to(torch.bfloat16) for n, t in w.items()}
    fresh = glue.build_model(tiny.write_config(workdir / f"config-{index}", ARCH), "bfloat16")
    with torch.no_grad():
        glue.load(fresh, list(expected.items()))
    want = dict(fresh.named_parameters())
    bad_params = []
    for name, p in model.named_parameters():
        a, b = p.detach().view(torch.int16), want[name].detach().view(torch.int16)
        if not torch.equal(a, b):
            bad_params.append([name, int((a != b).sum()), int(a.numel())])
    mirror = engine.rollout.mirror
    bad_mirror = [
        n
        for n, t in expected.items()
        if mirror[n].tobytes() != t.reshape(-1).view(torch.int16).numpy().tobytes()
    ]
    nans = sum(int(torch.isnan(t).sum()) for t in expected.values())
    return {"bad_params": bad_params, "bad_mirror": bad_mirror, "nans": nans}


if __name__ == "__main__":
    sys.exit(main())
