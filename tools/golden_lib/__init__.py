"""Helpers for tools/make_golden.py: tiny DeepSeek-V4 reference fixtures built with transformers."""
