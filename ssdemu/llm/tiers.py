"""A KV manager for decoding over the real model: every window of the sequence lives in a
tier, and every move between tiers is a real command to the drive, counted and booked on the
drive's timing model.

A window is `window` tokens of every layer's keys and values (a drive block: the unit a drive
stores, demotes and returns).  Its tiers, fastest first:

- HBM: full precision in the GPU's memory (here: the host's), attended every step; the
  budget (`hbm_tokens`) bounds how many windows it holds;
- DRAM: full precision in the host's memory, attended every step, its bytes crossing the
  link to the GPU each step (`dram_tokens`; 0 unless given);
- DRIVE, DRIVE_INT8, DRIVE_INT4, DRIVE_KIVI2: the drive's copy at full precision or
  quantized (one block under the window's key; the 2-bit tier is KIVI's, keys per channel
  and values per token, since 2-bit codes grouped along a token's channels lose the keys'
  outlier channels); attended only when the policy reads it for a step (KV_RETRIEVE of the
  compressed block, dequantized on the host as a GPU would);
- DROPPED: gone (its drive copy deleted).

Moves: to a drive tier, a window the drive holds no copy of is stored (KV_STORE_QUANTIZED
at the tier's scheme); a copy more precise than the tier is demoted in place (KV_REQUANTIZE:
the block never crosses the link); a copy at or below it stays (a drive cannot raise a
block's precision, and a promoted window's host values are its copy's).  A drive tier ->
HBM (a promotion) is a dequantized retrieve (KV_RETRIEVE_DEQUANTIZED), the drive's copy
kept; DROPPED deletes the copy.  A window promoted from int4 comes back at int4's values: a
demotion is recoverable, not lossless.

The drive runs on the virtual clock: each step's commands are submitted at the step's
modelled time, the reads a step attends are on its critical path (the step waits for
them), promotions too (the next step attends the window in HBM); demotions, stores and
deletes go on in the background, booked on the same NAND, link and compute.  The modelled
time per output token is the GPU's step (the serving model's decode rate) plus that drive
time.  Policies (ssdemu/llm/policies) decide placement; this module executes it and
measures: the attention each window receives per step (mean over layers and query heads),
bytes over the link and on NAND (the drive's own books), moves per kind.
"""

from __future__ import annotations

import dataclasses

import numpy as np

HBM, DRAM = "hbm", "dram"
DRIVE, DRIVE_INT8, DRIVE_INT4 = "drive", "drive-int8", "drive-int4"
DRIVE_KIVI2 = "drive-kivi2"
DROPPED = "dropped"
TIERS = (HBM, DRAM, DRIVE, DRIVE_INT8, DRIVE_INT4, DRIVE_KIVI2, DROPPED)
DRIVE_TIERS = (DRIVE, DRIVE_INT8, DRIVE_INT4, DRIVE_KIVI2)  # most precise first
SCHEME = {DRIVE: "plain", DRIVE_INT8: "int8_g64", DRIVE_INT4: "int4_g64",
          DRIVE_KIVI2: "kivi2_g32_r0"}
HOST_TIERS = (HBM, DRAM)


@dataclasses.dataclass
class Window:
    index: int
    k: np.ndarray | None  # (window, layers, kv_heads, head_dim) float16, in HBM or DRAM
    v: np.ndarray | None
    tier: str = HBM
    copy: str | None = None  # the drive tier its copy is at (None: the drive has none)
    score: float = 0.0  # the policy's importance (its own bookkeeping)
    mass: float = 0.0  # the attention it received this step (nan: not attended)


@dataclasses.dataclass
class Books:
    steps: int = 0
    stores: int = 0
    reads: int = 0
    promotions: int = 0
    demotions: int = 0  # in the drive (KV_REQUANTIZE)
    drops: int = 0
    link_bytes: int = 0  # host <-> drive: what the commands moved, both ways
    select_link_bytes: int = 0  # of which TOPK_PAGES' and ATTEND's requests and results
    gpu_link_bytes: int = 0  # DRAM -> GPU each step
    drive_ns: float = 0.0  # the steps' critical drive time, summed
    step_ns: float = 0.0  # the steps' modelled time (GPU + drive), summed

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


