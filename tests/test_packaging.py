"""How the toolkit installs: one version, py.typed, the extras, the floors, the installer's torch, the docs site.

The wheel is built here (no network: ``--no-build-isolation``) and read back; scripts/install.py's choice of torch
is checked as a function (the real fresh-venv install is scripts/smoke_min_versions.sh, run by CI); the docs site is
built with ``mkdocs build --strict`` (skipped where the docs extra is missing).
"""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

import nas
from nas.cli import main

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("nas", "supernet", "latency", "search_spaces", "tasks")
spec = importlib.util.spec_from_file_location("install_script", ROOT / "scripts" / "install.py")
install = importlib.util.module_from_spec(spec)
spec.loader.exec_module(install)


def pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    out, tree = tmp_path_factory.mktemp("wheel"), tmp_path_factory.mktemp("tree")
    for name in ("pyproject.toml", "README.md", "LICENSE"):  # a copy: setuptools builds inside the tree it is given
        shutil.copy(ROOT / name, tree / name)
    for package in PACKAGES:
        shutil.copytree(ROOT / package, tree / package, ignore=shutil.ignore_patterns("__pycache__", "*.so", "*.egg-info"))
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(out),
                            str(tree)], capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stderr[-3000:]
    (path,) = out.glob("nas_transformers-*.whl")
    return zipfile.ZipFile(path)


