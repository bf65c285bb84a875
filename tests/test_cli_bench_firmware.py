import json
import subprocess
import sys


def test_bench_firmware_json():
    p = subprocess.run([sys.executable, "-m", "ssdemu", "bench", "firmware", "--json", "--mib",
                        "1", "--prefix-chains", "4"], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    report = json.loads(p.stdout)
    assert report["memcpy_gbps"] > 0
    for section in ("quantize", "dequantize"):
        for name in ("int8_g64", "int4_g64"):
            entry = report[section][name]
            assert entry["gbps"] > 0
            assert entry["ratio_memcpy"] == entry["gbps"] / report["memcpy_gbps"]
    assert report["quantize"]["int4_g64"]["compression"] > 3.0
    pm = report["prefix_match"]
    assert pm["index_keys"] == 4 * 1024
    assert set(pm["ns_per_key"]) == {"b1", "b32", "b1024"}
    assert pm["ratio_python_b1024"] == pm["python_ns_per_key_b1024"] / pm["ns_per_key"]["b1024"]


def test_bench_firmware_bad_size_one_line():
    p = subprocess.run([sys.executable, "-m", "ssdemu", "bench", "firmware", "--mib", "0"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2
    assert p.stderr.strip().splitlines() == ["ssdemu: error: argument --mib: must be positive: '0'"]
