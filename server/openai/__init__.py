"""OpenAI's chat completions (chat.py) and text completions (completions.py); protocol.py holds
what clients may send."""
