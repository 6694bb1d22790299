"""The one registry idiom (search_spaces.registry): register, list, get by name, duplicates refused, and the
plugins' first load safe across threads."""

import sys
import threading
import types

import pytest

from search_spaces import UserError
from search_spaces.registry import Registry


class Thing:
    def __init__(self, name):
        self.name = name


def test_register_list_get_and_refusals():
    r = Registry("widget")
    a = r.register(Thing("a"))
    assert r.get("a") is a and r.names() == ["a"]
    with pytest.raises(UserError, match=r"^--widget: 'b' is not a widget \(known: a\)$"):
        r.get("b")

    class Other:
        name = "a"

    with pytest.raises(ValueError, match="widget 'a' is registered twice"):
        r.register(Other())


def test_a_thread_asking_while_another_loads_the_plugins_waits_for_them(tmp_path, monkeypatch):
    """The race that lost a benchmark's first models: a second thread read the registry empty while the first was
    still importing its plugins."""
    r = Registry("gadget", builtin="slow_gadgets_plugin")
    (tmp_path / "slow_gadgets_plugin.py").write_text(
        "import time\nfrom gadget_registry import Thing, REG\n"
        "time.sleep(0.3)\nREG.register(Thing('g'))\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(sys.modules, "gadget_registry", types.SimpleNamespace(REG=r, Thing=Thing))
    monkeypatch.delitem(sys.modules, "slow_gadgets_plugin", raising=False)
    got, errors = [], []

    def ask():
        try:
            got.append(r.get("g").name)
        except Exception as e:  # the failure this test exists for: "'g' is not a gadget (known: none)"
            errors.append(str(e))

    threads = [threading.Thread(target=ask) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and got == ["g"] * 4


def test_a_failed_plugin_import_is_tried_again(tmp_path, monkeypatch):
    r = Registry("gizmo", builtin="broken_gizmo_plugin")
    (tmp_path / "broken_gizmo_plugin.py").write_text("raise ImportError('not yet')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "broken_gizmo_plugin", raising=False)
    with pytest.raises(ImportError, match="not yet"):
        r.names()
    (tmp_path / "broken_gizmo_plugin.py").write_text("")
    monkeypatch.delitem(sys.modules, "broken_gizmo_plugin", raising=False)
    import importlib

    importlib.invalidate_caches()
    assert r.names() == []
