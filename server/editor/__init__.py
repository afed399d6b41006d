"""The editor's code completions at a cursor, POST /v1/lingcode/complete (serving.py)."""
