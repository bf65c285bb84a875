"""The sizes of the drive's compressed blocks, as arithmetic on plain integers, without Numba.

Model-mode replay (ssdemu/replay) needs only how many bytes a block of a scheme takes on the
media; importing the firmware's compiled kernels to learn that cost a third of its start
(seconds when the machine is busy).  This module is the one definition of that arithmetic:
the compiled firmware calls these same functions (firmware/blockparams.py registers them
with Numba, which compiles them inline into its callers), and `compressed_nbytes` composes
them for a scheme's name in plain Python.

The scheme-name grammar is the firmware's (firmware/kind_*.py `parse`, which works on the
bytes of a command); `parse_scheme_name` here reads the same names as text, and
tests/test_sizes.py holds the two to the same answers on every name it generates, and every
registered kind to a body formula here.
"""

from __future__ import annotations

import re

HEADER_BYTES = 64  # firmware/blockfmt.py's header (blockparams.HEADER_BYTES is this one)
GROUPS = (32, 64, 128)  # the integer kinds' group sizes


def pad8(n):
    return (n + 7) & ~7


def element_bytes(dtype):
    """Bytes of an element of dtype code 0 (fp16), 1 (bf16) or 2 (fp32)."""
    return 4 if dtype == 2 else 2


def pages_of(tokens, page):
    return (tokens + page - 1) // page


def summary_section_bytes(tokens, layers, heads, head_dim, page, elem_bytes):
    """The page summaries' section (firmware/summaries.py): min and max per layer, KV head,
    page of `page` tokens and channel, in the block's element type; 0 when page is 0."""
    if page <= 0:
        return 0
    return pad8(layers * 2 * heads * pages_of(tokens, page) * head_dim * elem_bytes)


def code_bytes(n, bits):
    """Bytes of n codes of `bits` bits (8, 4 or 2), packed; the last byte partly used."""
    return (n * bits + 7) // 8


def int_section_used(n, group, bits, symmetric):
    """An integer section of n elements (firmware/int_sections.py): a float32 scale (and a
    zero point unless symmetric) per group, then the codes (8, 4 or 2 bits)."""
    groups = (n + group - 1) // group
    return 4 * groups * (1 if symmetric else 2) + code_bytes(n, bits)


def int_section_bytes(n, group, bits, symmetric):
    return pad8(int_section_used(n, group, bits, symmetric))


def kivi_quantized_tokens(tokens, group, residual):
    """Tokens KIVI quantizes: whole groups of `group` tokens before the last `residual`."""
    return max(0, tokens - residual) // group * group


# ---- each kind's body (firmware/kind_*.py body_bytes calls these) -------------------------

def int_body_bytes(elements, group, bits, symmetric):
    return int_section_bytes(elements, group, bits, symmetric)


def kivi_body_bytes(tokens, quantized, per_token, group, bits, elem_bytes):
    """Keys and values of the quantized tokens as two integer sections, the rest raw."""
    raw = (tokens - quantized) * 2 * per_token * elem_bytes
    return 2 * int_section_bytes(quantized * per_token, group, bits, False) + pad8(raw)


def fp8_body_bytes(elements, scales):
    return pad8(4 * scales) + pad8(elements)


def plain_body_bytes(elements, elem_bytes):
    return pad8(elements * elem_bytes)


# the compiled firmware's callers (firmware/blockparams.py registers them with Numba)
ARITHMETIC = (pad8, element_bytes, pages_of, summary_section_bytes, code_bytes, int_section_used,
              int_section_bytes, kivi_quantized_tokens, int_body_bytes, kivi_body_bytes,
              fp8_body_bytes, plain_body_bytes)


# ---- scheme names, as text ----------------------------------------------------------------

_BITS_GROUP = r"(?P<bits>[842])_g(?P<group>[0-9]{1,9})"
_GRAMMAR = {  # kind NAME -> the names it takes (firmware/kind_*.py GRAMMAR)
    "int": re.compile(r"int" + _BITS_GROUP + r"(?P<sym>_sym)?"),
    "kivi": re.compile(r"kivi" + _BITS_GROUP + r"_r(?P<residual>[0-9]{1,9})"),
    "fp8": re.compile(r"fp8_(?P<scale>tensor|head)"),
    "plain": re.compile(r"plain"),
}


# the kinds' GRAMMAR lines (firmware/kind_*.py), for the error firmware.quant gives too
GRAMMAR_TEXT = ("int8_gN / int4_gN [_sym] / int2_gN, kivi8_gN_rR / kivi4_gN_rR / kivi2_gN_rR, "
                f"fp8_tensor, fp8_head, plain (N in {GROUPS})")


def unknown_scheme(name) -> ValueError:
    return ValueError(f"unknown quantization scheme {name!r}: expected {GRAMMAR_TEXT}")


def kind_code(kind: str) -> int:
    """A kind's code in the block header and the C model (firmware/abi.py, generated from
    firmware/kinds.py's REGISTRY)."""
    from firmware import abi  # constants only

    return getattr(abi, "SCHEME_" + kind.upper())


def parse_scheme_name(name: str) -> dict | None:
    """A scheme's fields from its name ({kind, bits, group, symmetric, residual, per_head}),
    or None when no kind takes it."""
    if not isinstance(name, str) or not name.isascii() or len(name) > 32:
        return None
    name = name.rstrip("\0")  # NUL-padded, as the command's field carries it
    for kind, grammar in _GRAMMAR.items():
        m = grammar.fullmatch(name)
        if m is None:
            continue
        g = m.groupdict()
        group = int(g.get("group") or 0)
        if "group" in g and group not in GROUPS:
            return None
        if g.get("bits") == "2" and g.get("sym"):  # three levels: no scheme (quant_int.py)
            return None
        return {"kind": kind, "bits": 0 if kind == "plain" else int(g.get("bits") or 8),
                "group": group, "symmetric": bool(g.get("sym")),
                "residual": int(g.get("residual") or 0),
                "per_head": g.get("scale") == "head"}
    return None


def compressed_nbytes(tokens: int, layers: int, heads: int, head_dim: int, scheme: str,
                      dtype: int = 0, summary_page: int = 0) -> int:
    """The compressed block a store of this shape, scheme name and dtype code makes (header,
    body, page summaries): what firmware.quant.compressed_nbytes computes, in plain Python."""
    s = parse_scheme_name(scheme)
    if s is None:
        raise unknown_scheme(scheme)
    per_token = layers * heads * head_dim
    elements, eb = tokens * 2 * per_token, element_bytes(dtype)
    kind = s["kind"]
    if kind == "int":
        body = int_body_bytes(elements, s["group"], s["bits"], s["symmetric"])
    elif kind == "kivi":
        q = kivi_quantized_tokens(tokens, s["group"], s["residual"])
        body = kivi_body_bytes(tokens, q, per_token, s["group"], s["bits"], eb)
    elif kind == "fp8":
        body = fp8_body_bytes(elements, 2 * layers * heads if s["per_head"] else 1)
    else:
        body = plain_body_bytes(elements, eb)
    return HEADER_BYTES + body + summary_section_bytes(tokens, layers, heads, head_dim,
                                                       summary_page, eb)


# the kinds this module sizes (tests/test_sizes.py: every registered kind is one of them)
KINDS = tuple(_GRAMMAR)
