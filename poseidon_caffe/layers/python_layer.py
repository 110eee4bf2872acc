"""Layer family: python_layer."""
