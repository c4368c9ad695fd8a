"""mlab zoo build never replaces what the zoo did not write, and checks its seed."""

from __future__ import annotations

import pytest

from labs import zoo as zoo_lib


def test_build_into_a_user_directory_refuses_and_keeps_its_files(tmp_path, mlab):
    user = tmp_path / "mine"
    user.mkdir()
    (user / "thesis.tex").write_text("years of work")
    code, _, err = mlab("zoo", "build", "tiny-llama", "--out", user)
    assert code == 2 and "not a zoo checkpoint" in err and str(user) in err
    assert (user / "thesis.tex").read_text() == "years of work"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine"]  # no temporary left behind


def test_build_onto_an_existing_file_refuses(tmp_path):
    target = tmp_path / "notes.txt"
    target.write_text("keep me")
    with pytest.raises(ValueError, match="existing file"):
        zoo_lib.build("tiny-llama", out=target)
    assert target.read_text() == "keep me"


def test_zoo_checkpoints_and_empty_directories_are_valid_targets(zoo, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    zoo_lib._check_target(empty)
    zoo_lib._check_target(zoo("tiny-llama"))  # ours (zoo.json): a rebuild may replace it
    zoo_lib._check_target(tmp_path / "new")


@pytest.mark.parametrize("seed", [2**64, -1, 1.5, "3", True])
def test_bad_seeds_are_named(tmp_path, seed):
    with pytest.raises(ValueError, match="zoo seed must be an integer in"):
        zoo_lib.build("tiny-llama", out=tmp_path / "m", seed=seed)
    assert not (tmp_path / "m").exists()


def test_bad_seed_on_the_command_line(tmp_path, mlab):
    code, _, err = mlab("zoo", "build", "tiny-llama", "--seed", str(2**64), "--out", tmp_path / "m")
    assert code == 2 and "zoo seed must be an integer" in err
