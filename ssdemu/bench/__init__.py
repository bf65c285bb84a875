"""Benchmarks behind `ssdemu bench ...`: each measures its figure and the baseline it names
(fio, memcpy, a Python reference) in the same run and prints one JSON object with --json.
`_client_loop` (c/tools) is the C client side of `bench queue` and `bench kv`; `_engine_bench`
(c/tools, with its own copy of the engine) runs `bench io`'s closed loop."""
