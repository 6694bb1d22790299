"""``--device ssh://user@host`` against a real OpenSSH server on 127.0.0.1.

The test starts ``sshd`` (Debian's openssh-server; .ci/run installs it) on a port of its own with a throwaway
host key and a user key. On the other side ``$NAS_REMOTE_PYTHON`` is the clean venv's interpreter (numpy and
onnxruntime only), or a bare venv's. The client side is ``ssh -F CONFIG`` through ``$NAS_SSH`` / ``$NAS_SCP``.
Skipped with the reason where sshd is missing or cannot start. The server is stopped at the end.
"""

from __future__ import annotations

import getpass
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from latency.table import read_timings
from latency.timing_core import sidecar_path

from tests.latency.latency_fakes import MICRO

ROOT = Path(__file__).resolve().parents[2]
SSHD = shutil.which("sshd") or "/usr/sbin/sshd"
PROTOCOL = ["--timing-warmup", "1", "--repeats", "2", "--rounds", "2", "--max-retries", "0", "--timing-threads", "1"]

pytestmark = pytest.mark.skipif(
    not (os.path.exists(SSHD) and shutil.which("ssh") and shutil.which("scp") and shutil.which("ssh-keygen")),
    reason="OpenSSH server and client are not installed (apt-get install openssh-server)",
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def keygen(path: Path) -> str:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", path.name, "-f", str(path)], check=True)
    return path.with_suffix(".pub").read_text().strip()


@pytest.fixture(scope="module")
def sshd(tmp_path_factory, clean_python):
    """A running sshd and the client config: hosts ``good``, ``refused`` (a key the server does not know),
    ``unknown`` (no known host key); the pythons: ``good`` (numpy and onnxruntime), ``bare`` (neither)."""
    d = tmp_path_factory.mktemp("sshd")
    port, user = free_port(), getpass.getuser()
    host_pub = keygen(d / "host_key")
    bare = d / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True)
    (d / "authorized_keys").write_text(keygen(d / "good_key") + "\n")
    keygen(d / "refused_key")
    (d / "sshd_config").write_text(
        f"Port {port}\nListenAddress 127.0.0.1\nHostKey {d}/host_key\nPidFile {d}/sshd.pid\n"
        f"AuthorizedKeysFile {d}/authorized_keys\nPubkeyAuthentication yes\nPasswordAuthentication no\n"
        "KbdInteractiveAuthentication no\nPermitRootLogin prohibit-password\nStrictModes no\n"
        "UsePAM no\nSubsystem sftp internal-sftp\n"
    )
    (d / "known_hosts").write_text(f"[127.0.0.1]:{port} {host_pub}\n")
    (d / "config").write_text(
        "".join(
            f"Host {name}\n  HostName 127.0.0.1\n  Port {port}\n  User {user}\n  IdentityFile {d}/{key}_key\n"
            f"  IdentitiesOnly yes\n  UserKnownHostsFile {d}/{known}\n  StrictHostKeyChecking yes\n  BatchMode yes\n"
            "  ConnectTimeout 10\n  LogLevel ERROR\n"
            for name, key, known in [("good", "good", "known_hosts"), ("refused", "refused", "known_hosts"),
                                     ("unknown", "good", "no_known_hosts")]
        )
    )
    if os.geteuid() == 0:
        Path("/run/sshd").mkdir(exist_ok=True)  # sshd's privilege separation folder
    server = subprocess.Popen([SSHD, "-D", "-e", "-f", str(d / "sshd_config")], stderr=open(d / "sshd.log", "w"))
    try:
        for _ in range(100):
            if server.poll() is not None:
                pytest.skip(f"sshd did not start: {(d / 'sshd.log').read_text().strip()[-300:]}")
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.1)
        # a wrapper that records the pid of every ssh client it starts (so a test can kill one mid-run)
        (d / "ssh").write_text(f'#!/bin/sh\necho $$ >> "{d}/ssh.pids"\nexec ssh -F "{d}/config" "$@"\n')
        (d / "ssh").chmod(0o755)
        pythons = {"good": str(clean_python), "bare": str(bare / "bin" / "python3")}
        yield {"dir": d, "user": user, "ssh": str(d / "ssh"), "scp": f"scp -q -F {d}/config", "python": pythons}
    finally:
        server.terminate()
        server.wait(timeout=10)


def measure(sshd, tmp_path, host: str, out: Path, *extra: str) -> list[str]:
    (tmp_path / "micro.yaml").write_text(MICRO)
    return [sys.executable, "-m", "nas", "measure-latency", str(tmp_path / "micro.yaml"), "--device",
            f"ssh://{sshd['user']}@{host}", "--out", str(out), *PROTOCOL, *extra]


