"""The search's Optuna storage: every evaluated subnet is one trial.

A trial holds the subnet as parameters (``embed_dim``, ``depth``, ``l{i}.heads`` ...,
categorical, so dashboards show them), its validation loss as the value, and user attrs
``subnet`` (JSON), ``latency_ms``, ``params``, ``budget``, ``generation`` and ``cached``
(the loss was reused from an earlier trial of the same subnet); each one a database row, so few.
System attrs: ``nas:slot`` = [budget, generation, index], the place of the subnet in the
search, and ``nas:owner`` = host:pid:start-time of the worker that claimed it.

A worker *claims* a slot by creating a RUNNING trial for it (one transaction, parameters
and attrs included); the lowest-numbered live trial of a slot owns it, a later one is
PRUNED unevaluated.  Trials left RUNNING by a dead worker are failed (so the slot is open
again): at once when the worker ran on this host (its pid is gone), else by Optuna's
heartbeat (RDB storages) after ``GRACE_S`` seconds.  The study's settings live in its
user attr ``nas:config``; opening it with other settings is refused.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import socket
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from search_spaces import Space, Subnet, UserError

SLOT, OWNER, CONFIG = "nas:slot", "nas:owner", "nas:config"
HEARTBEAT_S, GRACE_S = 10, 60
Slot = tuple[str, int, int]  # (budget label, generation, index)


def _optuna():
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    return optuna


def default_storage(out_dir: str | Path) -> str:
    return f"sqlite:///{Path(out_dir).resolve() / 'search.db'}"


def open_storage(url: str, heartbeat_s: int | None = HEARTBEAT_S, grace_s: int = GRACE_S, attempts: int = 20):
    """An Optuna storage for ``url`` (any SQLAlchemy database URL Optuna takes; ``memory``: in-process).

    SQLite waits up to 60 s for a lock instead of 5.  Creating the tables races when several
    workers open a fresh database at once; that is retried.  Database servers get Optuna's
    heartbeat (every ``heartbeat_s``; a RUNNING trial silent for ``grace_s`` belongs to a dead worker).
    """
    optuna = _optuna()
    from sqlalchemy.exc import SQLAlchemyError

    if url == "memory":  # one process only, nothing kept: tests and benchmarks
        return optuna.storages.InMemoryStorage()
    kwargs: dict[str, Any] = {}
    if url.startswith("sqlite"):
        # One host: dead workers are found by pid, no heartbeat needed.  WAL + synchronous=NORMAL:
        # a commit is not an fsync (a killed process loses nothing; a power cut may lose the last trials).
        kwargs["engine_kwargs"] = {"creator": _sqlite_creator(url)}
        heartbeat_s = None
    if heartbeat_s:
        kwargs.update(heartbeat_interval=heartbeat_s, grace_period=grace_s)
    for attempt in range(attempts):
        try:
            return optuna.storages.get_storage(optuna.storages.RDBStorage(url, **kwargs))
        except (SQLAlchemyError, optuna.exceptions.StorageInternalError) as e:
            if attempt == attempts - 1 or not _is_race(e):
                raise UserError(f"--storage: cannot open {url!r}: {str(e).splitlines()[0][:300]}") from None
            time.sleep(0.05 * (attempt + 1))
        except (ValueError, ImportError, ModuleNotFoundError) as e:
            raise UserError(f"--storage: cannot open {url!r}: {e}") from None


def _sqlite_creator(url: str):
    import sqlite3

    from sqlalchemy.engine import make_url

    database = make_url(url).database or ":memory:"
    if database != ":memory:":
        Path(database).parent.mkdir(parents=True, exist_ok=True)

    def connect():
        conn = sqlite3.connect(database, timeout=60, check_same_thread=False)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        return conn

    return connect


def _is_race(e: Exception) -> bool:
    text = str(e).lower()
    return any(s in text for s in ("already exists", "locked", "unique", "duplicate", "deadlock", "integrity", "version_info"))


def config_hash(config: dict) -> str:
    return hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()[:8]


def open_study(storage, name: str, config: dict, attempts: int = 20):
    """Create the study ``name`` once (several workers may race here) or load it; check its settings."""
    optuna = _optuna()
    for attempt in range(attempts):
        try:
            study = optuna.create_study(
                storage=storage, study_name=name, direction="minimize", load_if_exists=True,
                sampler=optuna.samplers.RandomSampler(seed=0),  # never asked: trials are created with their parameters
            )
            stored = study.user_attrs.get(CONFIG)
            if stored is None:
                study.set_user_attr(CONFIG, config)
                stored = config
            break
        except Exception as e:  # noqa: BLE001 - a lost creation race surfaces as several exception types
            if attempt == attempts - 1 or not _is_race(e):
                raise
            time.sleep(0.05 * (attempt + 1))
    stored = json.loads(json.dumps(stored))
    want = json.loads(json.dumps(config))
    if stored != want:
        diff = sorted(k for k in set(stored) | set(want) if stored.get(k) != want.get(k))
        raise UserError(
            f"--study {name}: the storage holds this study with other settings ({', '.join(diff)}: "
            f"{', '.join(f'{k}={stored.get(k)!r}' for k in diff)}); use another --study or --out"
        )
    return study


# --------------------------------------------------------------------------- workers


def _start_time(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def worker_id() -> str:
    """``host:pid:start`` of this process; the start time tells a reused pid apart."""
    return f"{socket.gethostname()}:{os.getpid()}:{_start_time(os.getpid()) or '?'}"


def worker_is_dead(owner: str) -> bool:
    """True only when ``owner`` ran on this host and its process is gone (unknown hosts: False)."""
    try:
        host, pid, start = owner.rsplit(":", 2)
        pid = int(pid)
    except ValueError:
        return False
    if host != socket.gethostname():
        return False
    now = _start_time(pid)
    if now is not None:
        return start != "?" and now != start
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


# --------------------------------------------------------------------------- trials


def subnet_params(space: Space, subnet: Subnet):
    """The subnet as Optuna parameters with their (categorical) distributions."""
    from optuna.distributions import CategoricalDistribution

    params: dict[str, Any] = {"embed_dim": subnet.embed_dim, "depth": subnet.depth}
    dists = {"embed_dim": CategoricalDistribution(space.embed_dim), "depth": CategoricalDistribution(space.depth)}
    for i, layer in enumerate(subnet.layers):
        for name, value, choices in (("heads", layer.heads, space.heads), ("ffn_dim", layer.ffn_dim, space.ffn_dim),
                                     ("attention", layer.attention, space.attention)):
            params[f"l{i}.{name}"] = value
            dists[f"l{i}.{name}"] = CategoricalDistribution(choices)
    return params, dists


@dataclass(frozen=True)
class Record:
    """One finished evaluation, as read back from storage."""

    trial: int  # number
    trial_id: int
    slot: Slot
    subnet: Subnet
    loss: float
    latency: float
    params: int
    cached: bool
    owner: str


@dataclass
class Snapshot:
    """What storage holds; ``complete`` and ``losses`` only grow, later snapshots extend the same dicts."""

    complete: dict[Slot, Record] = field(default_factory=dict)  # the owning (lowest-numbered) COMPLETE trial per slot
    running: dict[Slot, list[tuple[int, str]]] = field(default_factory=dict)  # slot -> [(trial id, owner)], ascending
    losses: dict[Subnet, float] = field(default_factory=dict)  # every subnet with a finished loss

    def owner_of(self, slot: Slot) -> int | None:
        """Trial id that owns ``slot``: the complete one, else the first running one (ids grow with numbers)."""
        if slot in self.complete:
            return self.complete[slot].trial_id
        claims = self.running.get(slot)
        return claims[0][0] if claims else None


class TrialStore:
    """Reads the search's trials (parsing each finished one once) and claims / finishes / recovers slots."""

    def __init__(self, study, space: Space, owner: str | None = None):
        self.study, self.space = study, space
        self.storage = study._storage  # noqa: SLF001 - Optuna exposes no public handle for create_new_trial
        self.owner = owner or worker_id()
        self._complete: dict[Slot, Record] = {}  # grows as trials finish; shared by the snapshots
        self._losses: dict[Subnet, float] = {}
        self._scanned = 0  # trials (by number) looked at so far
        self._unfinished: set[int] = set()  # of those, the ones not finished when last looked at

    def _record(self, t) -> Record | None:
        slot = t.system_attrs.get(SLOT)
        if t.state.name != "COMPLETE" or slot is None:
            return None
        u = t.user_attrs
        return Record(t.number, t._trial_id, (str(slot[0]), int(slot[1]), int(slot[2])), Subnet.from_json(u["subnet"]),  # noqa: SLF001
                      float(t.value), float(u["latency_ms"]), int(u["params"]), bool(u.get("cached")), str(t.system_attrs.get(OWNER)))

    def snapshot(self) -> Snapshot:
        """The trials now: finished ones are read once and kept (they never change), running ones afresh."""
        trials = self.study.get_trials(deepcopy=False)  # in number order
        fresh = [t for t in trials[self._scanned :]] + [trials[n] for n in sorted(self._unfinished) if n < self._scanned]
        self._scanned = len(trials)
        running: dict[Slot, list[tuple[int, str]]] = {}
        for t in fresh:
            if not t.state.is_finished():
                self._unfinished.add(t.number)
                continue
            self._unfinished.discard(t.number)
            rec = self._record(t)
            if rec is not None:
                owner = self._complete.get(rec.slot)
                if owner is None or rec.trial < owner.trial:  # the lowest-numbered complete trial owns a slot
                    self._complete[rec.slot] = rec
                self._losses.setdefault(rec.subnet, rec.loss)
        for n in sorted(self._unfinished):
            t = trials[n]
            slot = t.system_attrs.get(SLOT)
            if t.state.name == "RUNNING" and slot is not None:
                running.setdefault((str(slot[0]), int(slot[1]), int(slot[2])), []).append((t._trial_id, t.system_attrs.get(OWNER, "")))  # noqa: SLF001
        return Snapshot(complete=self._complete, running=running, losses=self._losses)

    def claim(self, slot: Slot, subnet: Subnet, latency: float, params: int, cached: bool) -> int:
        """A RUNNING trial for ``slot`` (parameters and attrs in the same transaction); its trial id."""
        optuna = _optuna()
        values, dists = subnet_params(self.space, subnet)
        template = optuna.trial.FrozenTrial(
            number=-1, state=optuna.trial.TrialState.RUNNING, value=None,
            datetime_start=datetime.datetime.now(), datetime_complete=None,
            params=values, distributions=dists,
            user_attrs={"subnet": subnet.to_json(), "latency_ms": float(latency), "params": int(params),
                        "budget": slot[0], "generation": slot[1], "cached": bool(cached)},
            system_attrs={SLOT: list(slot), OWNER: self.owner}, intermediate_values={}, trial_id=-1,
        )
        trial_id = self.storage.create_new_trial(self.study._study_id, template_trial=template)  # noqa: SLF001
        self.heartbeat([trial_id])
        return trial_id

    def heartbeat(self, trial_ids) -> None:
        if hasattr(self.storage, "record_heartbeat") and self.storage.get_heartbeat_interval():
            for tid in trial_ids:
                self.storage.record_heartbeat(tid)

    def finish(self, trial_id: int, loss: float) -> bool:
        """Complete the trial with ``loss``; False when it had been failed meanwhile (the slot went to another)."""
        optuna = _optuna()
        try:
            return self.storage.set_trial_state_values(trial_id, optuna.trial.TrialState.COMPLETE, [float(loss)])
        except (optuna.exceptions.UpdateFinishedTrialError, RuntimeError):
            return False

    def drop(self, trial_id: int, reason: str) -> None:
        """PRUNE a claim that lost its slot to a lower-numbered trial (it was never evaluated)."""
        self._end(trial_id, "PRUNED", "dropped", reason)

    def fail(self, trial_id: int, reason: str) -> None:
        self._end(trial_id, "FAIL", "failed_because", reason)

    def _end(self, trial_id: int, state: str, attr: str, reason: str) -> None:
        optuna = _optuna()
        try:
            self.storage.set_trial_user_attr(trial_id, attr, reason)
            self.storage.set_trial_state_values(trial_id, optuna.trial.TrialState[state])
        except (optuna.exceptions.UpdateFinishedTrialError, RuntimeError):
            pass  # finished meanwhile (another worker recovered it): nothing to do

    def recover(self) -> list[int]:
        """Fail the RUNNING trials of dead workers (this host: pid gone; elsewhere: heartbeat); their numbers."""
        optuna = _optuna()
        running = self.study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,))
        failed = []
        for t in running:
            owner = t.system_attrs.get(OWNER, "")
            if owner != self.owner and worker_is_dead(owner):
                self.fail(t._trial_id, f"worker {owner} died")  # noqa: SLF001
                failed.append(t.number)
        if running and getattr(self.storage, "get_heartbeat_interval", lambda: None)():
            optuna.storages.fail_stale_trials(self.study)
            was_running = {t.number for t in running} - set(failed)
            now_failed = self.study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.FAIL,))
            failed += sorted(t.number for t in now_failed if t.number in was_running)
        return failed
