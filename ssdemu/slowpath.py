"""Commands the data plane hands to Python: admin (identify, namespaces, log pages) and the
compute commands (the firmware kernels: quantized store, dequantized retrieve, prefix
match).  KV commands and pins run in the data plane (c/sde_dev.c) against the C store.  One
handler per opcode in HANDLERS; a test checks that every opcode the C table routes here has
one.  Each returns an Outcome; data moved between the client's buffer (the daemon's mapping
of it) and the store is counted as copied."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

import numpy as np

from firmware.cost import (
    dequantize_cost,
    prefix_hash_cost,
    prefix_match_cost,
    quantize_cost,
)
from firmware.layout import ELEMENT_BYTES, KVShape, storage_dtype
from firmware.prefix_hash import hash_chain
from firmware.quant import dequantize, parse_scheme, quantize
from hostlib.prefix_hash import BLOCK_SIZES
from ssdemu import _engine
from ssdemu.queue_layout import OPCODES, QUANT_REQUEST, STATUS, unpack_quant_request
from ssdemu.store import (
    MAX_KEY,
    STORE_ANY,
    CorruptValue,
    KeyExists,
    KeyNotFound,
    StoreFull,
)

lib = _engine.lib


@dataclass
class Outcome:
    status: int
    result: int = 0
    bytes: int = 0  # moved for the client
    copied: int = 0  # copied by the daemon
    device_ns: int = 0  # modelled in-drive time (compute commands), 0: use the measured


def _ok(result: int = 0, nbytes: int = 0, copied: int = 0) -> Outcome:
    return Outcome(STATUS["SUCCESS"], result, nbytes, copied)


def _err(name: str, result: int = 0) -> Outcome:
    return Outcome(STATUS[name], result)


class SlowPath:
    def __init__(self, daemon):
        self.d = daemon
        self.vnow = 0  # the virtual clock: the latest submission stamp seen

    def run(self, client, sqe, t0_ns: int = 0) -> Outcome:
        handler = HANDLERS.get(sqe.opcode)
        if handler is None:
            return _err("INVALID_OPCODE")
        self._t0, self._submit = t0_ns, int(sqe.submit_time_ns)
        self.vnow = max(self.vnow, self._submit)  # the virtual clock never goes back
        return handler(self, client, sqe)

    @property
    def _virtual(self) -> bool:
        return self.d.clock == "virtual"

    def _stage(self, stage: int, offset: int = 0, nbytes: int = 0, after_ns: int = 0) -> int:
        """The timing model's time for a stage of this command (sde_dev_model_stage): a
        latency on the real clock, a completion time on the virtual one; 0 without a model."""
        return lib.sde_dev_model_stage(self.d.dev, stage, offset, nbytes, after_ns, self._t0,
                                       self._submit)

    def _then_compute(self, ready_ns: int, kernel: str, cost, host_ns: int) -> int:
        """A firmware kernel after a stage that ended at ready_ns (same clock conventions)."""
        if self._virtual:
            return self._charge(kernel, cost, host_ns, ready_ns=ready_ns)
        return ready_ns + self._charge(kernel, cost, host_ns)

    # -- helpers --
    def _region(self, client, sqe):
        """The client's buffer range named by the command, or None."""
        buf = client.buffers.get(int(sqe.buf)) if client else None
        off, length = int(sqe.buf_offset), int(sqe.length)
        if buf is None or off > buf.nbytes or length > buf.nbytes - off:
            return None
        return buf.mm, off, length

    def _reply_json(self, client, sqe, data) -> Outcome:
        region = self._region(client, sqe)
        if region is None:
            return _err("INVALID_BUFFER")
        mm, off, length = region
        payload = json.dumps(data).encode()
        if len(payload) > length:
            return _err("INVALID_BUFFER", len(payload))
        mm[off:off + len(payload)] = payload
        return _ok(len(payload))

    @staticmethod
    def _key(sqe):
        n = int(sqe.param1)  # the whole field: a length past 16 is refused, never truncated
        if not 1 <= n <= MAX_KEY:
            return None
        return (int(sqe.lba).to_bytes(8, "little") + int(sqe.key_hi).to_bytes(8, "little"))[:n]

    # -- admin --
    def identify(self, client, sqe):
        return self._reply_json(client, sqe, self.d.identify())

    def ns_list(self, client, sqe):
        return self._reply_json(client, sqe, self.d.namespace_list())

    def get_log(self, client, sqe):
        page = self.d.log_page(int(sqe.param0))
        if page is None:
            return _err("INVALID_FIELD")
        return self._reply_json(client, sqe, page)

    def ns_create(self, client, sqe):
        try:
            nsid = self.d.create_namespace(int(sqe.param0))
        except ValueError:
            return _err("INVALID_FIELD")
        except StoreFull:
            return _err("CAPACITY_EXCEEDED")
        return _ok(nsid)

    def ns_delete(self, client, sqe):
        try:
            self.d.delete_namespace(int(sqe.nsid))
        except KeyNotFound:
            return _err("INVALID_NAMESPACE")
        return _ok()

    # -- KV --
    def _kv_checks(self, sqe):
        if sqe.nsid != 0 or sqe.flags:
            return None, _err("INVALID_NAMESPACE" if sqe.nsid else "INVALID_FIELD")
        key = self._key(sqe)
        if key is None:
            return None, _err("KV_INVALID_KEY_SIZE")
        return key, None

    def _put(self, key: bytes, value, copied: int, arrived_ns: int) -> Outcome:
        """Store a value the drive made (a quantized store): ready at arrived_ns, only its
        NAND program is left to time."""
        try:
            did = self.d.store.put_ex(key, value, STORE_ANY)
        except KeyExists:
            return _err("KV_KEY_EXISTS")
        except KeyNotFound:
            return _err("KV_KEY_NOT_EXIST")
        except StoreFull:
            return _err("CAPACITY_EXCEEDED")
        except CorruptValue:
            return _err("MEDIA_ERROR")
        if did["wrote"]:  # no NAND program for bytes stored already
            programmed = self._stage(lib.SDE_STAGE_PROGRAM, did["offset"], len(value),
                                     after_ns=arrived_ns)
            device = arrived_ns if self.d.profile.write_cache.enabled else programmed or arrived_ns
        else:
            device = arrived_ns
        return Outcome(STATUS["SUCCESS"], int(did["existed"]), len(value), copied, device)

    def _keyed_region(self, client, sqe):
        """(key, client region) of a KV command that moves a value, or the Outcome of a
        failure."""
        key, bad = self._kv_checks(sqe)
        if bad:
            return bad
        region = self._region(client, sqe)
        if region is None:
            return _err("INVALID_BUFFER")
        return key, region

    def _stored(self, client, sqe):
        """(key, client region, stored value) for a retrieve, or the Outcome of a failure."""
        found = self._keyed_region(client, sqe)
        if isinstance(found, Outcome):
            return found
        key, region = found
        try:
            return key, region, self.d.store.get(key)
        except KeyNotFound:
            return _err("KV_KEY_NOT_EXIST")
        except CorruptValue:
            return _err("MEDIA_ERROR")

    # -- compute: the firmware, charged to the TOPS budget --
    def _charge(self, kernel: str, cost, host_ns: int, ready_ns: int = 0) -> int:
        """The firmware's time for one call.  Real clock: its latency from now, queueing on
        the compute units included.  Virtual clock: its completion time, starting when its
        input is ready (ready_ns: the NAND read or kernel that produced it) or else at the
        command's submission."""
        if self._virtual:
            _, done = self.d.budget.charge(kernel, cost, max(ready_ns, self.vnow), host_ns)
            return int(done)
        now = self.d.device_now_ns()
        _, done = self.d.budget.charge(kernel, cost, now, host_ns)
        return int(done - now)

    def kv_store_quantized(self, client, sqe):
        found = self._keyed_region(client, sqe)
        if isinstance(found, Outcome):
            return found
        key, (mm, off, length) = found
        req = unpack_quant_request(bytes(mm[off:off + QUANT_REQUEST.size]))
        if req is None:
            return _err("INVALID_FIELD")
        code, scheme_name, shape = req
        try:
            scheme = parse_scheme(scheme_name)
            kv = KVShape(*shape)
            carrier = storage_dtype(code)
        except (ValueError, KeyError):
            return _err("INVALID_FIELD")
        raw = length - QUANT_REQUEST.size
        if code not in ELEMENT_BYTES or raw != kv.nbytes(code):
            return _err("KV_INVALID_VALUE_SIZE")
        block = np.frombuffer(mm, dtype=carrier, count=kv.elements,
                              offset=off + QUANT_REQUEST.size).reshape(kv.array_shape)
        # the block crosses the link as it is, is quantized, and the result is programmed
        arrived = self._stage(lib.SDE_STAGE_RECEIVE, nbytes=raw)
        t0 = time.perf_counter_ns()
        try:
            blob = quantize(block, {0: "fp16", 1: "bf16", 2: "fp32"}[code], scheme)
        except ValueError:
            return _err("INVALID_FIELD")  # inf or NaN in the block
        host = time.perf_counter_ns() - t0
        if blob.nbytes > self.d.store.max_value:
            return _err("KV_INVALID_VALUE_SIZE")
        cost = quantize_cost(kv.elements, ELEMENT_BYTES[code], scheme, blob.nbytes)
        quantized = self._then_compute(arrived, "quantize", cost, host)
        out = self._put(key, blob, copied=raw, arrived_ns=quantized)
        out.result = blob.nbytes if out.status == STATUS["SUCCESS"] else out.result
        return out

    def kv_retrieve_dequantized(self, client, sqe):
        found = self._stored(client, sqe)
        if isinstance(found, Outcome):
            return found
        key, region, blob = found
        t0 = time.perf_counter_ns()
        try:
            block, dtype = dequantize(blob)
        except ValueError:  # not a compressed block, or a corrupt one
            return _err("INVALID_FIELD")
        host = time.perf_counter_ns() - t0
        mm, off, length = region
        if block.nbytes > length:
            return _err("KV_INVALID_VALUE_SIZE", block.nbytes)
        mm[off:off + block.nbytes] = block.tobytes()
        elem = block.dtype.itemsize
        cost = dequantize_cost(block.size, elem, scheme_of(blob), len(blob))
        # the compressed block is sensed, dequantized as it arrives, and the result crosses
        # the link
        place = self.d.store.lookup(key)
        sensed = self._stage(lib.SDE_STAGE_SENSE, place[0] if place else 0, len(blob))
        ready = self._then_compute(sensed, "dequantize", cost, host)
        device = self._stage(lib.SDE_STAGE_TRANSFER, nbytes=block.nbytes, after_ns=ready) or ready
        return Outcome(STATUS["SUCCESS"], block.nbytes, block.nbytes, block.nbytes, device)

    def _match(self, keys: np.ndarray, hashed_ns: int = 0) -> Outcome:
        """hashed_ns: the time of hashing the keys in the drive first (0: the host sent
        them)."""
        t0 = time.perf_counter_ns()
        hits = self.d.store.prefix_match(keys)
        host = time.perf_counter_ns() - t0
        probed = max(1, min(hits + 1, len(keys)))
        cost = prefix_match_cost(probed)
        device = self._then_compute(hashed_ns, "prefix_match", cost, host)
        return Outcome(STATUS["SUCCESS"], hits, 0, 0, device)

    def prefix_match(self, client, sqe):
        region = self._region(client, sqe)
        if region is None or sqe.length == 0 or sqe.length % 16:
            return _err("INVALID_BUFFER" if region is None else "INVALID_FIELD")
        mm, off, length = region
        keys = np.frombuffer(mm, dtype=np.uint8, count=length, offset=off).reshape(-1, 16)
        return self._match(keys)

    def prefix_match_tokens(self, client, sqe):
        block_tokens = int(sqe.param0)
        region = self._region(client, sqe)
        if region is None:
            return _err("INVALID_BUFFER")
        mm, off, length = region
        if block_tokens not in BLOCK_SIZES or length < 16 or (length - 16) % 4:
            return _err("INVALID_FIELD")
        root = np.frombuffer(mm, dtype=np.uint8, count=16, offset=off).copy()
        tokens = np.frombuffer(mm, dtype="<u4", count=(length - 16) // 4,
                               offset=off + 16).copy()
        nblocks = len(tokens) // block_tokens
        if nblocks == 0:
            return _ok(0)
        keys = np.zeros((nblocks, 16), np.uint8)
        t0 = time.perf_counter_ns()
        hash_chain(tokens, block_tokens, root, keys)
        host = time.perf_counter_ns() - t0
        device = self._charge("prefix_hash", prefix_hash_cost(nblocks, block_tokens), host)
        return self._match(keys, device)


