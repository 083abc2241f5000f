"""Queen: a message queue server backed by PostgreSQL."""

__version__ = "0.1.0"
