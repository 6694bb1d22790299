"""Storage: resume after kill -9 equals an uninterrupted search; several workers on SQLite and PostgreSQL.

The searches here use a synthetic fitness (a deterministic function of the subnet, with a short
sleep so workers overlap) and the analytic latency proxy, so they test the driver, not a model.
``python -m tests.nas.search.test_search_storage URL STUDY SEED SLEEP`` runs one worker (used as a subprocess).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path

import numpy as np
import optuna
import pytest

from nas.search import (
    AnalyticLatency,
    BudgetSearch,
    CachedLatency,
    Constraints,
    Evolution,
    LatencyBudget,
    SearchConfig,
    TrialStore,
    feasible_seeds,
    format_ms,
    open_storage,
    open_study,
    run_search,
    strategy_rng,
)
from nas.search.storage import ended
from search_spaces import UserError, load_space

ROOT = Path(__file__).resolve().parents[3]
CONFIG = SearchConfig(population=10, parents=4, mutations=6, crossovers=6, generations=4)
BUDGETS = (4.0, 8.0)


def synthetic_loss(subnet) -> float:
    """Lower for more capacity, with a fixed per-subnet wobble: a landscape with structure and noise."""
    capacity = subnet.embed_dim * sum(h * 32 + f for h, f in zip(subnet.heads, subnet.ffn_dim))
    penalty = 0.15 * sum(a == "linear" for a in subnet.attention) + 0.05 * sum(a == "local:32" for a in subnet.attention)
    wobble = (zlib.crc32(subnet.key.encode()) % 1000) / 1000 * 0.2
    return 2.0 + 4.0 * np.exp(-capacity / 60000) + penalty + wobble


def synthetic_fitness(sleep: float = 0.0, hang_after: int | None = None, marker: Path | None = None):
    """The synthetic loss; with ``hang_after``, the call that goes past that many subnets writes ``marker`` and hangs."""
    done = [0]

    def fitness(subnets):
        time.sleep(sleep * len(subnets))
        done[0] += len(subnets)
        if hang_after is not None and done[0] > hang_after:
            marker.write_text("evaluating")  # its claimed trials are RUNNING now
            time.sleep(600)
        return np.array([synthetic_loss(s) for s in subnets])

    return fitness


def searches_for(space, seed: int, config: SearchConfig = CONFIG, budgets=BUDGETS, strategy=Evolution):
    proxy = AnalyticLatency(space)
    latency = CachedLatency(proxy.predict, proxy.name)
    out = []
    for b in budgets:
        label = format_ms(b)
        cons = Constraints((LatencyBudget(b, latency, proxy.name),))
        seeds = feasible_seeds(space, cons, np.random.default_rng([seed, 1]))
        out.append(BudgetSearch(label, cons, strategy(space, config, cons.feasible, strategy_rng(seed, label), seeds)))
    return out, latency


def params_of(subnet) -> int:
    return subnet.embed_dim * 1000 + sum(subnet.ffn_dim)


def synthetic_search(url: str, study: str, seed: int, sleep: float = 0.0, batch: int = 4, hang_after=None, marker=None):
    space = load_space("tiny")
    searches, latency = searches_for(space, seed)
    storage = open_storage(url, grace_s=600)  # PostgreSQL: Optuna's heartbeat, no trial stale while the machine is busy
    fitness = synthetic_fitness(sleep, hang_after, marker)
    with TrialStore(open_study(storage, study, {"seed": seed, "config": CONFIG.to_dict()}), space) as store:
        return run_search(searches, fitness, latency, params_of, store, batch=batch, poll_s=0.2)


def start_worker(url: str, study: str, seed: int, sleep: float, hang_after: int | None = None, marker: Path | None = None):
    extra = [str(hang_after), str(marker)] if hang_after is not None else []
    return subprocess.Popen(
        [sys.executable, "-m", "tests.nas.search.test_search_storage", url, study, str(seed), str(sleep), *extra],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )


def trials(url: str, study: str):
    return optuna.load_study(study_name=study, storage=open_storage(url)).get_trials(deepcopy=False)


def outcome(result):
    """What a search produced: best per budget and every slot's subnet and loss."""
    return (
        {label: (r.subnet, r.loss, r.latency) for label, r in result.best.items()},
        sorted((r.slot, r.subnet.key, r.loss) for r in result.records),
    )


@pytest.fixture(scope="module")
def reference():
    """The uninterrupted single-worker search (in memory: the storage must not change a result)."""
    return outcome(synthetic_search("memory", "s", seed=3))


