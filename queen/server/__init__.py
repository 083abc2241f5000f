"""The server process: the supervisor, gunicorn's worker class, per-worker memory and
metrics shared between worker processes."""
