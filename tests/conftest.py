"""Fixtures shared across test modules."""

from workflow_helpers import reduced_run  # noqa: F401  (the reduced study, run once per session)
