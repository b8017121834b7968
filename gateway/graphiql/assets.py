"""The IDE's third-party files: where they come from, and proof that they are those.

GraphiQL, React and ReactDOM come from npm at set-up time (the versions pinned
in ``graphiql/package-lock.json``, whose integrity hashes npm checks), never
from a CDN at page load: a CDN would mean a blank page without internet and a
third-party script inside the page of a memory store. ``assets.json`` records,
for each file the page needs, its package, version, path in the package and
SHA-256. ``vendor`` copies the files out of ``node_modules`` into ``vendor/``
only when every hash matches; ``load`` checks them again before the gateway
serves them, so a file changed on disk is refused rather than served.

Run ``python -m gateway.graphiql NODE_MODULES`` to vendor them (scripts/setup
does).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
MANIFEST = HERE / "assets.json"
VENDOR_DIR = HERE / "vendor"

_MEDIA_TYPES = {".js": "text/javascript", ".css": "text/css"}


class AssetError(Exception):
    """A vendored file is missing or is not the recorded one."""


@dataclass(frozen=True, slots=True)
class Asset:
    """One recorded file: ``name`` in vendor/, from ``path`` in the npm ``package``."""

    name: str
    package: str
    version: str
    path: str
    sha256: str

    @property
    def media_type(self) -> str | None:
        """What it is served as; ``None`` for files kept but not served (licences)."""
        return _MEDIA_TYPES.get(Path(self.name).suffix)


@dataclass(frozen=True, slots=True)
class Manifest:
    graphiql_version: str
    files: tuple[Asset, ...]


def read_manifest(path: Path = MANIFEST) -> Manifest:
    raw = json.loads(path.read_text(encoding="utf-8"))
    files = tuple(
        Asset(f["name"], f["package"], f["version"], f["path"], f["sha256"]) for f in raw["files"]
    )
    return Manifest(raw["graphiql"], files)


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def load(directory: Path = VENDOR_DIR, manifest: Manifest | None = None) -> dict[str, bytes]:
    """The served files by name, each checked against its recorded SHA-256."""
    manifest = manifest or read_manifest()
    out: dict[str, bytes] = {}
    for asset in manifest.files:
        if asset.media_type is None:
            continue
        file = directory / asset.name
        if not file.is_file():
            raise AssetError(f"{asset.name} is missing from {directory}")
        data = file.read_bytes()
        if _sha256(data) != asset.sha256:
            raise AssetError(f"{asset.name} in {directory} is not the recorded file (SHA-256)")
        out[asset.name] = data
    return out


def vendor(
    node_modules: Path, directory: Path = VENDOR_DIR, manifest: Manifest | None = None
) -> list[Asset]:
    """Copy the recorded files out of ``node_modules``; nothing is copied unless all match."""
    manifest = manifest or read_manifest()
    found: list[tuple[Asset, bytes]] = []
    for asset in manifest.files:
        package_dir = node_modules / asset.package
        meta = package_dir / "package.json"
        if not meta.is_file():
            raise AssetError(f"the npm package {asset.package} is not in {node_modules}")
        version = json.loads(meta.read_text(encoding="utf-8")).get("version")
        if version != asset.version:
            raise AssetError(f"{asset.package} is {version}, {asset.version} is recorded")
        data = (package_dir / asset.path).read_bytes()
        if _sha256(data) != asset.sha256:
            raise AssetError(
                f"{asset.package}/{asset.path} does not have the recorded SHA-256 {asset.sha256}"
            )
        found.append((asset, data))
    staging = directory.with_name(directory.name + ".new")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    for asset, data in found:
        (staging / asset.name).write_bytes(data)
    shutil.rmtree(directory, ignore_errors=True)
    staging.rename(directory)
    return [asset for asset, _ in found]


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1:
        print("usage: python -m gateway.graphiql NODE_MODULES", file=sys.stderr)
        return 2
    try:
        copied = vendor(Path(args[0]))
    except (AssetError, OSError) as exc:
        print(f"GraphiQL assets: {exc}", file=sys.stderr)
        return 1
    names = ", ".join(dict.fromkeys(f"{a.package}@{a.version}" for a in copied))
    print(f"GraphiQL assets verified and installed: {names}")
    return 0
