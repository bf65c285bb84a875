"""KV-cache traces: the Mooncake JSONL reader and a seeded synthetic generator."""