def environment(sshd, tmp_path, python: str = "good") -> dict:
    return {**os.environ, "PYTHONPATH": str(ROOT), "NAS_SSH": sshd["ssh"], "NAS_SCP": sshd["scp"],
            "NAS_REMOTE_DIR": str(tmp_path / "remote"), "NAS_REMOTE_PYTHON": sshd["python"][python],
            "NAS_CACHE": str(sshd["dir"] / "cache")}  # graphs exported once for the module


def rows_in(path: Path) -> int:
    return max(0, len(path.read_text().splitlines()) - 1) if path.exists() else 0


@pytest.mark.timeout(600)
def test_ssh_measures_through_sshd_and_resumes_after_the_connection_is_killed(sshd, tmp_path):
    out = tmp_path / "local" / "t.csv"
    # 3 subnets + 2 re-timed, one per group (--memory-mb), samples of 100 ms: rows land one by one, a few s apart
    cmd = measure(sshd, tmp_path, "good", out, "--samples", "3", "--retest", "0.5", "--memory-mb", "0.001",
                  "--min-sample-ms", "100")
    env = environment(sshd, tmp_path)
    first = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 300
    while time.time() < deadline and first.poll() is None:
        remote = list((tmp_path / "remote").glob("t-*/t.csv"))
        if remote and rows_in(remote[0]) >= 1:
            break
        time.sleep(0.05)
    assert first.poll() is None, f"the campaign ended before it could be cut: {first.communicate()}"
    running = int((sshd["dir"] / "ssh.pids").read_text().split()[-1])  # the ssh client running the bundle
    os.kill(running, signal.SIGKILL)  # the connection dies mid-campaign
    _, err = first.communicate(timeout=120)
    assert first.returncode == 2, err
    assert "running the bundle failed (killed by signal 9)" in err and "run the same command again to resume" in err, err
    partial = out.read_text().splitlines()
    assert 1 <= len(partial) - 1 < 5 and os.path.exists(sidecar_path(str(out)))  # the rows so far were fetched
    # the remote runner lost its connection: it stops at its next line of progress
    for _ in range(600):
        alive = [p for p in Path("/proc").glob("[0-9]*") if b"runner.py\x00--out\x00t.csv" in _cmdline(p)
                 and str(tmp_path / "remote") in _cwd(p)]
        if not alive:
            break
        time.sleep(0.1)
    assert not alive, "the remote runner kept running after its connection was killed"

    again = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr
    assert f"{len(partial) - 1} of 5 already measured" in again.stdout
    lines = out.read_text().splitlines()
    assert lines[: len(partial)] == partial  # the rows measured before the cut are kept, not re-measured
    t = read_timings(out)
    assert len(t.rows) == 5 and len(t.passes("measure")) == 3 and len(t.passes("retest")) == 2  # each subnet once
    assert t.fingerprint["device"] == "onnxruntime" and t.fingerprint["threads"] == 1
    finished = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)  # nothing left: fetched as is
    assert finished.returncode == 0 and "5 of 5 already measured" in finished.stdout
    assert out.read_text().splitlines() == lines


def _cmdline(p: Path) -> bytes:
    try:
        return (p / "cmdline").read_bytes()
    except OSError:
        return b""


def _cwd(p: Path) -> str:
    try:
        return os.readlink(p / "cwd")
    except OSError:
        return ""


@pytest.mark.parametrize(
    "host, python, expected",
    [
        ("refused", "good", "ssh could not reach {user}@refused (creating the remote folder): {user}@127.0.0.1: "
                            "Permission denied (publickey)."),
        ("unknown", "good", "ssh could not reach {user}@unknown (creating the remote folder): Host key verification failed."),
        ("good", "bare", "running the bundle failed (exit 2): error: numpy and onnxruntime are not installed for "),
    ],
)
def test_ssh_says_what_is_wrong_in_one_line(sshd, tmp_path, host, python, expected):
    out = tmp_path / "t.csv"
    done = subprocess.run(measure(sshd, tmp_path, host, out, "--samples", "2", "--retest", "0"),
                          env=environment(sshd, tmp_path, python), capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    errors = [ln for ln in done.stderr.splitlines() if "error:" in ln]
    assert len(errors) == 1 and expected.format(user=sshd["user"]) in errors[0], done.stderr
    assert errors[0].startswith(f"nas measure-latency: error: --device ssh://{sshd['user']}@{host}: ")
    assert not out.exists()  # nothing written locally
