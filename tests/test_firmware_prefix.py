"""Prefix hashing (drive kernel vs host Python) and the prefix index (vs a plain-Python
model with an OrderedDict LRU)."""

import hashlib
import os
from collections import OrderedDict

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from firmware.prefix_hash import hash_chain
from hostlib.prefix_hash import BLOCK_SIZES, chain_keys, root_key
from ssdemu.bench.prefix_index import (
    EXISTED,
    FULL,
    INSERTED,
    INSERTED_EVICTED,
    IndexFullError,
    PinnedError,
    PrefixIndex,
    keys_array,
)

# ---- hashing --------------------------------------------------------------------------------


def drive_keys(tokens, block_tokens, root):
    toks = np.asarray(tokens, dtype=np.uint32)
    keys = np.zeros((len(tokens) // block_tokens, 16), np.uint8)
    n = hash_chain(toks, block_tokens, np.frombuffer(root, np.uint8), keys)
    return [bytes(k) for k in keys[:n]]


@settings(max_examples=60, deadline=None)
@given(block=st.sampled_from(BLOCK_SIZES), nblocks=st.integers(0, 5),
       extra=st.integers(0, 15), seed=st.integers(0, 2**31),
       salt=st.tuples(st.text(max_size=8).filter(lambda t: "\0" not in t),
                      st.sampled_from(["", "lora-7"]), st.sampled_from(["", "tenant-a"])))
def test_drive_hash_bit_identical_to_host(block, nblocks, extra, seed, salt):
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, 2**32, block * nblocks + extra, dtype=np.uint64).tolist()
    tokens[:3] = [0, 2**32 - 1, 1][:len(tokens)]  # edge values
    root = root_key(*salt)
    host = chain_keys(tokens, block, root)
    assert len(host) == nblocks  # the partial trailing block gets no key
    assert drive_keys(tokens, block, root) == host


def test_hash_is_blake2b_128_of_parent_and_tokens():
    root = root_key("m")
    tokens = list(range(16))
    expect = hashlib.blake2b(root + np.arange(16, dtype="<u4").tobytes(),
                             digest_size=16).digest()
    assert chain_keys(tokens, 16, root) == [expect]


def test_chains_share_keys_exactly_as_far_as_they_share_blocks():
    root = root_key("m")
    a = list(range(64))
    b = list(range(32)) + [9] * 32
    ka, kb = chain_keys(a, 16, root), chain_keys(b, 16, root)
    assert ka[:2] == kb[:2] and ka[2] != kb[2]
    assert chain_keys(a, 16, root_key("m", adapter="x"))[0] != ka[0]


@pytest.mark.parametrize("bad", [
    dict(block=17), dict(tokens=[2**32] * 16), dict(tokens=[-1] * 16), dict(root=b"short")])
def test_hash_bad_input(bad):
    args = dict(tokens=[1] * 16, block=16, root=root_key("m")) | bad
    with pytest.raises(ValueError):
        chain_keys(args["tokens"], args["block"], args["root"])


def test_salt_with_nul_refused():
    with pytest.raises(ValueError, match="NUL"):
        root_key("a\0b")


# ---- the index, against a model -----------------------------------------------------------


class ModelIndex:
    def __init__(self, capacity, evict):
        self.capacity, self.evict = capacity, evict
        self.loc, self.pins, self.lru = {}, {}, OrderedDict()

    def touch(self, k):
        if self.pins.get(k, 0) == 0:
            self.lru.move_to_end(k)

    def insert(self, k, loc):
        if k in self.loc:
            self.touch(k)
            return EXISTED, None
        ev = None
        if len(self.loc) == self.capacity:
            if not self.evict or not self.lru:
                return FULL, None
            victim, _ = self.lru.popitem(last=False)
            ev = (victim, self.loc.pop(victim))
        self.loc[k] = loc
        self.lru[k] = None
        return (INSERTED_EVICTED if ev else INSERTED), ev

    def delete(self, k):
        if k not in self.loc:
            return "missing"
        if self.pins.get(k, 0):
            return "pinned"
        del self.loc[k]
        self.lru.pop(k)
        return "ok"

    def pin(self, k, delta):
        if k not in self.loc:
            return "missing"
        n = self.pins.get(k, 0)
        if delta < 0 and n == 0:
            return "not pinned"
        if delta > 0 and n == 0:
            self.lru.pop(k)
        n += delta
        self.pins[k] = n
        if n == 0:
            self.lru[k] = None
        return n

    def match(self, chain, touch):
        hits = []
        for k in chain:
            if k not in self.loc:
                break
            hits.append(self.loc[k])
            if touch:
                self.touch(k)
        return hits


POOL = [hashlib.blake2b(bytes([i]), digest_size=16).digest() for i in range(12)]
ops = st.lists(st.one_of(
    st.tuples(st.just("insert"), st.integers(0, 11), st.integers(0, 2**40)),
    st.tuples(st.just("delete"), st.integers(0, 11)),
    st.tuples(st.just("pin"), st.integers(0, 11)),
    st.tuples(st.just("unpin"), st.integers(0, 11)),
    st.tuples(st.just("match"), st.lists(st.integers(0, 11), max_size=6), st.booleans()),
    # chains set the successor hints that match follows; later deletes and evictions make
    # them stale, and entries get reused by other keys
    st.tuples(st.just("chain"), st.lists(st.integers(0, 11), min_size=1, max_size=6),
              st.integers(0, 2**30)),
), max_size=60)


def apply(ix, op):
    kind = op[0]
    try:
        if kind == "insert":
            return ix.insert(POOL[op[1]], op[2])
        if kind == "delete":
            ix.delete(POOL[op[1]])
            return "ok"
        if kind in ("pin", "unpin"):
            return ix.pin_block(POOL[op[1]]) if kind == "pin" else ix.unpin_block(POOL[op[1]])
        if kind == "chain":
            results, evicted = ix.insert_chain([POOL[i] for i in op[1]],
                                               np.arange(len(op[1])) + op[2])
            return [int(r) for r in results], evicted
        hits, locs = ix.match([POOL[i] for i in op[1]], touch=op[2])
        return [int(v) for v in locs[:hits]]
    except IndexFullError:
        return FULL, None
    except KeyError:
        return "missing"
    except PinnedError:
        return "pinned"
    except ValueError:
        return "not pinned"


def apply_model(m, op):
    kind = op[0]
    if kind == "insert":
        return m.insert(POOL[op[1]], op[2])
    if kind == "delete":
        return m.delete(POOL[op[1]])
    if kind in ("pin", "unpin"):
        return m.pin(POOL[op[1]], 1 if kind == "pin" else -1)
    if kind == "chain":
        out = [m.insert(POOL[k], op[2] + i) for i, k in enumerate(op[1])]
        return [r for r, _ in out], [ev for _, ev in out if ev]
    return m.match([POOL[i] for i in op[1]], op[2])


@settings(max_examples=500, deadline=None)
@given(capacity=st.integers(1, 8), evict=st.booleans(), seq=ops)
def test_index_agrees_with_model(capacity, evict, seq):
    ix, model = PrefixIndex(capacity, evict=evict), ModelIndex(capacity, evict)
    for op in seq:
        assert apply(ix, op) == apply_model(model, op), op
        assert len(ix) == len(model.loc)
        assert ix.lru_keys() == list(model.lru)
    for k in POOL:
        assert ix.lookup(k) == model.loc.get(k)


def test_eviction_is_exactly_lru_by_block_count():
    ix = PrefixIndex(100)
    keys = [os.urandom(16) for _ in range(150)]
    results, evicted = ix.insert_chain(keys, np.arange(150))
    assert list(results[:100]) == [INSERTED] * 100
    assert list(results[100:]) == [INSERTED_EVICTED] * 50
    assert [k for k, _ in evicted] == keys[:50]
    assert [loc for _, loc in evicted] == list(range(50))
    assert ix.lru_keys() == keys[50:]


def test_pinned_blocks_are_never_evicted_and_full_is_reported():
    ix = PrefixIndex(3)
    keys = [os.urandom(16) for _ in range(4)]
    for i, k in enumerate(keys[:3]):
        ix.insert(k, i)
        ix.pin_block(k)
    with pytest.raises(IndexFullError, match="all pinned"):
        ix.insert(keys[3], 3)
    ix.unpin_block(keys[1])
    r, ev = ix.insert(keys[3], 3)
    assert r == INSERTED_EVICTED and ev == (keys[1], 1)
    with pytest.raises(PinnedError):
        ix.delete(keys[0])
    assert ix.stats["refusals"] == 1 and ix.stats["evictions"] == 1


def test_refuse_mode_reports_full():
    ix = PrefixIndex(2, evict=False)
    ix.insert(POOL[0], 0)
    ix.insert(POOL[1], 1)
    with pytest.raises(IndexFullError, match="eviction off"):
        ix.insert(POOL[2], 2)
    assert ix.insert(POOL[0], 5) == (EXISTED, None)
    assert ix.lookup(POOL[0]) == 0  # an existing key keeps its location


def test_many_inserts_and_deletes_against_dict():
    """Probe runs and backward-shift deletion at 50% load, against a dict."""
    rng = np.random.default_rng(1)
    ix = PrefixIndex(4096, evict=False)
    ref = {}
    pool = [os.urandom(16) for _ in range(6000)]
    for step in range(40000):
        k = pool[int(rng.integers(len(pool)))]
        if k in ref and rng.random() < 0.5:
            ix.delete(k)
            del ref[k]
        elif len(ref) < 4096:
            ix.insert(k, step)
            ref.setdefault(k, step)
    assert len(ix) == len(ref)
    for k in pool:
        assert ix.lookup(k) == ref.get(k)


def test_match_counts_leading_run_only():
    ix = PrefixIndex(16)
    chain = POOL[:6]
    ix.insert_chain([chain[i] for i in (0, 1, 2, 4, 5)], np.array([10, 11, 12, 14, 15]))
    hits, locs = ix.match(chain)
    assert hits == 3 and list(locs) == [10, 11, 12]
    assert ix.match([POOL[7]] + chain)[0] == 0


@pytest.mark.parametrize("bad", [b"short", [b"x" * 15], np.zeros((2, 8), np.uint8)])
def test_bad_keys(bad):
    with pytest.raises(ValueError, match="16 bytes|uint8"):
        keys_array(bad)


def test_capacity_validated():
    with pytest.raises(ValueError, match="positive"):
        PrefixIndex(0)


def test_stale_chain_hint_never_gives_a_wrong_hit():
    """A hint to an entry freed and reused by another key must fall back to the table."""
    ix = PrefixIndex(3)
    a, b, c, d = POOL[:4]
    ix.insert_chain([a, b], np.array([1, 2]))  # hint a -> entry of b
    ix.delete(b)
    ix.insert(c, 3)  # reuses b's entry
    assert ix.match([a, b]) == (1, np.array([1], np.uint64))
    ix.insert(b, 9)  # b back, in another entry
    hits, locs = ix.match([a, b])
    assert hits == 2 and list(locs) == [1, 9]
    assert ix.lookup(d) is None
