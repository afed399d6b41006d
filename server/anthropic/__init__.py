"""Anthropic Messages (messages.py); protocol.py holds what clients may send and its translation to chat messages."""
