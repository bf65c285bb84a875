import os

import pytest

from ssdemu.device.media import MediaSpec, open_media, parse_media_spec
from ssdemu.errors import MediaError


@pytest.mark.parametrize(
    "text,spec",
    [
        ("file:/tmp/a.img", MediaSpec("file", "/tmp/a.img", None)),
        ("file:/tmp/a.img:1G", MediaSpec("file", "/tmp/a.img", 1 << 30)),
        ("file:/tmp/odd:name", MediaSpec("file", "/tmp/odd:name", None)),
        ("block:/dev/loop0", MediaSpec("block", "/dev/loop0", None)),
        ("mem:64m", MediaSpec("mem", None, 64 << 20)),
    ],
)
def test_parse_media_spec(text, spec):
    assert parse_media_spec(text) == spec


@pytest.mark.parametrize("text", ["", "disk:/x", "mem:", "mem:lots", "mem:0", "file:", "/tmp/x"])
def test_parse_media_spec_rejects(text):
    with pytest.raises(MediaError, match="bad media spec"):
        parse_media_spec(text)


def test_file_created_sparse_at_size(shm_dir):
    path = os.path.join(shm_dir, "new.img")
    with open_media(f"file:{path}:8M") as m:
        assert m.size == 8 << 20
        assert m.lba_size >= 512
    assert os.path.getsize(path) == 8 << 20


def test_existing_file_keeps_size_and_data(shm_dir):
    path = os.path.join(shm_dir, "old.img")
    payload = os.urandom(3 << 20)
    with open(path, "wb") as f:
        f.write(payload)
    with open_media(f"file:{path}:1M") as m:  # a smaller SIZE must not truncate
        assert m.size == 3 << 20
        assert "never truncated" in m.note
    with open(path, "rb") as f:
        assert f.read() == payload


def test_missing_file_without_size(shm_dir):
    with pytest.raises(MediaError, match="does not exist; give a size"):
        open_media(f"file:{shm_dir}/nope.img")


def test_unopenable_path():
    with pytest.raises(MediaError, match="No such file or directory"):
        open_media("file:/nonexistent-dir/x.img:1M")


def test_directory_is_not_media(shm_dir):
    with pytest.raises(MediaError, match="not a regular file"):
        open_media(f"file:{shm_dir}")


def test_block_spec_needs_block_device(shm_dir):
    path = os.path.join(shm_dir, "plain")
    open(path, "wb").close()
    with pytest.raises(MediaError, match="not a block device"):
        open_media(f"block:{path}")


def test_too_small_media(shm_dir):
    with pytest.raises(MediaError, match="smaller than one"):
        open_media(f"file:{shm_dir}/tiny.img:100")


def test_block_device_probe(loop_device):
    with open_media(f"block:{loop_device}") as m:
        assert m.is_block
        assert m.size == 64 << 20
        assert m.lba_size in (512, 4096)


def test_mem_media_reachable_by_path():
    """fio (another process) reaches mem media through /proc/PID/fd/N."""
    with open_media("mem:1M") as m:
        assert os.path.getsize(m.fio_path) == 1 << 20
