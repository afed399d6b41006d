"""lingcode's terminal chat and agent UI (its own issue)."""
