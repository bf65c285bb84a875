"""`ssdemu eval --policies`: KV placement policies on the real model, their quality beside
the bytes they move and the drive's modelled time (issue 59).

Per context length, the model (ssdemu.llm: SmolLM2-135M) prefills `context` tokens of a
text, then a reference pass decodes `held` tokens teacher-forced with its whole fp16 KV in
memory: per step its cross-entropy, its choice, and the attention mass of every page of
every layer and KV head (mean over the head's query heads).  Then each policy x memory
budget decodes the same tokens through the tier manager (ssdemu/llm/tiers.py) and the drive
(a daemon on the virtual clock, the profile's timing):

- quality: perplexity over the held span, greedy agreement with the reference;
- diagnostics, from the reference's masses and the policy's placement at each step:
  Future Missed Mass (FMM: the reference's attention on state the step did not attend:
  dropped, offloaded and not read, or pages the drive did not select), Global LIR (on state
  outside the full-precision tier: what the policy had judged inactive and demoted or
  dropped, coming back), placement match (of the windows decoding then read most, as many
  as HBM held, the share HBM held), promotions per step;
- cost: bytes over the link and on NAND (the drive's books), per step and for the prefill's
  placement, the moves by kind, and the modelled TPOT (the serving model's GPU step plus
  the step's drive time on the virtual clock).

The definitions of FMM and LIR are taken from the issue's own wording (the paper's text is
not available here): docs/tiers.md says so and how each is computed.  Passkey retrieval
(`--passkey`) runs each policy x budget over prompts with a key hidden at a random depth.
"""

from __future__ import annotations

import contextlib
import dataclasses
import pathlib
import time

import numpy as np

from ssdemu.bench.model_eval import DEFAULT_TEXT, _ce, passkey_prompt

PAGE_TOKENS, WINDOW = 16, 64
BUDGETS_PCT = (12.5, 25.0, 50.0)


@dataclasses.dataclass
class TierSpec:
    text: str = DEFAULT_TEXT
    contexts: tuple = (2048,)
    held: int = 256
    policies: tuple = ()
    budgets_pct: tuple = BUDGETS_PCT
    profile: str = "star2000d"
    seed: int = 0
    model_path: str | None = None


@dataclasses.dataclass
class Reference:
    mem: object  # the prefill's KVCache
    prefill_mass: np.ndarray  # per full window
    ce: np.ndarray
    greedy: list
    page_mass: list  # per step (layers, kv_heads, pages) float32


def _probs(q: np.ndarray, k: np.ndarray, group: int, causal_from: int | None = None):
    """Softmax of queries (n, heads, d) over keys (T, kv_heads, d): (n, kv_heads, T), mean
    over each KV head's query heads; causal_from c: query i sees keys up to c + i."""
    n, hq, d = q.shape
    hkv = k.shape[1]
    s = np.einsum("nhgd,thd->nhgt", q.reshape(n, hkv, group, d), k) * float(d ** -0.5)
    if causal_from is not None:
        mask = np.arange(k.shape[0])[None, :] > (causal_from + np.arange(n))[:, None]
        s = np.where(mask[:, None, None], -np.inf, s)
    s -= s.max(axis=-1, keepdims=True)
    p = np.exp(s)
    p /= p.sum(axis=-1, keepdims=True)
    return p.mean(axis=2)


def _pages(p: np.ndarray, page: int) -> np.ndarray:
    """(..., T) masses summed per page of `page` tokens (the last one partial)."""
    t = p.shape[-1]
    pad = (-t) % page
    if pad:
        p = np.concatenate([p, np.zeros((*p.shape[:-1], pad), p.dtype)], axis=-1)
    return p.reshape(*p.shape[:-1], -1, page).sum(axis=-1)


