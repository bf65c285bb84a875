"""Run by tests/test_lmcache.py in the LMCache venv (make builds .venv-lmcache): LMCache's own
engine, on CPU torch, with hostlib.lmcache as its storage plug-in, against a running daemon.
Prints one JSON object of what it saw."""

import json
import sys
import time

import torch
from engines import engine as _engine  # beside this script
from engines import remote
from lmcache.v1.cache_engine import LMCacheEngineBuilder

SOCK, QUANT = sys.argv[1], sys.argv[2]
LAYERS, HEADS, DIM, CHUNK = 4, 2, 64, 16


def engine(name: str):
    return _engine(name, SOCK, layers=LAYERS, heads=HEADS, dim=DIM, chunk=CHUNK,
                   cpu_gib=0.1, quant=QUANT)



torch.manual_seed(0)
shared = torch.arange(48)
seq_a = torch.cat([shared, torch.arange(100, 116)])  # 4 chunks
seq_b = torch.cat([shared, torch.arange(200, 232)])  # 3 shared chunks, then 2 of its own
kv_a = torch.randn(2, LAYERS, 64, HEADS * DIM).half()
kv_b = torch.cat([kv_a[:, :, :48], torch.randn(2, LAYERS, 32, HEADS * DIM).half()], dim=2)

writer = engine("writer")
writer.store(seq_a, kvcaches=kv_a)
writer.store(seq_b, kvcaches=kv_b)
backend = remote(writer)
deadline = time.monotonic() + 60
while backend.put_tasks and time.monotonic() < deadline:  # the drive's puts, in flight
    time.sleep(0.05)
LMCacheEngineBuilder.destroy("writer")

reader = engine("reader")  # a cold local CPU cache: everything comes from the drive
out = {"lookup_a": reader.lookup(seq_a), "lookup_b": reader.lookup(seq_b),
       "lookup_other": reader.lookup(torch.cat([shared[:32], torch.arange(900, 932)])),
       "lookup_none": reader.lookup(torch.arange(5000, 5064))}
got_a = torch.zeros_like(kv_a)
got_b = torch.zeros_like(kv_b)
out["retrieved_a"] = int(reader.retrieve(seq_a, kvcaches=got_a).sum())
out["retrieved_b"] = int(reader.retrieve(seq_b, kvcaches=got_b).sum())
out["exact_a"] = torch.equal(got_a, kv_a)
out["exact_b"] = torch.equal(got_b, kv_b)
out["max_err"] = max(float((got_a.float() - kv_a.float()).abs().max()),
                     float((got_b.float() - kv_b.float()).abs().max()))


def over_bound(got, want, levels):
    """The largest error over its group's bound: half a quantization step of the group
    (head_dim elements of one token, K or V, layer, head), plus an fp16 rounding."""
    w = want.float().view(2, LAYERS, -1, HEADS, DIM)
    err = (got.float().view_as(w) - w).abs()
    step = (w.amax(-1, keepdim=True) - w.amin(-1, keepdim=True)) / levels
    return float((err / (step / 2 + w.abs() * 2**-10 + 1e-6)).max())


levels = {"int8_g64": 255, "int4_g64": 15}.get(QUANT)
if levels:
    out["max_err_over_bound"] = max(over_bound(got_a, kv_a, levels),
                                    over_bound(got_b, kv_b, levels))
out["listed"] = len(reader.storage_manager.loop and __import__("asyncio")
                    .run_coroutine_threadsafe(remote(reader).connection.list(),
                                              reader.storage_manager.loop).result(30))
LMCacheEngineBuilder.destroy("reader")
print(json.dumps(out))
