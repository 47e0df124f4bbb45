"""`eyas serve`'s HTTP layer: the app and command line (server.py), one package per generation endpoint
(completion/, chat_completion/: protocol.py + serving.py, as vLLM lays them out), what they share
(protocol.py, serving.py), the non-generating endpoints (basic.py), the engine thread (runner.py),
tokens to text (text.py) and the Prometheus metrics (metrics.py)."""
