"""KV commands (the NVMe KV command set) and the drive's firmware on KV blocks (quantized
stores, dequantized retrieves, prefix matching, pins); a mixin of hostlib.Device (each
command defined once, as X_async: hostlib/commands.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from hostlib.commands import Retry, Value, command
from hostlib.errors import InvalidKeySizeError, InvalidValueSizeError, KeyNotFoundError
from hostlib.staging import Staging, _as_bytes_array, copy_bytes
from ssdemu_wire.layout import KV_DELETE_FORCE, OPCODES, STATUS

MAX_KEY = 16
_LOW64 = (1 << 64) - 1


def _key_bytes(key):
    """A key as a message names it (its bytes now: a bytearray may change later)."""
    return key if type(key) is bytes else bytes(key)


def _key_fields(key) -> dict:
    """The SQE fields of a key: refused here as the daemon would (never truncated)."""
    if type(key) is not bytes:
        if not isinstance(key, (bytes, bytearray, memoryview)):
            raise TypeError(f"keys are bytes, not {type(key).__name__}"
                            + (" (encode it first)" if isinstance(key, str) else ""))
        key = bytes(key)  # a memoryview's bytes, whatever its format
    n = len(key)
    if not 1 <= n <= MAX_KEY:
        raise InvalidKeySizeError(STATUS["KV_INVALID_KEY_SIZE"],
                                  f"a key of {n} bytes (keys are 1 to {MAX_KEY})")
    # bytes 0-7 little-endian in lba, 8-15 in key_hi, zero-padded: one integer's two halves
    v = int.from_bytes(key, "little")
    return {"lba": v & _LOW64, "key_hi": v >> 64, "param1": n}


def _read_whole(e: Exception, a: dict):
    """kv_get without `out` of a value larger than its first read (SMALL_GET): read again
    into an array of the value's size, which the error carries."""
    if not isinstance(e, InvalidValueSizeError) or a["out"] is not None or not e.value_length:
        return None
    tmp = np.empty(e.value_length, np.uint8)  # staged as any array (never waits for room)
    return Retry({**a, "out": tmp}, lambda n: tmp[:n].tobytes())


def _absent(e: Exception, _a: dict):
    return Value(False) if isinstance(e, KeyNotFoundError) else None

if TYPE_CHECKING:
    from hostlib.client import Future, QueuePair


