"""Kubernetes plumbing every adapter may use (imports ``oversale/`` and libraries, no adapter)."""
