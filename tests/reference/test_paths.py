"""The course cache's writes (graders.reference.paths): whole or not at all, and never pulled
from under another process reading them."""
from graders.reference.paths import atomic_folder


def _writer(text):
    def write(folder):
        (folder / "config.json").write_text(text)
    return write


def test_a_folder_another_process_completed_meanwhile_is_kept(tmp_path):
    target = tmp_path / "model"
    atomic_folder(target, _writer("first"))
    handle = (target / "config.json").open()   # a reader of the first copy
    atomic_folder(target, _writer("second"))
    assert (target / "config.json").read_text() == handle.read() == "first"
    assert [p.name for p in tmp_path.iterdir()] == ["model"]   # no temporary folder left behind


def test_a_folder_found_broken_is_replaced(tmp_path):
    target = tmp_path / "model"
    target.mkdir()
    (target / "half.bin").write_text("")
    atomic_folder(target, _writer("whole"), replace_broken=True)
    assert [p.name for p in target.iterdir()] == ["config.json"]
    assert (target / "config.json").read_text() == "whole"
