"""How the toolkit installs: one version, py.typed, the extras, the floors, the installer's torch, the docs site.

The wheel is built here (no network: ``--no-build-isolation``) and read back; scripts/install.py's choice of torch
is checked as a function (the real fresh-venv install is scripts/smoke_min_versions.sh, run by CI); the docs site is
built with ``mkdocs build --strict`` (skipped where the docs extra is missing).
"""

from __future__ import annotations

import importlib.util
import os
import re
import shlex
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


def test_the_build_is_the_newest_of_the_tested_releases():
    listed = ["2.14.1", "2.13.0+cpu", "2.12.0+cpu", "2.10.0+cpu", "2.15.0rc1+cpu", "2.15.0+cpu", "2.13.0+cu130"]
    assert install.newest_build(listed, "cpu", "2.11", "2.14") == "2.13.0+cpu"  # 2.15: newer than CI tests
    assert install.newest_build(listed, "cpu", "2.11", "2.16") == "2.15.0+cpu"
    assert install.newest_build(listed, "cpu", "2.11", "2.14", pin="2.12.0") == "2.12.0+cpu"
    assert install.newest_build(listed, "cu130", "2.11", "2.14") == "2.13.0+cu130"
    assert install.newest_build(listed, "cpu", "2.14", "2.15") is None
    assert install.torch_floor() == re.search(r'"torch>=([0-9.]+)"', (ROOT / "pyproject.toml").read_text()).group(1)
    # CI's torch: constraints.txt's pin; without -c the installer stays below the next minor release
    assert install.torch_pin(ROOT / "constraints.txt") == "2.13.0" and install.tested_ceiling() == "2.14"
    assert install.torch_pin(ROOT / "constraints-min.txt") is None
    assert install.requirement("2.11", "2.14", None) == "torch>=2.11,<2.14"
    assert install.requirement("2.11", "2.14", "2.13.0") == "torch==2.13.0"


def test_an_installed_torch_is_kept_unless_pip_would_replace_it(monkeypatch):
    said, commands = install.torch_plan("auto", "py", install.CPU_INDEX, "2.11", "2.14")
    assert said.startswith("keeping the installed torch") and commands == []  # this machine has one: untouched
    monkeypatch.setattr(install, "installed_torch", lambda: ("2.5.1+cu121", "CUDA 12.1"))  # too old: pip would swap it
    with pytest.raises(SystemExit, match=r"torch 2.5.1\+cu121 \(CUDA 12.1\) is older than 2.11.*--torch cpu or --torch cuda"):
        install.torch_plan("auto", "py", install.CPU_INDEX, "2.11", "2.14")
    monkeypatch.setattr(install, "installed_torch", lambda: ("2.15.0+cpu", "CPU"))
    said, commands = install.torch_plan("auto", "py", install.CPU_INDEX, "2.11", "2.14")
    assert said == "keeping the installed torch 2.15.0+cpu (CPU build; CI tests the releases below 2.14)"
    with pytest.raises(SystemExit, match=r"torch 2.15.0\+cpu \(CPU\) is not 2.13.0, which the constraints file pins: pip "
                                         r"would replace it with PyPI's 2.13.0; leave out -c, or say which build"):
        install.torch_plan("auto", "py", install.CPU_INDEX, "2.11", "2.14", pin="2.13.0")
    assert install.torch_plan("none", "py", install.CPU_INDEX, "2.11", "2.14")[1] == []


def _wheel(folder: Path, version: str) -> str:
    """A tiny wheel named as PyTorch's are (``torch-2.13.0+cpu-py3-none-any.whl``): a package and its dist-info."""
    name = f"torch-{version}-py3-none-any.whl"
    info = f"torch-{version}.dist-info"
    with zipfile.ZipFile(folder / name, "w") as z:
        z.writestr("torch/__init__.py", f"__version__ = {version!r}\n")
        z.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: torch\nVersion: {version}\n")
        z.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr(f"{info}/RECORD", "")
    return name


