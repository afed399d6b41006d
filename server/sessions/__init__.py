"""Token-exact agent sessions (serving.py) over lingcode.agent.sessions; protocol.py holds the request bodies."""