class KVCommands(Staging):
    _key_fields = staticmethod(_key_fields)

    @command()
    def kv_put_async(self, key: bytes, value, only_if_exists: bool = False,
                     only_if_not_exists: bool = False, qp: QueuePair | None = None, *,
                     nsid: int = 0) -> Future:
        """Store a value (bytes, or a uint8 array: zero copy when it lies in a Device.alloc
        buffer); the Future's result is True if the key existed."""
        qp = qp or self.qp
        kf = _key_fields(key)
        mode = 1 if only_if_exists else 2 if only_if_not_exists else 0
        fields, bounced, release = self._staged_in(value, qp, kv=True)
        return self.submit(OPCODES["KV_STORE"], ("kv store {!r}", _key_bytes(key)), qp=qp,
                           bounce=bounced, after=bool, release=release, param0=mode,
                           nsid=nsid, **fields, **kf)

    @command(on_error=_read_whole)
    def kv_get_async(self, key: bytes, out: np.ndarray | None = None,
                     qp: QueuePair | None = None, *, nsid: int = 0) -> Future:
        """Retrieve into `out` (any uint8-viewable array; zero copy in a Device.alloc buffer):
        the result is the value's length.  Without `out`, the result is the value (bytes)
        when it is at most SMALL_GET bytes (kv_get and AsyncDevice.kv_get read a larger one
        again, sized by the error: _read_whole).  A buffer too small raises InvalidValueSizeError
        carrying `value_length`."""
        qp = qp or self.qp
        kf = _key_fields(key)
        what = ("kv retrieve {!r}", _key_bytes(key))
        if out is None:
            # a small share (the bounce's or a staging buffer's), never the whole bounce: a
            # get of a name record must not hold every other command's staging up
            fields, share, bounced, tmp = self._stage(min(self.SMALL_GET, qp.bounce.nbytes),
                                                      qp, kv=True)
            return self.submit(OPCODES["KV_RETRIEVE"], what, qp=qp, bounce=bounced,
                               after=lambda n: bytes(share[:n]),
                               release=None if tmp is None else (lambda: self._staging_give(tmp)),
                               nsid=nsid, **fields, **kf)
        fields, bounced, copy, release = self._staged_out(out, qp, kv=True)
        return self.submit(OPCODES["KV_RETRIEVE"], what, qp=qp, bounce=bounced, after=copy,
                           release=release, nsid=nsid, **fields, **kf)

    @command()
    def kv_delete_async(self, key: bytes, qp: QueuePair | None = None, *, nsid: int = 0,
                        force: bool = False) -> Future:
        """force: delete even though other clients pinned the key (their pins go); the
        namespace's owner's or an admin's (AccessDeniedError otherwise; the default key
        space 0 is an admin's).  Without it a pinned key raises KeyPinnedError."""
        return self.submit(OPCODES["KV_DELETE"], ("kv delete {!r}", _key_bytes(key)), qp=qp,
                           nsid=nsid, param0=KV_DELETE_FORCE if force else 0,
                           **_key_fields(key))

    @command(finish=lambda _r, _a: True, on_error=_absent)
    def kv_exists_async(self, key: bytes, qp: QueuePair | None = None, *, nsid: int = 0) -> Future:
        """The result is 0 when the key exists; KeyNotFoundError otherwise (kv_exists:
        True or False)."""
        return self.submit(OPCODES["KV_EXIST"], ("kv exist {!r}", _key_bytes(key)), qp=qp,
                           nsid=nsid, **_key_fields(key))

    @command()
    def kv_list_async(self, start: bytes = b"", max_keys: int = 1024,
                qp: QueuePair | None = None, *, nsid: int = 0) -> Future:
        """Keys in byte order from `start` (the result: a list of at most max_keys)."""
        qp = qp or self.qp
        fields = _key_fields(start) if start else {}
        nbytes = min(qp.bounce.nbytes, 17 * max_keys)
        boff, share = qp.bounce_take(nbytes)

        def keys(n):
            raw = bytes(share[:17 * n])
            return [raw[i * 17 + 1:i * 17 + 1 + raw[i * 17]] for i in range(n)]

        return self.submit(OPCODES["KV_LIST"], "kv list", qp=qp, bounce=True, after=keys,
                           buf=qp.bounce_handle, buf_offset=boff, length=nbytes,
                           nsid=nsid, **fields)

    @command()
    def kv_put_quantized_async(self, key: bytes, block: np.ndarray, dtype: str, scheme: str,
                               qp: QueuePair | None = None, *, nsid: int = 0,
                               layout: str = "t2l", summary_page: int | bool = 0) -> Future:
        """Store a KV block (tokens, 2, layers, kv_heads, head_dim; fp16/bf16 as uint16 bits)
        quantized in the drive; the result is the compressed size.  kv_get returns the
        compressed block, kv_get_dequantized the block.  A block inside a Device.alloc
        buffer is read by the drive where it lies (no copy, any size up to the drive's
        largest value); the 64-byte request then travels in the queue pair's bounce.
        layout "2lt": the block is (2, layers, tokens, kv_heads, head_dim), LMCache's
        KV_2LTD, which the drive takes as it is and kv_get_dequantized gives back in that
        order (every scheme).  summary_page: the drive also keeps the block's page summaries
        (per page of that many tokens, per layer and KV head, the keys' per-channel min and
        max, after the compressed body), so that TOPK_PAGES with the same page_tokens scores
        the block from them rather than reading and summarizing it; True: the page the
        drive's profile gives (identify's page_tokens); 0: none."""
        from ssdemu_wire.codes import dtype_code
        from ssdemu_wire.layout import QUANT_REQUEST_BYTES, pack_quant_request

        qp = qp or self.qp
        kf = _key_fields(key)
        what = f"kv store quantized {key!r}"
        if layout == "2lt":  # LMCache's KV_2LTD: integer schemes take it as it is
            _two, layers, t, heads, dim = block.shape
        elif layout == "t2l":
            t, _two, layers, heads, dim = block.shape
        else:
            raise ValueError(f"layout is 't2l' (tokens, 2, layers, heads, head_dim) or '2lt' "
                             f"(2, layers, tokens, heads, head_dim), got {layout!r}")
        if summary_page is True:  # the drive's (its hello carries identify)
            summary_page = int(self.info.get("page_tokens", 16))
        if not 0 <= summary_page <= 4096:
            raise ValueError(f"summary_page is 0 (none) to 4096 tokens, got {summary_page}")
        request = np.frombuffer(pack_quant_request(dtype_code(dtype), scheme, t, layers, heads,
                                                   dim, layout, summary_page), np.uint8)
        handle, off = self._locate(block)
        if handle is None and QUANT_REQUEST_BYTES + block.nbytes <= qp.bounce.nbytes:
            # small and not registered: request and block together in one bounce share
            boff, share = qp.bounce_take(QUANT_REQUEST_BYTES + block.nbytes)
            share[:QUANT_REQUEST_BYTES] = request
            copy_bytes(share[QUANT_REQUEST_BYTES:], _as_bytes_array(block))
            return self.submit(OPCODES["KV_STORE_QUANTIZED"], what, qp=qp, bounce=True,
                               buf=qp.bounce_handle, buf_offset=boff, length=share.nbytes,
                               nsid=nsid, **kf)
        tmp = None
        if handle is None:  # larger than the bounce: a registered buffer for it
            stage, tmp = self._staging_take(block.nbytes)
            copy_bytes(stage, _as_bytes_array(block))
            handle, off = tmp, 0
        roff, rshare = qp.bounce_take(QUANT_REQUEST_BYTES)
        rshare[:] = request
        return self.submit(OPCODES["KV_STORE_QUANTIZED"], what, qp=qp, bounce=True,
                           release=None if tmp is None else (lambda: self._staging_give(tmp)),
                           buf=handle, buf_offset=off, length=block.nbytes,
                           param0=(qp.bounce_handle << 40) | roff, nsid=nsid, **kf)

    @command(finish=lambda _r, a: a["out"])
    def kv_get_dequantized_async(self, key: bytes, out: np.ndarray,
                                 qp: QueuePair | None = None, *, nsid: int = 0) -> Future:
        """Dequantized in the drive, into `out` (the block's shape and carrier dtype); the
        result is the bytes written."""
        qp = qp or self.qp
        kf = _key_fields(key)
        fields, bounced, copy, release = self._staged_out(out, qp, kv=True)
        return self.submit(OPCODES["KV_RETRIEVE_DEQUANTIZED"],
                           f"kv retrieve dequantized {key!r}", qp=qp, bounce=bounced,
                           after=copy, release=release, nsid=nsid, **fields, **kf)

    @command()
    def kv_requantize_async(self, key: bytes, scheme: str, qp: QueuePair | None = None, *,
                            nsid: int = 0) -> Future:
        """Rewrite the key's stored compressed block in place at a lower scheme, in the
        drive (its firmware dequantizes and quantizes it again, its page summaries
        recomputed; journaled like a put): int8 -> int4 -> int2 or kivi2, plain or fp8 ->
        int4, ...  The result is the new block's size.  InvalidCommandError (INVALID_FIELD): not a
        compressed block, or a scheme that is unknown, does not fit the block or is not
        lower (fewer bits per element and a smaller block); AbortedError: the key changed
        meanwhile (the newer value is kept).  A promotion is kv_get_dequantized."""
        qp = qp or self.qp
        kf = _key_fields(key)
        raw = scheme.encode("ascii") if isinstance(scheme, str) and scheme.isascii() else b""
        if not 1 <= len(raw) <= 32:
            raise ValueError(f"a scheme is a name of 1 to 32 ASCII characters, got {scheme!r}")
        boff, share = qp.bounce_take(len(raw))
        share[:] = np.frombuffer(raw, np.uint8)
        return self.submit(OPCODES["KV_REQUANTIZE"], f"kv requantize {key!r} to {scheme}",
                           qp=qp, bounce=True, buf=qp.bounce_handle, buf_offset=boff,
                           length=len(raw), nsid=nsid, **kf)

    @command()
    def prefix_match_async(self, keys, qp: QueuePair | None = None, *, nsid: int = 0) -> Future:
        from ssdemu_wire.codes import keys_array

        qp = qp or self.qp
        arr = keys_array(keys).view(np.uint8).reshape(-1)
        fields, bounced, release = self._staged_in(arr, qp, kv=True)
        return self.submit(OPCODES["PREFIX_MATCH"], "prefix match", qp=qp, bounce=bounced,
                           release=release, nsid=nsid, **fields)

    @command()
    def prefix_match_tokens_async(self, tokens, block_tokens: int, root: bytes,
                                  qp: QueuePair | None = None, *, nsid: int = 0) -> Future:
        qp = qp or self.qp
        payload = np.concatenate([np.frombuffer(root, np.uint8),
                                  np.asarray(tokens, dtype="<u4").view(np.uint8)])
        fields, bounced, release = self._staged_in(payload, qp, kv=True)
        return self.submit(OPCODES["PREFIX_MATCH_TOKENS"], "prefix match (tokens)", qp=qp,
                           bounce=bounced, release=release, param0=block_tokens, nsid=nsid,
                           **fields)

    @command()
    def pin_async(self, key: bytes, qp: QueuePair | None = None, *, nsid: int = 0) -> Future:
        return self.submit(OPCODES["PIN"], "pin", qp=qp, nsid=nsid, **_key_fields(key))

    @command()
    def unpin_async(self, key: bytes, qp: QueuePair | None = None, *, nsid: int = 0) -> Future:
        return self.submit(OPCODES["UNPIN"], "unpin", qp=qp, nsid=nsid, **_key_fields(key))
