"""A seeded generator of Mooncake-format traces with controllable prefix sharing, arrival
rate and lengths.

Requests draw from `prefixes` shared prompts (a system prompt, a document): with probability
`share` a request starts with one of them (Zipf-like popularity: prefix i is chosen with
weight 1/(i+1)) and continues with blocks of its own.  Arrivals are Poisson at `rate_per_s`;
input lengths are lognormal around `mean_input_tokens`."""

from __future__ import annotations

import json
import random

from traces.mooncake import BLOCK_TOKENS, Request


def generate(n: int, seed: int = 0, share: float = 0.6, prefixes: int = 20,
             prefix_blocks: int = 8, rate_per_s: float = 4.0, mean_input_tokens: int = 8000,
             mean_output_tokens: int = 200) -> list[Request]:
    if not 0 <= share <= 1 or n < 0 or rate_per_s <= 0 or mean_input_tokens <= 0:
        raise ValueError("share in [0, 1]; n >= 0; rate and lengths positive")
    rng = random.Random(seed)
    next_id = 0
    shared = []
    for _ in range(prefixes):
        shared.append(list(range(next_id, next_id + prefix_blocks)))
        next_id += prefix_blocks
    weights = [1 / (i + 1) for i in range(prefixes)]
    t = 0.0
    out = []
    for _ in range(n):
        t += rng.expovariate(rate_per_s)
        tokens = max(1, int(rng.lognormvariate(0, 0.5) * mean_input_tokens))
        blocks = -(-tokens // BLOCK_TOKENS)
        ids = []
        if prefixes and rng.random() < share:
            ids = list(rng.choices(shared, weights)[0][:blocks])
        while len(ids) < blocks:
            ids.append(next_id)
            next_id += 1
        out.append(Request(int(t * 1000), tokens, max(1, int(rng.expovariate(
            1 / mean_output_tokens))), tuple(ids)))
    return out


def write(requests: list[Request], path: str) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for r in requests:
            f.write(json.dumps({"timestamp": r.timestamp_ms, "input_length": r.input_length,
                                "output_length": r.output_length,
                                "hash_ids": list(r.hash_ids)}) + "\n")
