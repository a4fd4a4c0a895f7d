import argparse
from pathlib import Path

import pytest

from bench.errors import DataMissing
from bench.paths import DATA_ENV, DEFAULT_DATA, REPO_ROOT, add_data_flag, data_dir, existing


def test_the_default_data_directory_sits_beside_the_repository_whatever_the_cwd(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv(DATA_ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    assert (REPO_ROOT / "bench" / "paths.py").is_file()
    assert data_dir() == DEFAULT_DATA == REPO_ROOT.parent / "shared" / "data"


def test_a_flag_beats_the_environment_which_beats_the_default(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv(DATA_ENV, str(tmp_path / "env"))
    assert data_dir() == tmp_path / "env"
    assert data_dir(tmp_path / "flag") == tmp_path / "flag"
    parser = argparse.ArgumentParser()
    add_data_flag(parser)
    assert parser.parse_args([]).data == tmp_path / "env"
    assert parser.parse_args(["--data", str(tmp_path / "flag")]).data == tmp_path / "flag"


def test_a_missing_data_file_says_how_to_point_at_the_data(tmp_path: Path) -> None:
    with pytest.raises(DataMissing, match=DATA_ENV):
        existing(tmp_path / "absent.csv")
    (tmp_path / "here.csv").write_text("x")
    assert existing(tmp_path / "here.csv") == tmp_path / "here.csv"
