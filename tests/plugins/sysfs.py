"""pytest fixtures: sysfs (see module owner in docs/architecture.md)."""
