"""The README documents every setting, and the commands it gives exist."""

from __future__ import annotations

from gateway.cli import _parser
from gateway.settings import Settings

from .conftest import REPO

README = (REPO / "README.md").read_text(encoding="utf-8")


def test_every_setting_is_in_the_readme() -> None:
    for name in Settings.model_fields:
        env = "DATABASE_URL" if name == "database_url" else f"RECALL_{name.upper()}"
        assert f"`{env}`" in README, f"README does not document {env}"


def test_every_command_is_in_the_readme() -> None:
    sub = next(a for a in _parser()._actions if a.dest == "command")
    assert sub.choices is not None  # the sub-commands
    for command in sub.choices:
        assert f"`{command}" in README, f"README does not document `{command}`"


def test_readme_commands_exist() -> None:
    for script in ("scripts/demo", "scripts/test"):
        assert f"bash {script}" in README
        assert (REPO / script).is_file()
