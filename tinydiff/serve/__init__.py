"""Serving: continuous batching over a Model (scheduler.py) and an OpenAI-compatible HTTP server (server.py)."""
