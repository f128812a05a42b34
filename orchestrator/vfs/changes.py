"""Change values: what a branch did to one path, and the set of them.

A change is relative to a base tree: :class:`Write` (new content and mode; a new file or new
content), :class:`Delete`, or :class:`ModeChange` (same content, new mode). A :class:`ChangeSet` is
an immutable mapping from branch paths to changes. Renames are a delete plus a write.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from attrs import field, frozen

from ._fileio import DEFAULT_MODE, digest, normalize_mode

__all__ = ["Change", "ChangeSet", "Delete", "FileState", "ModeChange", "Write"]


@frozen
class FileState:
    """A file as a tree holds it: content and mode (type and permission bits, e.g. 0o100644)."""

    data: bytes = field(repr=lambda d: f"<{len(d)} bytes>")
    mode: int = DEFAULT_MODE
    #: SHA-256 of ``data``, hex
    digest: str = field(default="", repr=False)

    def __attrs_post_init__(self) -> None:
        if not self.digest:
            object.__setattr__(self, "digest", digest(self.data))
        object.__setattr__(self, "mode", normalize_mode(self.mode))

    def same_as(self, other: FileState | None) -> bool:
        """Same content and mode."""
        return other is not None and self.digest == other.digest and self.mode == other.mode


@frozen
class Write:
    """New content (and mode) for a path: a new file, or new content for an existing one."""

    data: bytes = field(repr=lambda d: f"<{len(d)} bytes>")
    mode: int = DEFAULT_MODE
    #: SHA-256 of ``data``, hex
    digest: str = field(default="", repr=False)

    def __attrs_post_init__(self) -> None:
        if not self.digest:
            object.__setattr__(self, "digest", digest(self.data))
        object.__setattr__(self, "mode", normalize_mode(self.mode))

    @classmethod
    def from_state(cls, state: FileState) -> Write:
        """The write that produces ``state``."""
        return cls(state.data, state.mode, state.digest)

    def state(self) -> FileState:
        """The file this write produces."""
        return FileState(self.data, self.mode, self.digest)


@frozen
class Delete:
    """The path is deleted."""


@frozen
class ModeChange:
    """Same content, new mode (e.g. the executable bit set)."""

    mode: int = field(converter=normalize_mode)


Change = Write | Delete | ModeChange


@frozen(repr=False)
class ChangeSet(Mapping[str, Change]):
    """An immutable mapping of branch path -> :data:`Change`, relative to some base tree."""

    _items: Mapping[str, Change] = field(factory=dict, alias="items")

    def __repr__(self) -> str:
        return f"ChangeSet({dict(sorted(self._items.items()))!r})"

    @classmethod
    def of(cls, items: Mapping[str, Change]) -> ChangeSet:
        """A change set holding a copy of ``items``."""
        if isinstance(items, ChangeSet):
            return items
        return cls(items=dict(items))

    def __getitem__(self, path: str) -> Change:
        return self._items[path]

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._items))

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, path: object) -> bool:
        return path in self._items

    @property
    def written(self) -> tuple[str, ...]:
        """Paths given new content (new or modified files), sorted."""
        return tuple(p for p in self if isinstance(self._items[p], Write))

    @property
    def deleted(self) -> tuple[str, ...]:
        """Deleted paths, sorted."""
        return tuple(p for p in self if isinstance(self._items[p], Delete))

    @property
    def mode_changed(self) -> tuple[str, ...]:
        """Paths whose mode only changed, sorted."""
        return tuple(p for p in self if isinstance(self._items[p], ModeChange))

    def summary(self) -> str:
        """``"3 written, 1 deleted, 0 mode changes"``."""
        return (
            f"{len(self.written)} written, {len(self.deleted)} deleted, "
            f"{len(self.mode_changed)} mode changes"
        )
