import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from filelock import FileLock

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = Path(__file__).resolve().parent / "fixtures"
sys.path.insert(0, str(ROOT))

# One worker per core under pytest-xdist (`-n 2` on the 2-core CI machine): each worker's torch keeps to one thread so
# that the two do not spin against each other; a plain run keeps the two threads it always had.
torch.set_num_threads(1 if os.environ.get("PYTEST_XDIST_WORKER") else 2)


@pytest.fixture(scope="module")
def graph_cache(tmp_path_factory):
    """A module-wide ONNX graph cache ($NAS_CACHE in a temporary folder; restored after): each graph exported once."""
    old = os.environ.get("NAS_CACHE")
    os.environ["NAS_CACHE"] = str(tmp_path_factory.mktemp("nas-cache"))
    yield
    if old is None:
        del os.environ["NAS_CACHE"]
    else:
        os.environ["NAS_CACHE"] = old


@pytest.fixture(scope="session")
def tiny():
    from search_spaces import load_space

    return load_space("tiny")


VENV = Path(os.environ.get("NAS_TEST_VENV", Path.home() / ".cache" / "nas-transformers" / "test-venv-ort"))


@pytest.fixture(scope="session")
def clean_python():
    """A venv with only numpy and onnxruntime (built once, kept in ~/.cache); skip if pip cannot reach them."""
    py = VENV / "bin" / "python"
    VENV.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(VENV) + ".lock"):  # two test workers build it once, not over each other
        return _clean_python(py)


def _clean_python(py: Path) -> Path:
    if not (py.exists() and subprocess.run([py, "-c", "import numpy, onnxruntime"], capture_output=True).returncode == 0):
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(VENV)], check=True)
        pip = subprocess.run([py, "-m", "pip", "install", "-q", "numpy", "onnxruntime"], capture_output=True, text=True)
        if pip.returncode != 0:
            pytest.skip(
                f"pip could not install numpy and onnxruntime into a clean venv (no registry?): {pip.stderr.strip()[-300:]}"
            )
    assert subprocess.run([py, "-c", "import torch"], capture_output=True).returncode != 0, "the clean venv must not see torch"
    return py


def _runs_a_benchmark(item) -> bool:
    """The --quick runs of scripts/bench_*.py (tests/test_bench_*.py, tests/test_*_bench.py): the suite's longest files."""
    name = item.path.name
    return name.startswith("test_bench_") or name.endswith("_bench.py")


def pytest_collection_modifyitems(config, items):
    """The benchmarks' end-to-end files first (in their own order), so that under `-n 2 --dist loadfile` the two workers
    start on the long files and finish together on the short ones, instead of one long file starting last."""
    items.sort(key=lambda item: not _runs_a_benchmark(item))
