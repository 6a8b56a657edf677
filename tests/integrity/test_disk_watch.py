"""The watch on what a confined kernel writes to the host's disk (graders.integrity.disk_watch)."""
import threading

from graders.integrity.disk_watch import DiskWatch, disk_use


def _watched(folder, **limits) -> DiskWatch:
    stopped = threading.Event()
    watch = DiskWatch([folder], stopped.set, every=0.05, **limits)
    watch.stopped = stopped
    return watch


def test_disk_taken_is_counted_not_a_sparse_files_apparent_size(tmp_path):
    (tmp_path / "nested").mkdir()
    (tmp_path / "nested" / "full").write_bytes(bytes(3 * 2**20))
    with open(tmp_path / "sparse", "wb") as f:
        f.seek(2**30)
        f.write(b"x")
    used, entries = disk_use([tmp_path], max_entries=100)
    assert 3 * 2**20 <= used < 4 * 2**20 and entries == 3


def test_the_watch_stops_once_past_its_bytes_or_its_files(tmp_path):
    for limits, write, exceeded in (
            ({"max_bytes": 2**20}, lambda: (tmp_path / "big").write_bytes(bytes(2 * 2**20)), "more than 1 MiB"),
            ({"max_entries": 50}, lambda: [(tmp_path / f"f{i}").touch() for i in range(60)], "more than 50 files")):
        for entry in tmp_path.iterdir():
            entry.unlink()
        with _watched(tmp_path, **limits) as watch:
            assert not watch.stopped.wait(0.3) and watch.exceeded is None   # within bounds: left alone
            write()
            assert watch.stopped.wait(5)
        assert watch.exceeded == exceeded
