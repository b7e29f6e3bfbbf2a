"""docs/environments.md's cookbook runs as written: its environment file, then its hand-played episode, whose
output must be the one the page shows."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

PAGE = Path(__file__).resolve().parents[2] / "docs" / "environments.md"


def _blocks(text: str, lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", text, re.DOTALL)


def test_the_cookbook_environment_plays_as_the_page_says(tmp_path):
    text = PAGE.read_text()
    cookbook = text[text.index("## Write your own environment") :]
    env_file, play = _blocks(cookbook, "python")[:2]
    expected = _blocks(cookbook[cookbook.index("\nprints\n") :], "")[0]
    assert env_file.startswith('"""my_envs.py') and "DigitSumEnv()" in play
    (tmp_path / "my_envs.py").write_text(env_file)
    (tmp_path / "play.py").write_text(play)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(
        [sys.executable, str(tmp_path / "play.py")], capture_output=True, text=True, env=env, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout == expected
