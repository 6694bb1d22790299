import pickle

import numpy as np
import pytest
import torch

from search_spaces import UserError, load_space
from supernet import SuperTransformer
from supernet.checkpoint import load_checkpoint, load_supernet, save_checkpoint


@pytest.fixture()
def saved(tiny, tmp_path):
    model = SuperTransformer(tiny, generator=torch.Generator().manual_seed(0))
    state = {"step": 7, "rng": torch.get_rng_state(), "np_rng": np.random.default_rng(1).bit_generator.state}
    return model, save_checkpoint(tmp_path / "ckpt.pt", model, state, seed=3)


def test_round_trip(tiny, saved):
    model, path = saved
    loaded, payload = load_supernet(path, tiny)
    assert payload["state"]["step"] == 7 and payload["meta"]["seed"] == 3
    assert payload["space"] == tiny
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), loaded.state_dict().values()))
    x = torch.randint(0, 256, (1, 20))
    with torch.no_grad():
        assert torch.equal(model.eval()(x, tiny.largest()), loaded(x, tiny.largest()))
    gen = np.random.default_rng()
    gen.bit_generator.state = payload["state"]["np_rng"]
    assert gen.random() == np.random.default_rng(1).random()


def test_truncated_checkpoint_is_a_clear_error(saved, tmp_path):
    _, path = saved
    data = path.read_bytes()
    bad = tmp_path / "truncated.pt"
    bad.write_bytes(data[: len(data) // 2])
    with pytest.raises(UserError, match=r"truncated.pt: not a readable supernet checkpoint \(truncated or foreign file\)"):
        load_checkpoint(bad)


def test_foreign_files_are_refused(tmp_path):
    plain = tmp_path / "plain.pt"
    torch.save({"weights": torch.zeros(3)}, plain)
    with pytest.raises(UserError, match="plain.pt: not a supernet checkpoint of this tool"):
        load_checkpoint(plain)
    pickled = tmp_path / "evil.pt"
    pickled.write_bytes(pickle.dumps(object()))
    with pytest.raises(UserError, match="evil.pt: not a readable supernet checkpoint"):
        load_checkpoint(pickled)
    with pytest.raises(UserError, match="missing.pt: no such checkpoint file"):
        load_checkpoint(tmp_path / "missing.pt")


def test_other_space_is_refused(saved):
    _, path = saved
    with pytest.raises(UserError, match=r"trained on space 'tiny' .* not on 'base'"):
        load_checkpoint(path, load_space("base"))


def test_save_is_atomic(saved, monkeypatch):
    model, path = saved
    before = path.read_bytes()

    def boom(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(torch, "save", boom)
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(path, model, {"step": 8})
    assert path.read_bytes() == before
    assert [p.name for p in path.parent.iterdir()] == [path.name]