def test_the_version_is_written_once_and_the_wheel_carries_it(wheel, capsys):
    project = pyproject()["project"]
    assert "version" not in project and project["dynamic"] == ["version"]
    assert pyproject()["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "search_spaces.version.__version__"}
    assert not re.search(r"^version:", (ROOT / "CITATION.cff").read_text(), re.M)  # `nas --version` says it
    hits = [p for p in ROOT.rglob("*.py") if re.search(r"^__version__\s*=", p.read_text(errors="ignore"), re.M)]
    assert [p.relative_to(ROOT).as_posix() for p in hits if p.parts[len(ROOT.parts)] not in ("build", ".venv")] == [
        "search_spaces/version.py"]
    metadata = wheel.read(next(n for n in wheel.namelist() if n.endswith(".dist-info/METADATA"))).decode()
    assert f"\nVersion: {nas.__version__}\n" in metadata
    with pytest.raises(SystemExit):
        main(["--version"])
    assert capsys.readouterr().out.strip() == f"nas {nas.__version__}"


def test_every_package_is_typed_and_its_py_typed_ships(wheel):
    names = set(wheel.namelist())
    for package in PACKAGES:
        assert (ROOT / package / "py.typed").exists()
        assert f"{package}/py.typed" in names, f"{package}/py.typed is not in the wheel"
    assert "search_spaces/tiny.yaml" in names  # package data kept beside it


def test_the_extras_and_what_every_user_gets(wheel):
    metadata = wheel.read(next(n for n in wheel.namelist() if n.endswith(".dist-info/METADATA"))).decode()
    requires = re.findall(r"^Requires-Dist: (.*)$", metadata, re.M)
    base = [r for r in requires if "extra ==" not in r]
    for heavy in ("sacrebleu", "psycopg2", "pytest", "ruff", "mkdocs"):  # only those who ask get them
        assert not any(r.startswith(heavy) for r in base), base
    extras = set(re.findall(r"^Provides-Extra: (.*)$", metadata, re.M))
    assert {"translate", "postgres", "docs", "dev", "dashboard"} <= extras
    assert set(install.EXTRAS) == extras, "scripts/install.py names every extra of pyproject.toml"
    assert any(r.startswith("sacrebleu") and 'extra == "translate"' in r for r in requires)
    assert any(r.startswith("psycopg2-binary") and 'extra == "postgres"' in r for r in requires)
    dev = [r for r in requires if 'extra == "dev"' in r]
    assert any("translate" in r and "postgres" in r and "docs" in r for r in dev), dev  # dev tests every part


def test_constraints_min_pins_every_declared_floor():
    """constraints-min.txt installs each dependency at the floor pyproject.toml declares (torch excepted: its wheel)."""
    pins = dict(re.findall(r"^([A-Za-z0-9_.-]+)==(\S+)", (ROOT / "constraints-min.txt").read_text(), re.M))
    pins = {k.lower(): v for k, v in pins.items()}
    project = pyproject()["project"]
    declared = list(project["dependencies"]) + list(project["optional-dependencies"]["translate"])
    same = lambda a, b: (a.split(".") + ["0"] * 3)[:3] == (b.split(".") + ["0"] * 3)[:3]  # noqa: E731
    for requirement in declared:
        name, floor = re.match(r"([A-Za-z0-9_.-]+)\s*>=\s*([0-9.]+)", requirement).groups()
        if name == "torch":
            assert name not in pins
            continue
        assert name.lower() in pins, f"{requirement}: no line in constraints-min.txt"
        assert same(pins[name.lower()], floor), f"pyproject.toml says {requirement}, constraints-min.txt {pins[name.lower()]}"
    assert "onnx" in pins and tuple(map(int, pins["onnx"].split(".")[:2])) >= (1, 18)  # opset 23 came with onnx 1.18
    from supernet.export import ORT_FOR_OPSET

    assert tuple(map(int, pins["onnxruntime"].split(".")[:2])) >= ORT_FOR_OPSET[23]


def test_the_readme_commands_are_the_installer_and_ci_runs_the_test_command():
    readme = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```bash\n(.*?)```", readme, re.S)
    assert blocks[0].strip() == "python3 scripts/install.py && nas demo"
    test_command = blocks[1].strip()
    assert test_command.startswith("python3 scripts/install.py dev -c constraints.txt && ")
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert test_command in ci, ".ci/run runs exactly the README's test command"
    after = ci[ci.index(test_command) + 1:]
    assert any(line.startswith("python3 -m mkdocs build --strict") for line in after)
    assert any(line.startswith("scripts/smoke_min_versions.sh") for line in after)


# --------------------------------------------------------------------------- scripts/install.py's torch


def test_the_cpu_build_is_the_newest_cpu_release_at_or_above_the_floor():
    listed = ["2.14.1", "2.13.0+cpu", "2.12.0+cpu", "2.10.0+cpu", "2.15.0rc1+cpu"]  # pip's list: CUDA, CPU, a pre-release
    assert install.newest_cpu_build(listed, "2.11") == "2.13.0+cpu"
    assert install.newest_cpu_build(listed, "2.14") is None
    assert install.newest_cpu_build(["2.11.0+cpu", "2.9.1+cpu"], "2.11") == "2.11.0+cpu"
    assert install.torch_floor() == re.search(r'"torch>=([0-9.]+)"', (ROOT / "pyproject.toml").read_text()).group(1)


def test_the_installer_keeps_a_torch_and_otherwise_chooses_by_the_driver(monkeypatch):
    said, commands = install.torch_plan("auto", "py", install.CPU_INDEX, "2.11")
    assert said.startswith("keeping the installed torch") and commands == []  # this machine has one: untouched

    monkeypatch.setattr(install, "installed_torch", lambda: ("2.5.1+cu121", "CUDA 12.1"))  # too old: pip would swap it
    with pytest.raises(SystemExit, match=r"torch 2.5.1\+cu121 \(CUDA 12.1\) is older than 2.11.*--torch cpu or --torch cuda"):
        install.torch_plan("auto", "py", install.CPU_INDEX, "2.11")
    monkeypatch.setattr(install, "installed_torch", lambda: None)  # a fresh environment
    monkeypatch.setattr(install.platform, "system", lambda: "Linux")
    monkeypatch.setattr(install, "available_versions", lambda python, index: ["2.14.1", "2.13.0+cpu"])
    monkeypatch.setattr(install.shutil, "which", lambda name: None)
    said, commands = install.torch_plan("auto", "py", install.CPU_INDEX, "2.11")
    assert commands == [["py", "-m", "pip", "install", "-q", "torch==2.13.0+cpu", "--index-url", install.CPU_INDEX]]
    assert "CPU build" in said
    monkeypatch.setattr(install.shutil, "which", lambda name: "/usr/bin/nvidia-smi" if name == "nvidia-smi" else None)
    said, commands = install.torch_plan("auto", "py", install.CPU_INDEX, "2.11")
    assert commands == [["py", "-m", "pip", "install", "-q", "torch>=2.11"]] and "CUDA build" in said
    monkeypatch.setattr(install, "available_versions", lambda python, index: [])  # `pip index` unavailable
    said, commands = install.torch_plan("cpu", "py", "https://example.org/cpu", "2.11")
    assert commands == [["py", "-m", "pip", "install", "-q", "torch>=2.11", "--index-url", "https://example.org/cpu"]]
    assert install.torch_plan("none", "py", install.CPU_INDEX, "2.11")[1] == []


def test_the_installer_dry_run_names_its_commands(capsys):
    assert install.main(["translate", "postgres", "-c", "constraints-min.txt", "--dry-run"]) == 0
    err = capsys.readouterr().err
    assert "install.py: torch: keeping the installed torch" in err
    assert f"-e '{ROOT}[translate,postgres]' -c {ROOT / 'constraints-min.txt'}" in err
    with pytest.raises(SystemExit) as stop:
        install.main(["gpu"])
    assert stop.value.code == 2 and "unknown extra 'gpu'" in capsys.readouterr().err


# --------------------------------------------------------------------------- an extra that is missing


def test_translate_eval_without_sacrebleu_says_which_extra(monkeypatch, tmp_path, capsys):
    monkeypatch.setitem(sys.modules, "sacrebleu", None)  # as if the translate extra were not installed
    assert main(["translate", "--model", str(tmp_path / "none"), "--eval", "val"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == ("nas translate: error: --eval: chrF and BLEU need sacrebleu, which is not installed: "
                   "pip install 'nas-transformers[translate]' (python3 scripts/install.py translate)")


def test_postgresql_storage_without_its_driver_says_which_extra(monkeypatch):
    from nas.search import open_storage
    from search_spaces import UserError

    monkeypatch.setitem(sys.modules, "psycopg2", None)
    with pytest.raises(UserError, match=r"--storage: cannot open .*postgres extra: pip install 'nas-transformers\[postgres\]'"):
        open_storage("postgresql://nas@localhost:1/nas_search")


# --------------------------------------------------------------------------- the docs site


def test_the_docs_site_builds_with_no_warning_and_the_api_reference(tmp_path):
    for module in ("mkdocs", "mkdocstrings", "mkdocstrings_handlers.python"):
        if importlib.util.find_spec(module.split(".")[0]) is None or importlib.util.find_spec(module) is None:
            pytest.skip(f"{module} is not installed (the docs extra: python3 scripts/install.py docs)")
    site = tmp_path / "site"
    built = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)], cwd=ROOT,
                           capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stderr[-3000:]
    assert "WARNING" not in built.stderr
    api = (site / "api" / "supernet" / "index.html").read_text()
    assert 'id="supernet.train.train"' in api and "already on its device" in api  # from train()'s docstring
    assert 'class="autorefs autorefs-internal"' in api  # a :func:`...` of a docstring, linked
    for package in PACKAGES:
        page = (site / "api" / package / "index.html").read_text()
        assert not re.search(r":(func|class|meth|mod|attr):<code>", page), package  # no Sphinx role left raw
    readme = (site / "project" / "index.html").read_text()  # README.md: the index of its folder
    assert "python3 scripts/install.py &amp;&amp; nas demo" in readme
    assert 'href="../workflow/"' in readme  # README's docs/workflow.md link, pointed at the page
    assert (site / "project" / "LICENSE").exists() and (site / "cluster" / "index.html").exists()
