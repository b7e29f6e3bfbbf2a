"""The model digest that every engine's copy of ``model.path`` is checked against, and the check itself."""

from __future__ import annotations

import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest

from relayrl.controller.membership import Joining, add_rollout
from relayrl.controller.replicas import check_same_model
from relayrl.models.digest import model_digest


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def test_the_digest_covers_config_and_tokenizer_not_weights(tiny_llama, tmp_path):
    """A copy has the digest of the original, also with other weights; a changed tokenizer or config does not."""
    same = _copy(tiny_llama, tmp_path / "same")
    (same / "model.safetensors").write_bytes(b"other weights")
    assert model_digest(same) == model_digest(tiny_llama)
    assert len(model_digest(tiny_llama)) == 16
    tok = _copy(tiny_llama, tmp_path / "tok")
    text = (tok / "tokenizer.json").read_text()
    head, _, tail = text.rpartition('"8"')  # the last merge rule: another token
    (tok / "tokenizer.json").write_text(head + '"9"' + tail)
    assert text != (tok / "tokenizer.json").read_text() and model_digest(tok) != model_digest(tiny_llama)
    cfg = _copy(tiny_llama, tmp_path / "cfg")
    (cfg / "config.json").write_text((cfg / "config.json").read_text().replace("{", '{"extra": 1, ', 1))
    assert model_digest(cfg) != model_digest(tiny_llama)


def test_an_engine_with_another_copy_is_refused_in_one_line():
    check_same_model({"node": "10.0.0.2", "model_digest": "ab" * 8}, "ab" * 8)
    with pytest.raises(ValueError, match=r"engine on node 10\.0\.0\.2 .* differs .*same files at model\.path") as e:
        check_same_model({"node": "10.0.0.2", "model_digest": "cd" * 8}, "ab" * 8)
    assert "\n" not in str(e.value)


def test_a_joiner_with_another_model_is_refused_before_it_joins_anything():
    """``add_rollout`` checks the joiner's digest first: the system's replicas are untouched."""
    system = SimpleNamespace(model_digest="ab" * 8, rollouts=["r0"], ids=[0], procs=[], placement=None)
    join = Joining(1, "actor", None, None, {}, 0.0)
    with pytest.raises(ValueError, match="differs from the driver's"):
        add_rollout(system, join, {"node": "10.0.0.3", "pid": 7, "model_digest": "cd" * 8}, 3)
    assert system.rollouts == ["r0"] and system.ids == [0]
