"""numpy views of the queue-pair layout, derived from the compiled C structs (c/wire/sde_queue.h is
the one definition), and the names of opcodes and status codes."""

from __future__ import annotations

import numpy as np

from ssdemu_wire import _ring

ffi, lib = _ring.ffi, _ring.lib

_NUMPY_OF_C = {"uint64_t": np.uint64, "int64_t": np.int64, "uint32_t": np.uint32,
               "int32_t": np.int32, "uint16_t": np.uint16, "int16_t": np.int16,
               "uint8_t": np.uint8, "int8_t": np.int8, "double": np.float64}


def dtype_of_struct(ctype: str, of_ffi=None) -> np.dtype:
    """A numpy dtype with the exact field offsets and size of a compiled C struct (of this
    module's ffi, or of another cffi module's)."""
    f = of_ffi or ffi
    t = f.typeof(ctype)
    names, formats, offsets = [], [], []
    for name, field in t.fields:
        names.append(name)
        if field.type.kind == "array":
            formats.append((_NUMPY_OF_C[field.type.item.cname], field.type.length))
        else:
            formats.append(_NUMPY_OF_C[field.type.cname])
        offsets.append(field.offset)
    return np.dtype({"names": names, "formats": formats, "offsets": offsets,
                     "itemsize": f.sizeof(ctype)})

SQE_DTYPE = dtype_of_struct("sde_sqe")
CQE_DTYPE = dtype_of_struct("sde_cqe")
RING_HDR_DTYPE = dtype_of_struct("sde_ring_hdr")
# TOPK_PAGES and ATTEND's request header (c/wire/sde_queue.h)
REQUEST_DTYPE = dtype_of_struct("sde_retrieval_req")
# COUNTERS' output: the drive model's books at the command's turn
COUNTERS_DTYPE = dtype_of_struct("sde_counters")
RETRIEVAL_MAGIC = lib.SDE_RETRIEVAL_MAGIC
RETRIEVAL_INT8 = lib.SDE_RETRIEVAL_INT8
PROTOCOL_VERSION = lib.SDE_PROTOCOL_VERSION
# what one retrieval command may ask (c/wire/sde_queue.h SDE_RETRIEVAL_MAX_*)
RETRIEVAL_MAX_KEYS = lib.SDE_RETRIEVAL_MAX_KEYS
RETRIEVAL_MAX_SCORED = lib.SDE_RETRIEVAL_MAX_SCORED
RETRIEVAL_MAX_READ = lib.SDE_RETRIEVAL_MAX_READ
RETRIEVAL_MAX_RESULT = lib.SDE_RETRIEVAL_MAX_RESULT


def retrieval_over_limit(op: str, *, kv_heads: int, head_dim: int, page_tokens: int,
                         nkeys: int, k: int, sink_pages: int, recent_pages: int,
                         rerank: int) -> str | None:
    """Why a TOPK_PAGES or ATTEND of this shape is past the bounds one command may ask
    (SDE_RETRIEVAL_MAX_*: the drive answers RETRIEVAL_LIMIT), or None.  What the header
    alone tells: the drive also stops scoring once the sequence's pages pass
    RETRIEVAL_MAX_SCORED (each block holds at least one page: checked here as a floor)."""
    if nkeys > RETRIEVAL_MAX_KEYS:
        return f"{nkeys} blocks: a command takes at most {RETRIEVAL_MAX_KEYS}"
    if kv_heads * nkeys * head_dim > RETRIEVAL_MAX_SCORED:
        return (f"{nkeys} blocks of at least a page each, x {kv_heads} KV heads x {head_dim} "
                f"channels: more than the {RETRIEVAL_MAX_SCORED} summary elements a command "
                "scores")
    page = page_tokens * kv_heads * head_dim
    if op == "TOPK_PAGES":
        if kv_heads * k * 8 > RETRIEVAL_MAX_RESULT:
            return (f"k={k} x {kv_heads} KV heads: a result of {kv_heads * k * 8} bytes, more "
                    f"than {RETRIEVAL_MAX_RESULT}")
        if max(1, rerank) > 1 and k * rerank * page > RETRIEVAL_MAX_READ:
            return (f"a re-rank of k={k} x rerank={rerank} pages of {page_tokens} tokens x "
                    f"{kv_heads} KV heads x {head_dim} channels reads more than "
                    f"{RETRIEVAL_MAX_READ} key elements")
    elif (k + sink_pages + recent_pages) * page > RETRIEVAL_MAX_READ:
        return (f"attention over k={k} + {sink_pages} sink + {recent_pages} recent pages of "
                f"{page_tokens} tokens x {kv_heads} KV heads x {head_dim} channels reads more "
                f"than {RETRIEVAL_MAX_READ} elements of keys (and as many of values)")
    return None


def _constants(prefix: str) -> dict[str, int]:
    return {name[len(prefix):]: getattr(lib, name) for name in dir(lib)
            if name.startswith(prefix) and name not in (prefix + "LAST", prefix + "COUNT")}


