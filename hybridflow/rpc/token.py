"""The shared auth token: where it comes from (environment or a 0600 file) and how a launcher
makes one per run. No grpc here; ``hybridflow.rpc.auth`` checks and attaches it."""

from __future__ import annotations

import os
import secrets
import stat
from collections.abc import MutableMapping
from pathlib import Path

TOKEN_FILE_NAME = "token"


def create_token_file(run_dir: str | Path, name: str = TOKEN_FILE_NAME) -> Path:
    """Writes a fresh random token to ``run_dir/name``, readable by the owner only (0600).

    The file is created with O_EXCL, so an existing file (or a symlink planted there) is never
    followed or reused: FileExistsError instead. Returns the file's path.
    """
    path = Path(run_dir) / name
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_urlsafe(32) + "\n")
    return path


def read_token_file(path: str | Path) -> str:
    """The token in ``path`` (surrounding whitespace stripped); ValueError if it is empty."""
    token = Path(path).read_text().strip()
    if not token:
        raise ValueError(f"auth token file {str(path)!r} is empty")
    return token


def resolve_token(env_var: str, token_file: str) -> str:
    """The token from ``$env_var`` if set and non-empty, else from ``token_file``, else ""."""
    token = os.environ.get(env_var, "") if env_var else ""
    if token:
        return token
    return read_token_file(token_file) if token_file else ""


def export_run_token(
    run_dir: str | Path, environ: MutableMapping[str, str], env_var: str = "HYBRIDFLOW_TOKEN"
) -> Path | None:
    """For a launcher: makes sure ``environ[env_var]`` holds a token its services share.

    An operator's own token (already in ``environ``) is kept and None returned. Otherwise the
    run directory's token file is created (0600) or, on a resumed run, reused after checking
    it is a regular file only its owner can read; its token is put in ``environ`` and the
    file's path returned.
    """
    if environ.get(env_var):
        return None
    path = Path(run_dir) / TOKEN_FILE_NAME
    try:
        path = create_token_file(run_dir)
    except FileExistsError:
        info = path.lstat()
        if not stat.S_ISREG(info.st_mode) or info.st_mode & 0o077 or info.st_uid != os.getuid():
            raise ValueError(
                f"{path} exists but is not a private regular file of this user; remove it"
            ) from None
    environ[env_var] = read_token_file(path)
    return path