def test_uninterrupted_search_fills_every_slot_and_respects_budgets(reference):
    best, slots = reference
    assert len({s for s, _, _ in slots}) == len(slots)
    for label in ("4ms", "8ms"):  # every generation ran, its slots numbered 0..n-1
        sizes = [sorted(i for (b, g, i), _, _ in slots if b == label and g == gen) for gen in range(CONFIG.generations)]
        assert all(s == list(range(len(s))) and s for s in sizes)
        assert len(sizes[0]) == CONFIG.population
    assert CONFIG.evaluations < len(slots) <= len(BUDGETS) * CONFIG.evaluations
    for label, (subnet, loss, latency) in best.items():
        assert latency <= float(label.removesuffix("ms"))
    assert best["8ms"][1] < best["4ms"][1]  # more budget, lower loss on this landscape


def test_same_seed_same_search_other_seed_other_search(reference):
    assert outcome(synthetic_search("memory", "s", seed=3)) == reference
    other = outcome(synthetic_search("memory", "s", seed=4))
    assert other[1] != reference[1]


def test_killed_and_resumed_search_ends_like_an_uninterrupted_one(tmp_path, reference):
    url, marker = f"sqlite:///{tmp_path / 'kill.db'}", tmp_path / "evaluating"
    slots = len(reference[1])
    worker = start_worker(url, "s", seed=3, sleep=0.0, hang_after=slots // 3, marker=marker)
    deadline = time.time() + 120
    while not marker.exists() and time.time() < deadline and worker.poll() is None:
        time.sleep(0.05)
    assert marker.exists(), worker.stderr.read() if worker.poll() is not None else "worker too slow"
    worker.send_signal(signal.SIGKILL)  # kill -9 in the middle of a batch, some generations in
    worker.wait()
    before = trials(url, "s")
    left_running = [t.number for t in before if t.state.name == "RUNNING"]
    assert left_running and sum(t.state.name == "COMPLETE" for t in before) < slots

    resumed = synthetic_search(url, "s", seed=3)  # the same command again
    assert outcome(resumed) == reference
    after = {t.number: t for t in trials(url, "s")}
    why = ended(optuna.load_study(study_name="s", storage=open_storage(url)))
    for n in left_running:  # recovered: failed with the reason, and their slots redone by new trials
        assert after[n].state.name == "FAIL" and why[n]["state"] == "FAIL" and "died" in why[n]["why"]
    assert not any(t.state.name == "RUNNING" for t in after.values())
    assert resumed.claimed_here == slots - sum(t.state.name == "COMPLETE" for t in before)


def two_workers(url: str, reference):
    workers = [start_worker(url, "s", seed=3, sleep=0.01) for _ in range(2)]  # both race to create the study
    for w in workers:
        out, err = w.communicate(timeout=120)
        assert w.returncode == 0, err[-3000:]
    ts = trials(url, "s")
    complete = [t for t in ts if t.state.name == "COMPLETE"]
    owners = {t.system_attrs["nas:owner"] for t in complete}
    assert len(owners) == 2, "both workers evaluated subnets"
    assert len(complete) == len(reference[1]), "every slot evaluated exactly once"
    assert not any(t.state.name in ("RUNNING", "FAIL") for t in ts)
    # and the result is the one a single worker gets
    joined = synthetic_search(url, "s", seed=3)
    assert joined.claimed_here == 0 and outcome(joined) == reference


def test_two_workers_on_one_sqlite_storage(tmp_path, reference):
    two_workers(f"sqlite:///{tmp_path / 'two.db'}", reference)


def test_study_with_other_settings_is_refused(tmp_path):
    storage = open_storage(f"sqlite:///{tmp_path / 'x.db'}")
    open_study(storage, "s", {"seed": 1, "budgets": ["50ms"]})
    with pytest.raises(UserError, match=r"--study s: the storage holds this study with other settings \(seed: seed=1\)"):
        open_study(storage, "s", {"seed": 2, "budgets": ["50ms"]})


def test_unopenable_storage_is_a_user_error(tmp_path):
    with pytest.raises(UserError, match="--storage: cannot open"):
        open_storage("nosuchdialect://x/y")


# --------------------------------------------------------------------------- PostgreSQL


def _pg_bin() -> Path | None:
    found = shutil.which("initdb")
    if found:
        return Path(found).resolve().parent
    candidates = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"))
    return candidates[-1].parent if candidates else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def postgres_url():
    """A throwaway PostgreSQL server in a temporary directory, on a local socket (as user postgres under root)."""
    pg = _pg_bin()
    if pg is None:
        pytest.skip("PostgreSQL server binaries (initdb, pg_ctl) not found; .ci/run installs Debian's postgresql")
    pytest.importorskip("psycopg2", reason="psycopg2-binary (the dev extra) is needed to talk to PostgreSQL")
    base = Path(tempfile.mkdtemp(prefix="nas-pg-"))
    data, sock = base / "data", base / "sock"
    sock.mkdir()
    user = "postgres"
    prefix: list[str] = []
    if os.geteuid() == 0:  # the server refuses to run as root
        if shutil.which("runuser") is None:
            pytest.skip("running as root without runuser: cannot start PostgreSQL as another user")
        os.chmod(base, 0o777)
        shutil.chown(sock, user)
        prefix = ["runuser", "-u", user, "--"]
    else:
        user = os.environ.get("USER") or "postgres"
    port = _free_port()
    run = lambda *cmd: subprocess.run(prefix + list(cmd), capture_output=True, text=True, timeout=120)  # noqa: E731
    init = run(str(pg / "initdb"), "-D", str(data), "-A", "trust", "-U", user, "--no-sync")
    assert init.returncode == 0, init.stderr
    start = run(str(pg / "pg_ctl"), "-D", str(data), "-w", "-l", str(base / "log"),
                "-o", f"-k {sock} -p {port} -c listen_addresses='' -c fsync=off", "start")
    assert start.returncode == 0, start.stderr + (base / "log").read_text() if (base / "log").exists() else start.stderr
    try:
        yield f"postgresql+psycopg2://{user}@/postgres?host={sock}&port={port}"
    finally:
        run(str(pg / "pg_ctl"), "-D", str(data), "-m", "immediate", "stop")
        shutil.rmtree(base, ignore_errors=True)


def test_two_workers_on_postgresql(postgres_url, reference):
    two_workers(postgres_url, reference)


@pytest.fixture(params=["sqlite", "postgresql"])
def server_url(request, tmp_path):
    """A storage URL: SQLite (always here) and the throwaway PostgreSQL server (where its binaries are)."""
    return f"sqlite:///{tmp_path / 'beats.db'}" if request.param == "sqlite" else request.getfixturevalue("postgres_url")


def test_trials_of_a_worker_on_another_host_are_failed_by_heartbeat(server_url):
    from nas.search.storage import BEATING, heartbeat_interval, worker_id, worker_is_dead

    assert heartbeat_interval("postgresql://u@h/db") and heartbeat_interval("sqlite:///x.db") is None
    assert heartbeat_interval("memory") is None
    space = load_space("tiny")
    storage = open_storage(server_url, heartbeat_s=1, grace_s=3)  # Optuna's heartbeat, every second (default: 10 s, 60 s)
    study = open_study(storage, "heartbeat", {})
    killed = TrialStore(study, space, owner="some-other-host:123:456")  # its heartbeat stops: killed, or cut off
    killed.claim(("50ms", 0, 0), space.smallest(), 1.0, 100, cached=False)
    assert study.trials[0].system_attrs[BEATING]  # its first heartbeat is recorded as it claims
    killed.close()
    unmarked = TrialStore(study, space, owner="fourth-host:9:10", storage=open_storage(server_url, heartbeat_s=0))
    unmarked.claim(("50ms", 0, 2), space.smallest(), 1.0, 100, cached=False)  # died before its first heartbeat
    with TrialStore(study, space, owner="third-host:7:8") as beating:  # alive, beating every second
        beating.claim(("50ms", 0, 1), space.largest(), 1.0, 100, cached=False)
        with TrialStore(study, space) as here:
            assert not worker_is_dead("some-other-host:123:456") and not worker_is_dead(worker_id())
            assert here.recover() == []  # nothing stale for a whole grace period yet
            time.sleep(5)
            assert sorted(here.recover()) == [0, 1]  # the silent workers' trials; the beating one's stays
    assert [t.state.name for t in study.trials] == ["FAIL", "FAIL", "RUNNING"]
    why = ended(study)
    assert "sent no heartbeat for 3 s" in why[0]["why"] and "recorded no heartbeat" in why[1]["why"]
    assert why[0]["by"] == why[1]["by"] == here.owner and here.snapshot().owner_of(("50ms", 0, 0)) is None
    assert not [k for k in study.user_attrs if k.startswith("nas:alive:")]  # the heartbeat leaves no study attr


def test_dead_worker_on_this_host_is_recognised_at_once():
    from nas.search.storage import worker_id, worker_is_dead

    child = subprocess.run([sys.executable, "-c", "from nas.search.storage import worker_id; print(worker_id())"],
                           capture_output=True, text=True, cwd=ROOT)
    gone = child.stdout.strip()
    assert gone.startswith(socket.gethostname() + ":") and worker_is_dead(gone)
    assert not worker_is_dead(worker_id())
    host, pid, start = worker_id().rsplit(":", 2)
    assert worker_is_dead(f"{host}:{pid}:{float(start) + 1:.2f}")  # same pid, other start time: a reused pid
    assert not worker_is_dead(f"other-{host}:{pid}:{float(start) + 1:.2f}")  # another host: only its heartbeat tells


if __name__ == "__main__":
    url, study, seed, sleep = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
    hang = (int(sys.argv[5]), Path(sys.argv[6])) if len(sys.argv) > 5 else (None, None)
    result = synthetic_search(url, study, seed, sleep=sleep, hang_after=hang[0], marker=hang[1])
    print(result.claimed_here, {k: r.loss for k, r in result.best.items()})
