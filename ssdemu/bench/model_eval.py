"""`ssdemu eval`: a real model decodes through the drive, its quality beside the drive's
modelled time.

The model (ssdemu.llm: SmolLM2-135M by default) prefills `context` tokens of a text; its KV
goes into the drive, a scheme at a time (plain, int8, int4, KIVI, fp8: quantized in the
drive, with page summaries).  Then `held` tokens are decoded teacher-forced, each step's
attention served through the drive one way per run: dense (every block dequantized in the
drive), host-select (page summaries on the host, Quest's rule there, the chosen pages read
back) or drive-select (TOPK_PAGES and ATTEND in the drive: rerank 1 is Quest's rule, the
default re-rank the drive's exact second stage), at page budgets given as percentages of the
context's pages.  Per run:

- quality: perplexity over the held span, greedy agreement with the model holding its plain
  fp16 KV in memory (the fraction of steps whose next-token choice is the same), and for
  drive-select the softmax mass its pages capture, per layer (of the model's own attention
  over every token);
- time, from the timing model (ssdemu/sim/retrieval.py's decode step, per profile): the
  KV's part of a decode step (ship every block / select and attend in the drive), its link
  and NAND bytes and compute utilization, the TPOT (the serving model's GPU step, then that
  part, as replay's decode mode books it), and the TTFT of the context's prefill on the
  serving model's GPU.

Nothing is fetched: the text is a file every Debian system has (the GPL, from base-files)
unless given."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import pathlib
import time

import numpy as np

DEFAULT_TEXT = "/usr/share/common-licenses/GPL-3"
METHODS = {"dense": ("dense", 1), "host-select": ("host-select", 1),
           "drive-select-rerank1": ("drive-select", 1),
           "drive-select": ("drive-select", 4)}  # name -> (mode, rerank)
# KIVI without a residual: the host's tail (the tokens of the block not yet full) is KIVI's
# full-precision window; with r128 a 64-token block would keep every token in fp16
SCHEMES = ("plain", "int8_g64", "int4_g64", "kivi4_g32_r0")
BLOCK_TOKENS, PAGE_TOKENS = 64, 16


@dataclasses.dataclass
class EvalSpec:
    text: str = DEFAULT_TEXT
    context: int = 512
    held: int = 32
    schemes: tuple = SCHEMES
    methods: tuple = tuple(METHODS)
    budgets_pct: tuple = (3, 6, 12)
    profiles: tuple = ("star2000d", "pcie4-tlc")
    model_path: str | None = None


def _ce(logits: np.ndarray, target: int) -> float:
    z = logits - logits.max()
    return float(np.log(np.exp(z).sum()) - z[target])


def _reference(m, ids, mem, spec):
    """The model holding its plain fp16 KV in memory: per step's cross-entropy and choice,
    and per layer and step the query (for the attention mass)."""
    ce, greedy, queries = [], [], []
    cache = copy.deepcopy(mem)
    for pos in range(spec.context, spec.context + spec.held):
        step_q = {}

        def attend(layer, q, k, v, step_q=step_q):
            step_q[layer] = q.copy()
            return cache.attend(layer, q, k, v)

        lg = m.decode_step(ids[pos], pos, attend)
        ce.append(_ce(lg, ids[pos + 1]))
        greedy.append(int(lg.argmax()))
        queries.append(step_q)
    return np.array(ce), greedy, queries, cache


def _mass(cfg, full, q: np.ndarray, layer: int, ids: np.ndarray, stored: int, total: int,
          sink: int, recent: int) -> float:
    """The softmax mass (mean over query heads) that the tokens drive-select attended hold
    of the model's own attention over every token seen (`total`): the chosen, sink and
    recent pages of the `stored` tokens in the drive, and the host's tail."""
    k = full.keys(layer)[:total]
    pages = stored // PAGE_TOKENS
    keep = np.zeros((cfg.kv_heads, total), bool)
    keep[:, stored:] = True
    for h in range(cfg.kv_heads):
        for p in [*ids[h][ids[h] >= 0].tolist(), *range(sink), *range(pages - recent, pages)]:
            keep[h, p * PAGE_TOKENS:(p + 1) * PAGE_TOKENS] = True
    scores = np.einsum("hd,thd->ht", q, np.repeat(k, cfg.group, axis=1)) / np.sqrt(q.shape[-1])
    prob = np.exp(scores - scores.max(axis=1, keepdims=True))
    prob /= prob.sum(axis=1, keepdims=True)
    return float((prob * np.repeat(keep, cfg.group, axis=0)).sum(axis=1).mean())


