"""pytest fixtures: netns (see module owner in docs/architecture.md)."""
