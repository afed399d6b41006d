"""The one path from token ids to an API's events, for every engine and every API: the scheduler
(one engine slot), text generation (detokenize, stop strings, timing), the turn (reasoning, tool
calls) and its metrics."""
