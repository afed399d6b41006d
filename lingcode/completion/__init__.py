"""Editor completions: the prompt at a cursor (prompt.py) and where a suggestion ends (cuts.py)."""