class TierManager:
    """The windows of one sequence, their tiers, and the drive behind them."""

    def __init__(self, dev, cfg, *, hbm_tokens: int, dram_tokens: int = 0, window: int = 64,
                 page_tokens: int = 16, gpu_step_ns: float = 0.0, prefix: bytes = b"t",
                 nsid: int = 0, seed: int = 0, start_ns: float = 0.0):
        if hbm_tokens < 2 * window:
            raise ValueError(f"an HBM budget holds two windows at least ({2 * window} tokens)")
        self.dev, self.cfg, self.window, self.page_tokens = dev, cfg, window, page_tokens
        self.hbm_windows = hbm_tokens // window
        self.dram_windows = dram_tokens // window
        self.gpu_step_ns, self.prefix, self.nsid = gpu_step_ns, prefix, nsid
        self.rng = np.random.default_rng(seed)
        self.windows: list[Window] = []
        shape = (0, cfg.layers, cfg.kv_heads, cfg.head_dim)
        self.tail_k, self.tail_v = np.zeros(shape, np.float16), np.zeros(shape, np.float16)
        self.books = Books()
        # the virtual clock, ns: a run on a drive that served others starts past their
        # work (start_ns), or it would queue behind it (the drive's clock only goes forward)
        self.t = float(start_ns)
        self.step = 0
        self._critical = 0.0  # this step's drive time the step waits for
        self._step_kv: list | None = None
        self._attended: list[Window] = []
        self.log: list[tuple] = []  # every move: (step, window, from, to): the decisions
        self.prefill_mass: np.ndarray | None = None

    # -- the sequence --------------------------------------------------------------------
    def key(self, w: Window) -> bytes:
        return (self.prefix + b"/" + w.index.to_bytes(4, "big"))[-16:]

    def tokens(self) -> int:
        return len(self.windows) * self.window + self.tail_k.shape[0]

    def in_tier(self, *tiers: str) -> list[Window]:
        return [w for w in self.windows if w.tier in tiers]

    def load_prefill(self, k_layers, v_layers, prefill_mass: np.ndarray) -> None:
        """The prefill's keys and values (per layer (T, kv_heads, head_dim)): its full windows
        start in HBM (the policy places them next), the rest is the host's tail.
        prefill_mass: the attention each full window received from the prefill's last
        queries (the predictive policies' signal)."""
        k = np.stack([np.asarray(x, np.float16) for x in k_layers], axis=1)
        v = np.stack([np.asarray(x, np.float16) for x in v_layers], axis=1)
        n = k.shape[0] // self.window
        for i in range(n):
            s = slice(i * self.window, (i + 1) * self.window)
            self.windows.append(Window(i, k[s].copy(), v[s].copy()))
        self.tail_k, self.tail_v = k[n * self.window:].copy(), v[n * self.window:].copy()
        self.prefill_mass = np.asarray(prefill_mass, np.float64)[:n]

    # -- the drive -----------------------------------------------------------------------
    def _submit(self, call, *args, critical: bool = False, at: float | None = None, **kw):
        """A command at the clock's time (or `at`); its completion joins the step's critical
        path when the step waits for it."""
        at = self.t if at is None else at
        self.dev.submit_time_ns = int(at)
        f = call(*args, nsid=self.nsid, **kw)
        f.result()
        if critical:
            self._critical = max(self._critical, f.device_ns - self.t)
        return f

    def _stored_bytes(self, tier: str) -> int:
        """A window's block in the drive at `tier`'s scheme (firmware/sizes.py: arithmetic)."""
        from firmware.layout import KVShape
        from firmware.quant import compressed_nbytes

        c = self.cfg
        return compressed_nbytes(KVShape(self.window, c.layers, c.kv_heads, c.head_dim),
                                 SCHEME[tier], "fp16", self.page_tokens)

    def _block(self, w: Window) -> np.ndarray:
        kv = np.stack([w.k, w.v], axis=1)  # (window, 2, layers, heads, dim)
        return np.ascontiguousarray(kv).view(np.uint16)

    def _set_host(self, w: Window, block: np.ndarray) -> None:
        b = block.view(np.float16)
        w.k, w.v = b[:, 0].copy(), b[:, 1].copy()

    def store(self, w: Window, tier: str) -> None:
        """The window's host copy stored in the drive at `tier`'s scheme."""
        block = self._block(w)
        self._submit(self.dev.kv_put_quantized_async, self.key(w), block, "fp16",
                     SCHEME[tier], summary_page=self.page_tokens)
        w.copy = tier
        self.books.stores += 1
        self.books.link_bytes += block.nbytes

    def move(self, w: Window, tier: str) -> None:
        """Put window w in `tier`, by the commands the move takes (module doc)."""
        if tier == w.tier:
            return
        if w.tier == DROPPED:
            raise ValueError(f"window {w.index} was dropped: nothing brings it back")
        if tier == DRIVE_KIVI2 and self.window % 32:
            raise ValueError(f"{DRIVE_KIVI2} needs windows of a multiple of 32 tokens (KIVI's "
                             f"key groups run along tokens), not {self.window}")
        self.log.append((self.step, w.index, w.tier, tier))
        if tier in HOST_TIERS:
            if w.k is None:  # a promotion: the drive's copy, dequantized in the drive
                out = np.empty((self.window, 2, self.cfg.layers, self.cfg.kv_heads,
                                self.cfg.head_dim), np.uint16)
                self._submit(self.dev.kv_get_dequantized_async, self.key(w), out,
                             critical=True)
                self._set_host(w, out)
                self.books.promotions += 1
                self.books.link_bytes += out.nbytes
            w.tier = tier
            return
        if tier == DROPPED:
            if w.copy is not None:
                self._submit(self.dev.kv_delete_async, self.key(w))
                w.copy = None
            self.books.drops += 1
        elif w.copy is None:
            if w.k is None:
                raise ValueError(f"window {w.index} has no copy anywhere")
            self.store(w, tier)  # the host's copy goes to the drive
        elif DRIVE_TIERS.index(w.copy) < DRIVE_TIERS.index(tier):
            self._submit(self.dev.kv_requantize_async, self.key(w), SCHEME[tier])
            w.copy = tier
            self.books.demotions += 1
        # else the drive's copy is at the tier's precision or below it already (a drive
        # cannot raise a block's precision, and a promoted window's host values are the
        # copy's): it stays as it is
        w.tier = tier
        w.k = w.v = None

    # -- a decode step -------------------------------------------------------------------
    def begin_step(self, drive_reads: list[Window], select_pages: int = 0,
                   rerank: int = 4) -> None:
        """The step's attended windows: the host tiers', and `drive_reads` read back from
        the drive (compressed, dequantized on the host) at the step's start.  select_pages
        k > 0: each layer also attends, inside the drive, the k best pages per KV head of
        the windows in DRIVE (TOPK_PAGES with `rerank`, then ATTEND), merged with the
        host's attention: only queries, page ids and outputs cross the link."""
        from firmware.quant import dequantize

        self._critical = 0.0
        self._select = (select_pages, rerank)
        self._layer_t = self.t
        self._in_drive = [w for w in self.windows if w.tier == DRIVE] if select_pages else []
        att = [w for w in self.windows if w.tier in HOST_TIERS]
        for w in drive_reads:
            if w.tier not in DRIVE_TIERS:
                raise ValueError(f"window {w.index} is not in the drive ({w.tier})")
            blob = np.empty(self._stored_bytes(w.copy), np.uint8)
            n = self._submit(self.dev.kv_get_async, self.key(w), blob, critical=True).result()
            blob = blob[:n]
            self.books.reads += 1
            self.books.link_bytes += n
            block, _ = dequantize(blob)
            b = block.view(np.float16)
            att.append(dataclasses.replace(w, k=b[:, 0], v=b[:, 1]))
        for w in self.windows:
            w.mass = np.nan
        self.books.gpu_link_bytes += sum(w.k.nbytes * 2 for w in att if w.tier == DRAM)
        att.sort(key=lambda w: w.index)
        self._attended = att
        c = self.cfg
        # each layer's attended keys and values (tokens, heads, dim) float32, made once a
        # step (the new token's join them as each layer attends)
        if att:
            k = np.concatenate([w.k for w in att]).astype(np.float32)
            v = np.concatenate([w.v for w in att]).astype(np.float32)
            self._step_kv = [(np.ascontiguousarray(k[:, layer]), np.ascontiguousarray(
                v[:, layer])) for layer in range(c.layers)]
        else:
            self._step_kv = None
        self._mass = np.zeros(len(att))
        self._selected: dict[int, np.ndarray] = {}

    def attend(self, layer: int, q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
        """decode_step's attend: the new token's KV joins the tail; attention over the
        step's attended windows and the tail; each window's share of it recorded."""
        if layer == 0:
            self.tail_k = np.concatenate([self.tail_k, np.zeros((1, *self.tail_k.shape[1:]),
                                                                np.float16)])
            self.tail_v = np.concatenate([self.tail_v, np.zeros_like(self.tail_k[:1])])
        self.tail_k[-1, layer], self.tail_v[-1, layer] = k, v
        tk = self.tail_k[:, layer].astype(np.float32)
        tv = self.tail_v[:, layer].astype(np.float32)
        if self._step_kv is None:
            keys, values = tk, tv
        else:
            sk, sv = self._step_kv[layer]
            keys, values = np.concatenate([sk, tk]), np.concatenate([sv, tv])
        out, lse, p = _attention_with_probs(q, keys, values, self.cfg.group)
        n = len(self._attended) * self.window
        self._mass += p[:n].reshape(len(self._attended), self.window).sum(axis=1)
        if not self._in_drive:
            return out
        return self._select_in_drive(layer, q, out, lse)

    def _select_in_drive(self, layer: int, q, out, lse) -> np.ndarray:
        """This layer's pages chosen and attended in the drive, merged with the host's part
        (the drive's chain on the step's critical path, layer after layer)."""
        import hostlib

        c = self.cfg
        k, rerank = self._select
        keys = [self.key(w) for w in self._in_drive]
        pages = len(keys) * self.window // self.page_tokens
        k = max(1, min(k, pages))
        kw = dict(layer=layer, layers=c.layers, page_tokens=self.page_tokens, sink_pages=0,
                  recent_pages=0)
        q32 = np.ascontiguousarray(q, np.float32)
        f = self._submit(self.dev.topk_pages_async, keys, q32, kv_heads=c.kv_heads, k=k,
                         rerank=rerank, at=self._layer_t, **kw)
        ids = f.result()[0]
        g = self._submit(self.dev.attend_async, keys, q32, ids, at=f.device_ns, **kw)
        dout, dlse = g.result()
        # their requests (header, keys, queries; ATTEND's page ids) and results
        moved = 2 * (64 + 16 * len(keys) + q32.nbytes) + 2 * ids.nbytes + dout.nbytes \
            + dlse.nbytes + 4 * ids.size
        self.books.select_link_bytes += moved
        self.books.link_bytes += moved
        self._critical += g.device_ns - self._layer_t
        self._layer_t = g.device_ns + self.gpu_step_ns / c.layers
        self._selected[layer] = (ids, [w.index for w in self._in_drive])
        return hostlib.merge_attention([(out, lse), (dout, dlse)])[0]

    def end_step(self) -> None:
        """The step's masses onto its windows (mean over layers and query heads; rounded, so
        that a policy's decisions do not hang on the last bits of a BLAS sum), a full tail
        becomes a window (in HBM: the policy admits it next), the clock moves on."""
        mass = np.round(self._mass / self.cfg.layers, 7)
        by_index = {w.index: m for w, m in zip(self._attended, mass, strict=True)}
        for w in self.windows:
            w.mass = float(by_index.get(w.index, np.nan))
        self.books.steps += 1
        self.books.drive_ns += self._critical
        step = self.gpu_step_ns + self._critical
        self.books.step_ns += step
        self.t += step
        self.step += 1
        self._critical = 0.0

    def take_full_tail(self) -> Window | None:
        """A window made of the tail once it is full (in HBM), or None."""
        if self.tail_k.shape[0] < self.window:
            return None
        n = self.window
        w = Window(len(self.windows), self.tail_k[:n].copy(), self.tail_v[:n].copy())
        self.tail_k, self.tail_v = self.tail_k[n:], self.tail_v[n:]
        self.windows.append(w)
        return w

    def finish(self) -> None:
        """Every copy the drive holds deleted (the run's end)."""
        for w in self.windows:
            if w.copy is not None:
                self._submit(self.dev.kv_delete_async, self.key(w))
                w.copy = None


def _attention_with_probs(q: np.ndarray, k: np.ndarray, v: np.ndarray, group: int):
    """One query's attention (q (heads, d); k, v (T, kv_heads, d)): the output (heads, d),
    the log-sum-exp per query head (hostlib.merge_attention's), and each key's
    probability, mean over query heads (T,)."""
    hq, d = q.shape
    hkv = k.shape[1]
    qg = q.reshape(hkv, group, d)
    s = np.einsum("hgd,thd->hgt", qg, k) * float(d ** -0.5)
    m = s.max(axis=-1, keepdims=True)
    p = np.exp(s - m)
    z = p.sum(axis=-1, keepdims=True)
    p /= z
    out = np.einsum("hgt,thd->hgd", p, v).reshape(hq, d)
    lse = (np.log(z) + m).reshape(hq)
    return out, lse, p.reshape(hq, -1).mean(axis=0)
