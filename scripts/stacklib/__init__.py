"""The pieces of scripts/stack (standard library only)."""
