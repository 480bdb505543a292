"""Finding the model files a training job exports to a folder (``eventbus model watch``)."""

from __future__ import annotations

from pathlib import Path

__all__ = ["new_model_files"]

_SUFFIXES = (".pt", ".pt2", ".pth", ".ts", ".torchscript")


def new_model_files(directory: Path, seen: dict[str, tuple[float, int]]) -> list[Path]:
    """Model files in a folder that are new or changed since the last look, oldest first.

    A file is returned once its size held still between two looks, so a file still being
    written is left for a later look.

    Args:
        directory: The folder to look in.
        seen: ``(mtime, size)`` by file name from earlier looks; updated in place. Start
            with an empty dict (every file counts as new) or one filled from the folder.

    Returns:
        The paths to push as new versions, by modification time.

    Example:
        >>> seen: dict[str, tuple[float, int]] = {}
        >>> new_model_files(Path("exports"), seen)  # doctest: +SKIP
        []
    """
    found: list[tuple[float, Path]] = []
    for p in directory.iterdir():
        if not p.is_file() or p.suffix not in _SUFFIXES:
            continue
        st = p.stat()
        sig = (st.st_mtime, st.st_size)
        prev = seen.get(p.name)
        if prev == sig:
            continue
        if prev is not None and prev[0] == -1.0 and prev[1] == st.st_size:
            seen[p.name] = sig
            found.append((st.st_mtime, p))
        else:
            seen[p.name] = (-1.0, st.st_size)  # first sight: push once the size holds still
    return [p for _, p in sorted(found)]
