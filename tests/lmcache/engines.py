"""The serving engine's side of the LMCache scripts, on the CPU: its KV is [2, layers, tokens,
heads * dim] (LMCache's KV_2LTD), copied into and out of LMCache's memory objects."""

import torch
from lmcache.v1.gpu_connector import GPUConnectorInterface


class CPUConnector(GPUConnectorInterface):
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
