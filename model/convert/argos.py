"""Argos Translate packages (what LibreTranslate serves) as our checkpoints.

    nmt import-argos ~/.local/share/argos-translate/packages/translate-en_de-1_0 OUT_DIR
    python -m model.convert.argos --cache DIR ENTRY...   # prints the checkpoint directory of each

A package is a folder (or an `.argosmodel` zip of one folder) with `metadata.json` (`from_code`,
`to_code`, names, version), `model/` (a CTranslate2 model directory: model/convert/ctranslate2.py)
and `sentencepiece.model`. Installed packages live in one folder each under ARGOS_PACKAGES_DIR,
else ~/.local/share/argos-translate/packages, where LibreTranslate finds them.

`checkpoints(entries, cache)` turns what NMT_MODEL_DIRS names (our checkpoints, packages,
`.argosmodel` files, packages folders, `argos`: the installed packages, and Marian release
folders: model/convert/marian_npz.py) into our checkpoint directories. A package is converted
once into `cache/<fingerprint>/`, the fingerprint a SHA-256 of the package's files, so a changed
package is converted again and an unchanged one is not. The service runs this in a child process
(`python -m model.convert.argos`): the HTTP process never imports torch.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import tempfile
import zipfile
from pathlib import Path

from model.convert.ctranslate2 import CT2ImportError, import_ct2
from model.convert.marian_npz import MarianNpzError, import_marian_npz, is_release

DEFAULT_PACKAGES_DIR = Path.home() / ".local" / "share" / "argos-translate" / "packages"
MAX_PACKAGE_BYTES = 4 * 2**30  # an .argosmodel inflated: base models are ~100-300 MB
MAX_PACKAGE_MEMBERS = 10_000


def packages_dir() -> Path:
    """Where installed packages live: ARGOS_PACKAGES_DIR, else Argos's default."""
    return Path(os.environ.get("ARGOS_PACKAGES_DIR") or DEFAULT_PACKAGES_DIR)


def is_checkpoint(path: Path) -> bool:
    return (path / "model.safetensors").is_file() and (path / "config.json").is_file()


def is_package(path: Path) -> bool:
    return (path / "metadata.json").is_file() and (path / "model" / "model.bin").is_file()


def metadata(package: Path) -> dict:
    meta = json.loads((package / "metadata.json").read_text(encoding="utf-8"))
    if not isinstance(meta, dict) or not meta.get("from_code") or not meta.get("to_code"):
        raise CT2ImportError(f"{package / 'metadata.json'}: needs from_code and to_code")
    return meta


def fingerprint(package: Path) -> str:
    """SHA-256 over the package's files (names and contents), in name order."""
    digest = hashlib.sha256()
    for path in sorted(p for p in package.rglob("*") if p.is_file()):
        digest.update(str(path.relative_to(package)).encode() + b"\0")
        with open(path, "rb") as f:
            while chunk := f.read(2**20):
                digest.update(chunk)
    return digest.hexdigest()


def import_argos(package: str | Path, out_dir: str | Path, dtype: str = "float32") -> Path:
    """Convert one installed package folder into a checkpoint directory."""
    package = Path(package)
    if not is_package(package):
        raise CT2ImportError(f"{package}: not an Argos package (metadata.json and model/model.bin expected)")
    meta = metadata(package)
    spm = package / "sentencepiece.model"
    if not spm.is_file():
        found = [p.name for p in package.iterdir() if p.suffix == ".model"]
        raise CT2ImportError(f"{package}: no sentencepiece.model ({', '.join(found) or 'no tokenizer'} found; BPE "
                             "packages are not supported)")
    out = import_ct2(package / "model", out_dir, spm, source_lang=meta["from_code"], target_lang=meta["to_code"],
                     dtype=dtype)
    written = json.loads((out / "metadata.json").read_text())
    written["imported_from"].update(format="argos", package=str(package.resolve()),
                                    package_version=meta.get("package_version"), from_name=meta.get("from_name"),
                                    to_name=meta.get("to_name"))
    (out / "metadata.json").write_text(json.dumps(written, indent=2, ensure_ascii=False) + "\n")
    return out


