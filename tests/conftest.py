import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = Path(__file__).resolve().parent / "fixtures"
sys.path.insert(0, str(ROOT))

torch.set_num_threads(2)


@pytest.fixture(scope="session")
def tiny():
    from search_spaces import load_space

    return load_space("tiny")