OPCODES = _constants("SDE_CMD_")  # name -> opcode
STATUS = _constants("SDE_SC_")  # name -> status code
STATUS_NAMES = {v: k for k, v in STATUS.items()}
NS_SHARED = lib.SDE_NS_SHARED  # NS_CREATE's param1: a namespace every client may use
NS_ALL_OWNERS = lib.SDE_NS_ALL_OWNERS  # NS_LIST's, NS_DELETE's param1: an admin's view
KV_DELETE_FORCE = lib.SDE_KV_DELETE_FORCE  # KV_DELETE's param0: even a key others pinned
NS_QUOTA = lib.SDE_NS_QUOTA  # NS_CREATE's result with CAPACITY_EXCEEDED: the uid's quota


def new_sqes(n: int) -> np.ndarray:
    return np.zeros(n, dtype=SQE_DTYPE)


# KV_STORE_QUANTIZED's request (sde_quant_req), at the start of the command's buffer (the raw
# KV block follows it) or apart: magic, element dtype code (ssdemu_wire.codes), the block's
# layout, scheme name, block shape, tokens per page of its page summaries (0: none).
QUANT_REQUEST_DTYPE = dtype_of_struct("sde_quant_req")
QUANT_REQUEST_BYTES = QUANT_REQUEST_DTYPE.itemsize
# the block's layout: the drive's (tokens, 2, layers, heads, head_dim), or LMCache's
# KV_2LTD (2, layers, tokens, heads, head_dim), which integer schemes take as it is
LAYOUTS = {"t2l": lib.SDE_QUANT_LAYOUT_T2L, "2lt": lib.SDE_QUANT_LAYOUT_2LT}


def pack_quant_request(dtype_code: int, scheme: str, tokens: int, layers: int, heads: int,
                       head_dim: int, layout: str = "t2l", summary_page: int = 0) -> bytes:
    name = scheme.encode("ascii")
    if len(name) > QUANT_REQUEST_DTYPE["scheme"].shape[0]:
        raise ValueError(f"a scheme name is at most {QUANT_REQUEST_DTYPE['scheme'].shape[0]} "
                         f"bytes: {scheme!r}")
    h = np.zeros(1, QUANT_REQUEST_DTYPE)
    h["scheme"][0, :len(name)] = np.frombuffer(name, np.uint8)
    for field, v in (("magic", lib.SDE_QUANT_MAGIC), ("dtype", dtype_code),
                     ("layout", LAYOUTS[layout]), ("tokens", tokens), ("layers", layers),
                     ("heads", heads), ("head_dim", head_dim),
                     ("summary_page", summary_page)):
        h[field] = v
    return h.tobytes()


def pack_retrieval_request(*, dtype_code: int, layer: int, layers: int, kv_heads: int,
                           q_heads: int, head_dim: int, page_tokens: int, keys, k: int,
                           sink_pages: int = 1, recent_pages: int = 1, rerank: int = 1,
                           int8: bool = False, queries: np.ndarray,
                           page_ids: np.ndarray | None = None,
                           check_limits: bool = True) -> np.ndarray:
    """TOPK_PAGES / ATTEND's buffer (c/wire/sde_queue.h): the header, the block keys (16 bytes
    each), the queries (float32), and ATTEND's page ids (int32).  A request past the bounds
    one command may ask (retrieval_over_limit) raises ValueError before anything is sent
    (check_limits=False: to see the drive refuse it)."""
    keys = [bytes(key) for key in keys]
    klen = len(keys[0]) if keys else 0
    if not keys or any(len(key) != klen for key in keys) or not 0 < klen <= 16:
        lengths = sorted({len(key) for key in keys})
        raise ValueError(f"a sequence is one or more keys of one length, 1 to 16 bytes (the "
                         f"request carries one key length); got lengths {lengths}: name the "
                         f"blocks with keys of one length, e.g. zero-padded numbers")
    why = retrieval_over_limit(
        "ATTEND" if page_ids is not None else "TOPK_PAGES", kv_heads=kv_heads,
        head_dim=head_dim, page_tokens=page_tokens, nkeys=len(keys), k=k,
        sink_pages=sink_pages, recent_pages=recent_pages, rerank=rerank)
    if why and check_limits:
        raise ValueError(f"past a retrieval command's bounds: {why}; split the sequence or "
                         "ask for fewer pages")
    h = np.zeros(1, REQUEST_DTYPE)
    for name, v in (("magic", RETRIEVAL_MAGIC), ("dtype", dtype_code),
                    ("flags", RETRIEVAL_INT8 if int8 else 0), ("layer", layer),
                    ("layers", layers), ("kv_heads", kv_heads), ("q_heads", q_heads),
                    ("head_dim", head_dim), ("page_tokens", page_tokens), ("key_len", klen),
                    ("nkeys", len(keys)), ("k", k), ("sink_pages", sink_pages),
                    ("recent_pages", recent_pages), ("rerank", rerank)):
        h[name] = v
    parts = [h.view(np.uint8), np.frombuffer(b"".join(key.ljust(16, b"\0") for key in keys),
                                             np.uint8),
             np.ascontiguousarray(queries, "<f4").reshape(-1).view(np.uint8)]
    if page_ids is not None:
        parts.append(np.ascontiguousarray(page_ids, "<i4").reshape(-1).view(np.uint8))
    return np.concatenate(parts)
