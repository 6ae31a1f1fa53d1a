"""pytest fixtures: nri (see module owner in docs/architecture.md)."""
