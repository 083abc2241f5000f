"""gunicorn settings for Queen, from the package: `gunicorn -c gunicorn.conf.py` in a checkout.

The settings and hooks live in queen/gunicorn_conf.py, which the installed package carries:
`gunicorn -c python:queen.gunicorn_conf` runs the same from any folder (`queen serve` does).
"""

from queen.gunicorn_conf import *  # noqa: F403