def reference(m, cfg, ids, context: int, held: int) -> Reference:
    """The prefill (its last window's queries kept), then the reference decode."""
    import copy

    from ssdemu.llm.forward import KVCache, attention

    mem = KVCache(cfg, np.float16)
    m.prefill(ids[:context], cache=mem, last_only=True, keep_queries=WINDOW)
    n = context // WINDOW
    pm = np.zeros(n)
    for layer, q in enumerate(m.last_queries):
        p = _probs(q, mem.keys(layer), cfg.group, causal_from=context - q.shape[0])
        pm += _pages(p.mean(axis=(0, 1)), WINDOW)[:n]
    cache = copy.deepcopy(mem)
    ce, greedy, page_mass = [], [], []
    for pos in range(context, context + held):
        step = []

        def attend(layer, q, k, v, step=step):
            cache.append(layer, k[None], v[None])
            keys = cache.keys(layer)
            step.append(_pages(_probs(q[None], keys, cfg.group)[0], PAGE_TOKENS))
            return attention(q[None], keys, cache.values(layer), None)[0]

        lg = m.decode_step(ids[pos], pos, attend)
        ce.append(_ce(lg, ids[pos + 1]))
        greedy.append(int(lg.argmax()))
        page_mass.append(np.stack(step).astype(np.float32))
    return Reference(mem, pm / cfg.layers, np.array(ce), greedy, page_mass)


