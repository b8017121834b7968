"""A server without pgvector is refused with a clear message, before anything else.

The server is real: a copy of the bundled PostgreSQL install with the vector
extension's files left out, initialised and started for this test only.
"""

from __future__ import annotations

import asyncio
import os
import pwd
import shutil
import subprocess

import pytest

from gateway.embedded import postgres_bin_dir
from gateway.errors import ConfigurationError
from gateway.store.database import prepare


def _as_server(args: list[str]) -> list[str]:
    if os.geteuid() == 0:
        pwd.getpwnam("pgserver")  # made by the embedded server's first start
        return ["runuser", "-u", "pgserver", "--", *args]
    return args


@pytest.mark.slow
def test_missing_vector_extension_is_a_clear_error(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    if os.geteuid() == 0 and shutil.which("runuser") is None:
        pytest.skip("runuser is needed to start PostgreSQL as root")
    root = tmp_path_factory.mktemp("novec")
    original = postgres_bin_dir().parent
    install = root / "pkg" / original.name
    shutil.copytree(original, install, ignore=shutil.ignore_patterns("vector*"))
    # The binaries find their libraries by a relative RPATH ($ORIGIN/../../../<libs>).
    libs = original.parent.parent / f"{original.parent.name}.libs"
    (root / libs.name).symlink_to(libs)
    assert not list(install.rglob("vector.control"))
    data, sock = root / "data", root / "s"
    sock.mkdir()
    if os.geteuid() == 0:
        entry = pwd.getpwnam("pgserver")
        for path in (root, sock):
            os.chown(path, entry.pw_uid, entry.pw_gid)
        for path in [install, *install.rglob("*")]:
            path.chmod(path.stat().st_mode | 0o055)
        for parent in root.parents:  # the server user must reach the folder
            if parent.stat().st_mode & 0o001 == 0:
                parent.chmod(parent.stat().st_mode | 0o001)
    bin_dir = install / "bin"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
    made = subprocess.run(
        _as_server([str(bin_dir / "initdb"), "-D", str(data), "-U", "postgres", "--auth=trust"]),
        capture_output=True,
        env=env,
        text=True,
        cwd=root,
    )
    assert made.returncode == 0, made.stderr
    started = subprocess.run(
        _as_server(
            [
                str(bin_dir / "pg_ctl"),
                "-w",
                "-D",
                str(data),
                "-l",
                str(root / "log"),
                "-o",
                f"-h '' -k {sock}",
                "start",
            ]
        ),
        capture_output=True,
        env=env,
    )
    assert started.returncode == 0, started.stderr
    try:
        dsn = f"postgresql://postgres@/postgres?host={sock}"
        with pytest.raises(ConfigurationError) as caught:
            asyncio.run(prepare(dsn, migrate=True))
        assert "no 'vector' extension" in caught.value.message
        assert "DATABASE_URL" in caught.value.message
    finally:
        subprocess.run(
            _as_server([str(bin_dir / "pg_ctl"), "-D", str(data), "-m", "immediate", "-w", "stop"]),
            capture_output=True,
            env=env,
        )
        shutil.rmtree(root, ignore_errors=True)