def _run(m, cfg, dev, ids, mem, ref, spec, scheme, method, budget_pages, n):
    """One scheme x method x budget through the drive."""
    from ssdemu.llm.drive_kv import DriveKV

    mode, rerank = METHODS[method]
    kv = DriveKV(dev, cfg, mode=mode, scheme=scheme, block_tokens=BLOCK_TOKENS,
                 page_tokens=PAGE_TOKENS, budget_pages=budget_pages, rerank=rerank,
                 prefix=b"e%d" % n)
    for layer in range(cfg.layers):
        kv.append(layer, mem.k[layer], mem.v[layer])
    ce_ref, greedy_ref, queries, full = ref
    ce, agree, mass, wall = [], 0, np.zeros(cfg.layers), 0.0
    kv.drive_s = 0.0  # the decode's, not the prefill's stores
    for i, pos in enumerate(range(spec.context, spec.context + spec.held)):
        t0 = time.perf_counter()
        kv.begin_step()
        lg = m.decode_step(ids[pos], pos, kv.attend)
        wall += time.perf_counter() - t0
        ce.append(_ce(lg, ids[pos + 1]))
        agree += int(lg.argmax()) == greedy_ref[i]
        if mode != "dense":
            for layer, (chosen, stored) in kv.last_ids.items():
                mass[layer] += _mass(cfg, full, queries[i][layer], layer, chosen, stored,
                                     spec.context + i + 1, kv.sink_pages, kv.recent_pages)
    kv.end()
    row = {"scheme": scheme, "method": method, "budget_pages": budget_pages,
           "perplexity": float(np.exp(np.mean(ce))),
           "greedy_agreement": agree / spec.held, "commands": dict(kv.commands),
           # this host's wall time per decoded token (not the modelled drive's): the model's
           # numpy layers and the host's attention, and the drive's commands sent and
           # waited for (the emulator's own work: the daemon's reads, kernels, the worker)
           "wall_ms_per_token": round(wall / spec.held * 1e3, 2),
           "wall_ms_per_token_in_drive": round(kv.drive_s / spec.held * 1e3, 2)}
    if mode != "dense":
        per_layer = mass / spec.held
        row["attention_mass"] = {"mean": float(per_layer.mean()),
                                 "per_layer": [round(float(x), 4) for x in per_layer]}
    return row


def _modelled(cfg, spec, method, budget_pages) -> dict:
    """The timing model's decode step (attention's part) per profile, and the TTFT."""
    from ssdemu.replay.serving import model_config
    from ssdemu.sim.profile import load as load_profile
    from ssdemu.sim.retrieval import AttentionShape, decode_step

    shape = AttentionShape(layers=cfg.layers, kv_heads=cfg.kv_heads, group=cfg.group,
                           head_dim=cfg.head_dim)
    mode, rerank = METHODS[method]
    serving = model_config("smollm2-135m")
    out = {"ttft_s": spec.context / serving.prefill_tokens_per_s}
    for name in spec.profiles:
        step = decode_step(load_profile(name), shape, spec.context,
                           "ship-all" if mode == "dense" else mode,
                           budget_tokens=max(1, budget_pages) * PAGE_TOKENS, rerank=rerank)
        # TPOT as replay's decode mode books it: the GPU's step, then the KV's from the drive
        out[name] = {**step.as_dict(), "tpot_ms": round(
            1e3 / serving.decode_tokens_per_s + step.latency_ns / 1e6, 4)}
    return out


@contextlib.contextmanager
def _drive(socket_path: str | None):
    """A connection to the daemon at socket_path, or to one started here for the run on
    memory media with its timing off (quality is what is measured through it)."""
    import hostlib
    from ssdemu.tools.daemon_process import private_daemon

    with contextlib.ExitStack() as stack:
        if socket_path is None:
            socket_path = stack.enter_context(private_daemon(
                "ssdemu-eval-", "mem:1G", ("--timing", "off"))).socket_path
        with hostlib.connect(socket_path) as dev:
            yield dev


