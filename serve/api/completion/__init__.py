"""/v1/completions: its request and response bodies (protocol.py) and their serving (serving.py)."""
