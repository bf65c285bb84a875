"""The model's tokenizer, made from the GGUF's own vocabulary: byte-level BPE (GGUF's
tokenizer.ggml.model "gpt2": GPT-2's byte-to-character map, its pre-tokenizer regex, the
merges in rank order), control tokens matched whole before anything is split.

The "smollm" pre-tokenizer (SmolLM2's) splits digits one by one before GPT-2's regex, as its
tokenizer.json says (Digits(individual_digits) then ByteLevel); "gpt2", "llama-bpe" and the
rest of the GPT-2 family use the regex alone.  SentencePiece vocabularies ("llama") are not
read here."""

from __future__ import annotations

import functools

import regex

from ssdemu.errors import SsdemuError

GPT2_SPLIT = regex.compile(
    r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+""")
DIGITS = regex.compile(r"\p{N}|[^\p{N}]+")
CONTROL, USER_DEFINED = 3, 4  # GGUF token types matched whole


class TokenizerError(SsdemuError):
    pass


@functools.lru_cache(maxsize=1)
def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's map of the 256 byte values to printable characters."""
    keep = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
            + list(range(ord("®"), ord("ÿ") + 1)))
    chars, n = keep[:], 0
    for b in range(256):
        if b not in keep:
            keep.append(b)
            chars.append(256 + n)
            n += 1
    return dict(zip(keep, map(chr, chars), strict=True))


class Tokenizer:
    def __init__(self, tokens: list[str], merges: list[str], types: list[int] | None = None,
                 pre: str = "gpt2", bos: int | None = None, eos: int | None = None):
        self.tokens = tokens
        self.ids = {t: i for i, t in enumerate(tokens)}
        self.ranks = {tuple(m.split(" ", 1)): r for r, m in enumerate(merges)}
        self.special = {t: i for i, t in enumerate(tokens)
                        if types and types[i] in (CONTROL, USER_DEFINED)}
        self.pre = pre
        self.bos, self.eos = bos, eos
        self.byte_char = bytes_to_unicode()
        self.char_byte = {c: b for b, c in self.byte_char.items()}
        self._specials = (regex.compile("|".join(regex.escape(t) for t in sorted(
            self.special, key=len, reverse=True))) if self.special else None)

    @classmethod
    def from_gguf(cls, reader) -> Tokenizer:
        def get(key, default=None):
            f = reader.fields.get(key)
            return default if f is None else f.contents()

        model = get("tokenizer.ggml.model")
        if model != "gpt2":
            raise TokenizerError(f"a {model!r} vocabulary: only byte-level BPE (gpt2) is read")
        return cls(get("tokenizer.ggml.tokens"), get("tokenizer.ggml.merges", []),
                   get("tokenizer.ggml.token_type"), get("tokenizer.ggml.pre", "gpt2"),
                   get("tokenizer.ggml.bos_token_id"), get("tokenizer.ggml.eos_token_id"))

    @functools.lru_cache(maxsize=65536)  # noqa: B019 (one tokenizer a process)
    def _bpe(self, word: str) -> tuple[int, ...]:
        parts = list(word)
        while len(parts) > 1:
            best, at = None, -1
            for i in range(len(parts) - 1):
                r = self.ranks.get((parts[i], parts[i + 1]))
                if r is not None and (best is None or r < best):
                    best, at = r, i
            if best is None:
                break
            parts[at:at + 2] = [parts[at] + parts[at + 1]]
        try:
            return tuple(self.ids[p] for p in parts)
        except KeyError as e:
            raise TokenizerError(f"no token for {e.args[0]!r}") from None

    def _words(self, text: str):
        pieces = DIGITS.findall(text) if self.pre == "smollm" else [text]
        for piece in pieces:
            yield from GPT2_SPLIT.findall(piece)

    def encode(self, text: str, bos: bool = False) -> list[int]:
        out = [self.bos] if bos and self.bos is not None else []
        at = 0
        spans = list(self._specials.finditer(text)) if self._specials else []
        for m in [*spans, None]:
            chunk = text[at:m.start()] if m else text[at:]
            for w in self._words(chunk):
                out.extend(self._bpe("".join(self.byte_char[b] for b in w.encode("utf-8"))))
            if m:
                out.append(self.special[m.group()])
                at = m.end()
        return out

    def decode(self, ids) -> str:
        data = bytearray()
        for i in ids:
            t = self.tokens[int(i)]
            if t in self.special:
                data += t.encode("utf-8")
            else:
                data += bytes(self.char_byte[c] for c in t)
        return data.decode("utf-8", errors="replace")
