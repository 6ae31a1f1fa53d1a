"""Development-only helpers (not shipped): build upstream binaries, run a real control plane."""
