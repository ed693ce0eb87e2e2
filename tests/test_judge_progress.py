"""The judge's listing: a pass stays a pass when a later grade fails (the last grade shows
beside it), and a reader that closes the pipe early (`python judge.py | head`) gets no traceback."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def load_judge():
    spec = importlib.util.spec_from_file_location("judge_script", ROOT / "judge.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_pass_stays_passed_and_the_last_failing_grade_shows(tmp_path, monkeypatch, capsys):
    judge = load_judge()
    monkeypatch.setattr(judge, "PROGRESS", tmp_path / "progress.json")
    judge.save_progress("102", False)
    assert judge.load_progress() == {"102": "failing"}
    judge.save_progress("102", True)
    judge.save_progress("102", False)  # a broken copy graded after the pass
    judge.save_progress("102", False)
    assert judge.load_progress() == {"102": "passed; last failing"}
    judge.list_exercises()
    listing = capsys.readouterr().out
    assert "102  01       passed; last failing" in listing and "\n1 of " in listing, listing
    judge.save_progress("102", True)
    assert json.loads((tmp_path / "progress.json").read_text()) == {"102": "passed"}


def test_a_closed_pipe_ends_the_listing_quietly(tmp_path):
    proc = subprocess.Popen([sys.executable, "judge.py"], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE,
                            env={"MINIVLLM_JUDGE_PROGRESS": str(tmp_path / "p.json"),
                                 "PATH": "/usr/bin:/bin"})
    proc.stdout.close()  # the reader is gone before the judge prints a line
    _, err = proc.communicate(timeout=120)
    assert b"Traceback" not in err and b"BrokenPipeError" not in err, err.decode()
    assert proc.returncode == 1