def unpack(archive: Path, cache: Path) -> Path:
    """An .argosmodel unpacked once into cache/unpacked/<its SHA-256>/; returns the package folder."""
    digest = hashlib.sha256(archive.read_bytes()).hexdigest()
    target = cache / "unpacked" / digest
    if not target.is_dir():
        with zipfile.ZipFile(archive) as z:
            infos = z.infolist()
            if len(infos) > MAX_PACKAGE_MEMBERS or sum(i.file_size for i in infos) > MAX_PACKAGE_BYTES:
                raise CT2ImportError(f"{archive}: more than {MAX_PACKAGE_MEMBERS} members or "
                                     f"{MAX_PACKAGE_BYTES:,} bytes unpacked")
            for info in infos:
                if info.filename.startswith("/") or ".." in Path(info.filename).parts:
                    raise CT2ImportError(f"{archive}: member {info.filename!r} points outside the package")
            target.parent.mkdir(parents=True, exist_ok=True)
            partial = Path(tempfile.mkdtemp(dir=target.parent, prefix=".unpacking-"))
            try:
                z.extractall(partial)
                os.replace(partial, target)
            finally:
                shutil.rmtree(partial, ignore_errors=True)
    folders = [p for p in target.iterdir() if is_package(p)] or ([target] if is_package(target) else [])
    if len(folders) != 1:
        raise CT2ImportError(f"{archive}: expected one package folder inside, found {len(folders)}")
    return folders[0]


def converted(package: Path, cache: Path, importer=None) -> Path:
    """The package (or Marian release folder, with importer=import_marian_npz) as a checkpoint in
    cache/<fingerprint>/, converted now if it is not there."""
    out = cache / fingerprint(package)
    if not is_checkpoint(out):
        partial = Path(tempfile.mkdtemp(dir=cache, prefix=".converting-"))
        try:
            (importer or import_argos)(package, partial)
            os.replace(partial, out)
        finally:
            shutil.rmtree(partial, ignore_errors=True)
    return out


def checkpoints(entries: list[str], cache: str | Path) -> list[Path]:
    """Each NMT_MODEL_DIRS entry as our checkpoint directories: a checkpoint is itself; a package,
    an .argosmodel or a folder of packages becomes the cached conversion of each package."""
    cache = Path(cache).expanduser()
    cache.mkdir(parents=True, exist_ok=True)
    out = []
    for entry in entries:
        path = packages_dir() if entry == "argos" else Path(entry).expanduser()
        if is_checkpoint(path):
            out.append(path)
        elif path.is_file() and path.suffix == ".argosmodel":
            out.append(converted(unpack(path, cache), cache))
        elif is_package(path):
            out.append(converted(path, cache))
        elif is_release(path):
            out.append(converted(path, cache, import_marian_npz))
        elif path.is_dir() and any(is_package(p) for p in path.iterdir()):
            out += [converted(p, cache) for p in sorted(path.iterdir()) if is_package(p)]
        else:
            raise CT2ImportError(f"{entry}: not a checkpoint directory, an Argos package, an .argosmodel file, a "
                                 "folder of Argos packages or a Marian release folder (decoder.yml and an .npz)")
    return out


def _command(args: argparse.Namespace) -> None:
    out = import_argos(args.package, args.out_dir, args.dtype)
    print(f"imported {args.package} -> {out}")


def register(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("import-argos", help="convert an Argos Translate package into a checkpoint")
    p.add_argument("package", metavar="PACKAGE", help="an installed package folder")
    p.add_argument("out_dir", metavar="OUT_DIR")
    p.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"])
    p.set_defaults(func=_command)
    return p


def main(argv: list[str] | None = None) -> None:
    """`python -m model.convert.argos --cache DIR ENTRY...`: the checkpoint directories, as JSON."""
    parser = argparse.ArgumentParser(prog="python -m model.convert.argos")
    parser.add_argument("--cache", required=True)
    parser.add_argument("entries", nargs="+")
    args = parser.parse_args(argv)
    try:
        print(json.dumps([str(p) for p in checkpoints(args.entries, args.cache)]))
    except (CT2ImportError, MarianNpzError, OSError, ValueError, zipfile.BadZipFile) as e:
        print(f"{e}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
