"""The LMCache side of `ssdemu bench lmcache`, run in the LMCache venv (.venv-lmcache) by
ssdemu/bench/lmcache.py: Llama-3-8B-shaped chunks (256 tokens x 32 layers x 8 KV heads x 128, fp16:
32 MiB each) stored into and retrieved from two LMCache storage backends through the same
StorageBackendInterface calls, in one run: the ssdemu plug-in (hostlib.lmcache, a
RemoteBackend) and LMCache's own LocalDiskBackend on the same filesystem as the drive's
media file.  Retrieves both ways LMCache makes them: one chunk at a time (get_blocking) and
every chunk at once (batched_get_blocking: the plug-in's batched_get runs them concurrently
on LMCache's loop, as a vLLM connector's retrieve of a whole prefix does).  LocalDisk twice:
with its files in the page cache (warm: memory speed, not the disk's) and with them dropped
from it (cold, POSIX_FADV_DONTNEED per file: what a disk gives; the drive's media is opened
O_DIRECT, always cold).  Prints one JSON object."""

import json
import os
import sys
import time

import torch
from lmcache.utils import CacheEngineKey
from lmcache.v1.cache_engine import LMCacheEngineBuilder
from lmcache.v1.config import LMCacheEngineConfig
from lmcache.v1.memory_management import MemoryFormat
from lmcache.v1.metadata import LMCacheMetadata

SOCK, DISK_DIR, CHUNKS = sys.argv[1], sys.argv[2], int(sys.argv[3])
QUANT = sys.argv[4] if len(sys.argv) > 4 else "none"
# both: the plug-in, then LocalDisk; local_disk: LocalDisk alone (its folder on ext4 on the
# drive: `bench lmcache --on-drive`)
WHICH = sys.argv[5] if len(sys.argv) > 5 else "both"
LAYERS, HEADS, DIM, TOKENS = 32, 8, 128, 256
SHAPE = torch.Size([2, LAYERS, TOKENS, HEADS * DIM])
CHUNK_BYTES = SHAPE.numel() * 2


def build():
    gib = CHUNKS * CHUNK_BYTES / 2**30
    cfg = LMCacheEngineConfig.from_dict({
        "chunk_size": TOKENS, "local_cpu": True, "max_local_cpu_size": 2 * gib + 1,
        "local_disk": f"file://{DISK_DIR}/", "max_local_disk_size": 2 * gib + 1,
        "remote_storage_plugins": ["ssdemu"],
        "extra_config": {
            "remote_storage_plugin.ssdemu.module_path": "hostlib.lmcache",
            "remote_storage_plugin.ssdemu.class_name": "SsdemuConnectorAdapter",
            "remote_storage_plugin.ssdemu.socket": SOCK,
            "remote_storage_plugin.ssdemu.quant": QUANT,
            "remote_storage_plugin.ssdemu.queue_pairs": 4,
        }})
    md = LMCacheMetadata(model_name="llama-3-8b", world_size=1, local_world_size=1,
                         worker_id=0, local_worker_id=0, kv_dtype=torch.float16,
                         kv_shape=(LAYERS, 2, TOKENS, HEADS, DIM))
    e = LMCacheEngineBuilder.get_or_create("bench", cfg, md, None, None, None)
    e.post_init()
    return e


def wait_stored(backend, keys, timeout=600.0) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if not any(backend.exists_in_put_tasks(k) for k in keys) and \
                all(backend.contains(k) for k in keys):
            return
        time.sleep(0.002)
    raise TimeoutError("the backend did not finish storing")


def drop_page_cache(folder: str) -> None:
    """LocalDisk's files out of the page cache (written back first)."""
    for root, _dirs, files in os.walk(folder):
        for f in files:
            fd = os.open(os.path.join(root, f), os.O_RDONLY)
            try:
                os.fdatasync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def retrieve(backend, keys, objs, batched: bool) -> tuple[float, bool]:
    t0 = time.perf_counter()
    got = backend.batched_get_blocking(keys) if batched else \
        [backend.get_blocking(k) for k in keys]
    seconds = time.perf_counter() - t0
    exact = all(g is not None and torch.equal(g.tensor, o.tensor)
                for g, o in zip(got, objs, strict=True))
    for g in got:
        if g is not None:
            g.ref_count_down()
    return seconds, exact


def measure(name, backend, cpu, keys, objs, cold_dir: str | None = None) -> dict:
    t0 = time.perf_counter()
    backend.batched_submit_put_task(keys, objs)
    wait_stored(backend, keys)
    store_s = time.perf_counter() - t0
    mb = len(keys) * CHUNK_BYTES / 1e6
    out = {"store_MBps": mb / store_s, "store_s": store_s}
    exact = True
    for batched, tag in ((False, "retrieve"), (True, "retrieve_concurrent")):
        s, ok = retrieve(backend, keys, objs, batched)
        out[f"{tag}_MBps"], out[f"{tag}_s"] = mb / s, s
        exact = exact and ok
        if cold_dir is not None:
            drop_page_cache(cold_dir)
            s, ok = retrieve(backend, keys, objs, batched)
            out[f"{tag}_cold_MBps"], out[f"{tag}_cold_s"] = mb / s, s
            exact = exact and ok
    out["bit_exact"] = exact
    return out


def main() -> None:
    e = build()
    backends = dict(e.storage_manager.get_active_storage_backends())
    cpu = backends["LocalCPUBackend"]
    plugin = next(b for n, b in backends.items() if n.startswith("RemoteBackend"))
    disk = next(b for n, b in backends.items() if n.startswith("LocalDiskBackend"))
    out = {"chunks": CHUNKS, "chunk_bytes": CHUNK_BYTES, "quant": QUANT}
    torch.manual_seed(0)
    runs = (("plugin", plugin), ("local_disk", disk))
    for name, backend in runs if WHICH == "both" else runs[1:]:
        keys = [CacheEngineKey("llama-3-8b", 1, 0, hash((name, i)), torch.float16)
                for i in range(CHUNKS)]
        objs = []
        for _ in range(CHUNKS):
            m = cpu.allocate(SHAPE, torch.float16, MemoryFormat.KV_2LTD)
            m.tensor.copy_(torch.randn(SHAPE, dtype=torch.float16))
            objs.append(m)
        out[name] = measure(name, backend, cpu, keys, objs,
                            cold_dir=DISK_DIR if name == "local_disk" else None)
        for m in objs:
            m.ref_count_down()
    if QUANT != "none" and "plugin" in out:
        out["plugin"]["bit_exact"] = None  # quantized: within its bound, not exact
    LMCacheEngineBuilder.destroy("bench")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