@pytest.fixture
def fake_index(tmp_path, monkeypatch):
    """PyTorch's indexes as a local PEP 503 server on 127.0.0.1: ``/cpu`` (2.12.0, 2.13.0 and 2.15.0 +cpu, the last newer
    than CI tests) and ``/cu130`` (2.13.0+cu130), tiny wheels; pip reads nothing else (no configuration, no PyPI), and
    PATH holds only the test's own programs (a fake ``nvidia-smi`` where a test puts one)."""
    import functools
    import http.server
    import threading
    import urllib.parse

    root, files = tmp_path / "index", tmp_path / "index" / "files"
    files.mkdir(parents=True)
    for name, versions in (("cpu", ("2.12.0+cpu", "2.13.0+cpu", "2.15.0+cpu")), ("cu130", ("2.13.0+cu130",))):
        page = root / name / "torch"
        page.mkdir(parents=True)
        links = [f'<a href="../../files/{urllib.parse.quote(_wheel(files, v))}">{_wheel(files, v)}</a>' for v in versions]
        page.joinpath("index.html").write_text("<!DOCTYPE html><html><body>\n" + "\n".join(links) + "\n</body></html>\n")

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(root)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    for name in [k for k in os.environ if k.startswith("PIP_") or k.lower().endswith("_proxy")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)  # no pip.conf: no find-links, no extra index, no constraint
    monkeypatch.setenv("PIP_DISABLE_PIP_VERSION_CHECK", "1")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    monkeypatch.setenv("PATH", str(bin_dir))
    monkeypatch.setattr(install, "installed_torch", lambda: None)  # a fresh environment
    monkeypatch.setattr(install.platform, "system", lambda: "Linux")
    url = f"http://127.0.0.1:{server.server_address[1]}"
    yield {"cpu": f"{url}/cpu", "cu130": f"{url}/cu130", "bin": bin_dir}
    server.shutdown()
    server.server_close()


def _nvidia_smi(bin_dir: Path, body: str) -> None:
    script = bin_dir / "nvidia-smi"
    script.write_text(f"#!/bin/sh\n{body}\n")
    script.chmod(0o755)


def _plan(capsys, index, *argv) -> tuple[str, list[str]]:
    """install.py --dry-run: (its line about torch, its commands)."""
    assert install.main([*argv, "--dry-run", "--torch-index", index["cpu"], "--torch-cuda-index", index["cu130"]]) == 0
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("install.py: ") and all(line.startswith("+ ") for line in err[1:]), err
    return err[0], [line[2:] for line in err[1:]]


def test_the_installer_takes_a_tested_release_from_pytorchs_index(fake_index, capsys):
    py = shlex.quote(sys.executable)
    line, commands = _plan(capsys, fake_index)
    assert line == f"install.py: torch: torch 2.13.0+cpu, the CPU build, from {fake_index['cpu']}"  # not 2.15: untested
    assert commands == [f"{py} -m pip install -q torch==2.13.0+cpu --index-url {fake_index['cpu']}",
                        f"{py} -m pip install -q -e {ROOT}"]
    ci = ROOT / "constraints.txt"
    line, commands = _plan(capsys, fake_index, "dev", "-c", str(ci))  # CI's command resolves CI's torch
    assert commands[0] == f"{py} -m pip install -q torch==2.13.0+cpu --index-url {fake_index['cpu']} -c {ci}"
    line, commands = _plan(capsys, fake_index, "-c", str(_pinned(fake_index["bin"].parent, "2.12.0")))
    assert "torch==2.12.0+cpu" in commands[0]


def _pinned(folder: Path, version: str) -> Path:
    path = folder / "pin.txt"
    path.write_text(f"numpy==2.4.6\ntorch=={version}  # a release of our own\n")
    return path


def test_an_unreachable_index_gives_way_to_pypis_torch_in_one_line(fake_index, capsys):
    import socket

    with socket.socket() as s:  # a port nothing listens on: the connection is refused
        s.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{s.getsockname()[1]}/cpu"
    py = shlex.quote(sys.executable)
    line, commands = _plan(capsys, {**fake_index, "cpu": closed})
    assert re.fullmatch(rf"install\.py: torch: PyTorch's index {re.escape(closed)} cannot be reached \(.*refused.*\): "
                        r"PyPI's torch>=2\.11,<2\.14 instead \(a CUDA build on Linux, several GB; --torch-index URL names "
                        r"a mirror\)", line), line
    assert commands == [f"{py} -m pip install -q 'torch>=2.11,<2.14'", f"{py} -m pip install -q -e {ROOT}"]


