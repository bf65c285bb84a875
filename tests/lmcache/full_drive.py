"""Run by tests/test_lmcache.py in the LMCache venv: an LMCache engine storing more chunks than
the drive holds (the plug-in's `evict` setting as argv[2]), then a cold reader engine looking
up and retrieving what the drive kept.  Prints one JSON object of what it saw."""

import json
import sys
import time

import torch
from engines import engine, remote
from lmcache.v1.cache_engine import LMCacheEngineBuilder
from lmcache.v1.config import LMCacheEngineConfig

from hostlib.lmcache import SsdemuConnector

SOCK, EVICT, SEQS = sys.argv[1], sys.argv[2], int(sys.argv[3])
LAYERS, HEADS, DIM, CHUNK = 4, 8, 128, 64  # a chunk is 1 MiB of fp16
TOKENS = 4 * CHUNK  # four chunks a sequence, no prefix shared between sequences


def make(name: str):
    return engine(name, SOCK, layers=LAYERS, heads=HEADS, dim=DIM, chunk=CHUNK, cpu_gib=0.1,
                  plugin={"evict": EVICT})


torch.manual_seed(0)
seqs = [torch.arange(i * 10_000, i * 10_000 + TOKENS) for i in range(SEQS)]
kvs = [torch.randn(2, LAYERS, TOKENS, HEADS * DIM).half() for _ in range(SEQS)]

writer = make("writer")
backend = remote(writer)
for s, kv in zip(seqs, kvs, strict=True):
    writer.store(s, kvcaches=kv)
    deadline = time.monotonic() + 60
    while backend.put_tasks and time.monotonic() < deadline:  # in the drive's order
        time.sleep(0.01)
conn = backend.connection._connector  # the plug-in, inside LMCache's wrapper
out = {"put_failed": backend._put_failed_count, "evictions": conn.evictions}
try:  # a setting the plug-in does not know: refused when LMCache makes the connector
    SsdemuConnector(conn.loop, conn.local_cpu_backend, LMCacheEngineConfig.from_dict(
        {"extra_config": {"remote_storage_plugin.ssdemu.socket": SOCK,
                          "remote_storage_plugin.ssdemu.evict": "fifo"}}))
    out["bad_evict"] = "accepted"
except ValueError as e:
    out["bad_evict"] = str(e)
LMCacheEngineBuilder.destroy("writer")

reader = make("reader")  # a cold local CPU cache: everything comes from the drive
out["lookups"] = [reader.lookup(s) for s in seqs]
got = torch.zeros_like(kvs[-1])
out["retrieved_last"] = int(reader.retrieve(seqs[-1], kvcaches=got).sum())
out["exact_last"] = torch.equal(got, kvs[-1])
LMCacheEngineBuilder.destroy("reader")

# an engine that stored nothing before, on the full drive: it evicts chunks it never touched
extra = [torch.arange(900_000 + i * 10_000, 900_000 + i * 10_000 + TOKENS) for i in range(2)]
g = torch.Generator().manual_seed(1)  # bytes of their own (the drive deduplicates)
extra_kvs = [torch.randn(2, LAYERS, TOKENS, HEADS * DIM, generator=g).half() for _ in extra]
late = make("late")
for s, kv in zip(extra, extra_kvs, strict=True):
    late.store(s, kvcaches=kv)
    deadline = time.monotonic() + 60
    while remote(late).put_tasks and time.monotonic() < deadline:
        time.sleep(0.01)
out["late_put_failed"] = remote(late)._put_failed_count
out["late_evictions"] = remote(late).connection._connector.evictions
LMCacheEngineBuilder.destroy("late")
reader = make("reader2")
out["late_lookups"] = [reader.lookup(s) for s in extra]
LMCacheEngineBuilder.destroy("reader2")
print(json.dumps(out))
