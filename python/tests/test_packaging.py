"""The wheel as a user installs it: into a fresh venv with nothing else, its dependencies from
the package index. Runs where SLUICE_WHEEL names a built wheel (.ci/run sets it)."""

import os
import subprocess
import sys

import pytest


def test_a_fresh_venv_with_only_the_wheel_transforms_boxes(tmp_path):
    wheel = os.environ.get("SLUICE_WHEEL")
    if not wheel:
        pytest.skip("SLUICE_WHEEL names no built wheel (.ci/run builds one)")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = subprocess.run([str(venv / "bin" / "pip"), "install", "--quiet",
                          "--disable-pip-version-check", wheel], capture_output=True, text=True)
    assert pip.returncode == 0, pip.stderr
    code = ("import sluice\n"
            "boxes, keep = sluice.transform_boxes([[10, 20, 60, 90]], "
            "{'box': [0, 0, 100, 100], 'flip': True, 'size': [50, 50]})\n"
            "print(boxes.tolist(), keep.tolist())\n")
    run = subprocess.run([str(venv / "bin" / "python"), "-c", code], capture_output=True,
                         text=True)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "[[20.0, 10.0, 45.0, 45.0]] [True]", run.stdout
