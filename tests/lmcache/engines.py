"""What the LMCache scripts share: the serving engine's side on the CPU, and an LMCache engine
configured only through LMCache's own config with hostlib.lmcache as its storage plug-in."""

import torch
from lmcache.v1.cache_engine import LMCacheEngineBuilder
from lmcache.v1.config import LMCacheEngineConfig
from lmcache.v1.gpu_connector import GPUConnectorInterface
from lmcache.v1.metadata import LMCacheMetadata


class CPUConnector(GPUConnectorInterface):
    """The engine's KV is [2, layers, tokens, heads * dim] (LMCache's KV_2LTD), copied into
    and out of LMCache's memory objects."""

    def __init__(self, layers: int, hidden: int):
        self.layers, self.hidden = layers, hidden

    def from_gpu(self, memory_obj, start, end, **kw):
        memory_obj.tensor.copy_(kw["kvcaches"][:, :, start:end, :])

    def to_gpu(self, memory_obj, start, end, **kw):
        kw["kvcaches"][:, :, start:end, :].copy_(memory_obj.tensor)

    def batched_from_gpu(self, memory_objs, starts, ends, **kw):
        for m, s, e in zip(memory_objs, starts, ends, strict=True):
            self.from_gpu(m, s, e, **kw)

    def batched_to_gpu(self, memory_objs, starts, ends, **kw):
        for m, s, e in zip(memory_objs, starts, ends, strict=True):
            self.to_gpu(m, s, e, **kw)

    def get_shape(self, num_tokens):
        return torch.Size([2, self.layers, num_tokens, self.hidden])


def engine(name: str, sock: str, *, layers: int, heads: int, dim: int, chunk: int,
           cpu_gib: float, quant: str = "none", plugin: dict | None = None, **more):
    """An engine of a tiny fp16 model whose chunks the drive keeps (`plugin`: more of the
    plug-in's settings, e.g. {"evict": "none"}; `more`: other LMCache settings, e.g.
    blocking_timeout_secs)."""
    cfg = LMCacheEngineConfig.from_dict({
        "chunk_size": chunk, "local_cpu": True, "max_local_cpu_size": cpu_gib,
        "remote_storage_plugins": ["ssdemu"], **more,
        "extra_config": {
            "remote_storage_plugin.ssdemu.module_path": "hostlib.lmcache",
            "remote_storage_plugin.ssdemu.class_name": "SsdemuConnectorAdapter",
            "remote_storage_plugin.ssdemu.socket": sock,
            "remote_storage_plugin.ssdemu.quant": quant,
            "remote_storage_plugin.ssdemu.queue_pairs": 2,
            **{f"remote_storage_plugin.ssdemu.{k}": v for k, v in (plugin or {}).items()},
        }})
    md = LMCacheMetadata(model_name="tiny", world_size=1, local_world_size=1, worker_id=0,
                         local_worker_id=0, kv_dtype=torch.float16,
                         kv_shape=(layers, 2, chunk, heads, dim))
    e = LMCacheEngineBuilder.get_or_create(name, cfg, md, CPUConnector(layers, heads * dim),
                                           None, None)
    e.post_init()
    return e


def remote(e):
    """The engine's RemoteBackend (the plug-in)."""
    return next(b for n, b in e.storage_manager.get_active_storage_backends()
                if n.startswith("RemoteBackend"))
