"""Acceptance checks that need hardware CI lacks; each runs from the repository root (`python -m checks.gpu`)."""