def evaluate(spec: EvalSpec, socket_path: str | None = None, progress=None) -> dict:
    """The runs of spec on a drive (a daemon at socket_path, or one started here on memory
    media with its timing off: quality is what is measured through it).  spec.context: one
    length, or several (a report each, under "contexts")."""
    from ssdemu.llm.forward import Llama
    from ssdemu.llm.gguf_model import load

    contexts = tuple(spec.context) if isinstance(spec.context, (tuple, list)) \
        else (spec.context,)
    cfg, w, tok = load(spec.model_path)
    m = Llama(cfg, w)
    ids = tok.encode(pathlib.Path(spec.text).read_text())
    if len(ids) < max(contexts) + spec.held + 1:
        raise ValueError(f"{spec.text} has {len(ids)} tokens: fewer than context + held + 1")
    plans = [_plan(dataclasses.replace(spec, context=c)) for c in contexts]
    total = sum(len(runs) for _, _, runs in plans)
    reports, done = [], [0]

    def step():
        done[0] += 1
        if progress is not None:
            progress(done[0], total)

    with _drive(socket_path) as dev:
        for one, budgets, runs in plans:
            reports.append(_evaluate_context(m, cfg, dev, ids, one, budgets, runs,
                                             len(reports), step))
    if len(reports) == 1:
        return reports[0]
    return {"model": cfg.name, "text": spec.text, "contexts": reports}


def _plan(spec: EvalSpec):
    """One context's spec, its budgets in pages, and its runs (scheme, method, pages)."""
    pages = spec.context // PAGE_TOKENS
    budgets = sorted({max(1, round(pages * pct / 100)) for pct in spec.budgets_pct})
    runs = [(s, meth, b) for s in spec.schemes for meth in spec.methods
            for b in ([pages] if METHODS[meth][0] == "dense" else budgets)]
    return spec, budgets, runs


def _evaluate_context(m, cfg, dev, ids, spec, budgets, runs, index, step) -> dict:
    from ssdemu.llm.forward import KVCache

    mem = KVCache(cfg, np.float16)
    m.prefill(ids[:spec.context], cache=mem, last_only=True)
    ref = _reference(m, ids, mem, spec)
    pages = spec.context // PAGE_TOKENS
    rows = []
    for n, (scheme, method, budget) in enumerate(runs):
        row = _run(m, cfg, dev, ids, mem, ref, spec, scheme, method, budget,
                   index * 1000 + n)
        row["modelled"] = _modelled(cfg, spec, method, budget)
        rows.append(row)
        step()
    return {"model": cfg.name, "text": spec.text, "context_tokens": spec.context,
            "held_tokens": spec.held, "pages": pages, "budget_pages": budgets,
            "reference": {"perplexity": float(np.exp(np.mean(ref[0]))),
                          "what": "the model holding its plain fp16 KV in memory"},
            "runs": rows}


# Passkey retrieval as Landmark Attention and Quest measure it: a key hidden at a random
# depth in repeated filler, asked for at the end
FILLER = ("The grass is green. The sky is blue. The sun is yellow. Here we go. There and back "
          "again. ")
PASSKEY_INTRO = ("There is an important info hidden inside a lot of irrelevant text. Find it "
                 "and memorize it. I will quiz you about the important information there. ")
PASSKEY_QUESTION = " What is the pass key? The pass key is"


