"""``make test-metal``'s report (worker/mac_report.py) off a Mac: what it picks at the production
shapes, that rows reach the file as they come, and its clear exits. (A run on the emulator:
``python -m kernelfleet.worker.mac_report --quick --backend metal-emu``; on a Mac, the real one.)"""

from __future__ import annotations

import pytest

from kernelfleet.kernels.catalog import get_spec
from kernelfleet.worker import mac_report


def test_production_picks_are_the_register_heavy_and_big_threadgroup_configs() -> None:
    spec = get_spec("rmsnorm")
    shape = tuple(spec.shapes["decode"][0])
    space = spec.space(shape, "float16")
    picks = mac_report.production_picks(spec, shape, "float16", 3)
    assert len(picks) == 3 and all(p in space for p in picks)
    heaviest = max(mac_report._values_per_thread(spec, c, shape, "float16") for c in space)
    assert mac_report._values_per_thread(spec, picks[0], shape, "float16") == heaviest
    assert max(int(c["tg"]) for c in space) >= 512
    assert any(int(p["tg"]) == max(int(c["tg"]) for c in space) for p in picks)  # the biggest threadgroup


def test_rows_reach_the_file_as_they_come(tmp_path) -> None:
    path = tmp_path / "report.md"
    with open(path, "w") as out:
        write = mac_report.Report(out)
        write("| a | b |")
        assert path.read_text() == "| a | b |\n"  # flushed before the next row exists
        write("| c | d |", "")
        assert path.read_text() == "| a | b |\n| c | d |\n\n"


def test_old_python_is_told_which_python_to_use(monkeypatch, capsys) -> None:
    monkeypatch.setattr(mac_report, "NEEDS", (99, 0))
    assert mac_report.main(["--quick"]) == 2
    err = capsys.readouterr().err
    assert "Python 3.11 or newer" in err and "PYTHON=python3.12" in err


@pytest.mark.parametrize(("argv", "message"), [
    (["--kernels", "nope"], "unknown kernels ['nope']"),
    (["--kernels", "rmsnorm", "--out", "/nonexistent-dir/r.md"], "cannot write the report to"),
])
def test_bad_arguments_exit_clearly(argv, message, capsys) -> None:
    assert mac_report.main(argv) == 2
    assert message in capsys.readouterr().err