def scheme_of(blob: bytes):
    """The scheme of a compressed block, for its cost (the header says it all)."""
    from firmware.blockfmt import SCHEME_FP8, SCHEME_KIVI, open_block
    from firmware.quant import Scheme

    h, _ = open_block(blob)
    if h.scheme == SCHEME_FP8:
        return Scheme("fp8", 8, per_head=h.per_head)
    kind = "kivi" if h.scheme == SCHEME_KIVI else "int"
    return Scheme(kind, h.bits, h.group, h.symmetric)


HANDLERS = {
    OPCODES["IDENTIFY"]: SlowPath.identify,
    OPCODES["NS_CREATE"]: SlowPath.ns_create,
    OPCODES["NS_DELETE"]: SlowPath.ns_delete,
    OPCODES["NS_LIST"]: SlowPath.ns_list,
    OPCODES["GET_LOG"]: SlowPath.get_log,
    OPCODES["KV_STORE_QUANTIZED"]: SlowPath.kv_store_quantized,
    OPCODES["KV_RETRIEVE_DEQUANTIZED"]: SlowPath.kv_retrieve_dequantized,
    OPCODES["PREFIX_MATCH"]: SlowPath.prefix_match,
    OPCODES["PREFIX_MATCH_TOKENS"]: SlowPath.prefix_match_tokens,
}