def _step_diagnostics(m, pages: np.ndarray, attended: set, hbm: set, selected: dict) -> dict:
    """One step's FMM, LIR and placement match from the reference's page masses (layers,
    kv_heads, pages) and the policy's sets at the step's start."""
    per = WINDOW // PAGE_TOKENS
    nwin = len(m.windows)
    captured = pages[:, :, nwin * per:].sum(axis=-1)  # the tail: always attended
    full = captured.copy()
    for w in range(nwin):
        wm = pages[:, :, w * per:(w + 1) * per].sum(axis=-1)
        if w in attended:
            captured += wm
        if w in hbm:
            full += wm
    for layer, (ids, windows) in selected.items():
        for h in range(ids.shape[0]):
            for pid in ids[h][ids[h] >= 0].tolist():
                g = windows[pid // per] * per + pid % per
                captured[layer, h] += pages[layer, h, g]
    window_mass = _pages(pages.mean(axis=(0, 1))[:nwin * per], per)
    k = len(hbm)
    top = set(np.argsort(-window_mass, kind="stable")[:k].tolist()) if k else set()
    return {"fmm": float(1 - captured.mean()), "lir": float(1 - full.mean()),
            "match": len(top & hbm) / k if k else 1.0}


def _model_books(dev) -> dict:
    """The drive's books: its timing model's, and the retrieval worker's NAND reads (it
    times TOPK_PAGES and ATTEND on its own: ssdemu/device/retrieval.py)."""
    log = dev.log()
    b = log["model"]
    return {"link": b["link_bytes"],
            "nand_read": b["nand_bytes_read"] + log["retrieval"]["nand_bytes_read"],
            "nand_written": b["nand_bytes_written"]}


def _delta(after: dict, before: dict) -> dict:
    return {k: after[k] - before[k] for k in after}


# where the next run on a device starts on its virtual clock: past the end of the last one by
# DRAIN_NS, so that no run queues behind another's background demotions, stores and deletes
# (each policy's TPOT grew with the runs before it on the same daemon: qevict at 2K and 256
# tokens 16.2 ms after six policies, 2.3 ms first)
DRAIN_NS = 60e9
_next_start: dict[int, float] = {}


def run_policy(model, cfg, dev, ids, ref: Reference, context: int, held: int, name: str,
               hbm_tokens: int, gpu_step_ns: float, seed: int = 0, prefix: bytes = b"t",
               diagnostics: bool = True):
    """One policy at one budget: (its row, the manager: its decisions in m.log)."""
    from ssdemu.llm.policies import POLICIES
    from ssdemu.llm.tiers import DRIVE, TierManager

    pol = POLICIES[name](seed)
    m = TierManager(dev, cfg, hbm_tokens=hbm_tokens, window=WINDOW, page_tokens=PAGE_TOKENS,
                    gpu_step_ns=gpu_step_ns, prefix=prefix, seed=seed,
                    start_ns=_next_start.get(id(dev), 0.0))
    m.load_prefill(ref.mem.k, ref.mem.v, ref.prefill_mass)
    before = _model_books(dev)
    if pol.keeps_drive_copy:
        for w in m.windows:
            m.store(w, DRIVE)
    pol.place(m)
    placed = _model_books(dev)
    prefill_link = m.books.link_bytes
    ce, agree, diag, t0 = [], 0, [], time.perf_counter()
    try:
        for i, pos in enumerate(range(context, context + held)):
            seen = []
            lg = decode_one(model, m, pol, ids[pos], pos, seen)
            ce.append(_ce(lg, ids[pos + 1]))
            agree += int(lg.argmax()) == ref.greedy[i]
            if diagnostics:
                diag.append(_step_diagnostics(m, ref.page_mass[i], *seen))
        wall = time.perf_counter() - t0
    finally:
        m.finish()
        _next_start[id(dev)] = m.t + DRAIN_NS
    decode = _delta(_model_books(dev), placed)
    decode["link"] += m.books.select_link_bytes  # the retrieval worker's: counted here
    steps = max(1, m.books.steps)
    row = {"policy": name, "hbm_tokens": hbm_tokens,
           "perplexity": float(np.exp(np.mean(ce))), "greedy_agreement": agree / held,
           "tpot_ms": round(m.books.step_ns / steps / 1e6, 4),
           "drive_ms_per_token": round(m.books.drive_ns / steps / 1e6, 4),
           "link_bytes_per_token": round(decode["link"] / steps),
           "nand_bytes_per_token": round((decode["nand_read"] + decode["nand_written"])
                                         / steps),
           "placement": {"link_bytes": prefill_link,
                         "nand_bytes": sum(_delta(placed, before).values())
                         - _delta(placed, before)["link"]},
           "moves": {k: v for k, v in m.books.as_dict().items()
                     if k in ("stores", "reads", "promotions", "demotions", "drops")},
           "promotions_per_step": m.books.promotions / steps,
           "final_tiers": _tier_counts(m),
           "wall_s": round(wall, 2)}
    if diag:
        row.update({k: float(np.mean([d[k] for d in diag])) for k in ("fmm", "lir", "match")})
    return row, m


def decode_one(model, m, pol, token: int, pos: int, seen: list | None = None) -> np.ndarray:
    """One decode step under a policy: its reads, the model's step over what the manager
    serves, the policy's update, a full tail made a window and admitted.  seen (a list):
    gets the step's attended and HBM windows' indexes and the drive's page choices."""
    from ssdemu.llm.tiers import DRAM, DRIVE, HBM

    m.begin_step(pol.reads(m), select_pages=pol.select_pages(m))
    if seen is not None:
        seen += [{w.index for w in m._attended},
                 {w.index for w in m.windows if w.tier in (HBM, DRAM)}]
    lg = model.decode_step(token, pos, m.attend)
    if seen is not None:
        seen.append(dict(m._selected))
    m.end_step()
    pol.update(m)
    w = m.take_full_tail()
    if w is not None:
        if pol.keeps_drive_copy:
            m.store(w, DRIVE)
        pol.admit(m, w)
    return lg


def _tier_counts(m) -> dict:
    out: dict[str, int] = {}
    for w in m.windows:
        out[w.tier] = out.get(w.tier, 0) + 1
    return out


@contextlib.contextmanager
def _drive(socket_path: str | None, profile: str):
    """A connection to the daemon at socket_path, or to one started here on memory media on
    the virtual clock (each command booked on the profile's timing, none waited for)."""
    import hostlib
    from ssdemu.tools.daemon_process import private_daemon

    with contextlib.ExitStack() as stack:
        if socket_path is None:
            socket_path = stack.enter_context(private_daemon(
                "ssdemu-tiers-", "mem:1G", ("--clock", "virtual", "--profile", profile)))\
                .socket_path
        with hostlib.connect(socket_path) as dev:
            yield dev


def gpu_step_ns() -> float:
    """The serving model's GPU decode step (replay's model of SmolLM2-135M)."""
    from ssdemu.replay.serving import model_config

    return 1e9 / model_config("smollm2-135m").decode_tokens_per_s


def budgets_for(context: int, pcts) -> list[int]:
    """Memory budgets in tokens: each percentage of the context in whole windows (two at
    least: the sink and the newest)."""
    return sorted({max(2, round(context * p / 100 / WINDOW)) * WINDOW for p in pcts})


def evaluate(spec: TierSpec, socket_path: str | None = None, progress=None) -> dict:
    """Every policy x budget at every context length: a report per context."""
    from ssdemu.llm.forward import Llama
    from ssdemu.llm.gguf_model import load
    from ssdemu.llm.policies import POLICIES

    policies = spec.policies or tuple(POLICIES)
    cfg, w, tok = load(spec.model_path)
    model = Llama(cfg, w)
    ids = tok.encode(pathlib.Path(spec.text).read_text())
    need = max(spec.contexts) + spec.held + 1
    if len(ids) < need:
        raise ValueError(f"{spec.text} has {len(ids)} tokens: fewer than context + held + 1")
    total = sum(len(budgets_for(c, spec.budgets_pct)) * len(policies) for c in spec.contexts)
    done, reports, g = 0, [], gpu_step_ns()
    with _drive(socket_path, spec.profile) as dev:
        for context in spec.contexts:
            ref = reference(model, cfg, ids, context, spec.held)
            rows = []
            for budget in budgets_for(context, spec.budgets_pct):
                for name in policies:
                    row, _ = run_policy(model, cfg, dev, ids, ref, context, spec.held, name,
                                        budget, g, spec.seed, prefix=b"t%d" % done)
                    rows.append(row)
                    done += 1
                    if progress is not None:
                        progress(done, total)
            reports.append({"model": cfg.name, "profile": spec.profile,
                            "context_tokens": context, "held_tokens": spec.held,
                            "window_tokens": WINDOW, "gpu_step_ms": round(g / 1e6, 4),
                            "reference": {"perplexity": float(np.exp(np.mean(ref.ce)))},
                            "runs": rows, "claims": claims(rows)})
    return {"reports": reports}


def claims(rows) -> dict:
    """The two claims the issue asks to test, per budget, as the runs came out:
    recoverable beats drop at equal memory (QEvict's perplexity against H2O's, its dropping
    twin), and attention's signal against random (H2O against the random control)."""
    out = {}
    by = {(r["policy"], r["hbm_tokens"]): r for r in rows}
    for budget in sorted({r["hbm_tokens"] for r in rows}):
        c = {}
        for a, b, what in (("qevict", "h2o", "recoverable_beats_drop"),
                           ("h2o", "random", "attention_beats_random")):
            if (a, budget) in by and (b, budget) in by:
                pa, pb = by[(a, budget)]["perplexity"], by[(b, budget)]["perplexity"]
                c[what] = {"holds": pa < pb, a: round(pa, 4), b: round(pb, 4)}
        out[str(budget)] = c
    return out


def passkey(spec: TierSpec, lengths, trials: int, socket_path=None, progress=None) -> dict:
    """Each policy x budget's accuracy at finding a 5-digit key hidden at a random depth
    (the prompt prefilled, its KV placed by the policy, the answer decoded greedily)."""
    from ssdemu.llm.forward import KVCache, Llama
    from ssdemu.llm.gguf_model import load
    from ssdemu.llm.policies import POLICIES

    policies = spec.policies or tuple(POLICIES)
    cfg, w, tok = load(spec.model_path)
    model = Llama(cfg, w)
    rng = np.random.default_rng(spec.seed)
    out: dict = {}
    done, g = 0, gpu_step_ns()
    with _drive(socket_path, spec.profile) as dev:
        for length in lengths:
            hits: dict = {}
            for _ in range(trials):
                key = int(rng.integers(10000, 100000))
                ids = passkey_prompt(tok, length, key, float(rng.uniform(0.05, 0.95)))
                mem = KVCache(cfg, np.float16)
                first = int(model.prefill(ids, cache=mem, last_only=True,
                                          keep_queries=WINDOW)[-1].argmax())
                ref = _prompt_reference(model, cfg, ids, mem)
                for budget in budgets_for(len(ids), spec.budgets_pct):
                    for name in policies:
                        got = _answer(model, cfg, dev, ref, ids, first, name, budget, g, spec)
                        k = f"{name}@{budget}"
                        hits[k] = hits.get(k, 0) + (str(key) in tok.decode(got))
                done += 1
                if progress is not None:
                    progress(done, len(lengths) * trials)
            out[str(length)] = {k: v / trials for k, v in hits.items()}
    return {"trials": trials, "budgets_pct": list(spec.budgets_pct), "accuracy": out}


def _prompt_reference(model, cfg, ids, mem) -> Reference:
    n = len(ids) // WINDOW
    pm = np.zeros(n)
    for layer, q in enumerate(model.last_queries):
        p = _probs(q, mem.keys(layer), cfg.group, causal_from=len(ids) - q.shape[0])
        pm += _pages(p.mean(axis=(0, 1)), WINDOW)[:n]
    return Reference(mem, pm / cfg.layers, np.zeros(0), [], [])


def _answer(model, cfg, dev, ref, ids, first, name, budget, g, spec) -> list[int]:
    from ssdemu.llm.policies import POLICIES
    from ssdemu.llm.tiers import DRIVE, TierManager

    pol = POLICIES[name](spec.seed)
    m = TierManager(dev, cfg, hbm_tokens=budget, window=WINDOW, page_tokens=PAGE_TOKENS,
                    gpu_step_ns=g, prefix=b"pk", seed=spec.seed)
    m.load_prefill(ref.mem.k, ref.mem.v, ref.prefill_mass)
    answer, token = [], first
    try:
        if pol.keeps_drive_copy:
            for w in m.windows:
                m.store(w, DRIVE)
        pol.place(m)
        for pos in range(len(ids), len(ids) + 7):
            answer.append(token)
            token = int(decode_one(model, m, pol, token, pos).argmax())
    finally:
        m.finish()
    return answer


def format_table(report: dict) -> str:
    lines = [f"{report['model']} on {report['profile']}: {report['context_tokens']} tokens "
             f"of context, {report['held_tokens']} decoded; reference perplexity "
             f"{report['reference']['perplexity']:.3f} (whole KV in memory); GPU step "
             f"{report['gpu_step_ms']} ms",
             f"{'policy':<14}{'HBM tok':>8}{'ppl':>9}{'agree':>7}{'FMM':>7}{'LIR':>7}"
             f"{'match':>7}{'prom/st':>8}{'link B/tok':>12}{'NAND B/tok':>12}{'TPOT ms':>9}"]
    for r in report["runs"]:
        lines.append(f"{r['policy']:<14}{r['hbm_tokens']:>8}{r['perplexity']:>9.3f}"
                     f"{r['greedy_agreement']:>7.2f}{r.get('fmm', 0):>7.3f}"
                     f"{r.get('lir', 0):>7.3f}{r.get('match', 0):>7.2f}"
                     f"{r['promotions_per_step']:>8.3f}{r['link_bytes_per_token']:>12,}"
                     f"{r['nand_bytes_per_token']:>12,}{r['tpot_ms']:>9.3f}")
    for budget, c in report["claims"].items():
        for what, v in c.items():
            lines.append(f"  {budget} tokens: {what.replace('_', ' ')}: "
                         f"{'holds' if v['holds'] else 'does not hold'} "
                         f"({', '.join(f'{k} {x}' for k, x in v.items() if k != 'holds')})")
    return "\n".join(lines)


def plot(report: dict, out_dir: str) -> str:
    """Perplexity against the bytes each policy moved per token (link + NAND)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = pathlib.Path(out_dir) / f"tiers_{report['context_tokens']}.png"
    path.parent.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name in dict.fromkeys(r["policy"] for r in report["runs"]):
        rs = [r for r in report["runs"] if r["policy"] == name]
        xs = [max(1, r["link_bytes_per_token"] + r["nand_bytes_per_token"]) for r in rs]
        ax.plot(xs, [r["perplexity"] for r in rs], "o-", label=name)
        for x, r in zip(xs, rs, strict=True):
            ax.annotate(str(r["hbm_tokens"]), (x, r["perplexity"]), fontsize=7,
                        xytext=(3, 2), textcoords="offset points")
    ax.axhline(report["reference"]["perplexity"], color="gray", ls="--", lw=1,
               label="whole KV in memory")
    ax.set_xscale("log")
    ax.set_xlabel("bytes moved per decoded token (link + NAND)")
    ax.set_ylabel("perplexity over the held span")
    ax.set_title(f"{report['model']}: {report['context_tokens']}-token context; labels: "
                 "HBM tokens")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return str(path)
