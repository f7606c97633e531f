"""The run log takes third-party output at both levels; accel's own progress still reaches the terminal."""

import logging
import os
import sys
import warnings

from tqdm import tqdm

from accel import runlog


def test_third_party_output_goes_to_the_log_and_accels_progress_to_the_terminal(tmp_path, capfd):
    log_path = tmp_path / "run" / "log.txt"
    with runlog.third_party_to(log_path):
        logging.getLogger("some_library").addHandler(handler := logging.StreamHandler())  # stderr at creation
        logging.getLogger("some_library").warning("library log line")
        logging.getLogger("some_library").removeHandler(handler)
        print("python stderr line", file=sys.stderr)
        os.write(2, b"native fd2 line\n")
        warnings.warn("a python warning")
        for _ in tqdm(range(3), desc="library bar"):
            pass
        print("accel progress line", file=runlog.terminal(), flush=True)
    print("after the block", file=sys.stderr)
    out, err = capfd.readouterr()
    log = log_path.read_text()
    for line in ("library log line", "python stderr line", "native fd2 line", "a python warning", "library bar"):
        assert line in log and line not in err
    assert "accel progress line" in err and "accel progress line" not in log
    assert "after the block" in err and runlog.terminal() is sys.stderr


def test_nested_blocks_keep_the_outer_log(tmp_path, capfd):
    with runlog.third_party_to(tmp_path / "a.txt"):
        with runlog.third_party_to(tmp_path / "b.txt"):
            print("inner", file=sys.stderr)
        print("outer", file=sys.stderr)
    capfd.readouterr()
    assert "inner" in (tmp_path / "a.txt").read_text() and not (tmp_path / "b.txt").exists()
