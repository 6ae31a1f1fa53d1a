"""pytest fixtures: cluster (see module owner in docs/architecture.md)."""
