"""The command line's parser as a whole: options every subcommand spells the same way."""

from __future__ import annotations

import argparse
from collections.abc import Iterator

from cryptdisk.cli._app import build_parser


def _commands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
              ) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _commands(sub, (*path, name))


def test_every_subcommand_that_takes_config_takes_c_for_it() -> None:
    with_config = {}
    for path, parser in _commands(build_parser()):
        for action in parser._actions:
            if "--config" in action.option_strings:
                with_config[" ".join(path)] = action
    # the commands the key options or their own --config reach, in every group
    assert {"backup create", "backup restore", "sqlite encrypt", "sqlite decrypt",
            "sql", "keys promote", "serve"} <= set(with_config), sorted(with_config)
    missing = sorted(p for p, a in with_config.items() if "-c" not in a.option_strings)
    assert not missing, f"--config without -c: {missing}"


def test_c_sets_what_config_sets_for_backup_and_sqlite() -> None:
    parser = build_parser()
    for argv in (["backup", "create", "REPO", "SRC"], ["backup", "restore", "REPO", "latest",
                                                       "T"],
                 ["sqlite", "encrypt", "IN", "OUT"]):
        long = parser.parse_args([*argv, "--config", "c.toml"])
        short = parser.parse_args([*argv, "-c", "c.toml"])
        assert vars(long) == vars(short) and "c.toml" in vars(short).values(), argv
