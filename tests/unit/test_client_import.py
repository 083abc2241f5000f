"""queen.client needs httpx alone: none of the server's dependencies."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import ROOT

BLOCKED = ("gevent", "psycopg", "psycopg_pool", "falcon", "orjson", "gunicorn", "cryptography",
           "prometheus_client", "geventwebsocket")

PROGRAM = f"""
import sys

class Refuse:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {BLOCKED!r}:
            raise ImportError(f"blocked: {{name}}")
        return None

sys.meta_path.insert(0, Refuse())
import queen.client
from queen.client import AsyncQueen, Queen
import queen.client.cli
Queen("http://127.0.0.1:1").close()
loaded = sorted(m for m in sys.modules if m.split(".")[0] in {BLOCKED!r})
print("loaded:", loaded)
sys.exit(1 if loaded else 0)
"""


def test_the_client_imports_with_server_dependencies_blocked():
    done = subprocess.run([sys.executable, "-c", PROGRAM], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr + done.stdout
    assert "loaded: []" in done.stdout


def test_the_blocker_does_block():
    program = PROGRAM.replace("import queen.client\n", "import queen.client\nimport falcon\n", 1)
    done = subprocess.run([sys.executable, "-c", program], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode != 0
    assert "blocked: falcon" in done.stderr
