"""Layer family: inputs."""
