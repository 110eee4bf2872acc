"""Layer family: vision."""