def passkey_prompt(tok, length: int, key: int, depth: float) -> list[int]:
    """About `length` tokens: the intro, filler with the key's sentence at `depth` (0..1)
    of it, the question."""
    needle = f" The pass key is {key}. Remember it. {key} is the pass key. "
    fixed = len(tok.encode(PASSKEY_INTRO + needle + PASSKEY_QUESTION))
    per = len(tok.encode(FILLER))
    n = max(2, (length - fixed) // per)
    before = int(n * depth)
    text = PASSKEY_INTRO + FILLER * before + needle + FILLER * (n - before) + PASSKEY_QUESTION
    return tok.encode(text)


def passkey(spec: EvalSpec, lengths, trials: int, seed: int = 0, socket_path=None,
            progress=None) -> dict:
    """Each method's accuracy at finding a 5-digit key: the prompt prefilled (its KV in the
    drive, plain), then the answer decoded greedily through the drive."""
    from ssdemu.llm.drive_kv import DriveKV
    from ssdemu.llm.forward import KVCache, Llama
    from ssdemu.llm.gguf_model import load

    cfg, w, tok = load(spec.model_path)
    m = Llama(cfg, w)
    rng = np.random.default_rng(seed)
    out: dict = {}
    done, total = 0, len(lengths) * trials
    with _drive(socket_path) as dev:
        for length in lengths:
            hits = {meth: 0 for meth in spec.methods}
            for _ in range(trials):
                key = int(rng.integers(10000, 100000))
                ids = passkey_prompt(tok, length, key, float(rng.uniform(0.05, 0.95)))
                mem = KVCache(cfg, np.float16)
                first = int(m.prefill(ids, cache=mem, last_only=True)[-1].argmax())
                pages = len(ids) // PAGE_TOKENS
                budget = max(1, round(pages * max(spec.budgets_pct) / 100))
                for meth in spec.methods:
                    mode, rerank = METHODS[meth]
                    kv = DriveKV(dev, cfg, mode=mode, budget_pages=budget, rerank=rerank,
                                 prefix=b"pk")
                    for layer in range(cfg.layers):
                        kv.append(layer, mem.k[layer], mem.v[layer])
                    answer, token = [], first
                    for pos in range(len(ids), len(ids) + 7):
                        answer.append(token)
                        kv.begin_step()
                        token = int(m.decode_step(token, pos, kv.attend).argmax())
                    kv.end()
                    hits[meth] += str(key) in tok.decode(answer)
                done += 1
                if progress is not None:
                    progress(done, total)
            out[str(length)] = {meth: hits[meth] / trials for meth in spec.methods}
    return {"trials": trials, "budget_pct": max(spec.budgets_pct), "accuracy": out}


def format_table(report: dict) -> str:
    lines = [f"{report['model']}: {report['context_tokens']} tokens of context, "
             f"{report['held_tokens']} decoded; reference perplexity "
             f"{report['reference']['perplexity']:.3f} (KV in memory)",
             f"{'scheme':<16}{'method':<22}{'pages':>6}{'ppl':>9}{'agree':>7}{'mass':>7}"
             + "".join(f"{p + ' TPOT ms':>20}" for p in report["runs"][0]["modelled"]
                       if p != "ttft_s")]
    for r in report["runs"]:
        mass = r.get("attention_mass", {}).get("mean")
        lines.append(f"{r['scheme']:<16}{r['method']:<22}{r['budget_pages']:>6}"
                     f"{r['perplexity']:>9.3f}{r['greedy_agreement']:>7.2f}"
                     f"{'' if mass is None else f'{mass:.3f}':>7}"
                     + "".join(f"{v['tpot_ms']:>20.4f}" for k, v in r["modelled"].items()
                               if k != "ttft_s"))
    return "\n".join(lines)


def plot(report: dict, out_dir: str, name: str = "quality_vs_tpot.png") -> str:
    """Perplexity against the modelled TPOT (first profile)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = pathlib.Path(out_dir) / name
    path.parent.mkdir(parents=True, exist_ok=True)
    prof = next(k for k in report["runs"][0]["modelled"] if k != "ttft_s")
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for method in dict.fromkeys(r["method"] for r in report["runs"]):
        rs = [r for r in report["runs"] if r["method"] == method]
        xs = [r["modelled"][prof]["tpot_ms"] for r in rs]
        ys = [r["perplexity"] for r in rs]
        ax.scatter(xs, ys, label=method)
        for x, y, r in zip(xs, ys, rs, strict=True):
            ax.annotate(f"{r['scheme']} {r['budget_pages']}p", (x, y), fontsize=7,
                        xytext=(4, 2), textcoords="offset points")
    ax.axhline(report["reference"]["perplexity"], color="gray", ls="--", lw=1,
               label="KV in memory")
    ax.set_xscale("log")
    ax.set_xlabel(f"modelled TPOT, {prof} (ms): the GPU's step and the KV's from the drive")
    ax.set_ylabel("perplexity over the held span")
    ax.set_title(f"{report['model']}: {report['context_tokens']}-token context")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return str(path)
