"""Where a sweep's results live: ``tune.storage_path`` as a local folder or a storage URI.

What this module owns
    Reading ``tune.storage_path`` once: a plain path (made absolute) or a ``file://`` URI is a local folder;
    any other URI (``s3://bucket/prefix``, ``gs://...``, what ``pyarrow.fs`` opens) is remote: Ray Tune writes
    its trials there itself, and the few files of the sweep's own (its description, the check that the name
    is free) go through ``pyarrow.fs``. MLflow's default store is an sqlite file in a local storage folder; a
    remote one needs ``tune.mlflow_tracking_uri`` (an MLflow server: sqlite cannot live in an object store).
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from urllib.parse import unquote, urlparse

from muzero_tune.config import ConfigError


@dataclass(frozen=True)
class Storage:
    """A sweep storage location: ``uri`` for Ray Tune; ``local`` the folder when it is on this machine."""

    uri: str
    local: str | None

    def join(self, *parts: str) -> str:
        if self.local is not None:
            return os.path.join(self.local, *parts)
        return "/".join([self.uri.rstrip("/"), *parts])

    def _fs(self, path: str):
        import pyarrow.fs

        return pyarrow.fs.FileSystem.from_uri(path)

    def makedirs(self, path: str) -> None:
        if self.local is not None:
            os.makedirs(path, exist_ok=True)
            return
        fs, inner = self._fs(path)
        fs.create_dir(inner, recursive=True)

    def is_dir(self, path: str) -> bool:
        if self.local is not None:
            return os.path.isdir(path)
        import pyarrow.fs

        fs, inner = self._fs(path)
        return fs.get_file_info(inner).type == pyarrow.fs.FileType.Directory

    def holds_anything(self, path: str) -> bool:
        """Whether the folder ``path`` exists and is not empty."""
        if self.local is not None:
            return os.path.isdir(path) and bool(os.listdir(path))
        import pyarrow.fs

        fs, inner = self._fs(path)
        if fs.get_file_info(inner).type != pyarrow.fs.FileType.Directory:
            return False
        return bool(fs.get_file_info(pyarrow.fs.FileSelector(inner, recursive=False)))

    def remove(self, path: str) -> None:
        """Delete the folder ``path`` and everything in it."""
        if self.local is not None:
            shutil.rmtree(path)
            return
        fs, inner = self._fs(path)
        fs.delete_dir(inner)

    def write_text(self, path: str, text: str) -> None:
        if self.local is not None:
            with open(path, "w") as f:
                f.write(text)
            return
        fs, inner = self._fs(path)
        with fs.open_output_stream(inner) as f:
            f.write(text.encode())

    def read_text(self, path: str) -> str | None:
        """The file's text, or None where it does not exist."""
        if self.local is not None:
            if not os.path.exists(path):
                return None
            with open(path) as f:
                return f.read()
        import pyarrow.fs

        fs, inner = self._fs(path)
        if fs.get_file_info(inner).type != pyarrow.fs.FileType.File:
            return None
        with fs.open_input_stream(inner) as f:
            return f.read().decode()


def storage_of(path: str, *, key: str = "tune.storage_path") -> Storage:
    """``path`` (a folder or a URI) as a :class:`Storage`; ``key`` names the setting in errors."""
    parsed = urlparse(path)
    if parsed.scheme in ("", "file") or len(parsed.scheme) == 1:  # a path (or a Windows drive letter)
        if parsed.scheme == "file":
            if parsed.netloc not in ("", "localhost"):
                raise ConfigError(key, path, "a file:// URI names this machine: file:///absolute/path")
            path = unquote(parsed.path)
        local = os.path.abspath(os.path.expanduser(path))
        return Storage(uri=local, local=local)
    try:
        import pyarrow.fs

        pyarrow.fs.FileSystem.from_uri(path)
    except Exception as err:  # pyarrow's errors name the scheme it lacks
        why = " ".join(str(err).split())
        raise ConfigError(key, path, f"not a storage URI pyarrow can open ({why})") from None
    return Storage(uri=path.rstrip("/"), local=None)


def default_tracking_uri_for(storage: Storage, *, key: str = "tune.mlflow_tracking_uri") -> str:
    """MLflow's default store for ``storage``: sqlite in its folder; a remote one must name a server."""
    from muzero_tune.runs.mlflow_log import default_tracking_uri

    if storage.local is None:
        raise ConfigError(
            key, None, f"tune.storage_path {storage.uri} is remote, where an sqlite store cannot live: set "
            f"it to an MLflow server (http://HOST:PORT, `mlflow server`), or tune.mlflow=false",
        )  # fmt: skip
    return default_tracking_uri(storage.local)
