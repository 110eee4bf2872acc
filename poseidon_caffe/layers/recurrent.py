"""Layer family: recurrent."""
