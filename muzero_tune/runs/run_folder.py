"""Standalone run folders: one run per folder, claimed before anything is written into it.

A run folder ``<logging.output_dir>/<exp_name>/`` holds ``run.json`` (the run's id, which MLflow uses to find
the run again), ``config.json``, ``metrics.jsonl`` (one row per evaluation) and ``ckpt/eval_NNNNNN.pt``.

This module owns the rules that keep runs from mixing:

- a new run never writes into a folder that holds another run (:func:`claim_new`), unless told to replace it
  or that run stopped before its first checkpoint (nothing to resume: the new run takes the folder over);
- a resumed run continues its own folder (:func:`claim_resume`): checkpoints and metrics rows after the
  resumed evaluation belong to a future the resume replaces, so damaged ones are set aside
  (``*.pt.damaged``) and intact ones are only discarded when the user says so.

:func:`make_writable_folder` probes a folder setting before any work starts. It never touches files it
does not know (anything besides the four above is left alone).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import tempfile
import uuid

from muzero_tune.errors import CheckpointError, ConfigError, RunFolderError
from muzero_tune.runs.checkpoint import _EVAL_FILE, _load_file, eval_checkpoints

RUN_FILE = "run.json"
RUN_FILES = (RUN_FILE, "config.json", "metrics.jsonl")


def holds_run(folder: str) -> bool:
    """Whether ``folder`` already holds (part of) a run."""
    return any(os.path.exists(os.path.join(folder, f)) for f in RUN_FILES) or bool(
        eval_checkpoints(os.path.join(folder, "ckpt"))
    )


def _describe(folder: str) -> str:
    n = len(eval_checkpoints(os.path.join(folder, "ckpt")))
    return f"{n} checkpoint{'s' if n != 1 else ''}"


def _clear(folder: str) -> None:
    for f in RUN_FILES:
        p = os.path.join(folder, f)
        if os.path.exists(p):
            os.unlink(p)
    shutil.rmtree(os.path.join(folder, "ckpt"), ignore_errors=True)


def _write_run_file(folder: str, info: dict) -> None:
    tmp = os.path.join(folder, f".{RUN_FILE}.tmp")
    with open(tmp, "w") as f:
        json.dump(info, f, indent=1)
    os.replace(tmp, os.path.join(folder, RUN_FILE))


def read_run_info(folder: str) -> dict:
    """``run.json`` of a run folder ({} for folders written before it existed)."""
    try:
        with open(os.path.join(folder, RUN_FILE)) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def make_writable_folder(key: str, path: str) -> None:
    """Create the folder ``path`` (and its parents) and write and remove a probe file in it, so a folder that
    cannot hold a run's files is refused before any work starts: :class:`ConfigError` naming ``key``, the
    folder and the OS error."""
    try:
        os.makedirs(path, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".write_probe_", dir=path)
        os.close(fd)
        os.unlink(probe)
    except OSError as err:
        raise ConfigError(key, path, f"cannot write there ({err.strerror or err})") from None


def _owner() -> dict:
    return {"host": socket.gethostname(), "pid": os.getpid()}


def _still_running(info: dict) -> int | None:
    """The process id of the run that wrote ``info`` if it still runs on this machine (else None)."""
    pid = info.get("pid")
    if info.get("host") != socket.gethostname() or not isinstance(pid, int) or pid == os.getpid():
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:  # alive, under another user
        return pid
    return pid


def claim_new(folder: str, *, overwrite: bool = False) -> tuple[dict, list[str]]:
    """Make ``folder`` the home of a new run; returns its run info (``{"run_id": ...}``) and notes.

    A folder whose run stopped before its first checkpoint holds nothing to resume: it is taken over (a note
    says so) unless that run still runs on this machine. Raises :class:`RunFolderError` if the folder holds
    another run with checkpoints (or a running one) and ``overwrite`` is False.
    """
    notes: list[str] = []
    if holds_run(folder):
        n_ckpt = len(eval_checkpoints(os.path.join(folder, "ckpt")))
        running = _still_running(read_run_info(folder))
        if not overwrite and running is not None:
            raise RunFolderError(
                f"run folder {folder} holds a run that is still running (process {running}, "
                f"{_describe(folder)}): let it finish or stop it, start a new run with "
                f"`--set exp_name=NEW_NAME`, or replace it with `--overwrite`"
            )
        if not overwrite and n_ckpt > 0:
            raise RunFolderError(
                f"run folder {folder} already holds a run ({_describe(folder)}): continue it with "
                f"`muzero-tune train --resume {folder}`, start a new run with `--set exp_name=NEW_NAME`, "
                f"or replace it with `--overwrite`"
            )
        if not overwrite:
            held = [f for f in RUN_FILES if os.path.exists(os.path.join(folder, f))]
            notes.append(
                f"replaced the run in {folder}: it stopped before its first checkpoint, so nothing could be "
                f"resumed (removed {', '.join(held) or 'its empty ckpt/'})"
            )
        _clear(folder)
    os.makedirs(os.path.join(folder, "ckpt"), exist_ok=True)
    info = {"run_id": uuid.uuid4().hex, **_owner()}
    _write_run_file(folder, info)
    return info, notes


def _eval_index(path: str) -> int:
    return int(_EVAL_FILE.match(os.path.basename(path)).group(1))


def claim_resume(folder: str, eval_index: int, *, overwrite: bool = False) -> tuple[dict, list[str]]:
    """Continue the run in ``folder`` from its evaluation ``eval_index``; returns (run info, notes).

    Later damaged checkpoints are renamed ``*.pt.damaged``; later intact ones raise
    :class:`RunFolderError` unless ``overwrite`` (then they and their metrics rows are deleted). Metrics rows
    after ``eval_index`` are dropped, since the resumed run writes those evaluations again.
    """
    notes: list[str] = []
    later = [p for p in eval_checkpoints(os.path.join(folder, "ckpt")) if _eval_index(p) > eval_index]
    intact = []
    for p in later:
        try:
            _load_file(p)
            intact.append(p)
        except CheckpointError as e:
            os.replace(p, p + ".damaged")
            notes.append(f"set aside damaged {p} ({e.problem}) as {os.path.basename(p)}.damaged")
    if intact and not overwrite:
        raise RunFolderError(
            f"resuming evaluation {eval_index} into {folder} would replace its {len(intact)} later "
            f"checkpoint(s) (newest {os.path.basename(intact[-1])}): resume the newest with "
            f"`--resume {folder}`, branch into a new run folder with `--set exp_name=NEW_NAME`, or discard "
            f"them with `--overwrite`"
        )
    for p in intact:
        os.unlink(p)
        notes.append(f"discarded later checkpoint {p} (--overwrite)")
    metrics = os.path.join(folder, "metrics.jsonl")
    if os.path.exists(metrics):
        with open(metrics) as f:
            rows = [line for line in f if line.strip()]
        keep = [line for line in rows if int(json.loads(line).get("eval_index", 0)) <= eval_index]
        if len(keep) != len(rows):
            with open(metrics, "w") as f:
                f.writelines(keep)
    info = {**(read_run_info(folder) or {"run_id": uuid.uuid4().hex}), **_owner()}
    os.makedirs(os.path.join(folder, "ckpt"), exist_ok=True)
    _write_run_file(folder, info)
    return info, notes


def update_run_info(folder: str, **fields) -> dict:
    """Add fields to ``run.json`` (e.g. the MLflow run id once it exists)."""
    info = {**read_run_info(folder), **fields}
    _write_run_file(folder, info)
    return info
