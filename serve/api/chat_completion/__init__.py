"""/v1/chat/completions: its request and response bodies (protocol.py) and their serving (serving.py)."""
