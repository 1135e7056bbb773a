"""The transports over the request layer (reflex_runtime/api/): serve (OpenAI-compatible HTTP) and
ipc (JSON lines on stdio and a unix socket). They only move bytes; handlers/app.py is the third,
for the serverless function."""
