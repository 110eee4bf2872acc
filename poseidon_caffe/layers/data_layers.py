"""Layer family: data_layers."""
