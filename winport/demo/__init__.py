"""The tiny DeepSeek-V4 demo model: config, tokenizer and deterministic random weights."""
