"""What agents need beyond text: tool prompts and tool-call parsers, reasoning split from the
answer, constrained decoding (forced tool calls, JSON), and token-exact sessions."""