def test_the_nvidia_driver_decides_between_the_cuda_and_the_cpu_build(fake_index, capsys):
    cpu = f"torch==2.13.0+cpu --index-url {fake_index['cpu']}"
    _nvidia_smi(fake_index["bin"], "echo 580.159.04")  # new enough for CUDA 13.0
    line, commands = _plan(capsys, fake_index)
    assert line == f"install.py: torch: torch 2.13.0+cu130, the CUDA 13.0 build, from {fake_index['cu130']}"
    assert commands[0].endswith(f"torch==2.13.0+cu130 --index-url {fake_index['cu130']}")
    _nvidia_smi(fake_index["bin"], "echo 470.82.01")
    line, commands = _plan(capsys, fake_index)
    assert line == ("install.py: torch: the NVIDIA driver 470.82.01 is older than 580.65.06, which torch's CUDA 13.0 build "
                    "needs: the CPU build (update the driver to use the GPU, or --torch cuda to take that build anyway); "
                    f"torch 2.13.0+cpu, the CPU build, from {fake_index['cpu']}")
    assert commands[0].endswith(cpu)
    _nvidia_smi(fake_index["bin"], "echo \"NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\" >&2;"
                " exit 9")
    line, commands = _plan(capsys, fake_index)
    assert line == ("install.py: torch: nvidia-smi failed (exit 9: NVIDIA-SMI has failed because it couldn't communicate "
                    "with the NVIDIA driver.): the CPU build (--torch cuda to take the CUDA build anyway); "
                    f"torch 2.13.0+cpu, the CPU build, from {fake_index['cpu']}")
    assert commands[0].endswith(cpu)
    (fake_index["bin"] / "nvidia-smi").unlink()  # no driver at all: the CPU build, nothing to explain
    line, commands = _plan(capsys, fake_index)
    assert line == f"install.py: torch: torch 2.13.0+cpu, the CPU build, from {fake_index['cpu']}" and commands[0].endswith(cpu)


def test_an_externally_managed_python_gets_a_venv_and_the_command_that_activates_it(fake_index, tmp_path, monkeypatch,
                                                                                      capfd):
    """PEP 668 (Debian 12's or Ubuntu 24.04's system Python): pip may not install into it, so the installer makes a
    virtual environment (once), runs itself there, and ends with the one command that activates it."""
    stdlib = tmp_path / "stdlib"
    stdlib.mkdir()
    (stdlib / "EXTERNALLY-MANAGED").write_text("[externally-managed]\nError=use apt\n")
    real = install.sysconfig.get_path
    monkeypatch.setattr(install.sysconfig, "get_path", lambda name, *a, **k: str(stdlib) if name == "stdlib" else real(name))
    monkeypatch.setattr(install.sys, "base_prefix", install.sys.prefix)  # not a virtual environment itself
    venv = tmp_path / "venv"
    argv = ["--dry-run", "--venv", str(venv), "--torch-index", fake_index["cpu"], "--torch-cuda-index", fake_index["cu130"]]
    assert install.main(argv) == 0
    err = capfd.readouterr().err.splitlines()
    python = venv / "bin" / "python"
    assert err[0] == (f"install.py: {sys.executable} is externally managed (PEP 668: pip may not install into it): making "
                      f"the virtual environment {venv}")
    assert python.exists() and f"+ {python} -m pip install -q torch==2.13.0+cpu --index-url {fake_index['cpu']}" in err
    assert err[-1] == (f"install.py: nas would be {venv / 'bin' / 'nas'}; activate the environment first: "
                       f"source {venv}/bin/activate")
    assert install.main(argv) == 0  # again: the same environment
    assert "reusing the virtual environment" in capfd.readouterr().err
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    assert install.main([*argv[:1], "--venv", str(blocked / "venv"), *argv[3:]]) == 1
    last = capfd.readouterr().err.splitlines()[-1]
    assert last.startswith(f"install.py: cannot make {blocked / 'venv'}: ") and last.endswith(
        "(on Debian or Ubuntu: sudo apt install python3-venv)")


def test_the_docs_extra_alone_installs_no_torch(capsys):
    assert install.main(["docs", "--dry-run", "-c", "constraints.txt"]) == 0
    err = capsys.readouterr().err.splitlines()
    assert err == ["install.py: the docs extra alone: MkDocs and mkdocstrings, neither torch nor the toolkit (the site is "
                   "built from the sources without importing them)",
                   f"+ {shlex.quote(sys.executable)} -m pip install -q 'mkdocs>=1.6' 'mkdocstrings[python]>=0.26' "
                   f"-c {ROOT / 'constraints.txt'}"]
    assert install.docs_requirements() == pyproject()["project"]["optional-dependencies"]["docs"]


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
    # built as `python3 scripts/install.py docs` leaves a machine: MkDocs without torch or the toolkit's other
    # dependencies (any import of them fails here), the API reference read from the sources
    blocked = ("torch", "numpy", "onnx", "onnxruntime", "optuna", "sklearn", "scipy", "matplotlib", "safetensors")
    build = (f"import sys; sys.modules.update(dict.fromkeys({blocked!r})); from mkdocs.__main__ import cli; "
             f"sys.argv = ['mkdocs', 'build', '--strict', '--site-dir', {str(site)!r}]; cli()")
    built = subprocess.run([sys.executable, "-c", build], cwd=ROOT, capture_output=True, text=True, timeout=300,
                           env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
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
