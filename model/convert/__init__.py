"""Converters from other toolkits' checkpoints into ours (`marian`: OPUS-MT / MarianMT)."""
