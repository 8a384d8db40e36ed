"""Choosing each next token (logits processors, grammar, watermark, top tokens), stopping, and the
per-step `Generation` each request gets."""
